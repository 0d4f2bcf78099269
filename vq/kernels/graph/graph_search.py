"""HNSW search (graph search): greedy descent on the upper levels, then a beam search on level 0
(the steps: :mod:`vq.kernels.graph.graph_walk`), from the queries to their k nearest nodes.

The kernels take the graph as a :class:`~vq.kernels.common.bundles.Graph` and what the
traversal reads as a :class:`~vq.kernels.common.bundles.Walk` (:func:`traversal`): on the
vectors, on int8 codes (the beam then re-ranked on the vectors) or on scalar-quantizer codes.
:func:`vq.kernels.graph.graph_store.node_distance` is the only function that reads the store.

The kernels take the metric as a type (``ip``: :data:`vq.kernels.common.constants.L2` or
``IP``), so a call compiles the code of its own metric only, with the metric a constant in the
loops.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from vq.kernels.common.bundles import BeamSpace, Graph, TopK, Walk
from vq.kernels.common.constants import metric
from vq.kernels.common.heaps import heapify_pair, sort_pair_heap
from vq.kernels.common.simd import borrow, fetch_add
from vq.kernels.common.threads import get_num_threads, parallel_for
from vq.kernels.exact.exact_scans import exact_distance, rows_to_ids
from vq.kernels.exact.lean_scans import all_finite
from vq.kernels.graph.graph_store import (
    node_distance,
    prefetch_node,
    prepare_query,
    reranks,
)
from vq.kernels.graph.graph_walk import beam, descend, keep_nearest
from vq.kernels.jit.cache import kernel
from vq.kernels.sq.sq_scans import sq_kind

#: ``allowed`` of an unfiltered search
NO_FILTER = np.zeros(0, dtype=np.uint8)


@kernel(nogil=True, fastmath=True)
def hnsw_search_range(s0, s1, queries, graph, walk, ip, ef, seen, allowed, out):
    """:func:`hnsw_search` for slices ``s0..s1`` of ``seen``'s rows (slice s: queries ``nq *
    s // slices`` .. of ``slices = seen.shape[0]``, and the visit stamps ``seen[s]``) on the
    calling thread; ``ip`` a :class:`vq.kernels.common.constants.Static`."""
    queries, graph, seen, out = borrow(queries), borrow(graph), borrow(seen), borrow(out)
    walk, allowed = borrow(walk), borrow(allowed)
    nq, slices = out.distances.shape[0], seen.shape[0]
    for s in range(s0, s1):
        q0, q1 = nq * s // slices, nq * (s + 1) // slices
        space = _walk_space(ef, out.distances.shape[1], graph, allowed, seen[s])
        _search_queries(q0, q1, queries, graph, walk, ip, ef, allowed, space, out)


@njit(inline="always")
def _walk_space(ef, k, graph, allowed, seen):
    """One thread's :class:`~vq.kernels.common.bundles.BeamSpace` for :func:`_search_queries`:
    the beam (max(ef, k)), a node's neighbours and their distances, the allowed nodes' heap
    (filtered searches), the visit stamps ``seen``."""
    cap = max(ef, k)
    kept = cap if allowed.shape[0] > 0 else 0
    width = graph.nbr0.shape[1]
    return BeamSpace(
        np.empty(cap, dtype=np.float32),
        np.empty(cap, dtype=np.int64),
        np.empty(width, dtype=np.int64),
        np.empty(width, dtype=np.float32),
        np.empty(kept, dtype=np.float32),
        np.empty(kept, dtype=np.int64),
        seen,
    )


@njit(inline="always", fastmath=True)
def _search_queries(q0, q1, queries, graph, walk, ip, ef, allowed, space, out):
    """hnsw_search_range's queries ``q0..q1`` into rows of ``out``, on ``space``."""
    store, data = walk
    hd, hi, _, _, rd, ri, _ = space
    filtered = allowed.shape[0] > 0
    for q in range(q0, q1):
        x = prepare_query(queries[q], store, ip)
        v, dv = descend(x, store, ip, graph, 0)
        size, rsize = beam(x, store, ip, graph, 0, v, dv, ef, allowed, space)
        if filtered:  # the allowed nodes seen (a heap), not the beam
            size = rsize
            for j in range(size):
                hd[j], hi[j] = rd[j], ri[j]
        if reranks(store):  # the beam's nodes by their exact distances, fetched ahead
            for j in range(size):
                prefetch_node(data, hi[j])
            for j in range(size):
                hd[j] = exact_distance(queries[q], data, hi[j], ip)
        if filtered:  # ascending by distance (a heap's order)
            heapify_pair(hd, hi, size)
            sort_pair_heap(hd, hi, size)
        elif reranks(store):  # the beam's order by estimates: nearly that of the exact distances
            sort_nearly_sorted(hd, hi, size)
        write_row(hd, hi, size, out, q)


@njit(inline="always")
def sort_nearly_sorted(hd, hi, size):
    """Sort the first ``size`` pairs ascending by distance (ties by node), in place, by
    insertion: few moves where the order is nearly right already (a re-ranked beam)."""
    for j in range(1, size):
        d, w = hd[j], hi[j]
        at = j
        while at > 0 and (hd[at - 1] > d or (hd[at - 1] == d and hi[at - 1] > w)):
            hd[at], hi[at] = hd[at - 1], hi[at - 1]
            at -= 1
        hd[at], hi[at] = d, w


@njit(inline="always")
def write_row(hd, hi, size, out, q):
    """Row q of ``out`` := the first k of ``size`` sorted results, padded (+inf, -1)."""
    out_dist, out_idx = out
    for j in range(out_dist.shape[1]):
        if j < size:
            out_dist[q, j], out_idx[q, j] = hd[j], hi[j]
        else:
            out_dist[q, j], out_idx[q, j] = np.inf, -1


@kernel(nogil=True, fastmath=True)
def rows_scan_range(q0, q1, queries, walk, ip, rows, out):
    """:func:`rows_scan` for queries ``q0..q1`` on the calling thread."""
    queries, rows, out = borrow(queries), borrow(rows), borrow(out)
    store, data = borrow(walk)
    k = out.distances.shape[1]
    hd = np.empty(k, dtype=np.float32)
    hi = np.empty(k, dtype=np.int64)
    for q in range(q0, q1):
        x = prepare_query(queries[q], store, ip)
        size = 0
        for r in range(rows.shape[0]):
            w = rows[r]
            if reranks(store):
                d = exact_distance(queries[q], data, w, ip)
            else:
                d = node_distance(x, store, w, ip)
            size = keep_nearest(hd, hi, size, k, d, w)
        sort_pair_heap(hd, hi, size)
        write_row(hd, hi, size, out, q)


def rows_scan(queries, walk, inner_product, rows, out):
    """The ``k`` nearest of the graph's nodes ``rows`` (int64 [m]) for each query, by an exact
    scan (a search under a filter that allows few nodes); arguments as :func:`hnsw_search`'s:
    the distances are exact where the walk's store is the vectors or int8 codes beside them,
    else those of the compressed store (see :func:`hnsw_search`)."""
    parallel_for(rows_scan_range, queries.shape[0], queries, walk, metric(inner_product), rows, out)


def new_seen(slots: int, n: int) -> np.ndarray:
    """Visit stamps for ``slots`` threads over a graph of ``n`` nodes: uint16 [slots, n + 1]."""
    return np.zeros((slots, n + 1), dtype=np.uint16)


def hnsw_search(queries, graph, walk, inner_product, ef, seen, out, allowed=NO_FILTER):
    """The ``k`` nearest nodes of each query by HNSW search; threads split the queries.

    Args:
        queries: float32 [nq, d].
        graph: a :class:`~vq.kernels.common.bundles.Graph` (``entry`` a node of level
            ``max_level``; a non-empty graph).
        walk: a :class:`~vq.kernels.common.bundles.Walk` (:func:`traversal`): the vectors; or
            (int8 [n, d], float32 [n, 2]) codes with a scale per vector
            (:func:`vq.kernels.graph.graph_store.int8_codes`), which the traversal reads,
            and the beam's nodes re-ranked on the vectors; or scalar-quantizer codes
            ``(codes uint8 [n, code_size], offset, scale, kind)`` as :mod:`vq.kernels.sq.sq_scans`
            reads them: the traversal and the distances returned are on the codes (``data``
            float32 [0, d]: no vectors are kept).
        inner_product: rank by negated inner products instead of squared L2 distances.
        ef: efSearch (the beam holds max(ef, k) nodes).
        seen: uint16 [slots, n + 1] visit stamps (:func:`new_seen`), one row per thread,
            owned by this call; at most ``slots`` threads are used.
        out: a :class:`~vq.kernels.common.bundles.TopK` [nq, k]: distances ascending (+inf
            padding), nodes (-1 padding).
        allowed: uint8 [n], 0 for nodes a filtered search must not return (the beam still
            walks them), or [0]: no filter.
    """
    slices = max(1, min(get_num_threads(), seen.shape[0], queries.shape[0]))
    parallel_for(
        hnsw_search_range,
        slices,
        queries,
        graph,
        walk,
        metric(inner_product),
        int(ef),
        seen[:slices],
        allowed,
        out,
    )


@kernel(nogil=True, fastmath=True)
def hnsw_search_lean(queries, graph, walk, ip, ef, seen, ids, claim, chunk, out):
    """A few queries on the calling thread, from the search to ids, in one call (the lean
    path of an HNSW index: one dispatch where a single query's kernel takes a few µs):
    :func:`hnsw_search_range`'s search with ``seen`` [1, n + 1], then
    :func:`vq.kernels.exact.exact_scans.rows_to_ids` (``ids`` int64 [n] or [0], distances
    negated back with ``ip``, a :class:`vq.kernels.common.constants.Static`) into ``out`` =
    (out_dist float32 [nq, k], out_ids int64 [nq, k]). ``graph``, ``walk`` and ``out`` are
    plain tuples (:mod:`vq.kernels.common.bundles`).

    ``claim``: int64 [1], a counter that threads calling this on the same queries share:
    each takes the next ``chunk`` queries not yet taken (:func:`vq.kernels.common.simd.fetch_add`)
    until none is left, so that a thread that starts late or walks slower takes fewer; or
    :data:`vq.kernels.common.simd.NO_CLAIM`: all of them. Returns False if a query it took holds
    a NaN or an infinity (that chunk left undone).

    Compiled with ``fastmath`` as :func:`hnsw_search_range` is: the traversal's code is
    inlined here and takes this kernel's flags."""
    graph, walk = borrow(Graph(*graph)), borrow(Walk(*walk))
    out_dist, out_ids = out
    queries, seen = borrow(queries), borrow(seen)
    nq, k = out_dist.shape
    kk = min(k, graph.nbr0.shape[0])
    found = TopK(np.empty((nq, kk), dtype=np.float32), np.empty((nq, kk), dtype=np.int64))
    no_filter = np.zeros(0, dtype=np.uint8)
    space = _walk_space(ef, kk, graph, no_filter, seen[0])
    fill = np.float32(-np.inf) if ip else np.float32(np.inf)
    claimed = claim.shape[0] > 0
    first = np.int64(0)
    while True:
        if claimed:
            first = fetch_add(claim, chunk)
        if first >= nq:
            return True
        last = min(nq, first + chunk) if claimed else nq
        if not all_finite(queries[first:last]):
            return False
        _search_queries(first, last, queries, graph, walk, ip, ef, no_filter, space, found)
        dist, rows = found.distances[first:last], found.labels[first:last]
        rows_to_ids(dist, rows, ids, ip, fill, out_dist[first:last], out_ids[first:last])
        first = nq  # (unclaimed: all of them done)


def traversal(data, codes) -> Walk:
    """What the traversal of :func:`hnsw_search` reads, from the vectors ``data`` and
    ``codes``: None (the vectors themselves), int8 codes and factors (the nodes then re-ranked
    on ``data``), scalar-quantizer codes ``(codes, offset, scale, kind)``, or RaBitQ codes
    ``(words, factors, transform)`` (:mod:`vq.kernels.graph.graph_store`), beside ``data``."""
    if codes is None:
        return Walk(data, data)
    codes = tuple(codes)
    if len(codes) == 4:
        c, offset, scale, kind = codes
        return Walk((c, offset, scale, sq_kind(kind)), data)
    if len(codes) == 3:  # RaBitQ codes: the beam reads the vectors where the bits let it
        return Walk((*codes, data), data)
    return Walk(codes, data)
