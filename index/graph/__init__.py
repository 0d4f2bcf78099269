"""The graph kinds: HNSW over vectors or scalar-quantizer codes, and its static-shape search."""
