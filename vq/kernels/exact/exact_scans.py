"""Exact distances fused with top-k: the distance every exact scan computes
(:func:`exact_distance`), the candidates of a re-ranking step, the blocks of a Flat search,
and the step every CPU search ends with (rows to ids, padding). The lists of an IVF-Flat index
are :mod:`vq.kernels.exact.ivf_flat`.

Each scan keeps, per query, a max-heap of the k smallest distances (:mod:`vq.kernels.common.heaps`);
among equal distances the first one scanned stays. Threads split the queries
(:func:`vq.kernels.common.threads.parallel_for`); the ``*_range`` kernels are one thread's share.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import overload

from vq.kernels.common.constants import L2, constant_metric, metric
from vq.kernels.common.halves import stored_value
from vq.kernels.common.heaps import heap_replace_top, heap_reset, heap_sorted
from vq.kernels.common.rowdist import ip_row, l2_row
from vq.kernels.common.simd import borrow, prefetch_line
from vq.kernels.common.threads import parallel_for
from vq.kernels.jit.cache import kernel


def exact_distance(x, vectors, i, inner_product):
    """Squared L2 distance of the float32 vector x [d] to row i of ``vectors`` (float32, or
    uint16 fp16 bits: :func:`vq.kernels.common.halves.stored_value`), or their negated inner
    product.

    Float32 rows: :mod:`vq.kernels.common.rowdist`'s fixed sequence of operations (head + tail), the
    same bit for bit as the scans that test a row's head first. By metric: a loop that calls
    this with ``inner_product`` a run-time flag gets scalar code (LLVM does not take the test
    out of the loop), so each kernel here tests the flag
    once and runs its loop as an inlined function called with the literal ``True`` or
    ``False``, or takes the metric as a type (:mod:`vq.kernels.common.constants`: one metric
    compiled per call, as the graph kernels do). (This body runs with ``NUMBA_DISABLE_JIT=1``;
    compiled kernels take the overload below.)"""
    if vectors.dtype == np.uint16:
        return _half_distance(x, vectors, i, inner_product)
    return ip_row(x, vectors, i) if inner_product else l2_row(x, vectors, i)


@overload(exact_distance, prefer_literal=True, jit_options={"fastmath": True})
def _exact_distance(x, vectors, i, inner_product):
    if isinstance(vectors, types.Array) and vectors.dtype == types.uint16:
        return lambda x, vectors, i, inner_product: _half_distance(x, vectors, i, inner_product)
    fixed = constant_metric(inner_product)  # (the kernels' literal or typed metric)
    if fixed is not None:
        if fixed:
            return lambda x, vectors, i, inner_product: ip_row(x, vectors, i)
        return lambda x, vectors, i, inner_product: l2_row(x, vectors, i)

    def impl(x, vectors, i, inner_product):
        if inner_product:
            return ip_row(x, vectors, i)
        return l2_row(x, vectors, i)

    return impl


@njit(inline="always", fastmath=True)
def _half_distance(x, vectors, i, inner_product):
    """:func:`exact_distance` to a row of fp16 bits (uint16 [n, d]), indexed in place (not
    taken as a view: see :func:`vq.kernels.common.heaps.heap_replace_top_row`)."""
    d = np.float32(0.0)
    if inner_product:
        for j in range(x.shape[0]):
            d -= x[j] * stored_value(vectors, i, j)
    else:
        for j in range(x.shape[0]):
            diff = x[j] - stored_value(vectors, i, j)
            d += diff * diff
    return d


_PREFETCH_AHEAD = 4  # candidates whose vectors refine_scan fetches before their turn


@njit(inline="always")
def _prefetch_vector(vectors, row, row_bytes):
    if row >= 0:
        for byte in range(0, row_bytes, 64):
            prefetch_line(vectors, row, byte)


def refine_scan(queries, vectors, candidates, inner_product, out_dist, out_idx):
    """Exact distances to given candidate rows, fused with top-k: the re-ranking step of
    ``Refine`` (faiss ``IndexRefineFlat``); threads split the queries.

    Args:
        queries: float32 [nq, d]; vectors: float32 [n, d], or uint16 [n, d] (fp16 values).
        candidates: int64 [nq, C] rows of ``vectors`` to rank (-1: skip).
        inner_product: False for squared L2 distances, True for negated inner products.
        out_dist: float32 [nq, k] ascending (+inf padding); out_idx: int64 [nq, k] rows of
            ``vectors`` (-1 padding).
    """
    parallel_for(
        refine_range,
        candidates.shape[0],
        queries,
        vectors,
        candidates,
        metric(inner_product),
        out_dist,
        out_idx,
    )


@kernel(nogil=True, fastmath=True)
def refine_range(q0, q1, queries, vectors, candidates, inner_product, out_dist, out_idx):
    """:func:`refine_scan` for queries ``q0..q1`` (int64) on the calling thread."""
    queries, out_dist, out_idx = borrow(queries), borrow(out_dist), borrow(out_idx)
    if inner_product:  # the metric a constant in each copy (see exact_distance)
        _refine_queries(q0, q1, queries, vectors, candidates, True, out_dist, out_idx)
    else:
        _refine_queries(q0, q1, queries, vectors, candidates, False, out_dist, out_idx)


@njit(inline="always", fastmath=True)
def _refine_queries(q0, q1, queries, vectors, candidates, inner_product, out_dist, out_idx):
    n_cand = candidates.shape[1]
    k = out_dist.shape[1]
    row_bytes = vectors.shape[1] * vectors.itemsize
    heap_d = np.empty(k, dtype=np.float32)
    heap_i = np.empty(k, dtype=np.int64)
    for q in range(q0, q1):
        heap_reset(heap_d, heap_i)
        x = queries[q]
        threshold = heap_d[0]
        for c in range(min(_PREFETCH_AHEAD, n_cand)):
            _prefetch_vector(vectors, candidates[q, c], row_bytes)
        for c in range(n_cand):
            # scattered rows: fetch a few candidates ahead
            if c + _PREFETCH_AHEAD < n_cand:
                _prefetch_vector(vectors, candidates[q, c + _PREFETCH_AHEAD], row_bytes)
            i = candidates[q, c]
            if i < 0:
                continue
            d = exact_distance(x, vectors, i, inner_product)
            if d < threshold:
                heap_replace_top(heap_d, heap_i, d, i)
                threshold = heap_d[0]
        heap_sorted(heap_d, heap_i, out_dist[q], out_idx[q])


@kernel(nogil=True)
def refine_lean(queries, vectors, candidates, ids, inner_product, out_dist, out_ids):
    """:func:`refine_range` for every query, then ids, in one call on the calling thread (the
    lean path of ``Refine``): ``ids`` int64 [n] (or [0]: the rows are the ids); ``out_dist``
    float32 [nq, k] ascending (negated back to inner products with ``inner_product``;
    +inf / -inf padding), ``out_ids`` int64 [nq, k] (-1 padding)."""
    nq, k = out_dist.shape
    dist, rows = np.empty((nq, k), dtype=np.float32), np.empty((nq, k), dtype=np.int64)
    refine_range(np.int64(0), np.int64(nq), queries, vectors, candidates, inner_product, dist, rows)
    fill = np.float32(-np.inf) if inner_product else np.float32(np.inf)
    rows_to_ids(dist, rows, ids, inner_product, fill, out_dist, out_ids)


@kernel(nogil=True)
def finish_lean(queries, dist, rows, finish, inner_product, out_dist, out_ids):
    """The last step of a lean IVF search, from the k_c best stored rows (``dist``, ``rows``
    [nq, k_c], consumed) to results (``out_dist``, ``out_ids`` [nq, k]), as ``finish`` (a
    :class:`~vq.kernels.common.bundles.Finish`) says.

    Without re-ranking (``finish.refine`` 0; k_c = k): the rows mapped to ``finish.ids``
    (int64 [n], or [0]: the rows are the ids), distances negated back with ``inner_product``.
    With it: the rows mapped to ids are candidates — rows of the ``Refine``'s vectors
    (float32, or fp16 bits) — ranked by their exact distances (:func:`refine_lean`) and
    mapped to ``finish.ref_ids``.

    The re-ranking is a value, not a type: every lean kernel compiles once whether its index
    is wrapped in a ``Refine`` or not (both re-rankings are separate kernels it calls, compiled
    once per metric for every kind). A disk-cached kernel itself: each lean kernel compiled
    after the first loads it."""
    ids, refine, ref_vectors, ref_halves, ref_ids = finish
    fill = np.float32(-np.inf) if inner_product else np.float32(np.inf)
    if refine == 0:
        rows_to_ids(dist, rows, ids, inner_product, fill, out_dist, out_ids)
        return
    rows_to_ids(dist, rows, ids, L2, fill, dist, rows)  # in place: the candidates (not negated)
    if refine == 1:
        refine_lean(queries, ref_vectors, rows, ref_ids, inner_product, out_dist, out_ids)
    else:
        refine_lean(queries, ref_halves, rows, ref_ids, inner_product, out_dist, out_ids)


def heap_push_block(scores, x_norms, first, allowed, inner_product, heap_d, heap_i):
    """Offer a block of columns to per-query top-k max-heaps (the Flat index's selection
    step, fused with the distance arithmetic, applied block after block of the database so
    that the scores stay in cache); threads split the queries.

    Args:
        scores: float32 [nq, b] inner products ⟨q, x⟩ of the queries with vectors
            ``first .. first + b``.
        x_norms: float32 [b] their squared norms ‖x‖² (read for L2 only).
        first: row number of the block's first vector.
        allowed: uint8 [b], 0 for the block's vectors a filtered search skips, or [0]: none.
        inner_product: False: rank by ‖x‖² − 2⟨q, x⟩ (the squared L2 distance minus the
            query's constant ‖q‖², which the caller adds); True: rank by −⟨q, x⟩.
        heap_d: float32 [nq, k], heap_i: int64 [nq, k]: max-heaps, +inf/-1 when empty;
            finish them with :func:`heaps_sorted`.
    """
    args = (scores, x_norms, int(first), allowed, metric(inner_product), heap_d, heap_i)
    parallel_for(heap_push_range, scores.shape[0], *args)


@kernel(nogil=True, fastmath=True)
def heap_push_range(q0, q1, scores, x_norms, first, allowed, inner_product, heap_d, heap_i):
    """:func:`heap_push_block` for queries ``q0..q1`` on the calling thread."""
    scores, heap_d, heap_i = borrow(scores), borrow(heap_d), borrow(heap_i)
    b = scores.shape[1]
    filtered = allowed.shape[0] > 0
    for q in range(q0, q1):
        hd = heap_d[q]
        hi = heap_i[q]
        row = scores[q]
        threshold = hd[0]
        for s in range(0, b, 16):
            e = min(s + 16, b)
            # a vectorisable pass finds whether any of 16 beats the threshold
            best = np.float32(np.inf)
            for i in range(s, e):
                d = -row[i] if inner_product else x_norms[i] - np.float32(2.0) * row[i]
                best = min(best, d)
            if best >= threshold:
                continue
            for i in range(s, e):
                d = -row[i] if inner_product else x_norms[i] - np.float32(2.0) * row[i]
                if d < threshold and (not filtered or allowed[i] != 0):
                    heap_replace_top(hd, hi, d, first + i)
                    threshold = hd[0]


@kernel(nogil=True)
def heaps_sorted(heap_d, heap_i, out_dist, out_idx):
    """Each row's max-heap (``heap_d``/``heap_i`` [nq, k], consumed) in ascending order."""
    heap_d, heap_i = borrow(heap_d), borrow(heap_i)
    out_dist, out_idx = borrow(out_dist), borrow(out_idx)
    for q in range(heap_d.shape[0]):
        heap_sorted(heap_d[q], heap_i[q], out_dist[q], out_idx[q])


@kernel(nogil=True)
def rows_to_ids(dist, rows, ids, negate, fill, out_dist, out_ids):
    """Search results by stored row → by id, padded: what every CPU search returns (a pass
    over nq * k entries: one thread).

    Args:
        dist: float32 [nq, kk] distances of ``rows`` int64 [nq, kk] (-1 where missing).
        ids: int64 [ntotal], the id of each row, or [0] when ids are the rows themselves.
        negate: write ``-dist`` (inner products ranked as negated values).
        fill: the distance of a missing result (+inf, or -inf for inner products).
        out_dist: float32 [nq, k], out_ids: int64 [nq, k], k >= kk: columns past kk are
            missing results. They may be ``dist`` and ``rows`` themselves (in place).
    """
    kk = rows.shape[1]
    mapped = ids.shape[0] > 0
    for q in range(rows.shape[0]):
        for j in range(out_ids.shape[1]):
            r = rows[q, j] if j < kk else -1
            if r < 0:
                out_ids[q, j] = -1
                out_dist[q, j] = fill
            else:
                out_ids[q, j] = ids[r] if mapped else r
                out_dist[q, j] = -dist[q, j] if negate else dist[q, j]
