"""Where k-means starts: the seeded generator, random rows, and greedy k-means++ seeding.

Every random choice of a clustering run draws from one ``torch.Generator`` seeded on CPU
(:func:`generator`), so a seed gives the same centroids on every device and, under
torch.distributed, on every process.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from vq import _cpu, kernels
from vq.parallel import Shards

# k-means++ seeds from at most this many points per centroid (a random subset): the D² sampling
# is sequential over k, and Lloyd iterations on the full sample fix what the subset misses.
_SEEDING_POINTS_PER_CENTROID = 8


def generator(seed: int) -> torch.Generator:
    """The CPU generator every random choice of a run seeded with ``seed`` draws from."""
    return torch.Generator().manual_seed(int(seed))


def sample_rows(x: torch.Tensor, count: int, gen: torch.Generator) -> torch.Tensor:
    """``count`` distinct rows of ``x`` [n, d] drawn at random, in their order in ``x`` (all
    rows if count >= n): what :meth:`vq.parallel.Shards.sample` draws on one process."""
    if count >= x.shape[0]:
        return x
    perm = torch.randperm(x.shape[0], generator=gen)[:count]
    return x[perm.sort().values.to(x.device)]


def kmeans_plus_plus(x: torch.Tensor | Shards, k: int, gen: torch.Generator) -> torch.Tensor:
    """Greedy k-means++: at each step draw ``2 + log k`` candidates by D² sampling and keep the
    one that lowers the potential most (as scikit-learn does); seeds from a random pool of at
    most ``8 k`` training vectors. On CPU the sampling and the choice run in numba; the inner
    products of pool and candidates are one small GEMM per step everywhere.

    Args:
        x: float Tensor[n, d] (this process's data) or :class:`vq.parallel.Shards`: then the
            pool is drawn from the global rows and gathered, and rank 0 seeds from it for
            everyone (the others take its centroids and generator state).
        k: number of centroids; gen: the run's generator (advanced).

    Returns:
        float32 Tensor[k, d], on x's device.
    """
    shards = x if isinstance(x, Shards) else Shards.whole(x)
    pool = shards.sample(max(k * _SEEDING_POINTS_PER_CENTROID, 4096), gen).float().contiguous()
    if not shards.distributed:
        return _seed_from_pool(pool, k, gen)
    # the seeding is sequential: rank 0 runs it, the others take its centroids and generator
    # state (rather than repeat the work on the same cores)
    if shards.is_root:
        centroids = _seed_from_pool(pool, k, gen)
    else:
        centroids = pool.new_empty((k, pool.shape[1]))
    gen.set_state(shards.broadcast(gen.get_state()))
    return shards.broadcast(centroids)


def _seed_from_pool(pool: torch.Tensor, k: int, gen: torch.Generator) -> torch.Tensor:
    """The k-means++ loop of :func:`kmeans_plus_plus` on float32 ``pool`` [n, d]."""
    n = pool.shape[0]
    trials = 2 + int(math.log(k)) if k > 1 else 1
    pool_norms = (pool * pool).sum(dim=1)
    centroids = torch.empty(k, pool.shape[1], device=pool.device)
    first = int(torch.randint(n, (1,), generator=gen))
    centroids[0] = pool[first]
    d2 = (pool_norms - 2.0 * (pool @ centroids[0]) + pool_norms[first]).clamp_min(0.0)
    uniforms = torch.rand(k, trials, generator=gen, dtype=torch.float64).sort(dim=1).values
    if _cpu.fast_path(pool):
        # numpy's skinny [n, d] x [d, trials] product is about twice as fast as torch's here
        pool_np, d2_np, norms_np = pool.numpy(), d2.numpy(), pool_norms.numpy()
        centroids_np, uniforms_np = centroids.numpy(), uniforms.numpy()
        cand = np.empty(trials, dtype=np.int64)
        for i in range(1, k):
            kernels.kmeanspp_sample(d2_np, uniforms_np[i], cand)
            c = pool_np[cand]
            best = kernels.kmeanspp_pick(pool_np @ c.T, norms_np, norms_np[cand], d2_np)
            centroids_np[i] = c[best]
        return centroids
    uniforms = uniforms.to(pool.device)
    for i in range(1, k):
        cdf = torch.cumsum(d2.double(), dim=0)
        if float(cdf[-1]) <= 0.0:  # every point sits on a centroid: draw uniformly
            cand = (uniforms[i] * n).long().clamp_max(n - 1)
        else:
            cand = torch.searchsorted(cdf, uniforms[i] * cdf[-1], right=True).clamp_max(n - 1)
        c = pool[cand]  # [trials, d]
        cand_d2 = (pool_norms[:, None] - 2.0 * (pool @ c.T) + pool_norms[cand]).clamp_min(0.0)
        cand_d2 = torch.minimum(d2[:, None], cand_d2)
        best = int(torch.argmin(cand_d2.double().sum(dim=0)))
        centroids[i] = c[best]
        d2 = cand_d2[:, best].contiguous()
    return centroids
