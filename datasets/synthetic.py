"""Seeded synthetic vector sets with known structure, for tests, benchmarks and the demo."""

from __future__ import annotations

import math

import numpy as np

from vq._checks import check_int


def clustered_vectors(
    n: int, dim: int, *, n_clusters: int = 256, spread: float = 0.5, seed: int = 0
) -> np.ndarray:
    """Gaussian blobs: float32 [n, dim] around ``n_clusters`` unit-normal centres,
    noise std ``spread``."""
    n, dim = check_int(n, "n", 0), check_int(dim, "dim", 1)
    n_clusters, seed = check_int(n_clusters, "n_clusters", 1), check_int(seed, "seed", 0)
    if not (isinstance(spread, int | float) and math.isfinite(spread) and spread >= 0):
        raise ValueError(f"spread must be a finite number >= 0, got {spread!r}")
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((n_clusters, dim), dtype=np.float32)
    labels = rng.integers(0, n_clusters, n)
    noise = rng.standard_normal((n, dim), dtype=np.float32)
    return centres[labels] + np.float32(spread) * noise


def anisotropic_vectors(n: int, dim: int, *, decay: float = 0.9, seed: int = 0) -> np.ndarray:
    """Correlated Gaussian data whose variance falls off geometrically across a random basis:
    float32 [n, dim] with per-direction std ``decay**i`` (what OPQ is meant to fix)."""
    n, dim, seed = check_int(n, "n", 0), check_int(dim, "dim", 1), check_int(seed, "seed", 0)
    if not (isinstance(decay, int | float) and 0 < decay <= 1):
        raise ValueError(f"decay must lie in (0, 1], got {decay!r}")
    rng = np.random.default_rng(seed)
    basis, _ = np.linalg.qr(rng.standard_normal((dim, dim)))
    scales = decay ** np.arange(dim)
    z = rng.standard_normal((n, dim)) * scales
    return (z @ basis.T).astype(np.float32)
