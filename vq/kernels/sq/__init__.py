"""Scalar-quantizer kernels: distances to SQ codes over flat arrays and inverted lists."""
