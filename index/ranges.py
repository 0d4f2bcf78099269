"""Range search (faiss ``range_search``): every stored vector within ``radius`` of each query —
squared L2 distance below it, or inner product above it — as faiss returns them: ``lims``
int64 [nq + 1] and, for query i at ``lims[i]:lims[i + 1]``, distances ``D`` float32 and ids
``I`` int64.

The index kinds find the hits with numba kernels (:mod:`vq.kernels.ranges`), a block of
queries at a time so that memory stays bounded by the block's candidates and the hits;
:func:`range_search` checks the input and puts the blocks' hits together.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from vq._checks import check_vectors, like_input
from vq.index.filters import IdFilter

#: candidate slots per kernel call (bounds a block's temporary memory: 12 bytes each)
RANGE_SLOTS = 1 << 22


def check_radius(radius: Any) -> float:
    """The radius as a float: a finite real number (a NaN or an infinity is refused)."""
    if isinstance(radius, bool) or not isinstance(radius, int | float | np.floating | np.integer):
        raise TypeError(f"radius must be a number, got {type(radius).__name__}")
    if not math.isfinite(float(radius)):
        raise ValueError(f"radius must be a finite number, got {radius}")
    return float(radius)


def range_search(index, queries: Any, radius: Any, allowed: Any, params: dict):
    """``index.range_search(queries, radius, allowed=..., **params)`` (see
    :meth:`vq.index.Index.range_search`)."""
    radius = check_radius(radius)
    index._require_trained("range_search")
    if params:
        unknown = sorted(set(params) - set(index.search_options()))
        if unknown:
            raise TypeError(f"range_search() got an unexpected keyword argument {unknown[0]!r}")
    q = check_vectors(queries, index.dim, "queries").float().cpu().contiguous()
    f = IdFilter.of(allowed)
    nq = q.shape[0]
    with index._lock.read(), torch.no_grad():
        if index.ntotal == 0:
            parts = []
        else:
            parts = index._range_hits(q, radius, f, **params)
        qs, rows, vals = join(parts)
        stored = index.stored_ids().cpu().numpy()
    ids = stored[rows] if rows.size else rows
    if stored.shape[0] > index.ntotal:  # spilled: a vector's two copies may both hit
        order = np.lexsort((vals, ids, qs))  # by query, id, value: the nearer copy first
        q_o, i_o = qs[order], ids[order]
        first = np.ones(order.shape[0], bool)
        first[1:] = (q_o[1:] != q_o[:-1]) | (i_o[1:] != i_o[:-1])
        order = order[first]
    else:
        order = np.argsort(qs, kind="stable")
    lims = np.zeros(nq + 1, np.int64)
    np.cumsum(np.bincount(qs[order], minlength=nq), out=lims[1:])
    dist = -vals[order] if index.metric == "ip" else vals[order]
    ids = ids[order]
    out = (torch.from_numpy(t) for t in (lims, np.ascontiguousarray(dist), ids))
    return tuple(like_input(t, queries) for t in out)


def join(parts: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The hits of several kernel calls, ``(queries, rows, values)`` each, concatenated."""
    if not parts:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32)
    return tuple(np.concatenate([p[i] for p in parts]) for i in range(3))


def counted(counts, starts, rows, vals, q0: int) -> tuple:
    """One kernel call's hits as ``(queries, rows, values)``: query ``q0 + j`` has
    ``counts[j]`` hits from ``starts[j]`` of the flat ``rows``/``vals``."""
    before = np.zeros_like(counts)
    np.cumsum(counts[:-1], out=before[1:])
    take = np.repeat(starts - before, counts) + np.arange(int(counts.sum()))
    return np.repeat(np.arange(q0, q0 + counts.shape[0]), counts), rows[take], vals[take]


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


def probed_hits(radius: float, inner_product: bool, lists: np.ndarray, sizes: np.ndarray, call):
    """The hits of a scan of probed lists (``lists`` int64 [nq, nprobe], -1: none; ``sizes``
    int64 [nlist]), a block of queries at a time: ``call(s, e, starts, thresholds, rows,
    values, counts)`` runs the kind's hits kernel on queries s..e; thresholds are on the
    ranked values (the radius, or minus it for inner products)."""
    per_query = np.where(lists >= 0, sizes[lists.clip(0)], 0).sum(1)
    parts = []
    for s, e, starts, total in query_blocks(per_query):
        rows, vals = np.empty(total, np.int64), np.empty(total, np.float32)
        counts = np.empty(e - s, np.int64)
        t = np.full(e - s, -radius if inner_product else radius, np.float32)
        call(s, e, starts, t, rows, vals, counts)
        parts.append(counted(counts, starts, rows, vals, s))
    return parts
