"""Nearest-centroid search by chunked GEMM: the one assignment step every quantizer shares.

``||x - c||² = ||x||² + ||c||² - 2⟨x, c⟩``: the inner products come from one matrix product per
chunk of rows, so memory stays bounded (about 4 MiB of distances per chunk on CPU) whatever the
number of vectors. On CPU the arg-min runs in a numba kernel fused with the ``||c||²`` bias; on
other devices, and while tracing or compiling, it is plain torch (``addmm`` + ``min``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import numpy as np
import torch

from vq import _cpu, kernels
from vq._checks import is_eager


def unit_rows(x: torch.Tensor) -> torch.Tensor:
    """float32 rows of ``x`` [n, d] scaled to unit L2 norm (metric "cosine", ``"L2norm,"``,
    spherical k-means' centroids):
    the norms computed in float64 and rounded to float32, then one float32 division per
    value, so that :func:`unit_rows_np` (the lean path's) gives the very same values; a zero
    row stays zero."""
    norms = torch.linalg.vector_norm(x, dim=-1, keepdim=True, dtype=torch.float64).float()
    return x.float() / torch.where(norms > 0, norms, 1.0)


def unit_rows_np(q: np.ndarray) -> np.ndarray:
    """:func:`unit_rows` of float32 numpy rows ``q`` [n, d] (a new C-contiguous array)."""
    q64 = q.astype(np.float64)
    norms = np.sqrt(np.einsum("ij,ij->i", q64, q64))[:, None].astype(np.float32)
    return np.ascontiguousarray(q / np.where(norms > 0, norms, np.float32(1.0)))


class Nearest(NamedTuple):
    """Result of :func:`nearest`: squared L2 distance and index of the closest centroid, and
    (when asked for) the squared distance to the second closest."""

    distances: torch.Tensor  # float32 [n]
    indices: torch.Tensor  # int64 [n]
    second: torch.Tensor | None = None  # float32 [n]


def chunk_rows(k: int, device: torch.device) -> int:
    """Rows per chunk so that a chunk's [rows, k] distance block stays cache/memory friendly."""
    budget = (1 << 20) if device.type == "cpu" else (1 << 26)
    return max(256, min(1 << 16, budget // max(k, 1)))


def _torch_min(dist: torch.Tensor, second: bool):
    """Minimum, arg-min and (optionally) second minimum along dim 1 of [n, k] distances."""
    if not second:
        val, idx = dist.min(dim=1)
        return val, idx, None
    if dist.shape[1] == 1:
        val, idx = dist.min(dim=1)
        return val, idx, torch.full_like(val, float("inf"))
    vals, idxs = torch.topk(dist, 2, dim=1, largest=False, sorted=True)
    # topk does not promise the lowest index among ties: take the arg-min from min()
    val, idx = dist.min(dim=1)
    return val, idx, vals[:, 1]


def iter_nearest(
    x: torch.Tensor, centroids: torch.Tensor, rows: int | None = None, second: bool = False
) -> Iterator[tuple[int, torch.Tensor, Nearest]]:
    """Yield ``(start, chunk, Nearest)`` over row chunks of ``x``.

    Args:
        x: Tensor[n, d] of any floating dtype (float16/bfloat16 chunks are computed in float32).
        centroids: float32 Tensor[k, d] on ``x``'s device.
        rows: rows per chunk (default from :func:`chunk_rows`).
        second: also return the squared distance to the second closest centroid.

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
            idx, val = _cpu.empty((m,), torch.int64), _cpu.empty((m,))
            snd = _cpu.empty((m if second else 0,))
            kernels.argmin_rows(dots.numpy(), norms_np, idx.numpy(), val.numpy(), snd.numpy())
        else:
            dist = torch.addmm(norms, chunk, centroids.T, alpha=-2.0)
            val, idx, snd = _torch_min(dist, second)
        if second:
            snd = (snd + chunk_norms).clamp_min(0.0)
        yield start, chunk, Nearest((val + chunk_norms).clamp_min(0.0), idx, snd)


def nearest(
    x: torch.Tensor,
    centroids: torch.Tensor,
    rows: int | None = None,
    x_norms: torch.Tensor | None = None,
    second: bool = False,
) -> Nearest:
    """Closest centroid (squared L2) for every row of ``x``.

    Args:
        x: Tensor[n, d], floating point, on ``centroids``' device.
        centroids: float32 Tensor[k, d].
        rows: rows per chunk (memory bound); default chosen from k and the device.
        x_norms: optional precomputed ``||x||²`` float32 [n] (saves a pass over x when the
            same vectors are assigned repeatedly, as in Lloyd iterations).
        second: also return the squared distance to the second closest centroid (k-means uses
            it to bound which points may change cluster).

    Returns:
        :class:`Nearest` with float32 ``distances`` [n], int64 ``indices`` [n] (ties go to the
        lowest index) and, if asked, float32 ``second`` [n].
    """
    if not is_eager():
        return nearest_static(x.float(), centroids)
    n, k = x.shape[0], centroids.shape[0]
    if not (_cpu.fast_path(x) and x.dtype == torch.float32):
        dist = torch.empty(n, dtype=torch.float32, device=x.device)
        idx = torch.empty(n, dtype=torch.long, device=x.device)
        snd = torch.empty(n, dtype=torch.float32, device=x.device) if second else None
        for start, _, res in iter_nearest(x, centroids, rows, second):
            stop = start + res.indices.shape[0]
            dist[start:stop], idx[start:stop] = res.distances, res.indices
            if second:
                snd[start:stop] = res.second
        return Nearest(dist, idx, snd)
    # CPU fast path: one GEMM per chunk into a reused buffer, numba arg-min writing in place
    rows = rows or chunk_rows(k, x.device)
    neg2_t = (-2.0 * centroids).T.contiguous()
    norms = (centroids * centroids).sum(dim=1).numpy()
    buf = _cpu.empty((min(rows, n), k))
    idx, val = _cpu.empty((n,), torch.int64), _cpu.empty((n,))
    snd = _cpu.empty((n if second else 0,))
    idx_np, val_np, snd_np = idx.numpy(), val.numpy(), snd.numpy()
    for start in range(0, n, rows):
        chunk = x[start : start + rows]
        stop = start + chunk.shape[0]
        dots = torch.mm(chunk, neg2_t, out=buf[: chunk.shape[0]])
        kernels.argmin_rows(
            dots.numpy(),
            norms,
            idx_np[start:stop],
            val_np[start:stop],
            snd_np[start:stop] if second else snd_np,
        )
    if x_norms is None:
        x_norms = (x * x).sum(dim=1)
    second_dist = snd.add_(x_norms).clamp_min_(0.0) if second else None
    return Nearest(val.add_(x_norms).clamp_min_(0.0), idx, second_dist)


def nearest_static(x: torch.Tensor, centroids: torch.Tensor) -> Nearest:
    """Graph-friendly nearest centroid (one ``addmm`` + ``min``, no chunking, no numba)."""
    norms = (centroids * centroids).sum(dim=1)
    val, idx = torch.addmm(norms, x, centroids.T, alpha=-2.0).min(dim=1)
    return Nearest((val + (x * x).sum(dim=1)).clamp_min(0.0), idx)
