"""Graph search (HNSW): greedy descent on the upper levels, then a beam search on level 0.

Reference: Yu. A. Malkov, D. A. Yashunin, "Efficient and robust approximate nearest neighbor
search using Hierarchical Navigable Small World graphs", IEEE TPAMI 2018; faiss ``HNSW::search``
(``greedy_update_nearest``, ``search_from_candidates`` with its ``MinimaxHeap``).

The graph, as plain arrays (what :mod:`vq.kernels.graph.graph_build` writes):

- ``data`` float32 [n, d]: the vectors, read by :func:`node_distance` only;
- ``nbr0`` int32 [n, 2M]: each node's level-0 neighbours, -1 after the last;
- ``up_off`` int64 [n + 1] and ``up_nbr`` int32 [rows, M]: node v's neighbours at level
  l >= 1 are row ``up_off[v] + l - 1`` (v has ``up_off[v + 1] - up_off[v]`` upper levels);
- ``entry``: the entry point, a node of the top level ``max_level``.

The beam is faiss's: the ``cap`` = max(efSearch, k) nearest nodes seen; the nearest one not
yet expanded is expanded next, and the search stops when none is left (or, for efSearch < k,
when efSearch of them are nearer than the one to expand), so that the same graph gives faiss's
ids (ties aside). faiss finds that node by scanning the beam (its ``MinimaxHeap``), hnswlib
keeps a heap of candidates beside the beam; here the beam is one sorted array (NSG's and
DiskANN's search list, see :func:`beam`): the same nodes expanded in the same order, with
neither scan nor heap. The upper levels are descended as faiss does (:func:`greedy`).

Visited nodes of the beam are stamped with an epoch in a uint16 array per thread (``seen``
[n + 1], the epoch in its last slot), reused from query to query and cleared once every 65,534
searches.

:func:`node_distance` is the only function that reads the vectors: a traversal on
compressed codes replaces it (and re-ranks the survivors exactly).

The kernels take the metric as a type (``ip``: :data:`vq.kernels.common.constants.L2` or ``IP``), so
a call compiles the code of its own metric only (a float-traversal search compiled in 14 s on
Zen 1 where both metrics inlined took 30 s), with the metric a constant in the loops.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from vq.kernels.common.constants import metric
from vq.kernels.common.heaps import heapify_pair, push_pair, sift_down_pair, sort_pair_heap
from vq.kernels.common.simd import borrow, fetch_add, prefetch_line
from vq.kernels.common.threads import get_num_threads, parallel_for
from vq.kernels.exact.exact_scans import exact_distance, rows_to_ids
from vq.kernels.exact.lean_scans import all_finite
from vq.kernels.graph.graph_store import (
    borrow_store,
    node_distance,
    prefetch_node,
    prepare_query,
)
from vq.kernels.jit.cache import kernel
from vq.kernels.sq.sq_scans import sq_kind

_EPOCHS = 65535
#: ``allowed`` of an unfiltered search
NO_FILTER = np.zeros(0, dtype=np.uint8)


@njit(inline="always", fastmath=True)
def pair_distance(data, a, b, inner_product):
    """:func:`node_distance` between rows a and b of ``data``."""
    d = np.float32(0.0)
    if inner_product:
        for j in range(data.shape[1]):
            d -= data[a, j] * data[b, j]
    else:
        for j in range(data.shape[1]):
            diff = data[a, j] - data[b, j]
            d += diff * diff
    return d


@njit(inline="always")
def neighbour(nbr0, up_off, up_nbr, v, level, j):
    """The j-th neighbour of node v at ``level`` (-1: none)."""
    if level == 0:
        return nbr0[v, j]
    return up_nbr[up_off[v] + level - 1, j]


@njit(inline="always")
def degree(nbr0, up_nbr, level):
    """Neighbour slots per node at ``level``: 2M on level 0, M above."""
    return nbr0.shape[1] if level == 0 else up_nbr.shape[1]


@njit(inline="always")
def next_epoch(seen):
    """A fresh visit stamp for ``seen`` (uint16 [n + 1], the last slot holding the epoch)."""
    n = seen.shape[0] - 1
    e = np.int64(seen[n]) + 1
    if e >= _EPOCHS:
        for i in range(n):
            seen[i] = 0
        e = 1
    seen[n] = e
    return e


# -- traversal --------------------------------------------------------------------------------
@njit(inline="always", fastmath=True)
def greedy(x, data, ip, up_off, up_nbr, level, v, dv):
    """faiss's ``greedy_update_nearest`` at an upper ``level``: move to a nearer neighbour
    until none is; returns the node and its distance. Every neighbour's distance is computed,
    as faiss does, seen before or not: stamping the visited ones (and fetching their vectors
    ahead) cost more than the distances it saved (a descent of HNSW8 over 33,000 NSynth
    vectors, 37 distances of 52 neighbours read: 1.9 -> 1.7 µs without, Zen 1)."""
    while True:
        prev = v
        row = up_off[prev] + level - 1
        for j in range(up_nbr.shape[1]):
            w = up_nbr[row, j]
            if w < 0:
                break
            d = node_distance(x, data, w, ip)
            if d < dv:
                v, dv = w, d
        if v == prev:
            return v, dv


@njit(inline="always", fastmath=True)
def beam(x, data, ip, nbr0, up_off, up_nbr, level, entry, d_entry, cap, ef, seen, bd, bi,
         scratch, dist, allowed, rd, ri):  # fmt: skip
    """Beam search at ``level`` from ``entry``: the ``cap`` nearest nodes seen, ascending in
    ``bd``/``bi`` [>= cap]; returns their number and, with a filter, how many allowed nodes
    ``rd``/``ri`` hold. ``ef`` is faiss's stopping efSearch (see the module docstring);
    ``scratch`` int64 and ``dist`` float32 [>= 2M] hold a node's unvisited neighbours and
    their distances. ``allowed`` uint8 [n] (or [0]: no filter): the beam walks every node,
    and the ``cap`` nearest allowed ones seen are kept in the max-heap ``rd``/``ri`` (faiss's
    search with an ``IDSelector``).

    The beam is a sorted array (NSG's and DiskANN's search list): the nearest node not yet
    expanded is expanded next (marked by its id's complement while the search runs), and
    the search stops when every node of the beam is expanded. That is the order of faiss's
    search (a node pushed out of the beam is farther than all in it, so faiss stops before
    it expands one), without a heap's unpredictable sift branches: a new node takes its
    place by an insertion sort's step from the far end, which is short (HNSW8 over 33,000
    NSynth vectors, efConstruction 200, one thread, Zen 1, against the two heaps this
    replaced, A/B pairs: 1.3-1.5x the queries per second at efSearch 10, 1.6x at 64,
    1.4-1.8x at 256, 1.3-1.6x at 512, the same ids; the build 1.2x faster)."""
    epoch = next_epoch(seen)
    deg = degree(nbr0, up_nbr, level)
    filtered = allowed.shape[0] > 0
    bd[0], bi[0] = d_entry, entry
    size, cur, rsize = 1, 0, 0
    seen[entry] = epoch
    if filtered and allowed[entry] != 0:
        rd[0], ri[0] = d_entry, entry
        rsize = 1
    while cur < size:
        if ef < cap and cur >= ef:  # faiss's stop for efSearch < k: ef nodes are nearer
            break
        v = bi[cur]
        bi[cur] = ~v
        first = size  # the nearest place a node entered this round
        fresh = unvisited(data, nbr0, up_off, up_nbr, level, v, deg, seen, epoch, scratch)
        for j in range(fresh):
            dist[j] = node_distance(x, data, scratch[j], ip)
        for j in range(fresh):
            w, d = scratch[j], dist[j]
            if filtered and allowed[w] != 0:
                rsize = keep_nearest(rd, ri, rsize, cap, d, w)
            if size == cap and d >= bd[size - 1]:
                continue
            if size < cap:
                size += 1
            at = size - 1  # an insertion sort's step, from the far end (where most land)
            while at > 0 and bd[at - 1] > d:
                bd[at], bi[at] = bd[at - 1], bi[at - 1]
                at -= 1
            bd[at], bi[at] = d, w
            first = min(first, at)
            if level == 0:  # its neighbour list, read when it is expanded
                prefetch_line(nbr0, w, 0)
        if first <= cur:
            cur = first
        else:
            cur += 1
            while cur < size and bi[cur] < 0:
                cur += 1
    for j in range(size):
        if bi[j] < 0:
            bi[j] = ~bi[j]
    return size, rsize


@njit(inline="always")
def unvisited(data, nbr0, up_off, up_nbr, level, v, deg, seen, epoch, scratch):
    """Node v's neighbours at ``level`` not stamped ``epoch`` in ``seen``, in list order:
    stamped, their number returned, themselves in ``scratch`` and their vectors asked of the
    CPU ahead of the distances. Branch-free over the stamps (a visited neighbour is written
    and then overwritten): whether a neighbour was seen is a coin toss to the branch
    predictor."""
    fresh = 0
    for j in range(deg):
        w = neighbour(nbr0, up_off, up_nbr, v, level, j)
        if w < 0:
            break
        new = seen[w] != epoch
        seen[w] = epoch
        scratch[fresh] = w
        fresh += new
    for j in range(fresh):
        prefetch_node(data, scratch[j])
    return fresh


@njit(inline="always")
def keep_nearest(heap_d, heap_i, count, limit, dist, node):
    """Offer (dist, node) to the max-heap ``heap_d``/``heap_i`` of at most ``limit``
    entries (``count`` now); returns its new count."""
    grown = count
    if count < limit:
        push_pair(heap_d, heap_i, count, dist, node)
        grown = count + 1
    elif dist < heap_d[0]:
        sift_down_pair(heap_d, heap_i, count, 0, dist, node)
    return grown


@njit(inline="always", fastmath=True)
def descend(x, data, ip, up_off, up_nbr, entry, max_level, stop):
    """Greedy descent from ``entry`` through levels ``max_level`` .. ``stop + 1``: the node
    reached on level ``stop`` and its distance."""
    v, dv = entry, node_distance(x, data, entry, ip)
    for level in range(max_level, stop, -1):
        v, dv = greedy(x, data, ip, up_off, up_nbr, level, v, dv)
    return v, dv


@kernel(nogil=True, fastmath=True)
def hnsw_search_range(s0, s1, slices, queries, store, data, rerank, ip, nbr0, up_off, up_nbr,
                      entry, max_level, ef, seen, allowed, out_dist, out_idx):  # fmt: skip
    """:func:`hnsw_search` for slices ``s0..s1`` of ``slices`` (slice s: queries
    ``nq * s // slices`` .. and the visit stamps ``seen[s]``) on the calling thread; ``ip``
    a :class:`vq.kernels.common.constants.Static`."""
    queries, data, nbr0 = borrow(queries), borrow(data), borrow(nbr0)
    up_off, up_nbr, seen = borrow(up_off), borrow(up_nbr), borrow(seen)
    store = borrow_store(store)
    out_dist, out_idx = borrow(out_dist), borrow(out_idx)
    allowed = borrow(allowed)
    nq = out_dist.shape[0]
    hd, hi, scratch, dist, rd, ri = _walk_scratch(ef, out_dist.shape[1], nbr0, allowed)
    for s in range(s0, s1):
        q0, q1 = nq * s // slices, nq * (s + 1) // slices
        _search_queries(q0, q1, queries, store, data, rerank, ip, nbr0, up_off, up_nbr, entry,
                        max_level, ef, seen[s], allowed, hd, hi, scratch, dist, rd, ri,
                        out_dist, out_idx)  # fmt: skip


@njit(inline="always")
def _walk_scratch(ef, k, nbr0, allowed):
    """One thread's arrays for :func:`_search_queries`: the beam (max(ef, k)), a node's
    neighbours and their distances, the allowed nodes' heap (filtered searches)."""
    cap = max(ef, k)
    filtered = allowed.shape[0] > 0
    return (np.empty(cap, dtype=np.float32), np.empty(cap, dtype=np.int64),
            np.empty(nbr0.shape[1], dtype=np.int64), np.empty(nbr0.shape[1], dtype=np.float32),
            np.empty(cap if filtered else 0, dtype=np.float32),
            np.empty(cap if filtered else 0, dtype=np.int64))  # fmt: skip


@njit(inline="always", fastmath=True)
def _search_queries(q0, q1, queries, store, data, rerank, ip, nbr0, up_off, up_nbr, entry,
                    max_level, ef, stamps, allowed, hd, hi, scratch, dist, rd, ri, out_dist,
                    out_idx):  # fmt: skip
    """hnsw_search_range's queries ``q0..q1``, visit stamps ``stamps``."""
    cap = hd.shape[0]
    filtered = allowed.shape[0] > 0
    for q in range(q0, q1):
        x = prepare_query(queries[q], store, ip)
        v, dv = descend(x, store, ip, up_off, up_nbr, entry, max_level, 0)
        size, rsize = beam(x, store, ip, nbr0, up_off, up_nbr, 0, v, dv, cap, ef, stamps,
                           hd, hi, scratch, dist, allowed, rd, ri)  # fmt: skip
        if filtered:  # the allowed nodes seen (a heap), not the beam
            size = rsize
            for j in range(size):
                hd[j], hi[j] = rd[j], ri[j]
        if rerank:  # the beam's nodes by their exact distances, their vectors fetched ahead
            for j in range(size):
                prefetch_node(data, hi[j])
            for j in range(size):
                hd[j] = exact_distance(queries[q], data, hi[j], ip)
        if filtered:  # ascending by distance (a heap's order)
            heapify_pair(hd, hi, size)
            sort_pair_heap(hd, hi, size)
        elif rerank:  # the beam's order by estimates: nearly that of the exact distances
            sort_nearly_sorted(hd, hi, size)
        write_row(hd, hi, size, out_dist, out_idx, q)


@njit(inline="always")
def sort_nearly_sorted(hd, hi, size):
    """Sort the first ``size`` pairs ascending by distance (ties by node), in place, by
    insertion: few moves where the order is nearly right already (a re-ranked beam: the
    heap sort this replaced cost 0.08 µs more a query, 3% of an HNSW5 int8 search of the
    3,300 NSynth notes at efSearch 10, Zen 3)."""
    for j in range(1, size):
        d, w = hd[j], hi[j]
        at = j
        while at > 0 and (hd[at - 1] > d or (hd[at - 1] == d and hi[at - 1] > w)):
            hd[at], hi[at] = hd[at - 1], hi[at - 1]
            at -= 1
        hd[at], hi[at] = d, w


@njit(inline="always")
def write_row(hd, hi, size, out_dist, out_idx, q):
    """Row q of the outputs := the first k of ``size`` sorted results, padded (+inf, -1)."""
    for j in range(out_dist.shape[1]):
        if j < size:
            out_dist[q, j], out_idx[q, j] = hd[j], hi[j]
        else:
            out_dist[q, j], out_idx[q, j] = np.inf, -1


@kernel(nogil=True, fastmath=True)
def rows_scan_range(q0, q1, queries, store, data, rerank, ip, rows, out_dist, out_idx):
    """:func:`rows_scan` for queries ``q0..q1`` on the calling thread."""
    queries, data, rows = borrow(queries), borrow(data), borrow(rows)
    store = borrow_store(store)
    out_dist, out_idx = borrow(out_dist), borrow(out_idx)
    k = out_dist.shape[1]
    hd = np.empty(k, dtype=np.float32)
    hi = np.empty(k, dtype=np.int64)
    for q in range(q0, q1):
        x = prepare_query(queries[q], store, ip)
        size = 0
        for r in range(rows.shape[0]):
            w = rows[r]
            if rerank:
                d = exact_distance(queries[q], data, w, ip)
            else:
                d = node_distance(x, store, w, ip)
            size = keep_nearest(hd, hi, size, k, d, w)
        sort_pair_heap(hd, hi, size)
        write_row(hd, hi, size, out_dist, out_idx, q)


def rows_scan(queries, data, inner_product, rows, out_dist, out_idx, codes=None):
    """The ``k`` nearest of the graph's nodes ``rows`` (int64 [m]) for each query, by an exact
    scan (a search under a filter that allows few nodes); arguments as :func:`hnsw_search`'s:
    the distances are exact where ``data`` holds the vectors (``codes`` None, or int8 codes
    beside them), else those of the compressed ``store`` (see :func:`hnsw_search`)."""
    store, rerank = traversal_store(data, codes)
    parallel_for(rows_scan_range, queries.shape[0], queries, store, data, rerank,
                 metric(inner_product), rows, out_dist, out_idx)  # fmt: skip


def new_seen(slots: int, n: int) -> np.ndarray:
    """Visit stamps for ``slots`` threads over a graph of ``n`` nodes: uint16 [slots, n + 1]."""
    return np.zeros((slots, n + 1), dtype=np.uint16)


def hnsw_search(queries, data, inner_product, nbr0, up_off, up_nbr, entry, max_level, ef, seen,
                out_dist, out_idx, codes=None, allowed=NO_FILTER):  # fmt: skip
    """The ``k`` nearest nodes of each query by HNSW search; threads split the queries.

    Args:
        queries: float32 [nq, d]; the graph arrays as in the module docstring (``entry`` a
            node of level ``max_level``; a non-empty graph).
        codes: None (the traversal reads ``data``), or (int8 [n, d], float32 [n, 2]) codes
            with a scale per vector (:func:`int8_codes`): the traversal reads them, and the
            beam's nodes are re-ranked on ``data``; or scalar-quantizer codes ``(codes uint8
            [n, code_size], offset, scale, kind)`` as :mod:`vq.kernels.sq.sq_scans` reads them:
            the traversal and the distances returned are on the codes (``data`` float32
            [0, d]: no vectors are kept).
        allowed: uint8 [n], 0 for nodes a filtered search must not return (the beam still
            walks them), or [0]: no filter.
        inner_product: rank by negated inner products instead of squared L2 distances.
        ef: efSearch (the beam holds max(ef, k) nodes).
        seen: uint16 [slots, n + 1] visit stamps (:func:`new_seen`), one row per thread,
            owned by this call; at most ``slots`` threads are used.
        out_dist: float32 [nq, k] ascending (+inf padding); out_idx: int64 [nq, k] nodes
            (-1 padding).
    """
    slices = max(1, min(get_num_threads(), seen.shape[0], queries.shape[0]))
    store, rerank = traversal_store(data, codes)
    parallel_for(hnsw_search_range, slices, slices, queries, store, data, rerank,
                 metric(inner_product), nbr0, up_off, up_nbr, int(entry), int(max_level), int(ef),
                 seen, allowed, out_dist, out_idx)  # fmt: skip


@kernel(nogil=True, fastmath=True)
def hnsw_search_lean(queries, store, data, rerank, ip, nbr0, up_off, up_nbr, entry, max_level,
                     ef, seen, ids, claim, chunk, out_dist, out_ids):  # fmt: skip
    """A few queries on the calling thread, from the search to ids, in one call (the lean
    path of an HNSW index: one dispatch where a single query's kernel takes a few µs):
    :func:`hnsw_search_range` with ``store``/``rerank`` from :func:`traversal_store`, ``ip``
    a :class:`vq.kernels.common.constants.Static` and ``seen`` [1, n + 1], then
    :func:`vq.kernels.exact.exact_scans.rows_to_ids` (``ids`` int64 [n] or [0], distances negated
    back with ``ip``): ``out_dist`` float32 [nq, k], ``out_ids`` int64 [nq, k].

    ``claim``: int64 [1], a counter that threads calling this on the same queries share:
    each takes the next ``chunk`` queries not yet taken (:func:`vq.kernels.common.simd.fetch_add`)
    until none is left, so that a thread that starts late or walks slower takes fewer (a
    static split left one of two threads waiting a tenth of a 330-query search); or
    :data:`vq.kernels.common.simd.NO_CLAIM`: all of them. Returns False if a query it took holds a
    NaN or an infinity (that chunk left undone).

    Compiled with ``fastmath`` as :func:`hnsw_search_range` is: the traversal's code is
    inlined here and takes this kernel's flags (without them the int8 walk's products stayed
    scalar: 2.35 against 2.27 µs a query, HNSW5 int8 over the 3,300 NSynth notes at efSearch
    10, one thread, Zen 3)."""
    queries, data, nbr0 = borrow(queries), borrow(data), borrow(nbr0)
    up_off, up_nbr, seen = borrow(up_off), borrow(up_nbr), borrow(seen)
    store = borrow_store(store)
    nq, k = out_dist.shape
    kk = min(k, nbr0.shape[0])
    dist, rows = np.empty((nq, kk), dtype=np.float32), np.empty((nq, kk), dtype=np.int64)
    no_filter = np.zeros(0, dtype=np.uint8)
    hd, hi, scratch, node_dist, rd, ri = _walk_scratch(ef, kk, nbr0, no_filter)
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
        _search_queries(first, last, queries, store, data, rerank, ip, nbr0, up_off, up_nbr,
                        entry, max_level, ef, seen[0], no_filter, hd, hi, scratch, node_dist, rd,
                        ri, dist, rows)  # fmt: skip
        rows_to_ids(dist[first:last], rows[first:last], ids, ip, fill, out_dist[first:last],
                    out_ids[first:last])  # fmt: skip
        first = nq  # (unclaimed: all of them done)


def traversal_store(data, codes) -> tuple:
    """(store, rerank): what the traversal of :func:`hnsw_search_range` reads, from
    ``data`` and ``codes`` as :func:`hnsw_search` takes them, and whether the results are
    re-ranked on ``data`` (for a caller of the range kernel itself: the lean path of a
    single query reads them once per index)."""
    if codes is None:
        return data, False
    codes = tuple(codes)
    if len(codes) == 4:
        c, offset, scale, kind = codes
        return (c, offset, scale, sq_kind(kind)), False
    return codes, True
