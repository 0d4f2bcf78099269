"""The public entry points: :func:`kmeans`, :func:`lbg` and their :class:`KMeansResult`.

Both check their input, subsample the training rows, start (random rows or k-means++ seeding;
LBG: the mean, then splitting rounds) and run :func:`vq.clustering.lloyd.lloyd`, with a progress
bar and checkpoints (:class:`vq.parallel.TrainingRun`) observing every iteration; then they assign
every input vector to its centroid (:func:`_finish`).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import Any, Literal

import torch
from tqdm.auto import tqdm

from vq._checks import as_vectors, check_flag, check_int, check_training_size, like_input
from vq.clustering.lloyd import Observer, accumulate, lloyd
from vq.clustering.seeding import generator, kmeans_plus_plus
from vq.distances import nearest, unit_rows
from vq.parallel import Shards, TrainingRun, checkpoint_path


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


def _advance(progress: tqdm | None, centroids: torch.Tensor, total: float) -> None:
    if progress is not None:
        progress.update(1)
        progress.set_postfix(k=centroids.shape[0], objective=f"{total:.6g}")


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
    spherical: bool = False,
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
        init: "random" (k distinct training vectors, as faiss starts) or "k-means++"
            (greedy D² sampling, k sequential steps: a better start when there are few
            iterations; docs/perf/clustering.md compares the two).
        seed: seeds every random choice; the same seed gives the same centroids.
        max_points_per_centroid: train on a random subset of ``k * max_points_per_centroid``
            vectors when there are more (faiss's subsampling); assignments still cover all of x.
        spherical: unit-norm centroids (faiss's ``spherical``): the start and every update
            scaled to L2 norm 1. Assignments stay nearest-by-L2, which for unit-norm rows is
            the largest inner product (cosine): the partition for normalised embeddings.
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
    spherical = check_flag(spherical, "spherical")
    path, every = checkpoint_path("kmeans", checkpoint, checkpoint_every)
    gen = generator(seed)
    train = data.subsample(k * max_points_per_centroid, gen)
    settings = {
        "k": k,
        "niter": niter,
        "init": init,
        "seed": seed,
        "max_points_per_centroid": max_points_per_centroid,
        **({"spherical": True} if spherical else {}),
    }
    run = TrainingRun("kmeans", settings, train, niter, gen, path, every)
    centroids = run.restore()
    if centroids is None:
        if init == "random":
            centroids = train.sample(k, gen).float().clone()
        else:
            centroids = kmeans_plus_plus(train, k, gen)
        centroids = unit_rows(centroids) if spherical else centroids
    quiet = not verbose or not data.is_root
    with tqdm(
        total=niter, initial=run.step, desc=f"k-means k={k}", disable=quiet, leave=False
    ) as bar:
        after = _observer(run, bar)
        centroids = lloyd(train, centroids, niter - run.step, gen, after, spherical)
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
    gen = generator(seed)
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
            centroids = lloyd(train, centroids, niter - run.step % niter, gen, after)
        while centroids.shape[0] < k:
            centroids = _split_worst(train, centroids, k, epsilon, gen)
            centroids = lloyd(train, centroids, niter, gen, after)
    return _finish(x_in, data, centroids, run.objective)


def _split_worst(
    train: Shards, centroids: torch.Tensor, k: int, epsilon: float, gen: torch.Generator
) -> torch.Tensor:
    """One LBG round's split: the ``min(size, k - size)`` cells of highest distortion become
    ``c + δ`` (in place) and ``c - δ`` (appended)."""
    size, d = centroids.shape
    _, counts, errors, _ = accumulate(train.local, centroids)
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
