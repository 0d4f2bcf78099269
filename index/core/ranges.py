"""Range search (faiss ``range_search``): every stored vector within ``radius`` of each query —
squared L2 distance below it, or inner product above it — as faiss returns them: ``lims``
int64 [nq + 1] and, for query i at ``lims[i]:lims[i + 1]``, distances ``D`` float32 and ids
``I`` int64.

The index kinds find the hits with numba kernels (:mod:`vq.kernels.exact.range_scans`), a block of
queries at a time, each block's hits kept compact (:class:`Hits`: 12 bytes a hit, the count of
each query rather than a query number per hit); :func:`range_search` checks the input and copies
the blocks' hits into the result, dropping each block once copied. Memory: at most twice the
result (12 bytes a hit: the blocks' hits, then the result they are copied into) plus one
block — :data:`RANGE_SLOTS` candidate slots of 12 bytes, or a single query's probed rows where
it has more — and its copy's temporaries; spilled IVF lists keep each id's nearer copy
within the block (a query's hits are all in one block).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
import torch

from vq._checks import MAX_NORM, check_vectors, like_input
from vq.index.core.filters import IdFilter
from vq.index.core.searching import one_query_as_rows, query_rows

#: candidate slots per kernel call (bounds a block's temporary memory: 12 bytes each)
RANGE_SLOTS = 1 << 22


def check_radius(radius: Any) -> float:
    """The radius as a float: a finite real number (a NaN or an infinity is refused)."""
    if isinstance(radius, bool) or not isinstance(radius, int | float | np.floating | np.integer):
        raise TypeError(f"radius must be a number, got {type(radius).__name__}")
    if not math.isfinite(float(radius)):
        raise ValueError(f"radius must be a finite number, got {radius}")
    return float(radius)


class Hits(NamedTuple):
    """The hits of one kernel call: query ``first + j`` has ``counts[j]`` hits, those of each
    query next to each other, in query order, in ``rows`` (stored rows, int64) and ``values``
    (float32, ranked as the scans rank them: squared L2, or negated inner products). A query's
    hits may be spread over several calls (a Flat index's blocks of vectors)."""

    first: int
    counts: np.ndarray
    rows: np.ndarray
    values: np.ndarray


def range_search(index, queries: Any, radius: Any, allowed: Any, params: dict):
    """``index.range_search(queries, radius, allowed=..., **params)`` (see
    :meth:`vq.index.Index.range_search`)."""
    radius = check_radius(radius)
    index._require_trained("range_search")
    if params:
        unknown = sorted(set(params) - set(index.search_options()))
        if unknown:
            raise TypeError(f"range_search() got an unexpected keyword argument {unknown[0]!r}")
    queries = one_query_as_rows(queries)
    q = check_vectors(queries, index.dim, "queries", max_norm=MAX_NORM)
    q = query_rows(q, torch.device("cpu"), index.normalize)
    f = IdFilter.of(allowed)
    nq = q.shape[0]
    with index.lock.read(), torch.no_grad():
        parts = [] if index.ntotal == 0 else index.range_hits(q, radius, f, **params)
        stored = None if index.has_sequential_ids() else index.stored_ids().cpu().numpy()
        lims, dist, ids = assemble(parts, nq, stored, index.metric == "ip")
    out = (torch.from_numpy(t) for t in (lims, dist, ids))
    return tuple(like_input(t, queries) for t in out)


def assemble(parts: list, nq: int, stored: np.ndarray | None, inner_product: bool) -> tuple:
    """The hits of ``parts`` (a list of :class:`Hits`, emptied as it is read) as faiss returns
    them: ``lims`` int64 [nq + 1], distances float32 and ids int64 (``stored[row]``, or the
    rows themselves where ``stored`` is None) [lims[-1]], query i's at ``lims[i]:lims[i + 1]``
    in the order of the parts. Each part is copied into place and dropped, so that the result
    and the parts not yet copied are all that is held."""
    lims = np.zeros(nq + 1, np.int64)
    for p in parts:
        lims[p.first + 1 : p.first + 1 + p.counts.shape[0]] += p.counts
    np.cumsum(lims, out=lims)
    dist = np.empty(int(lims[-1]), np.float32)
    ids = np.empty(int(lims[-1]), np.int64)
    filled = lims[:-1].copy()  # where each query's next hit goes
    parts.reverse()
    while parts:
        p = parts.pop()
        m = p.counts.shape[0]
        at = filled[p.first : p.first + m]
        dest = np.repeat(at - _starts(p.counts), p.counts) + np.arange(p.rows.shape[0])
        ids[dest] = p.rows if stored is None else stored[p.rows]
        dist[dest] = -p.values if inner_product else p.values
        at += p.counts
        del p, dest
    return lims, dist, ids


def _starts(counts: np.ndarray) -> np.ndarray:
    """int64 [m]: where each of ``counts`` begins in their concatenation."""
    out = np.zeros(counts.shape[0], np.int64)
    np.cumsum(counts[:-1], out=out[1:])
    return out


def counted(counts, starts, rows, vals, q0: int) -> Hits:
    """One kernel call's hits as :class:`Hits`: query ``q0 + j`` has ``counts[j]`` hits from
    ``starts[j]`` of the flat ``rows``/``vals`` (copied out, compact)."""
    take = np.repeat(starts - _starts(counts), counts) + np.arange(int(counts.sum()))
    return Hits(q0, counts.astype(np.int64, copy=True), rows[take], vals[take])


def by_query(qs: np.ndarray, rows: np.ndarray, values: np.ndarray) -> Hits:
    """:class:`Hits` from a query number per hit (``qs`` int64, ascending)."""
    if qs.shape[0] == 0:
        return Hits(0, np.zeros(0, np.int64), rows, values)
    first = int(qs[0])
    return Hits(first, np.bincount(qs - first).astype(np.int64), rows, values)


def query_numbers(hits: Hits) -> np.ndarray:
    """int64 [hits]: the query of each of ``hits``'s hits."""
    m = hits.counts.shape[0]
    return np.repeat(np.arange(hits.first, hits.first + m, dtype=np.int64), hits.counts)


def nearest_copies(hits: Hits, row_ids: np.ndarray) -> Hits:
    """``hits`` (each query's all in this part) with each query's hits of one id (the two
    copies of a spilled vector: ``row_ids`` int64 [n_rows], the id of each row) cut to the
    nearer one; each query's hits then ordered by id."""
    if hits.rows.shape[0] == 0:
        return hits
    qs, ids = query_numbers(hits), row_ids[hits.rows]
    order = np.lexsort((hits.values, ids, qs))  # by query, id, value: the nearer copy first
    q_o, i_o = qs[order], ids[order]
    first = np.ones(order.shape[0], bool)
    first[1:] = (q_o[1:] != q_o[:-1]) | (i_o[1:] != i_o[:-1])
    order = order[first]
    counts = np.bincount(qs[order] - hits.first, minlength=hits.counts.shape[0])
    return Hits(hits.first, counts.astype(np.int64), hits.rows[order], hits.values[order])


def query_blocks(per_query: np.ndarray):
    """Blocks of consecutive queries whose candidate rows (``per_query`` int64 [nq]) fit in
    RANGE_SLOTS (a query with more is a block alone): ``(s, e, starts, total)``, ``starts``
    int64 [e - s] each query's region in the block's ``total`` slots."""
    s = 0
    while s < per_query.shape[0]:
        e = s + max(1, int(np.searchsorted(np.cumsum(per_query[s:]), RANGE_SLOTS, side="right")))
        starts = np.zeros(e - s, np.int64)
        np.cumsum(per_query[s : e - 1], out=starts[1:])
        yield s, e, starts, int(per_query[s:e].sum())
        s = e


def probed_hits(
    radius: float,
    inner_product: bool,
    lists: np.ndarray,
    sizes: np.ndarray,
    call,
    row_ids: np.ndarray | None = None,
) -> list[Hits]:
    """The hits of a scan of probed lists (``lists`` int64 [nq, nprobe], -1: none; ``sizes``
    int64 [nlist]), a block of queries at a time: ``call(s, e, starts, thresholds, rows,
    values, counts)`` runs the kind's hits kernel on queries s..e; thresholds are on the
    ranked values (the radius, or minus it for inner products). Spilled lists: ``row_ids``
    int64 [n_rows], the id of each row, and each query's nearer copy of a vector is kept
    (:func:`nearest_copies`)."""
    per_query = np.where(lists >= 0, sizes[lists.clip(0)], 0).sum(1)
    parts = []
    for s, e, starts, total in query_blocks(per_query):
        rows, vals = np.empty(total, np.int64), np.empty(total, np.float32)
        counts = np.empty(e - s, np.int64)
        t = np.full(e - s, -radius if inner_product else radius, np.float32)
        call(s, e, starts, t, rows, vals, counts)
        hits = counted(counts, starts, rows, vals, s)
        del rows, vals
        parts.append(hits if row_ids is None else nearest_copies(hits, row_ids))
    return parts
