"""k-means initialisation of a learning layer's codebooks, per codebook, on its first batch.

:func:`kmeans_init` runs :func:`vq.kmeans` (random seeding: see ``_kmeans_rows``) on the rows of
each codebook's slice; under torch.distributed on every process's rows, rank 0 training and
broadcasting. :func:`kmeans_init_op` wraps it as an opaque custom op (``vq::kmeans_init``), so
that a compiled training step calls it as it is inside ``torch.cond`` (see
:meth:`vq.quantizers.learning.CodebookLearner.initialize`).
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

from vq.clustering import kmeans
from vq.parallel import sync, use_group


def kmeans_init(
    x: torch.Tensor, weight: torch.Tensor, k: int, niter: int, cosine: bool, synced: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """k-means centroids of the rows of ``x`` whose weight is positive, per group.

    Args:
        x: float32 Tensor[G, n, d]; weight: float Tensor[n].
        k: centroids per group; niter: Lloyd iterations; cosine: cluster unit vectors.
        synced: use every process's rows; rank 0 trains and broadcasts.

    Returns:
        ``(centroids, counts)``: float32 Tensor[G, k, d] and the cluster sizes [G, k].
    """
    if synced:
        x, weight = sync.gather_rows(x, weight)
    centroids = x.new_zeros(x.shape[0], k, x.shape[2])
    counts = x.new_zeros(x.shape[0], k)
    # drawn on every process (keeps their generators in step); torch.manual_seed fixes it
    seed = int(torch.randint(1 << 30, ()))
    if not synced or sync.rank() == 0:
        rows = x[:, weight > 0]
        for g in range(x.shape[0]):
            centroids[g], counts[g] = _kmeans_rows(rows[g], k, niter, seed + g, cosine)
    if synced:
        sync.broadcast_(centroids)
        sync.broadcast_(counts)
    return centroids, counts


def _kmeans_rows(rows: torch.Tensor, k: int, niter: int, seed: int, cosine: bool):
    if rows.shape[0] == 0:
        raise ValueError(
            "k-means initialisation got no vectors (every position of the first training batch "
            "is masked); give a batch with unmasked vectors first, or call fit(x)"
        )
    if cosine:
        rows = F.normalize(rows, dim=-1)
    if rows.shape[0] < k:
        warnings.warn(
            f"k-means initialisation got {rows.shape[0]} vectors for {k} codes: the missing "
            "codes start as noisy copies of them (dead-code restart spreads them later); a "
            "larger first batch, or fit(x), gives a better start",
            RuntimeWarning,
            stacklevel=2,
        )
        gen = torch.Generator().manual_seed(seed)
        pick = torch.randint(rows.shape[0], (k - rows.shape[0],), generator=gen).to(rows.device)
        spread = rows.std(dim=0, keepdim=True).nan_to_num(0.0) * 0.01 + 1e-6
        noise = torch.randn(k - rows.shape[0], rows.shape[1], generator=gen).to(rows.device)
        centroids = torch.cat([rows, rows[pick] + noise * spread])
        counts = torch.ones(k, device=rows.device)
    else:
        # random seeding, as EnCodec does: on a first batch with few vectors per code (and
        # encoder outputs that are still nearly isotropic), k-means++ seeds singleton clusters
        # on outliers and leaves one centroid near the mean holding most vectors — a lower
        # k-means objective on that batch, but a collapsed codebook
        with use_group(None), warnings.catch_warnings():  # our own syncing: every
            # process's rows are already here; empty clusters are dead codes, restarted later
            warnings.filterwarnings("ignore", ".* clusters are empty", RuntimeWarning)
            result = kmeans(rows, k, niter=niter, init="random", seed=seed)
        centroids = result.centroids
        counts = torch.bincount(result.assignments, minlength=k).float()
    if cosine:
        centroids = F.normalize(centroids, dim=-1)
    return centroids, counts


@torch.library.custom_op("vq::kmeans_init", mutates_args=())
def kmeans_init_op(
    x: torch.Tensor, weight: torch.Tensor, k: int, niter: int, cosine: bool, synced: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    centroids, counts = kmeans_init(x, weight, k, niter, cosine, synced)
    return centroids, counts


@kmeans_init_op.register_fake
def _(x, weight, k, niter, cosine, synced):
    return x.new_empty(x.shape[0], k, x.shape[2]), x.new_empty(x.shape[0], k)
