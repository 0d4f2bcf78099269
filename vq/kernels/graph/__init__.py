"""HNSW kernels: search, batched parallel construction, what a traversal reads."""
