"""Nearest-centroid search by chunked GEMM: the one assignment step every quantizer shares.

``||x - c||² = ||x||² + ||c||² - 2⟨x, c⟩``: the inner products come from one matrix product per
chunk of rows, so memory stays bounded (about 4 MiB of distances per chunk on CPU) whatever the
number of vectors. On CPU the arg-min runs in a numba kernel fused with the ``||c||²`` bias; on
other devices, and while tracing or compiling, it is plain torch (``addmm`` + ``min``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import torch

from vq import _cpu, kernels
from vq._checks import is_eager


class Nearest(NamedTuple):
    """Result of :func:`nearest`: squared L2 distance and index of the closest centroid."""

    distances: torch.Tensor  # float32 [n]
    indices: torch.Tensor  # int64 [n]


def chunk_rows(k: int, device: torch.device) -> int:
    """Rows per chunk so that a chunk's [rows, k] distance block stays cache/memory friendly."""
    budget = (1 << 20) if device.type == "cpu" else (1 << 26)
    return max(256, min(1 << 16, budget // max(k, 1)))


def iter_nearest(
    x: torch.Tensor, centroids: torch.Tensor, rows: int | None = None
) -> Iterator[tuple[int, torch.Tensor, Nearest]]:
    """Yield ``(start, chunk, Nearest)`` over row chunks of ``x``.

    Args:
        x: Tensor[n, d] of any floating dtype (float16/bfloat16 chunks are computed in float32).
        centroids: float32 Tensor[k, d] on ``x``'s device.
        rows: rows per chunk (default from :func:`chunk_rows`).

    Yields:
        ``start`` (first row of the chunk), the chunk as float32, and its nearest centroids.
    """
    n, k = x.shape[0], centroids.shape[0]
    rows = rows or chunk_rows(k, x.device)
    norms = (centroids * centroids).sum(dim=1)
    fast = _cpu.fast_path(x)
    if fast:
        neg2_t = (-2.0 * centroids).T.contiguous()
        norms_np = norms.numpy()
        buf = _cpu.empty((min(rows, n), k))
    for start in range(0, n, rows):
        chunk = x[start : start + rows].float()
        chunk_norms = (chunk * chunk).sum(dim=1)
        if fast:
            m = chunk.shape[0]
            dots = torch.mm(chunk, neg2_t, out=buf[:m])
            idx = _cpu.empty((m,), torch.int64)
            val = _cpu.empty((m,))
            kernels.argmin_rows(dots.numpy(), norms_np, idx.numpy(), val.numpy())
        else:
            val, idx = torch.addmm(norms, chunk, centroids.T, alpha=-2.0).min(dim=1)
        yield start, chunk, Nearest((val + chunk_norms).clamp_min(0.0), idx)


def nearest(
    x: torch.Tensor,
    centroids: torch.Tensor,
    rows: int | None = None,
    x_norms: torch.Tensor | None = None,
) -> Nearest:
    """Closest centroid (squared L2) for every row of ``x``.

    Args:
        x: Tensor[n, d], floating point, on ``centroids``' device.
        centroids: float32 Tensor[k, d].
        rows: rows per chunk (memory bound); default chosen from k and the device.
        x_norms: optional precomputed ``||x||²`` float32 [n] (saves a pass over x when the
            same vectors are assigned repeatedly, as in Lloyd iterations).

    Returns:
        :class:`Nearest` with float32 ``distances`` [n] and int64 ``indices`` [n]; ties go to the
        lowest index.
    """
    if not is_eager():
        return nearest_static(x.float(), centroids)
    n, k = x.shape[0], centroids.shape[0]
    if not (_cpu.fast_path(x) and x.dtype == torch.float32):
        dist = torch.empty(n, dtype=torch.float32, device=x.device)
        idx = torch.empty(n, dtype=torch.long, device=x.device)
        for start, _, res in iter_nearest(x, centroids, rows):
            dist[start : start + res.indices.shape[0]] = res.distances
            idx[start : start + res.indices.shape[0]] = res.indices
        return Nearest(dist, idx)
    # CPU fast path: one GEMM per chunk into a reused buffer, numba arg-min writing in place
    rows = rows or chunk_rows(k, x.device)
    neg2_t = (-2.0 * centroids).T.contiguous()
    norms = (centroids * centroids).sum(dim=1).numpy()
    buf = _cpu.empty((min(rows, n), k))
    idx, val = _cpu.empty((n,), torch.int64), _cpu.empty((n,))
    idx_np, val_np = idx.numpy(), val.numpy()
    for start in range(0, n, rows):
        chunk = x[start : start + rows]
        m = chunk.shape[0]
        dots = torch.mm(chunk, neg2_t, out=buf[:m])
        kernels.argmin_rows(
            dots.numpy(), norms, idx_np[start : start + m], val_np[start : start + m]
        )
    if x_norms is None:
        x_norms = (x * x).sum(dim=1)
    return Nearest(val.add_(x_norms).clamp_min_(0.0), idx)


def nearest_static(x: torch.Tensor, centroids: torch.Tensor) -> Nearest:
    """Graph-friendly nearest centroid (one ``addmm`` + ``min``, no chunking, no numba)."""
    norms = (centroids * centroids).sum(dim=1)
    val, idx = torch.addmm(norms, x, centroids.T, alpha=-2.0).min(dim=1)
    return Nearest((val + (x * x).sum(dim=1)).clamp_min(0.0), idx)
