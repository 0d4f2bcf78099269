"""RaBitQ kernels: estimated distances to 1-bit RaBitQ codes, fused with top-k."""
