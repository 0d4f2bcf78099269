"""How the kernels compile: the disk cache and its trust rules, background compiles, and
numba_compat, the one module that uses numba's internals."""
