"""The scan of an IVF-Flat index's probed lists: exact distances fused with top-k.

Each query keeps a max-heap of the k smallest distances (:mod:`vq.kernels.common.heaps`);
among equal distances the first one scanned stays. Three loops read a list's rows: whole
distances (:func:`_scan_rows`), heads first (:func:`_scan_heads`: L2 over vectors rotated into
their principal axes) and sketch bounds first (:func:`_scan_sketched`,
:mod:`vq.kernels.exact.sketch`): the same results. Threads split the queries
(:func:`vq.kernels.common.threads.parallel_for`); :func:`ivf_flat_range` is one thread's share.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from vq.kernels.common.constants import metric
from vq.kernels.common.heaps import heap_replace_top, heap_reset, heap_sorted
from vq.kernels.common.rowdist import l2_heads4, l2_tail
from vq.kernels.common.simd import borrow
from vq.kernels.common.threads import parallel_for
from vq.kernels.exact.exact_scans import exact_distance
from vq.kernels.exact.sketch import centre_distance, sketch_dots4, sketch_lower, sketch_prepare
from vq.kernels.jit.cache import kernel

#: ``row_ids`` of lists whose rows are distinct vectors (no spilled copies)
NO_ROW_IDS = np.zeros(0, dtype=np.int64)
#: ``sketch`` of lists without sketches
NO_SKETCH = None


def ivf_flat_scan(queries, lists, probes, allowed, inner_product, out):
    """Exact distances to the vectors of the probed inverted lists, fused with top-k; threads
    split the queries.

    Args:
        queries: float32 [nq, d].
        lists: a :class:`~vq.kernels.common.bundles.FlatLists`: the vectors list after list,
            the CSR offsets, and

            - ``prune``: (L2) compute a row's head first, four rows at a time, and its tail
              only where the head is below the heap's threshold
              (:mod:`vq.kernels.common.rowdist`): the same results, faster where the first
              dimensions carry most of the distance (vectors rotated into their principal
              axes), slower elsewhere;
            - ``row_ids``: int64 [n], the id of each row, where a vector is stored in more
              than one list (spilled lists): a row whose id the heap holds already is not
              offered, so the k rows found hold k distinct ids (the first row of each
              scanned, and the k best ids of all the probed rows: the copies of a vector hold
              the same floats, so they score the same); [0] (:data:`NO_ROW_IDS`): rows are
              offered whatever their id;
            - ``sketch``: (codes uint8 [n, width], factors float32 [n, 4], low float32 [d],
              step float32 [d], centroids float32 [nlist, d]): the rows' sketches
              (:mod:`vq.kernels.exact.sketch`), whose bounds skip the exact distance of a
              row that cannot enter the heap (the same results); None (:data:`NO_SKETCH`).
        probes: int64 [nq, nprobe], the lists to scan (-1: skip).
        allowed: uint8 [n], 0 for rows a filtered search skips, or [0]: no filter.
        inner_product: False for squared L2 distances, True for negated inner products (so
            that smaller is better in both cases).
        out: a :class:`~vq.kernels.common.bundles.TopK` [nq, k]: distances ascending (+inf
            padding), rows of ``lists.vectors`` (-1 padding).
    """
    parallel_for(
        ivf_flat_range, probes.shape[0], queries, lists, probes, allowed, metric(inner_product), out
    )


@kernel(nogil=True, fastmath=True)
def ivf_flat_range(q0, q1, queries, lists, probes, allowed, inner_product, out):
    """:func:`ivf_flat_scan` for queries ``q0..q1`` (int64) on the calling thread."""
    queries, lists, probes, allowed, out = (
        borrow(queries),
        borrow(lists),
        borrow(probes),
        borrow(allowed),
        borrow(out),
    )
    _range_queries(q0, q1, queries, lists, lists.sketch, probes, allowed, inner_product, out)


@njit(nogil=True, fastmath=True)
def _range_queries(q0, q1, queries, lists, sketch, probes, allowed, inner_product, out):
    """:func:`ivf_flat_range`'s loop. ``sketch`` is an argument of its own (of a function
    numba compiles apart, not inlined): where it is None, numba drops the sketched loop while
    it compiles, so an index without sketches never compiles it."""
    if sketch is None:
        _plain_queries(q0, q1, queries, lists, probes, allowed, inner_product, out)
    else:
        _sketched_queries(q0, q1, queries, lists, sketch, probes, allowed, inner_product, out)


@njit(inline="always", fastmath=True)
def _plain_queries(q0, q1, queries, lists, probes, allowed, inner_product, out):
    """:func:`ivf_flat_range`'s loop without sketches."""
    vectors, offsets, prune, row_ids, _ = lists
    k = out.distances.shape[1]
    heap_d = np.empty(k, dtype=np.float32)
    heap_i = np.empty(k, dtype=np.int64)
    for q in range(q0, q1):
        heap_reset(heap_d, heap_i)
        x = queries[q]
        for p in range(probes.shape[1]):
            lst = probes[q, p]
            if lst < 0:
                continue
            start, end = offsets[lst], offsets[lst + 1]
            # the metric and the pruning constants in each copy (see exact_distance)
            if inner_product:
                _scan_rows(x, vectors, start, end, allowed, True, row_ids, heap_d, heap_i)
            elif prune:
                _scan_heads(x, vectors, start, end, allowed, row_ids, heap_d, heap_i)
            else:
                _scan_rows(x, vectors, start, end, allowed, False, row_ids, heap_d, heap_i)
        heap_sorted(heap_d, heap_i, out.distances[q], out.labels[q])


@njit(inline="always", fastmath=True)
def _sketched_queries(q0, q1, queries, lists, sketch, probes, allowed, inner_product, out):
    """:func:`ivf_flat_range`'s loop with sketches (:func:`_scan_sketched`)."""
    vectors, offsets, _, row_ids, _ = lists
    codes, factors, low, step, centroids = sketch
    codes, factors, centroids = borrow(codes), borrow(factors), borrow(centroids)
    k = out.distances.shape[1]
    heap_d = np.empty(k, dtype=np.float32)
    heap_i = np.empty(k, dtype=np.int64)
    query_codes = np.zeros(codes.shape[1], dtype=np.int8)
    margin = np.float32((queries.shape[1] + 32) * 2.0**-20)
    for q in range(q0, q1):
        heap_reset(heap_d, heap_i)
        x = queries[q]
        prepared = sketch_prepare(x, low, step, query_codes)
        for p in range(probes.shape[1]):
            lst = probes[q, p]
            if lst < 0:
                continue
            start, end = offsets[lst], offsets[lst + 1]
            rho = centre_distance(x, centroids, lst)
            bound = (query_codes, codes, factors, prepared, rho, margin)
            heap = (heap_d, heap_i)
            if inner_product:
                _scan_sketched(x, vectors, start, end, allowed, True, row_ids, bound, heap)
            else:
                _scan_sketched(x, vectors, start, end, allowed, False, row_ids, bound, heap)
        heap_sorted(heap_d, heap_i, out.distances[q], out.labels[q])


@njit(inline="always")
def _four_row_scan(allowed, row_ids, heap_d, end):
    """What a scan of rows four at a time starts from: whether it is filtered, whether its
    lists are spilled, the heap's threshold, and the list's last row."""
    return allowed.shape[0] > 0, row_ids.shape[0] > 0, heap_d[0], end - 1


@njit(inline="always")
def _four_rows(i, last):
    """Rows i .. i + 3, the last row repeated past ``last`` (four-row steps over a list)."""
    return i, min(i + 1, last), min(i + 2, last), min(i + 3, last)


@njit(inline="always")
def _held(heap_i, row_ids, row):
    """Whether the heap holds a row of ``row``'s id (the heap's free slots hold row -1)."""
    wanted = row_ids[row]
    for j in range(heap_i.shape[0]):
        r = heap_i[j]
        if r >= 0 and row_ids[r] == wanted:
            return True
    return False


@njit(inline="always", fastmath=True)
def _scan_rows(x, vectors, start, end, allowed, inner_product, row_ids, heap_d, heap_i):
    """Rows ``start..end`` offered to the max-heap, one whole distance at a time (with
    ``row_ids``, a row whose id the heap holds is not)."""
    filtered = allowed.shape[0] > 0
    spilled = row_ids.shape[0] > 0
    threshold = heap_d[0]
    for i in range(start, end):
        if filtered and allowed[i] == 0:
            continue
        d = exact_distance(x, vectors, i, inner_product)
        if d < threshold and not (spilled and _held(heap_i, row_ids, i)):
            heap_replace_top(heap_d, heap_i, d, i)
            threshold = heap_d[0]


@njit(inline="always", fastmath=True)
def _scan_heads(x, vectors, start, end, allowed, row_ids, heap_d, heap_i):
    """:func:`_scan_rows` (L2) with the heads of four rows first, a row's tail only where its
    head is below the heap's threshold (the last row repeated to fill the last four)."""
    filtered, spilled, threshold, last = _four_row_scan(allowed, row_ids, heap_d, end)
    for i in range(start, end, 4):
        h0, h1, h2, h3 = l2_heads4(x, vectors, *_four_rows(i, last))
        if min(min(h0, h1), min(h2, h3)) >= threshold:
            continue  # (no row of the four can enter the heap)
        for r in range(min(4, end - i)):
            h = h0 if r == 0 else h1 if r == 1 else h2 if r == 2 else h3
            row = i + r
            if h >= threshold or (filtered and allowed[row] == 0):
                continue
            d = h + l2_tail(x, vectors, row)
            if d < threshold and not (spilled and _held(heap_i, row_ids, row)):
                heap_replace_top(heap_d, heap_i, d, row)
                threshold = heap_d[0]


@njit(inline="always", fastmath=True)
def _scan_sketched(x, vectors, start, end, allowed, inner_product, row_ids, bound, heap):
    """:func:`_scan_rows` with each row's sketch bound first (four rows' integer products at
    a time): a row's exact distance only where its lower bound is below the heap's threshold
    (``bound`` = (query codes, codes, factors, prepared query, ρ, margin): see
    :func:`vq.kernels.exact.sketch.sketch_lower`; ``heap`` = (distances, rows))."""
    query_codes, codes, factors, prepared, rho, margin = bound
    heap_d, heap_i = heap
    filtered, spilled, threshold, last = _four_row_scan(allowed, row_ids, heap_d, end)
    for i in range(start, end, 4):
        p0, p1, p2, p3 = sketch_dots4(query_codes, codes, *_four_rows(i, last))
        for r in range(min(4, end - i)):
            dot = p0 if r == 0 else p1 if r == 1 else p2 if r == 2 else p3
            row = i + r
            if filtered and allowed[row] == 0:
                continue
            if sketch_lower(dot, factors, row, prepared, rho, margin, inner_product) >= threshold:
                continue  # (its exact distance is at least its bound)
            d = exact_distance(x, vectors, row, inner_product)
            if d < threshold and not (spilled and _held(heap_i, row_ids, row)):
                heap_replace_top(heap_d, heap_i, d, row)
                threshold = heap_d[0]
