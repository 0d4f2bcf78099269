"""Codebook training: k-means (Lloyd, faiss-style) and Linde–Buzo–Gray splitting.

One Lloyd loop serves both. Each iteration is one pass over the data (:func:`_accumulate`):
chunked GEMM nearest-centroid search, then per-cluster sums, counts and errors with
``index_add_``. Empty clusters are repaired as faiss does, by splitting a large cluster in two.
All randomness comes from one ``torch.Generator`` seeded on CPU, so a seed fixes the result on
every device.

Under ``torch.distributed`` (see :mod:`vq.distributed`) the data are this process's shard of the
concatenation of every process's rows: subsampling and seeding draw global row numbers from the
same generator on every process, each iteration all-reduces the cluster sums and counts, and the
update (empty-cluster repair included) runs identically everywhere on the reduced values, so a
seed gives the centroids of one process holding all the data. Long runs can checkpoint and resume
(:class:`vq.parallel.TrainingRun`).

References:
    S. Lloyd, "Least squares quantization in PCM", IEEE Trans. IT, 1982.
    D. Arthur, S. Vassilvitskii, "k-means++: the advantages of careful seeding", SODA 2007.
    Y. Linde, A. Buzo, R. Gray, "An algorithm for vector quantizer design", IEEE Trans. Comm., 1980.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from tqdm.auto import tqdm

from vq import _cpu, kernels
from vq._checks import as_vectors, check_int, check_training_size, like_input
from vq.distances import iter_nearest, nearest
from vq.parallel import Shards, TrainingRun, checkpoint_path

# k-means++ seeds from at most this many points per centroid (a random subset): the D² sampling
# is sequential over k, and Lloyd iterations on the full sample fix what the subset misses.
_SEEDING_POINTS_PER_CENTROID = 8
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


@dataclass(frozen=True)
class KMeansResult:
    """What :func:`kmeans` and :func:`lbg` return (numpy for numpy input, torch otherwise).

    Attributes:
        centroids: float32 [k, d].
        assignments: int64 [n], index of the nearest centroid of every input vector.
        objective: float64 [iterations], sum of squared distances of the training sample to the
            centroids at each assignment step (faiss's ``obj``).
        inertia: sum of squared distances of all input vectors to the final centroids.

    Under ``torch.distributed``, ``assignments`` covers this process's vectors and the rest is
    the same on every process (``inertia`` sums over all processes' vectors).
    """

    centroids: Any
    assignments: Any
    objective: Any
    inertia: float


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(int(seed))


def _sample_rows(x: torch.Tensor, count: int, gen: torch.Generator) -> torch.Tensor:
    """``count`` distinct rows of ``x`` drawn at random (all rows, in order, if count >= n)."""
    if count >= x.shape[0]:
        return x
    perm = torch.randperm(x.shape[0], generator=gen)[:count]
    return x[perm.sort().values.to(x.device)]


def _kmeans_plus_plus(x: torch.Tensor | Shards, k: int, gen: torch.Generator) -> torch.Tensor:
    """Greedy k-means++: at each step draw ``2 + log k`` candidates by D² sampling and keep the
    one that lowers the potential most (as scikit-learn does); seeds from a random pool of at
    most ``8 k`` training vectors. On CPU the sampling and the choice run in numba; the inner
    products of pool and candidates are one small GEMM per step everywhere.

    ``x`` is a tensor (this process's data) or :class:`Shards`: then the pool is drawn from the
    global rows and gathered, and rank 0 seeds from it for everyone."""
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
    """The k-means++ loop of :func:`_kmeans_plus_plus` on float32 ``pool`` [n, d]."""
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


def _accumulate(x: torch.Tensor, centroids: torch.Tensor, x_norms: torch.Tensor | None = None):
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


def _split_empty_clusters(
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


#: what a Lloyd loop calls after each iteration: the new centroids and the objective of the
#: assignment step
Observer = Callable[[torch.Tensor, float], None]


def _lloyd(
    x: Shards, centroids: torch.Tensor, niter: int, gen: torch.Generator, after: Observer
) -> torch.Tensor:
    """``niter`` Lloyd iterations on the (possibly distributed) rows ``x``; returns the
    centroids and reports each iteration to ``after``. float32 data with enough centroids for
    the bounds to pay (each search costs k·d per point, the bounds about d) takes
    :func:`_lloyd_bounded`, which gives the same iterations."""
    local = x.local
    if local.dtype == torch.float32 and _cpu.fast_path(local) and local.shape[0] <= _FUSED_MAX_N:
        return _lloyd_fused(x, centroids, niter, gen, after)
    if local.dtype == torch.float32 and _BOUNDED and centroids.shape[0] >= _BOUNDED_MIN_K:
        return _lloyd_bounded(x, centroids, niter, gen, after)
    for _ in range(niter):
        sums, counts, errors, _ = _accumulate(x.local, centroids)
        sums, counts, total = x.all_sum(sums, counts, errors.sum())
        centroids = _update(centroids, sums, counts, gen)
        after(centroids, float(total))
    return centroids


def _lloyd_fused(
    shards: Shards, centroids: torch.Tensor, niter: int, gen: torch.Generator, after: Observer
) -> torch.Tensor:
    """Plain Lloyd on CPU float32 rows, each iteration one matrix product and one kernel
    (:func:`vq.kernels.assign_accumulate`: nearest centroids, cluster sums, counts and errors
    at once): for small jobs, where the per-iteration steps of the general loop, not the
    product, took most of the time. The same assignments as :func:`nearest`.

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
            torch.from_numpy(sums.sum(axis=0)), torch.from_numpy(counts.sum(axis=0)),
            torch.tensor(errors.sum(), dtype=torch.float64), torch.tensor(changed),
        )  # fmt: skip
        new = _update(centroids, sums_t, counts_t, gen)
        after(new, float(total))
        if int(changed_t) == 0 and bool((counts_t > 0).all()):
            for _ in range(it + 1, niter):  # a fixed point: the same centroids every time
                after(new, float(total))
            return new
        centroids = new
    return centroids


def _update(centroids, sums, counts, gen) -> torch.Tensor:
    new = torch.where(counts[:, None] > 0, sums / counts.clamp_min(1.0)[:, None], centroids)
    _split_empty_clusters(new, counts, gen)
    return new


def _advance(progress: tqdm | None, centroids: torch.Tensor, total: float) -> None:
    if progress is not None:
        progress.update(1)
        progress.set_postfix(k=centroids.shape[0], objective=f"{total:.6g}")


def _lloyd_bounded(
    shards: Shards, centroids: torch.Tensor, niter: int, gen: torch.Generator, after: Observer
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
        new = _update(centroids, sums, counts, gen)
        shift = (new - centroids).double().norm(dim=1)
        upper += shift[assign]
        lower -= shift.max()
        centroids = new
        after(centroids, total)
    return centroids


def _finish(x_in, data: Shards, centroids, objective) -> KMeansResult:
    assign = nearest(data.local, centroids)
    k = centroids.shape[0]
    counts, inertia = data.all_sum(
        torch.bincount(assign.indices, minlength=k), assign.distances.double().sum()
    )
    used = int((counts > 0).sum())
    if used < k and data.is_root:
        warnings.warn(
            f"{k - used} of {k} clusters are empty after training: the data probably has fewer "
            "than k distinct vectors",
            RuntimeWarning,
            stacklevel=3,
        )
    return KMeansResult(
        centroids=like_input(centroids, x_in),
        assignments=like_input(assign.indices, x_in),
        objective=like_input(torch.tensor(objective, dtype=torch.float64), x_in),
        inertia=float(inertia),
    )


def _observer(run: TrainingRun, bar: tqdm) -> Observer:
    def after(centroids: torch.Tensor, total: float) -> None:
        run.iteration_done(centroids, total)
        _advance(bar, centroids, total)

    return after


def _check_common(niter: int, max_points_per_centroid: int) -> None:
    check_int(niter, "niter", 0)
    check_int(max_points_per_centroid, "max_points_per_centroid", 1)


def kmeans(
    x: Any,
    k: int,
    *,
    niter: int = 25,
    init: Literal["k-means++", "random"] = "random",
    seed: int = 1234,
    max_points_per_centroid: int = 256,
    verbose: bool = False,
    checkpoint: str | os.PathLike | None = None,
    checkpoint_every: int = 1,
) -> KMeansResult:
    """k-means clustering with Lloyd iterations, as faiss.Kmeans does it.

    Args:
        x: float Tensor or ndarray [n, d] (float16/bfloat16 are accumulated in float32), on any
            device; n >= k. Under ``torch.distributed``: this process's shard (see below).
        k: number of centroids.
        niter: Lloyd iterations.
        init: "random" (k distinct training vectors, as faiss starts: after 20 iterations
            within 0.3% of k-means++'s objective, at 0.6x its time here) or "k-means++"
            (greedy D² sampling: a better start when there are few iterations).
        seed: seeds every random choice; the same seed gives the same centroids.
        max_points_per_centroid: train on a random subset of ``k * max_points_per_centroid``
            vectors when there are more (faiss's subsampling); assignments still cover all of x.
        verbose: show a progress bar with the objective.
        checkpoint: file to save the training state to every ``checkpoint_every`` iterations
            (and after the last one), and to resume from when it exists — after a crash, run the
            same call again; a checkpoint of other settings or data is a ValueError. Default: the
            next file of an enclosing :func:`vq.distributed.checkpoints` block, else none.
        checkpoint_every: iterations between checkpoints.

    Returns:
        :class:`KMeansResult` (numpy for numpy input, tensors on x's device otherwise).

    Distributed: when ``torch.distributed`` is initialised with several processes (or inside
    :func:`vq.distributed.use_group`), every process of the group must call ``kmeans`` with the
    same arguments and its own rows ``x``; they train together on the concatenation of all
    rows in rank order and, for a seed, get the centroids that one process holding all of them
    would get (to float rounding of the summed cluster sums), however the rows are split.

    Raises:
        ValueError: wrong shape, NaN/Inf, empty input, n < k, bad parameters, a checkpoint of
            another run.
        TypeError: non-floating input.
    """
    x_in = x
    x = as_vectors(x, None, "x", keep_half=True)
    data = Shards.of(x)
    check_training_size(data.n, k, "kmeans")
    _check_common(niter, max_points_per_centroid)
    if init not in ("k-means++", "random"):
        raise ValueError(f"init must be 'k-means++' or 'random', got {init!r}")
    path, every = checkpoint_path("kmeans", checkpoint, checkpoint_every)
    gen = _generator(seed)
    train = data.subsample(k * max_points_per_centroid, gen)
    settings = {
        "k": k,
        "niter": niter,
        "init": init,
        "seed": seed,
        "max_points_per_centroid": max_points_per_centroid,
    }
    run = TrainingRun("kmeans", settings, train, niter, gen, path, every)
    centroids = run.restore()
    if centroids is None and init == "random":
        centroids = train.sample(k, gen).float().clone()
    elif centroids is None:
        centroids = _kmeans_plus_plus(train, k, gen)
    quiet = not verbose or not data.is_root
    with tqdm(
        total=niter, initial=run.step, desc=f"k-means k={k}", disable=quiet, leave=False
    ) as bar:
        centroids = _lloyd(train, centroids, niter - run.step, gen, _observer(run, bar))
    return _finish(x_in, data, centroids, run.objective)


def lbg(
    x: Any,
    k: int,
    *,
    epsilon: float = 0.01,
    niter: int = 10,
    seed: int = 1234,
    max_points_per_centroid: int = 256,
    verbose: bool = False,
    checkpoint: str | os.PathLike | None = None,
    checkpoint_every: int = 1,
) -> KMeansResult:
    """Linde–Buzo–Gray codebook design by codeword splitting.

    Starts from the mean of the data; each round splits codewords in two, ``c ± δ`` with
    ``δ = epsilon · σ_cell · g`` (σ_cell the RMS spread of the cell, g a seeded Gaussian
    direction), then runs ``niter`` Lloyd iterations. Every codeword splits while the codebook can
    double; when k is not a power of two the last round splits only the ``k - size`` cells with the
    highest distortion.

    Args:
        x: float Tensor or ndarray [n, d] (float16/bfloat16 accumulated in float32); n >= k.
            Under ``torch.distributed``: this process's shard, as in :func:`kmeans`.
        k: number of codewords.
        epsilon: relative size of the split perturbation (> 0).
        niter: Lloyd iterations after each split.
        seed: seeds the perturbations, the subsampling and empty-cluster repair.
        max_points_per_centroid: subsampling as in :func:`kmeans`.
        verbose: show a progress bar.
        checkpoint, checkpoint_every: periodic checkpoints and resume, as in :func:`kmeans`
            (iterations count over all rounds).

    Returns:
        :class:`KMeansResult`; ``objective`` runs over all Lloyd iterations of all rounds.
    """
    x_in = x
    x = as_vectors(x, None, "x", keep_half=True)
    data = Shards.of(x)
    check_training_size(data.n, k, "lbg")
    _check_common(niter, max_points_per_centroid)
    if not epsilon > 0:
        raise ValueError(f"epsilon must be positive, got {epsilon}")
    path, every = checkpoint_path("lbg", checkpoint, checkpoint_every)
    gen = _generator(seed)
    train = data.subsample(k * max_points_per_centroid, gen)
    rounds = max(0, (k - 1).bit_length())
    settings = {
        "k": k,
        "epsilon": epsilon,
        "niter": niter,
        "seed": seed,
        "max_points_per_centroid": max_points_per_centroid,
    }
    run = TrainingRun("lbg", settings, train, rounds * niter, gen, path, every)
    centroids = run.restore()
    if centroids is None:
        centroids = train.mean()
    quiet = not verbose or not data.is_root
    with tqdm(
        total=rounds * niter, initial=run.step, desc=f"LBG k={k}", disable=quiet, leave=False
    ) as bar:
        after = _observer(run, bar)
        if niter and run.step % niter:  # resumed within a round: finish its iterations
            centroids = _lloyd(train, centroids, niter - run.step % niter, gen, after)
        while centroids.shape[0] < k:
            centroids = _split_worst(train, centroids, k, epsilon, gen)
            centroids = _lloyd(train, centroids, niter, gen, after)
    return _finish(x_in, data, centroids, run.objective)


def _split_worst(
    train: Shards, centroids: torch.Tensor, k: int, epsilon: float, gen: torch.Generator
) -> torch.Tensor:
    """One LBG round's split: the ``min(size, k - size)`` cells of highest distortion become
    ``c + δ`` (in place) and ``c - δ`` (appended)."""
    size, d = centroids.shape
    _, counts, errors, _ = _accumulate(train.local, centroids)
    counts, errors = train.all_sum(counts, errors)
    n_split = min(size, k - size)
    device = centroids.device
    order = torch.argsort(errors, descending=True, stable=True)[:n_split].to(device)
    spread = (errors[order] / (counts[order].double().clamp_min(1.0) * d)).sqrt()
    direction = torch.randn(n_split, d, generator=gen).to(device)
    delta = epsilon * spread.float()[:, None] * direction
    parents = centroids[order]
    centroids = centroids.clone()
    centroids[order] = parents + delta
    # rank 0's bits everywhere (randn may round differently on other CPUs)
    return train.broadcast(torch.cat([centroids, parents - delta]))
