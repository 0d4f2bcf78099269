"""Kernels of the lean path: a search of a few queries on the calling thread (or, for a large
flat scan, split by rows between threads), called straight from numpy arrays with no matrix
product, torch tensor or thread-pool wake-up before them.

- :func:`flat_lean`: a whole flat search of a few queries in one call; :func:`flat_finish`
  merges the parts of a split one.
- :func:`flat_rows`: exact distances of rows ``r0..r1`` to a few queries into per-query heaps,
  each stored vector read once for all the queries; :func:`flat_parts` splits the rows.
- :func:`project_range`: a pre-transform's map of a few queries (the coarse step of an IVF
  search is :mod:`vq.kernels.exact.coarse_probe`).
- :func:`ivf_flat_lean`: a whole IVF-Flat search of a few queries in one call.
- :func:`nearest_lean`: a vector quantizer's encode of a few vectors.
- :func:`all_finite`: the input check.

Each numpy operation on a small array costs a microsecond or more in Python, about what one
of these calls costs: the lean path hands whole steps to kernels instead.
"""

from __future__ import annotations

import numpy as np

from vq.kernels.common.bundles import Coarse, Finish, FlatLists, TopK
from vq.kernels.common.constants import L2, metric
from vq.kernels.common.heaps import EMPTY_KEY, heap_replace_top_row, heap_sorted
from vq.kernels.common.simd import borrow
from vq.kernels.common.threads import parallel_for
from vq.kernels.exact.coarse_probe import probe_few, probe_lists, products
from vq.kernels.exact.exact_scans import finish_lean
from vq.kernels.exact.ivf_flat import ivf_flat_range
from vq.kernels.jit.cache import kernel


@kernel(nogil=True, fastmath=True)
def flat_rows(queries, vectors, x_norms, inner_product, r0, r1, heap_d, heap_i):
    """Offer rows ``r0..r1`` of ``vectors`` to each query's max-heap.

    Args:
        queries: float32 [nq, d]; vectors: float32 [n, d]; x_norms: float32 [n] (read for l2).
        inner_product: rank by -⟨q, x⟩; else by ‖x‖² - 2⟨q, x⟩ (the query's own ‖q‖² left to
            the caller, as :func:`vq.kernels.heap_push_block` does).
        r0, r1: int64, the rows to scan.
        heap_d: float32 [nq, k], heap_i: int64 [nq, k]: max-heaps (+inf / -1 when empty),
            finished by :func:`vq.kernels.heaps_sorted`.
    """
    nq, dim = queries.shape
    for i in range(r0, r1):  # rows and heaps indexed in place: a view costs two atomics
        for q in range(nq):
            s = np.float32(0.0)
            for j in range(dim):
                s += queries[q, j] * vectors[i, j]
            d = -s if inner_product else x_norms[i] - np.float32(2.0) * s
            if d < heap_d[q, 0]:
                heap_replace_top_row(heap_d, heap_i, q, d, i)


def flat_parts(queries, vectors, x_norms, inner_product, heap_d, heap_i):
    """:func:`flat_rows` with the rows cut into ``heap_d.shape[0]`` parts, shared by the
    threads, each into heaps of its own (``heap_d`` [parts, nq, k], ``heap_i`` likewise); the
    caller merges them."""
    parts = heap_d.shape[0]
    n = vectors.shape[0]
    per = -(-n // parts)
    inner_product = metric(inner_product)

    def run(p0: int, p1: int) -> None:
        for p in range(p0, p1):
            r0 = p * per
            flat_rows(
                queries, vectors, x_norms, inner_product, r0, min(n, r0 + per), heap_d[p], heap_i[p]
            )

    parallel_for(run, parts)


@kernel(nogil=True)
def flat_finish(heap_d, heap_i, queries, ids, inner_product, out_dist, out_ids):
    """The results of a flat scan: the parts' heaps ``heap_d``/``heap_i`` [parts, nq, k]
    (:func:`flat_rows`'s, consumed) merged in ascending order (ties by lower row), ‖q‖² added
    back and clamped at 0 (l2) or negated back to inner products, rows mapped to ``ids``
    int64 [n] ([0]: the rows are the ids) → ``out_dist`` float32 [nq, k] (+inf / -inf
    padding), ``out_ids`` int64 [nq, k] (-1 padding)."""
    heap_d, heap_i, queries = borrow(heap_d), borrow(heap_i), borrow(queries)
    parts, nq, k = heap_d.shape
    mapped = ids.shape[0] > 0
    fill = np.float32(-np.inf) if inner_product else np.float32(np.inf)
    sd = np.empty((parts, k), dtype=np.float32)
    si = np.empty((parts, k), dtype=np.int64)
    pos = np.zeros(parts, dtype=np.int64)
    for q in range(nq):
        for p in range(parts):
            heap_sorted(heap_d[p, q], heap_i[p, q], sd[p], si[p])
            pos[p] = 0
        q_norm = np.float32(0.0)
        if not inner_product:
            for j in range(queries.shape[1]):
                q_norm += queries[q, j] * queries[q, j]
        for e in range(k):
            best = 0
            for p in range(1, parts):  # the smallest (distance, row) at the parts' heads
                a, b = sd[p, pos[p]], sd[best, pos[best]]
                if a < b or (a == b and si[p, pos[p]] < si[best, pos[best]]):
                    best = p
            d, r = sd[best, pos[best]], si[best, pos[best]]
            if pos[best] < k - 1:
                pos[best] += 1
            else:  # this part is used up
                sd[best, k - 1] = np.inf
                si[best, k - 1] = EMPTY_KEY
            if r < 0 or r == EMPTY_KEY:
                out_ids[q, e] = -1
                out_dist[q, e] = fill
            else:
                out_ids[q, e] = ids[r] if mapped else r
                out_dist[q, e] = -d if inner_product else max(d + q_norm, np.float32(0.0))


@kernel(nogil=True)
def flat_lean(queries, vectors, x_norms, ids, inner_product, out_dist, out_ids):
    """A flat search of a few queries in one call on the calling thread: :func:`flat_rows`
    over every row, then :func:`flat_finish` (``out_dist``/``out_ids`` [nq, k], k may exceed
    the rows). False (and nothing done) if a query holds a NaN or an infinity."""
    if not all_finite(queries):
        return False
    nq, k = out_dist.shape
    heap_d = np.full((1, nq, k), np.inf, dtype=np.float32)
    heap_i = np.full((1, nq, k), -1, dtype=np.int64)
    flat_rows(
        queries,
        vectors,
        x_norms,
        inner_product,
        np.int64(0),
        np.int64(vectors.shape[0]),
        heap_d[0],
        heap_i[0],
    )
    flat_finish(heap_d, heap_i, queries, ids, inner_product, out_dist, out_ids)
    return True


@kernel(nogil=True)
def project_range(q0, q1, queries, panels, mean, out):
    """``out[q] = (queries[q] - mean) @ matrix_t`` for q in ``q0..q1`` on the calling thread: a
    pre-transform's map of a few queries (:class:`vq.PreTransform`'s lean path), with no
    matrix product of a BLAS library (whose threads then spin on the cores the search needs).

    Args:
        queries: float32 [nq, d] (C-contiguous); panels: float32 [ceil(d_out / 16), d, 16],
            the map transposed ([d, d_out]) in column panels
            (:func:`vq.kernels.exact.coarse_probe.column_panels`); mean: float32 [d]
            subtracted first (zeros: none).
        out: float32 [nq, d_out].
    """
    queries, out = borrow(queries), borrow(out)
    n, dim = q1 - q0, queries.shape[1]
    centred = np.empty((n, dim), dtype=np.float32)
    for i in range(n):
        for j in range(dim):
            centred[i, j] = queries[q0 + i, j] - mean[j]
    products(centred, np.int64(0), n, panels, out.shape[1], out[q0:q1])


@kernel(nogil=True)
def nearest_lean(x, panels, c_norms, out_codes):
    """The nearest centroid of each of a few vectors, on the calling thread (the lean path of
    a vector quantizer's ``encode``): ``x`` float32 [n, d], ``panels`` [ceil(K / 16), d, 16]
    (the centroids transposed, in column panels), ``c_norms`` [K] their squared norms →
    ``out_codes`` [n] (any integer dtype; ties to the lower index). Distances are computed
    directly, not through a matrix product, so a near-tie may go the other way than in a
    large batch (faiss's ``distance_compute_blas_threshold`` does the same). False (and
    nothing done) if a vector holds a NaN or an infinity."""
    if not all_finite(x):
        return False
    n = x.shape[0]
    scores = np.empty((n, 1), dtype=np.float32)
    lists = np.empty((n, 1), dtype=np.int64)
    probe_lists(x, panels, c_norms, L2, scores, lists)
    for i in range(n):
        out_codes[i] = lists[i, 0]
    return True


@kernel(nogil=True, fastmath=False)
def all_finite(x):
    """Whether every value of the float32 array ``x`` [n, d] is finite (one pass, no
    temporary: ``np.isfinite(x).all()`` costs a few µs more on a small array). A row at a
    time without a branch per value (``v - v`` is 0 but for NaN and ±inf), so that the
    loop is vector code (a test and exit per value is several times slower). ``fastmath=False`` said
    outright: numba compiles a function called from a kernel with the caller's fastmath
    unless the function sets its own, and fastmath assumes there is no NaN or infinity
    (this test would always pass)."""
    for i in range(x.shape[0]):
        bad = False
        for j in range(x.shape[1]):
            v = x[i, j]
            bad |= (v - v) != np.float32(0.0)
        if bad:
            return False
    return True


@kernel(nogil=True)
def ivf_flat_lean(queries, coarse, lists, finish, inner_product, nprobe, k_candidates, out, ranked):
    """A search of a few queries in an IVF-Flat index on the calling thread in one call, from
    the coarse step to ids (the lean path): :func:`~vq.kernels.exact.coarse_probe.probe_few`
    over ``coarse``, :func:`vq.kernels.exact.ivf_flat.ivf_flat_range` over the ``nprobe``
    lists of ``lists`` for the ``k_candidates`` nearest, then
    :func:`vq.kernels.exact.exact_scans.finish_lean` (ids, or the re-ranking of a wrapping
    ``Refine``): ``out`` = (distances float32 [nq, k] ascending, negated back to inner
    products with ``inner_product``, +inf / -inf padding; ids int64 [nq, k], -1 padding).
    Returns False (and does nothing) if a query holds a NaN or an infinity.

    ``coarse``, ``lists``, ``finish`` and ``out``: a
    :class:`~vq.kernels.common.bundles.Coarse`, :class:`~vq.kernels.common.bundles.FlatLists`,
    :class:`~vq.kernels.common.bundles.Finish` and (out_dist, out_ids), as plain tuples
    (:mod:`vq.kernels.common.bundles`); ``ranked`` is not read (results are always ranked)."""
    coarse, lists = borrow(Coarse(*coarse)), borrow(FlatLists(*lists))
    finish = borrow(Finish(*finish))  # (borrowed: no reference counts in the calls below)
    out_dist, out_ids = out
    if not all_finite(queries):
        return False
    nq, k = queries.shape[0], k_candidates
    _, probes = probe_few(queries, coarse, nprobe, inner_product)
    found = TopK(np.empty((nq, k), dtype=np.float32), np.empty((nq, k), dtype=np.int64))
    no_filter = np.zeros(0, dtype=np.uint8)  # (not a global: typed read-only, it would
    # compile the range kernel a second time, beside the general path's)
    ivf_flat_range(
        np.int64(0), np.int64(nq), queries, lists, probes, no_filter, inner_product, found
    )
    finish_lean(queries, found.distances, found.labels, finish, inner_product, out_dist, out_ids)
    return True
