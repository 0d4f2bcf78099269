"""Spilled inverted lists (SOAR): each vector stored in its nearest list and in one more,
chosen so that the two lists' errors are nearly orthogonal, so that a query whose nearest
lists miss the first copy tends to find the second (fewer probes for the same recall).

For x with primary centroid c₁ and residual r = x - c₁, the second list is

    argmin_{c ≠ c₁}  ||x - c||²  +  λ ⟨r, x - c⟩² / ||r||²

(λ = ``soar_lambda``, 1 by default): the distance to c, plus a penalty on the part of the new
residual parallel to r — the part that made x hard to find from c₁'s direction.

Reference: P. Sun, D. Simcha, D. Dopson, R. Guo, S. Kumar, "SOAR: Improved Indexing for
Approximate Nearest Neighbor Search", NeurIPS 2023 (ScaNN's spilling).

A search over spilled lists may meet a vector twice: it keeps each id's best score
(:func:`unique_top`, the static search's; ``vq.kernels.unique_rows``, the numba path's), over
the best ``2 k`` candidates, which hold the best k distinct ids. IVF-Flat's numba scans keep
each id once as they go instead (both copies hold the same floats, so the second scores as
the first: a row whose id the heap holds is not offered), and look for k rows, not 2 k
(``IVFIndex.scans_distinct_ids``).
"""

from __future__ import annotations

import numpy as np
import torch

from vq import _cpu, kernels
from vq.distances import chunk_rows
from vq.index.core.searchers import INF, top_rows

#: copies of each vector in spilled lists
SPILL_COPIES = 2


def soar_assign(
    x: torch.Tensor, centroids: torch.Tensor, primary: torch.Tensor, soar_lambda: float
) -> torch.Tensor:
    """The spill list of each vector (never its primary).

    Args:
        x: float32 [n, dim]; centroids: float32 [nlist >= 2, dim]; primary: int64 [n], the
            list each vector is in already; soar_lambda: λ >= 0 (0: the second-nearest list).

    Returns:
        int64 [n].
    """
    r = x - centroids.index_select(0, primary)
    r_norm2 = (r * r).sum(1, keepdim=True).clamp_min(1e-30)
    c_norms = (centroids * centroids).sum(1)
    # ||x||² + (||c||² - 2⟨x, c⟩), the latter as the nearest-centroid step computes it
    dist = (x * x).sum(1, keepdim=True) + torch.addmm(c_norms, x, centroids.T, alpha=-2.0)
    parallel = (r * x).sum(1, keepdim=True) - r @ centroids.T  # ⟨r, x - c⟩
    loss = dist + soar_lambda * parallel * parallel / r_norm2
    loss.scatter_(1, primary[:, None], INF)
    return loss.argmin(dim=1)


def spill_lists(
    x: torch.Tensor, centroids: torch.Tensor, primary: torch.Tensor, soar_lambda: float
) -> torch.Tensor:
    """:func:`soar_assign` as an ``add`` runs it: :func:`vq.distances.chunk_rows` rows at a
    time, so that its [rows, nlist] products stay small (4 MiB each up to 4,096 lists, 64 MiB
    at 65,536; the whole batch at once held several [batch, nlist] temporaries: 4 GiB each at
    nlist 65,536). On the CPU the products are BLAS calls into reused buffers and one numba
    pass (:func:`vq.kernels.spill_argmin_rows`) computes the loss and its arg-min, term for
    term as :func:`soar_assign` does (the same lists).

    Args and returns: as :func:`soar_assign`.
    """
    n, nlist = x.shape[0], centroids.shape[0]
    rows = chunk_rows(nlist, x.device)
    c = centroids.float()
    if not (_cpu.fast_path(x) and x.dtype == torch.float32):
        out = torch.empty(n, dtype=torch.int64, device=x.device)
        for s in range(0, n, rows):
            out[s : s + rows] = soar_assign(x[s : s + rows], c, primary[s : s + rows], soar_lambda)
        return out
    spill = _CpuSpill(c, soar_lambda, min(rows, n))
    out = _cpu.empty((n,), torch.int64)
    for s in range(0, n, rows):
        chunk = x[s : s + rows].contiguous()
        scores = spill.scores(chunk)
        scores += spill.c_norms_t
        spill.spill(chunk, scores, primary[s : s + rows].contiguous(), out[s : s + rows])
    return out


def nearest_and_spill(
    x: torch.Tensor, centroids: torch.Tensor, soar_lambda: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each CPU float32 vector's nearest centroid (squared L2: :func:`vq.distances.nearest`'s
    list, ties to the lowest) and its :func:`soar_assign` spill list, from one product per
    chunk of rows for both: the nearest-centroid scores ``||c||² - 2⟨x, c⟩`` are the first
    term of the spill loss (one product where routing and spilling apart would take three:
    docs/perf/indexes.md).

    Returns:
        (int64 [n], int64 [n]): the lists and the spill lists.
    """
    n, nlist = x.shape[0], centroids.shape[0]
    rows = chunk_rows(nlist, x.device)
    spill = _CpuSpill(centroids.float(), soar_lambda, min(rows, n))
    first, out = _cpu.empty((n,), torch.int64), _cpu.empty((n,), torch.int64)
    best = np.empty(min(rows, n), np.float32)
    for s in range(0, n, rows):
        chunk = x[s : s + rows].contiguous()
        m = chunk.shape[0]
        scores = spill.scores(chunk)
        first_np = first[s : s + m].numpy()  # (the norms added in place, as nearest() does)
        kernels.argmin_rows(scores.numpy(), spill.c_norms, first_np, best[:m], _NONE)
        spill.spill(chunk, scores, first[s : s + m], out[s : s + m])
    return first, out


_NONE = np.zeros(0, np.float32)


class _CpuSpill:
    """The work space of the CPU spill lists: the centroids as the products read them, and
    two [rows, nlist] buffers reused chunk after chunk."""

    def __init__(self, c: torch.Tensor, soar_lambda: float, rows: int):
        self.c, self.c_t = c.contiguous(), c.T
        self.neg2_t = (-2.0 * c).T.contiguous()  # (an exact scaling: the same products x -2)
        self.c_norms_t = (c * c).sum(1)
        self.c_norms = self.c_norms_t.numpy()
        self.lam = np.float32(soar_lambda)
        self._scores = _cpu.empty((rows, c.shape[0]))
        self._rdots = _cpu.empty((rows, c.shape[0]))

    def scores(self, chunk: torch.Tensor) -> torch.Tensor:
        """-2⟨x, c⟩ [m, nlist] (a view of the buffer)."""
        return torch.mm(chunk, self.neg2_t, out=self._scores[: chunk.shape[0]])

    def spill(self, chunk, scores, primary, out) -> None:
        """``out`` [m] ← the spill lists, from ``scores`` = ||c||² - 2⟨x, c⟩ [m, nlist]."""
        r = chunk - self.c.index_select(0, primary)
        kernels.spill_argmin_rows(
            scores.numpy(),
            torch.mm(r, self.c_t, out=self._rdots[: chunk.shape[0]]).numpy(),
            (chunk * chunk).sum(1).numpy(),
            (r * chunk).sum(1).numpy(),
            (r * r).sum(1).clamp_min(1e-30).numpy(),
            primary.numpy(),
            self.lam,
            out.numpy(),
        )


def unique_top(scores: torch.Tensor, k: int, rows: torch.Tensor, id_table: torch.Tensor):
    """:func:`vq.index.core.searchers.top_rows` keeping each id's best candidate only (static
    shapes): the best ``2 k`` candidates, those whose id an earlier one holds set to +inf, the
    best k of them.

    Args:
        scores: float32 [B, C] (+inf padding); rows: int64 [B, C] stored rows (-1 padding);
        id_table: int64 [n_rows], the id of each stored row.

    Returns:
        values float32 [B, min(k, C)] ascending and rows int64 (-1 where +inf).
    """
    val, found = top_rows(scores, SPILL_COPIES * k, rows)
    ident = id_table.index_select(0, found.clamp_min(0).reshape(-1)).reshape(found.shape)
    c = found.shape[1]
    earlier = torch.ones(c, c, device=scores.device).tril(-1)  # [i, j]: j before i
    repeats = ((ident[:, :, None] == ident[:, None, :]).float() * earlier).sum(-1)
    val = torch.where(repeats > 0, INF, val)
    return top_rows(val, k, found)
