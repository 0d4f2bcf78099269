"""What the static-shape searches of every index kind share.

Each index kind that has one writes its search once, as a :class:`Searcher` next to its class
(``FlatSearch`` next to ``FlatIndex``, ``IVFPQSearch`` to ``IVFPQ``, ``HNSWSearch`` to ``HNSW``,
``RefineSearch`` to ``Refine``...; the kinds whose ``exports`` the registry says is true): a
``torch.nn.Module`` whose buffers are the index's constants in fixed shapes (inverted lists
padded to one capacity, with a +inf bias on the padding slots so that padding never wins) and
whose ``search`` uses matrix products, gathers, top-k and elementwise ops only: no shape
computed from data, no ``.item()``, no Python branch on a tensor value. So it runs the same
eagerly, compiled with ``fullgraph=True``, under strict ``torch.export`` and in ONNX Runtime.

The index's torch path (CUDA tensors, ``vq._cpu.torch_only()``, graph capture) runs that module
over its own storage (``copy=False``), a chunk of queries at a time (:func:`search_in_chunks`);
``index.searcher(...)`` gives a snapshot (``copy=True``) that :mod:`vq.export` writes out. The
numba kernels are the CPU engine, tested against it.
"""

from __future__ import annotations

import torch
from torch import nn

INF = float("inf")
_TINY = float(torch.finfo(torch.float32).tiny)
#: search options that do not change the size of a search's temporaries
_NOT_SIZES = ("allowed", "limit")


def kept(t: torch.Tensor, copy: bool) -> torch.Tensor:
    """``t`` detached: a copy (a snapshot that later ``add`` or training do not reach) or the
    tensor itself (the torch path, over the index's storage)."""
    return t.detach().clone() if copy else t.detach()


class Searcher(nn.Module):
    """Base of the static searches: queries float32 [B, dim] → distances float32 [B, k] and ids
    int64 [B, k], as :meth:`vq.index.Index.search` returns them (squared L2 ascending or inner
    products descending; id -1 with +inf, -inf for "ip", where fewer than k results exist).

    ``forward(queries)`` searches with the options fixed at construction (``k``, ``nprobe``,
    ``k_factor``: what an exported graph bakes in), queries scaled to unit norm first where
    the index normalises them (metric "cosine", ``"L2norm,"``: :meth:`prepared`, part of the
    graph); ``search(queries, k, **options)`` takes them per call, as they are (the index's
    torch path, which has scaled them).

    Attributes:
        k, metric, dim, ntotal, normalize: those of the index.

    Buffers:
        id_table: int64 [ntotal], the id of every stored row (absent while the ids are the row
        numbers, or where a wrapped searcher maps them).
    """

    def __init__(self, index, k: int | None, copy: bool, ids: bool = True):
        super().__init__()
        self.k = index.k if k is None else int(k)
        self.metric, self.dim, self.ntotal = index.metric, index.dim, index.ntotal
        self.normalize = index.normalize
        self.sequential = not ids or index.has_sequential_ids()
        if not self.sequential:
            self.register_buffer("id_table", kept(index.stored_ids(), copy))

    def forward(self, queries: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.search(self.prepared(queries), self.k)

    def prepared(self, queries: torch.Tensor) -> torch.Tensor:
        """float32 queries [B, dim] as ``search`` takes them: scaled to unit norm where the
        index normalises (static shapes: a sum of squares, its power 0.5 held above float32's
        least normal number, a division; a zero query stays zero), else as they are."""
        if not self.normalize:
            return queries
        norms = ((queries * queries).sum(dim=-1, keepdim=True) ** 0.5).clamp_min(_TINY)
        return queries / norms

    def search(self, queries: torch.Tensor, k: int, **options):
        """Distances float32 [B, k] and ids int64 [B, k] of queries float32 [B, dim]. Every
        search takes ``allowed``: bool [ntotal] (stored rows, in storage order), False for
        rows a filtered search skips (default None: all)."""
        raise NotImplementedError

    def chunk_rows(self, k: int, **options) -> int:
        """Queries per ``search`` call that keep its temporaries to some hundred MiB (the
        torch path's chunks)."""
        raise NotImplementedError

    @staticmethod
    def row_bias(allowed: torch.Tensor) -> torch.Tensor:
        """float32 [ntotal]: 0 for the stored rows ``allowed`` (bool [ntotal]) keeps, +inf for
        those a filtered search skips (added to their scores: they never win)."""
        return torch.where(allowed, 0.0, INF)

    def exhaustive(self, queries, k: int, x: torch.Tensor, norms: torch.Tensor, allowed=None):
        """Every stored row scored exactly: float32 vectors ``x`` [ntotal, dim] (their squared
        norms ``norms`` [ntotal] ranking L2 as ``||x||² - 2⟨q, x⟩``, ``||q||²`` added to the k
        kept), ``allowed`` bool [ntotal] or None; search results (Flat, and the SQ kinds on
        their decoded codes)."""
        if self.metric == "ip":
            scores = -(queries @ x.T)
        else:
            scores = torch.addmm(norms, queries, x.T, alpha=-2.0)
        if allowed is not None:
            scores = scores + self.row_bias(allowed)
        val, rows = top_rows(scores, k)
        if self.metric == "l2":
            val = (val + (queries * queries).sum(dim=1, keepdim=True)).clamp_min(0.0)
        return self.results(val, rows, k)

    def results(self, val: torch.Tensor, rows: torch.Tensor, k: int):
        """Candidates best first → search results (:func:`to_results` with this search's
        metric and id table)."""
        table = None if self.sequential else self.id_table
        return to_results(val, rows, k, self.metric, table)


def to_results(val, rows, k: int, metric: str, id_table: torch.Tensor | None = None):
    """Candidates best first → search results: rows mapped to ids, padded to k. The one torch
    implementation (static shapes), used by every search graph and by the index's own results
    off the CPU; on CPU, ``Index._finish`` runs its numba twin, ``vq.kernels.rows_to_ids``.

    Args:
        val: float32 [B, kk], smaller is nearer (negated inner products for "ip"), +inf where
            there is no candidate; rows: int64 [B, kk], -1 there; kk <= k.
        metric: "l2" or "ip"; id_table: int64 [ntotal], the id of each row, or None where the
            ids are the rows.

    Returns:
        distances float32 [B, k] (negated back for "ip") and ids int64 [B, k], padded with
        +inf (-inf for "ip") and -1.
    """
    if id_table is None:
        ids = rows
    else:
        found = id_table.index_select(0, rows.clamp_min(0).reshape(-1))
        ids = torch.where(rows < 0, -1, found.reshape(rows.shape))
    dist = -val if metric == "ip" else val
    pad = k - dist.shape[1]
    if pad <= 0:
        return dist, ids
    fill = INF if metric == "l2" else -INF
    dist = torch.cat([dist, dist.new_full((dist.shape[0], pad), fill)], dim=1)
    ids = torch.cat([ids, ids.new_full((ids.shape[0], pad), -1)], dim=1)
    return dist, ids


def top_rows(scores: torch.Tensor, k: int, rows: torch.Tensor | None = None):
    """The ``k`` smallest candidate scores and their rows.

    Args:
        scores: float32 [B, C], +inf for padding; k: how many to keep (at most C are).
        rows: int64 [B, C], the stored row of each candidate (-1 for padding), or None when
            candidate c is row c.

    Returns:
        values float32 [B, min(k, C)], ascending, and rows int64 (-1 where the value is +inf).
    """
    val, pos = torch.topk(scores, min(k, scores.shape[1]), dim=1, largest=False, sorted=True)
    found = pos if rows is None else rows.gather(1, pos)
    return val, torch.where(torch.isinf(val), -1, found)


def search_in_chunks(searcher: Searcher, queries: torch.Tensor, k: int, **options):
    """``searcher.search(queries, k, **options)`` a chunk of queries at a time (bounded
    temporary memory: see ``Searcher.chunk_rows``)."""
    rows = searcher.chunk_rows(k, **{n: v for n, v in options.items() if n not in _NOT_SIZES})
    if queries.shape[0] <= rows:
        return searcher.search(queries, k, **options)
    parts = [
        searcher.search(queries[s : s + rows], k, **options)
        for s in range(0, queries.shape[0], rows)
    ]
    return torch.cat([d for d, _ in parts]), torch.cat([i for _, i in parts])
