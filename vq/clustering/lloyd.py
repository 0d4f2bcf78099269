"""Lloyd iterations: assign every point to its nearest centroid, move each centroid to the mean
of its points, repair empty clusters (faiss's split), and report the objective.

:func:`lloyd` picks one of three loops that give the same iterations: the general one (one
chunked pass per iteration, any dtype and device: :func:`accumulate`), a fused one for small
float32 CPU jobs (:func:`_lloyd_fused`: one matrix product and one numba kernel per iteration,
stopping at a fixed point) and a bounded one for float32 data with many centroids
(:func:`_lloyd_bounded`: Hamerly's bounds skip the points that provably keep their cluster).
The data are :class:`vq.parallel.Shards`; each iteration all-reduces the cluster sums and
counts, and the update runs identically on every process.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from vq import _cpu, kernels
from vq.distances import iter_nearest, nearest, unit_rows
from vq.parallel import Shards

# relative size of the symmetric perturbation when a cluster is split (faiss uses 1/1024)
_SPLIT_EPS = 1.0 / 1024.0
# Lloyd on float32 data skips points whose cluster provably cannot change (Hamerly's bounds);
# the slack keeps float rounding of the bounds on the safe side
_BOUNDED = True
_BOUNDED_MIN_K = 64
_FULL_PASS_FRACTION = 0.5
_BOUND_SLACK = 1e-6
# up to this many rows (per process), each Lloyd iteration is one matrix product and one fused
# kernel: the bounds' bookkeeping costs more than it saves on small jobs
_FUSED_MAX_N = 65536

#: what a Lloyd loop calls after each iteration: the new centroids and the objective of the
#: assignment step
Observer = Callable[[torch.Tensor, float], None]


def lloyd(
    x: Shards,
    centroids: torch.Tensor,
    niter: int,
    gen: torch.Generator,
    after: Observer,
    spherical: bool = False,
) -> torch.Tensor:
    """``niter`` Lloyd iterations on the (possibly distributed) rows ``x``; returns the
    centroids and reports each iteration to ``after``. Small float32 CPU jobs take
    :func:`_lloyd_fused`; float32 data with enough centroids for the bounds to pay (each search
    costs k·d per point, the bounds about d) takes :func:`_lloyd_bounded`. All three loops give
    the same iterations.

    Args:
        x: the training rows, float Tensor[n, d] per process; centroids: float32 Tensor[k, d],
            the start; gen: the run's generator (empty-cluster repair draws from it).
        spherical: each update ends with the centroids scaled to unit L2 norm
            (:func:`update_centroids`); the assignment step stays nearest-by-L2.
    """
    local = x.local
    if local.dtype == torch.float32 and _cpu.fast_path(local) and local.shape[0] <= _FUSED_MAX_N:
        return _lloyd_fused(x, centroids, niter, gen, after, spherical)
    if local.dtype == torch.float32 and _BOUNDED and centroids.shape[0] >= _BOUNDED_MIN_K:
        return _lloyd_bounded(x, centroids, niter, gen, after, spherical)
    for _ in range(niter):
        sums, counts, errors, _ = accumulate(x.local, centroids)
        sums, counts, total = x.all_sum(sums, counts, errors.sum())
        centroids = update_centroids(centroids, sums, counts, gen, spherical)
        after(centroids, float(total))
    return centroids


def accumulate(x: torch.Tensor, centroids: torch.Tensor, x_norms: torch.Tensor | None = None):
    """One pass: per-cluster sums [k, d], counts [k], squared errors [k] (float64) and the total
    error. float32 data is assigned in one call and accumulated with one ``index_add_``;
    float16/bfloat16 data is converted chunk by chunk."""
    k, d = centroids.shape
    sums = torch.zeros(k, d, device=x.device)
    counts = torch.zeros(k, device=x.device)
    errors = torch.zeros(k, device=x.device, dtype=torch.float64)
    if x.dtype == torch.float32:
        parts = [(x, nearest(x, centroids, x_norms=x_norms))]
    else:
        parts = ((chunk, res) for _, chunk, res in iter_nearest(x, centroids))
    for chunk, res in parts:
        sums.index_add_(0, res.indices, chunk)
        counts += torch.bincount(res.indices, minlength=k).to(counts.dtype)
        errors.index_add_(0, res.indices, res.distances.double())
    return sums, counts, errors, float(errors.sum())


def update_centroids(
    centroids: torch.Tensor,
    sums: torch.Tensor,
    counts: torch.Tensor,
    gen: torch.Generator,
    spherical: bool = False,
) -> torch.Tensor:
    """The centroids after an assignment step: each cluster's mean (``sums`` float32 [k, d] /
    ``counts`` [k]), the old centroid where a cluster is empty, then empty clusters repaired
    (:func:`split_empty_clusters`); with ``spherical``, every row then scaled to unit L2 norm
    (faiss's ``spherical``; a zero row stays zero). Returns a new float32 Tensor[k, d]."""
    new = torch.where(counts[:, None] > 0, sums / counts.clamp_min(1.0)[:, None], centroids)
    split_empty_clusters(new, counts, gen)
    return unit_rows(new) if spherical else new


def split_empty_clusters(
    centroids: torch.Tensor, counts: torch.Tensor, gen: torch.Generator
) -> int:
    """faiss's repair: each empty cluster takes a copy of a cluster drawn with probability
    proportional to (size - 1); the two copies are pushed apart by a relative ±1/1024."""
    empty = torch.nonzero(counts == 0).flatten().tolist()
    if not empty:
        return 0
    counts = counts.clone()
    for ci in empty:
        weights = (counts - 1.0).clamp_min(0.0).cpu()
        cj = int(torch.multinomial(weights, 1, generator=gen))
        centroids[ci] = centroids[cj] * (1.0 + _SPLIT_EPS)
        centroids[cj] = centroids[cj] * (1.0 - _SPLIT_EPS)
        counts[ci] = torch.floor(counts[cj] / 2)
        counts[cj] -= counts[ci]
    return len(empty)


def _lloyd_fused(
    shards: Shards,
    centroids: torch.Tensor,
    niter: int,
    gen: torch.Generator,
    after: Observer,
    spherical: bool,
) -> torch.Tensor:
    """Plain Lloyd on CPU float32 rows, each iteration one matrix product and one kernel
    (:func:`vq.kernels.assign_accumulate`: nearest centroids, cluster sums, counts and errors
    at once): for small jobs, where the per-iteration steps of the general loop, not the
    product, dominate. The same assignments as :func:`nearest`.

    Once an iteration changes no assignment (on any process) and leaves no cluster empty, the
    centroids are a fixed point: every later iteration would compute the same ones, so they
    are reported without being computed (faiss stops there too)."""
    x = shards.local.contiguous()
    n, d = x.shape
    k = centroids.shape[0]
    x_np = x.numpy()
    x_norms = (x * x).sum(dim=1).numpy()
    blocks = max(1, -(-n // kernels.ASSIGN_BLOCK))
    dots = _cpu.empty((n, k))
    assign, previous = np.empty(n, np.int64), np.full(n, -1, np.int64)
    for it in range(niter):
        torch.mm(x, (-2.0 * centroids).T, out=dots)
        sums = np.zeros((blocks, k, d), np.float32)
        counts = np.zeros((blocks, k), np.float32)
        errors = np.zeros(blocks, np.float64)
        bias = (centroids * centroids).sum(dim=1).numpy()
        kernels.assign_accumulate(dots.numpy(), bias, x_np, x_norms, assign, sums, counts, errors)
        changed = int(np.count_nonzero(assign != previous))
        assign, previous = previous, assign
        sums_t, counts_t, total, changed_t = shards.all_sum(
            torch.from_numpy(sums.sum(axis=0)),
            torch.from_numpy(counts.sum(axis=0)),
            torch.tensor(errors.sum(), dtype=torch.float64),
            torch.tensor(changed),
        )
        new = update_centroids(centroids, sums_t, counts_t, gen, spherical)
        after(new, float(total))
        if int(changed_t) == 0 and bool((counts_t > 0).all()):
            for _ in range(it + 1, niter):  # a fixed point: the same centroids every time
                after(new, float(total))
            return new
        centroids = new
    return centroids


def _lloyd_bounded(
    shards: Shards,
    centroids: torch.Tensor,
    niter: int,
    gen: torch.Generator,
    after: Observer,
    spherical: bool,
) -> torch.Tensor:
    """Lloyd iterations that skip the points which provably keep their cluster.

    Hamerly's bounds: ``upper`` ≥ distance to the assigned centroid, ``lower`` ≤ distance to any
    other. When centroids move by ``shift``, ``upper += shift[assigned]`` and
    ``lower -= max(shift)``; only points with ``upper > lower`` (after tightening ``upper`` to the
    exact distance) are searched again. Assignments — and so centroids and objective — are those
    of plain Lloyd (up to float rounding in exact ties). The objective is computed from the
    cluster sums: ``Σ||x||² - 2 Σ_j ⟨c_j, S_j⟩ + Σ_j n_j ||c_j||²``. Bounds are per point, so
    each process keeps those of its rows; only the sums and counts travel.

    Reference: G. Hamerly, "Making k-means even faster", SDM 2010.
    """
    if niter == 0:
        return centroids
    x = shards.local
    k, d = centroids.shape
    x_norms = (x * x).sum(dim=1)
    (total_norm,) = shards.all_sum(x_norms.double().sum())
    total_norm = float(total_norm)
    res = nearest(x, centroids, x_norms=x_norms, second=True)
    assign = res.indices.clone()
    upper = res.distances.double().sqrt()
    lower = res.second.double().sqrt()
    for it in range(niter):
        if it > 0:
            rows = torch.nonzero(upper * (1.0 + _BOUND_SLACK) >= lower).flatten()
            if rows.numel() > _FULL_PASS_FRACTION * x.shape[0]:
                rows = None  # most points may move (e.g. right after splits): search them all
                res = nearest(x, centroids, x_norms=x_norms, second=True)
                assign = res.indices
                upper = res.distances.double().sqrt()
                lower = res.second.double().sqrt()
            elif rows.numel():
                diff = x[rows] - centroids[assign[rows]]
                upper[rows] = (diff * diff).sum(dim=1).double().sqrt()
                rows = rows[upper[rows] * (1.0 + _BOUND_SLACK) >= lower[rows]]
            if rows is not None and rows.numel():
                r = nearest(x[rows], centroids, x_norms=x_norms[rows], second=True)
                assign[rows] = r.indices
                upper[rows] = r.distances.double().sqrt()
                lower[rows] = r.second.double().sqrt()
        sums = torch.zeros(k, d, device=x.device).index_add_(0, assign, x)
        counts = torch.bincount(assign, minlength=k).to(torch.float32)
        sums, counts = shards.all_sum(sums, counts)
        c64 = centroids.double()
        total = (
            total_norm
            - 2.0 * float((c64 * sums.double()).sum())
            + float((counts.double() * (c64 * c64).sum(dim=1)).sum())
        )
        total = max(total, 0.0)
        new = update_centroids(centroids, sums, counts, gen, spherical)
        shift = (new - centroids).double().norm(dim=1)
        upper += shift[assign]
        lower -= shift.max()
        centroids = new
        after(centroids, total)
    return centroids
