"""Exact nearest neighbours (the ground truth of a benchmark) and the recall of a search
measured against them.

:func:`ground_truth` is a brute-force search by blocks of matrix products, so that a database
larger than memory (a memmapped ``.fvecs``/``.bvecs`` file) is read once; it returns what faiss's
``IndexFlatL2``/``IndexFlatIP`` return, ties ordered by lower id. :func:`recall_at` is
ann-benchmarks' r-recall@r.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch

from vq._checks import as_tensor, as_vectors, check_positive


class GroundTruth(NamedTuple):
    """Result of :func:`ground_truth`; unpacks as ``D, I = ground_truth(...)``."""

    distances: np.ndarray  # float32 [nq, k]
    ids: np.ndarray  # int64 [nq, k]


def ground_truth(
    xb: Any,
    xq: Any,
    k: int,
    metric: str = "l2",
    batch_size: int = 1024,
    db_batch_size: int = 16384,
) -> GroundTruth:
    """Exact k nearest neighbours of each query by brute force (faiss ``IndexFlatL2`` /
    ``IndexFlatIP`` results).

    The database is read once, ``db_batch_size`` rows at a time (so ``xb`` may be a memmap larger
    than memory), and scored against ``batch_size`` queries at a time by one matrix product: the
    score block holds ``batch_size × db_batch_size`` float32 (64 MiB by default). Runs on the
    device of ``xq`` or ``xb`` when either is a CUDA tensor, else on CPU.

    Args:
        xb: database, float or uint8 [n, d], numpy (a memmap is fine) or torch.
        xq: queries, float or uint8 [nq, d], numpy or torch.
        k: neighbours per query (k > n is allowed: the missing ones are padded).
        metric: "l2" (squared Euclidean, ascending) or "ip" (inner product, descending).
        batch_size: queries per score block.
        db_batch_size: database rows per score block.

    Returns:
        :class:`GroundTruth` ``(distances, ids)``: numpy float32 [nq, k] and int64 [nq, k]; equal
        distances are ordered by lower id; columns past n hold id -1 and distance +inf (-inf for
        "ip"), as faiss does.
    """
    if metric not in ("l2", "ip"):
        raise ValueError(f'metric must be "l2" or "ip", got {metric!r}')
    for arg, value in (("k", k), ("batch_size", batch_size), ("db_batch_size", db_batch_size)):
        check_positive(value, arg)
    xb_t = _as_search_vectors(xb, None, "xb")
    xq_t = _as_search_vectors(xq, xb_t.shape[1], "xq")
    device = next((t.device for t in (xq_t, xb_t) if t.device.type != "cpu"), torch.device("cpu"))
    xq_t = xq_t.to(device).float()
    n, nq, k = xb_t.shape[0], xq_t.shape[0], int(k)
    q_norms = (xq_t * xq_t).sum(dim=1) if metric == "l2" else None

    # running best keys (smaller is better: squared L2, or minus the inner product) and ids
    keys = torch.empty(nq, 0, device=device)
    ids = torch.empty(nq, 0, dtype=torch.int64, device=device)
    with torch.no_grad():
        for b0 in range(0, n, db_batch_size):
            block = xb_t[b0 : b0 + db_batch_size].to(device).float()
            b_norms = (block * block).sum(dim=1) if metric == "l2" else None
            new_keys, new_ids = [], []
            for q0 in range(0, nq, batch_size):
                q = xq_t[q0 : q0 + batch_size]
                if metric == "l2":
                    scores = torch.addmm(b_norms, q, block.T, alpha=-2.0)
                    scores.add_(q_norms[q0 : q0 + batch_size, None]).clamp_min_(0.0)
                else:
                    scores = torch.mm(q, block.T).neg_()
                top_keys, top_rows = _smallest(scores, min(k, block.shape[0]))
                merged_keys = torch.cat([keys[q0 : q0 + batch_size], top_keys], dim=1)
                merged_ids = torch.cat([ids[q0 : q0 + batch_size], top_rows + b0], dim=1)
                # stable: among equal keys the earlier (lower) ids stay first
                order = torch.sort(merged_keys, dim=1, stable=True).indices[:, :k]
                new_keys.append(torch.gather(merged_keys, 1, order))
                new_ids.append(torch.gather(merged_ids, 1, order))
            if nq:
                keys, ids = torch.cat(new_keys), torch.cat(new_ids)

    pad = k - keys.shape[1]
    if pad:
        keys = torch.cat([keys, torch.full((nq, pad), float("inf"), device=device)], dim=1)
        ids = torch.cat([ids, torch.full((nq, pad), -1, dtype=torch.int64, device=device)], dim=1)
    distances = keys if metric == "l2" else keys.neg()
    return GroundTruth(distances.float().cpu().numpy(), ids.cpu().numpy())


def _as_search_vectors(x: Any, dim: int | None, name: str) -> torch.Tensor:
    """Checked [n, dim] vectors in their own dtype: float16/bfloat16/uint8 (.bvecs data) are
    converted to float32 a block at a time, so a huge memmapped database is never copied whole."""
    t = as_tensor(x, name)
    if t.dtype != torch.uint8:
        return as_vectors(t, dim, name, keep_half=True)
    if t.dim() != 2:
        raise ValueError(f"{name}: expected a 2-D array [n, dim], got shape {tuple(t.shape)}")
    if dim is not None and t.shape[1] != dim:
        raise ValueError(f"{name}: expected vectors of dim {dim}, got {t.shape[1]}")
    return t


def _smallest(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k smallest entries of each row of ``scores`` [m, n] and their columns, in ascending
    column order (not value order); among equal values at the cut the lowest columns are kept."""
    if k == scores.shape[1]:
        cols = torch.arange(k, device=scores.device).expand(scores.shape[0], k)
        return scores, cols
    vals, cols = torch.topk(scores, k + 1, dim=1, largest=False, sorted=True)
    # topk may keep any of several values equal to the k-th: where the (k+1)-th equals the k-th
    # it had a choice, so redo those rows with a stable sort (rare outside duplicated data)
    tied = vals[:, k] == vals[:, k - 1]
    cols = cols[:, :k]
    if bool(tied.any()):
        rows = torch.nonzero(tied).flatten()
        cols[rows] = torch.sort(scores[rows], dim=1, stable=True).indices[:, :k]
    cols = torch.sort(cols, dim=1).values
    return torch.gather(scores, 1, cols), cols


def recall_at(found: np.ndarray, truth: np.ndarray, r: int) -> float:
    """r-recall@r: the mean fraction of the true r nearest (``truth[:, :r]``) among the first
    r found (``found[:, :r]``), as ann-benchmarks reports it.

    Args:
        found: int [nq, >= r] ids returned by a search (-1 for missing results).
        truth: int [nq, >= r] exact neighbour ids, e.g. from :func:`ground_truth`.
        r: how many neighbours count.

    Returns:
        The recall, a float in [0, 1].
    """
    found, truth = np.asarray(found), np.asarray(truth)
    for name, a in (("found", found), ("truth", truth)):
        if a.dtype.kind not in "iu":
            raise TypeError(f"{name}: expected integer ids, got {a.dtype}")
    if isinstance(r, bool) or not isinstance(r, int | np.integer):
        raise TypeError(f"r must be an integer, got {r!r}")
    if found.ndim != 2 or truth.ndim != 2 or found.shape[0] != truth.shape[0]:
        raise ValueError(
            f"expected found and truth of shape [nq, k] with the same nq, got {found.shape} "
            f"and {truth.shape}"
        )
    if not 0 < r <= min(found.shape[1], truth.shape[1]):
        raise ValueError(
            f"r must lie in [1, {min(found.shape[1], truth.shape[1])}] (the columns given), got {r}"
        )
    f, t = found[:, :r], truth[:, :r]
    hits = ((f[:, :, None] == t[:, None, :]) & (f[:, :, None] >= 0)).any(axis=2).sum(axis=1)
    return float(hits.mean() / r)
