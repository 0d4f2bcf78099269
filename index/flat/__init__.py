"""The flat kinds: every stored vector scanned (exact, PQ codes, scalar-quantizer codes)."""
