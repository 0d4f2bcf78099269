"""How the kernels compile: the disk cache, its trust rules, background compiles and numba's inliner
(every use of numba's internals)."""
