"""Seeded synthetic vector sets with known structure, for tests, benchmarks and the demo."""

from __future__ import annotations

import numpy as np


def clustered_vectors(
    n: int, dim: int, *, n_clusters: int = 256, spread: float = 0.5, seed: int = 0
) -> np.ndarray:
    """Gaussian blobs: float32 [n, dim] around ``n_clusters`` unit-normal centres,
    noise std ``spread``."""
    if n < 0 or dim <= 0 or n_clusters <= 0:
        raise ValueError(f"need n >= 0, dim > 0, n_clusters > 0; got {n}, {dim}, {n_clusters}")
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((n_clusters, dim), dtype=np.float32)
    labels = rng.integers(0, n_clusters, n)
    noise = rng.standard_normal((n, dim), dtype=np.float32)
    return centres[labels] + np.float32(spread) * noise


def anisotropic_vectors(n: int, dim: int, *, decay: float = 0.9, seed: int = 0) -> np.ndarray:
    """Correlated Gaussian data whose variance falls off geometrically across a random basis:
    float32 [n, dim] with per-direction std ``decay**i`` (what OPQ is meant to fix)."""
    if n < 0 or dim <= 0 or not 0 < decay <= 1:
        raise ValueError(f"need n >= 0, dim > 0, 0 < decay <= 1; got {n}, {dim}, {decay}")
    rng = np.random.default_rng(seed)
    basis, _ = np.linalg.qr(rng.standard_normal((dim, dim)))
    scales = decay ** np.arange(dim)
    z = rng.standard_normal((n, dim)) * scales
    return (z @ basis.T).astype(np.float32)
