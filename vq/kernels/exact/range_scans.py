"""Range search: every stored row nearer than a threshold, rather than the k nearest (faiss
``range_search``). The number of results is not known in advance, so each kernel writes a
query's hits into a region of its own of the output — as many slots as the query has
candidates in the call — and their count; the caller chunks the work so that the regions stay
bounded, and concatenates the counted parts.

Values are ranked as the top-k scans rank them (smaller is nearer: squared L2, or negated
inner products); a row is a hit when its value is strictly below the query's threshold. Threads
split the queries.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from vq.kernels.common.constants import metric
from vq.kernels.common.simd import borrow
from vq.kernels.common.threads import parallel_for
from vq.kernels.exact.exact_scans import exact_distance
from vq.kernels.jit.cache import kernel
from vq.kernels.sq.sq_scans import BLOCK, block_distances, sq_kind, sq_prepare

_NO_CENTROID = np.zeros(0, np.float32)


def flat_range_block(scores, x_norms, first, allowed, inner_product, hits):
    """The hits of a block of a Flat search: scores float32 [nq, b] (⟨q, x⟩ of vectors
    ``first .. first + b``), x_norms float32 [b] (l2), allowed uint8 [b] or [0], and ``hits``
    (a :class:`~vq.kernels.common.bundles.RangeHits` whose regions hold b slots each:
    ``starts[q] = q b``) whose thresholds are on ``‖x‖² − 2⟨q, x⟩`` (l2: the radius minus
    ‖q‖²) or on ``−⟨q, x⟩`` (ip); the values written are those ranked values."""
    args = (scores, x_norms, int(first), allowed, metric(inner_product), hits)
    parallel_for(flat_range_rows, scores.shape[0], *args)


@kernel(nogil=True, fastmath=True)
def flat_range_rows(q0, q1, scores, x_norms, first, allowed, inner_product, hits):
    """:func:`flat_range_block` for queries ``q0..q1`` on the calling thread."""
    scores, hits = borrow(scores), borrow(hits)
    starts, thresholds, out_rows, out_dist, counts = hits
    filtered = allowed.shape[0] > 0
    for q in range(q0, q1):
        t = thresholds[q]
        c = starts[q]
        for i in range(scores.shape[1]):
            s = scores[q, i]
            d = -s if inner_product else x_norms[i] - np.float32(2.0) * s
            if d < t and (not filtered or allowed[i] != 0):
                out_rows[c] = first + i
                out_dist[c] = d
                c += 1
        counts[q] = c - starts[q]


def ivf_flat_range_search(queries, vectors, offsets, probes, allowed, inner_product, hits):
    """The hits of an IVF-Flat search: exact values of the rows of the probed lists
    (``probes`` int64 [nq, nprobe], -1: skip; ``vectors`` float32 [n, d] list after list, CSR
    ``offsets``) below the thresholds of ``hits`` (squared L2, or negated inner products; a
    :class:`~vq.kernels.common.bundles.RangeHits` with room for every row a query probes), of
    those ``allowed`` uint8 [n] (or [0]) lets through."""
    parallel_for(
        ivf_flat_range_rows,
        probes.shape[0],
        queries,
        vectors,
        offsets,
        probes,
        allowed,
        metric(inner_product),
        hits,
    )


@kernel(nogil=True, fastmath=True)
def ivf_flat_range_rows(q0, q1, queries, vectors, offsets, probes, allowed, inner_product, hits):
    """:func:`ivf_flat_range_search` for queries ``q0..q1`` on the calling thread."""
    queries, hits = borrow(queries), borrow(hits)
    lists = (vectors, offsets, probes, allowed)
    if inner_product:  # the metric a constant in each copy (see exact_distance)
        _flat_hits(q0, q1, queries, lists, True, hits)
    else:
        _flat_hits(q0, q1, queries, lists, False, hits)


@njit(inline="always", fastmath=True)
def _flat_hits(q0, q1, queries, lists, inner_product, hits):
    vectors, offsets, probes, allowed = lists
    starts, thresholds, out_rows, out_dist, counts = hits
    filtered = allowed.shape[0] > 0
    for q in range(q0, q1):
        x = queries[q]
        t = thresholds[q]
        c = starts[q]
        for p in range(probes.shape[1]):
            lst = probes[q, p]
            if lst < 0:
                continue
            for i in range(offsets[lst], offsets[lst + 1]):
                if filtered and allowed[i] == 0:
                    continue
                d = exact_distance(x, vectors, i, inner_product)
                if d < t:
                    out_rows[c] = i
                    out_dist[c] = d
                    c += 1
        counts[q] = c - starts[q]


def sq_hits(queries, lists, kind, probes, allowed, inner_product, hits):
    """Range search (faiss ``range_search`` of ``IndexScalarQuantizer`` /
    ``IndexIVFScalarQuantizer``): the rows of the probed lists whose value (the top-k scans':
    squared L2, or negated inner product) is below their query's threshold, into ``hits`` (a
    :class:`~vq.kernels.common.bundles.RangeHits` with room for every row a query probes).
    ``lists`` (a :class:`~vq.kernels.common.bundles.SQLists`), ``kind``, ``probes`` and
    ``allowed`` are :func:`vq.kernels.sq.sq_scans.sq_ivf_scan`'s; a flat code array is one
    list (offsets [0, n], probes zeros [nq, 1], by_residual False). Threads split the
    queries."""
    parallel_for(
        sq_hits_range,
        queries.shape[0],
        queries,
        lists,
        sq_kind(kind),
        probes,
        allowed,
        metric(inner_product),
        hits,
    )


@kernel(nogil=True, fastmath=True)
def sq_hits_range(q0, q1, queries, lists, kind, probes, allowed, inner_product, hits):
    """:func:`sq_hits` for queries ``q0..q1`` (int64) on the calling thread."""
    queries, lists, hits = borrow(queries), borrow(lists), borrow(hits)
    offsets, _, centroids, by_residual, offset, scale = lists
    # (the outputs as named arrays: numba drops a write through a field of a tuple made here)
    starts, thresholds, out_rows, out_dist, counts = hits
    qa = np.empty(queries.shape[1], dtype=np.float32)
    buf = np.empty(BLOCK, dtype=np.float32)
    for q in range(q0, q1):
        x = queries[q]
        c = starts[q]
        const = np.float32(0.0)
        if not by_residual:
            const = sq_prepare(x, _NO_CENTROID, offset, scale, inner_product, qa)
        for p in range(probes.shape[1]):
            lst = probes[q, p]
            if lst < 0:
                continue
            if by_residual:
                const = sq_prepare(x, centroids[lst], offset, scale, inner_product, qa)
            query = (qa, const, thresholds[q])
            out = (out_rows, out_dist)
            c = _hits_rows(
                lists,
                offsets[lst],
                offsets[lst + 1],
                query,
                kind,
                inner_product,
                allowed,
                out,
                c,
                buf,
            )
        counts[q] = c - starts[q]


@njit(inline="always")
def _hits_rows(lists, r0, r1, query, kind, inner_product, allowed, out, c, buf):
    """Rows ``r0..r1`` of ``lists.codes`` below the prepared query's limit (``query`` = (qa,
    const, limit)) written from slot ``c`` of ``out`` = (rows, values), distances computed
    :data:`BLOCK` rows at a time as the top-k scan does (``kind`` a
    :func:`vq.kernels.sq.sq_scans.sq_kind`); returns the next slot."""
    qa, const, limit = query
    out_rows, out_dist = out
    filtered = allowed.shape[0] > 0
    for s in range(r0, r1, BLOCK):
        e = min(s + BLOCK, r1)
        block_distances(lists.codes, s, e, qa, lists.scale, kind, inner_product, buf)
        for i in range(s, e):
            acc = buf[i - s]
            dist = -(const + acc) if inner_product else acc
            if dist < limit and (not filtered or allowed[i] != 0):
                out_rows[c] = i
                out_dist[c] = dist
                c += 1
    return c
