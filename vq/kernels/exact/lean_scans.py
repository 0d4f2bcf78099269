"""Kernels of the lean path: a search of a few queries on the calling thread (or, for a large
flat scan, split by rows between threads), called straight from numpy arrays with no matrix
product, torch tensor or thread-pool wake-up before them.

- :func:`flat_lean`: a whole flat search of a few queries in one call; :func:`flat_finish`
  merges the parts of a split one.
- :func:`flat_rows`: exact distances of rows ``r0..r1`` to a few queries into per-query heaps,
  each stored vector read once for all the queries; :func:`flat_parts` splits the rows.
- :func:`probe_lists`: the coarse step of an IVF search, inner products with the centroids
  (:func:`products`) and the ``nprobe`` nearest, as :func:`vq.kernels.smallest_k_rows` ranks
  them; :func:`project_range`: a pre-transform's map of a few queries.
- :func:`ivf_flat_lean`: a whole IVF-Flat search of a few queries in one call.
- :func:`nearest_lean`: a vector quantizer's encode of a few vectors.
- :func:`all_finite`: the input check.

Each numpy operation on a small array costs a microsecond or more in Python, about what one
of these calls costs: the lean path hands whole steps to kernels instead.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from vq.kernels.common.constants import L2, metric
from vq.kernels.common.dots import (
    DOT_COLUMNS,
    DOT_ROWS,
    column_dots16,
    column_dots_rows,
    column_dots_wide,
)
from vq.kernels.common.heaps import EMPTY_KEY, heap_replace_top_row, heap_sorted
from vq.kernels.common.select import _insert, _smallest_k_row, row_scratch
from vq.kernels.common.simd import borrow
from vq.kernels.common.threads import parallel_for
from vq.kernels.exact.exact_scans import finish_lean, ivf_flat_range
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
            flat_rows(queries, vectors, x_norms, inner_product, r0, min(n, r0 + per), heap_d[p],
                      heap_i[p])  # fmt: skip

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
    flat_rows(queries, vectors, x_norms, inner_product, np.int64(0), np.int64(vectors.shape[0]),
              heap_d[0], heap_i[0])  # fmt: skip
    flat_finish(heap_d, heap_i, queries, ids, inner_product, out_dist, out_ids)
    return True


@kernel(nogil=True, fastmath=True)
def probe_lists(queries, centroids_t, c_norms, inner_product, out_scores, out_lists):
    """The ``nprobe`` nearest centroids of each query, on the calling thread.

    Args:
        queries: float32 [nq, d]; centroids_t: float32 [d, nlist], the centroids transposed
            (the products of 16 centroids then take one vector step per dimension, with no
            sum across a vector); c_norms: float32 [nlist], their squared norms (read for l2).
        inner_product: rank by -⟨q, c⟩ rather than by squared L2 distance.
        out_scores: float32 [nq, nprobe], ascending: ‖q - c‖² clamped at 0, or -⟨q, c⟩;
            out_lists: int64 [nq, nprobe], their centroids (ties by lower number).

    The products, up to :data:`PROBE_COLUMNS` centroids:
    :func:`vq.kernels.common.dots.column_dots_rows`
    over ``DOT_COLUMNS`` centroids and ``DOT_ROWS`` queries at a time (4 x 64 with AVX-512:
    3x one query by 64 columns, which was 2x numba's loop, at 256 x 128), for up to
    :data:`PROBE_QUERIES` queries in turn, so that those centroids stay in cache for all
    of them. More centroids: numba's loop, a query at a time (with rows of more than 4 KiB
    the strided reads of 64 columns contend for the same cache sets, and the registers no
    longer pay: 0.9-1.3x at 2,048-4,096 centroids).
    """
    queries, out_scores, out_lists = borrow(queries), borrow(out_scores), borrow(out_lists)
    nq = queries.shape[0]
    nlist = centroids_t.shape[1]
    rows = np.empty((min(nq, PROBE_QUERIES), nlist), dtype=np.float32)
    values = row_scratch(nlist)
    held = nlist <= PROBE_COLUMNS
    for q0 in range(0, nq, PROBE_QUERIES):
        q1 = min(nq, q0 + PROBE_QUERIES)
        products(queries, q0, q1, centroids_t, held, rows)
        for q in range(q0, q1):
            _smallest_k_row(rows[q - q0], queries[q], c_norms, inner_product, out_scores[q],
                            out_lists[q], values)  # fmt: skip


@njit(nogil=True, fastmath=True)
def products(queries, q0, q1, columns_t, held, out):
    """``out[i - q0] = queries[i] @ columns_t`` for i in ``q0..q1``: queries float32 [nq, d]
    (C-contiguous), columns_t float32 [d, n], out float32 [>= q1 - q0, n]. ``held``: sums in
    vector registers (:func:`vq.kernels.common.dots.column_dots_rows` over ``DOT_COLUMNS`` columns
    and ``DOT_ROWS`` queries at a time, then 16 columns), the rest by numba's loop (all of
    them without ``held``). Each product is the same whichever way it is computed for the
    same ``held`` and n."""
    dim, n = queries.shape[1], columns_t.shape[1]
    wide, blocks = n - n % DOT_COLUMNS, n - n % 16
    first = 0
    if held:
        for c in range(0, wide, DOT_COLUMNS):  # sums in registers over all of a query
            q = q0
            while q + DOT_ROWS <= q1:  # several queries at a time
                column_dots_rows(queries, q * dim, dim, columns_t, c, out, (q - q0) * n + c, n)
                q += DOT_ROWS
            for r in range(q, q1):
                column_dots_wide(queries, r * dim, columns_t, c, out, (r - q0) * n + c)
        for q in range(q0, q1):
            for c in range(wide, blocks, 16):
                column_dots16(queries, q * dim, columns_t, c, out[q - q0], c)
        first = blocks
    for q in range(q0, q1):
        rest = out[q - q0, first:]  # (a loop from a variable start does not vectorise: 4x)
        for c in range(n - first):
            rest[c] = 0.0
        for j in range(dim):
            xj = queries[q, j]
            columns = columns_t[j, first:]
            for c in range(n - first):
                rest[c] += xj * columns[c]


@kernel(nogil=True)
def project_range(q0, q1, queries, matrix_t, mean, out):
    """``out[q] = (queries[q] - mean) @ matrix_t`` for q in ``q0..q1`` on the calling thread: a
    pre-transform's map of a few queries (:class:`vq.PreTransform`'s lean path), with no
    matrix product of a BLAS library (whose threads then spin on the cores the search needs).

    Args:
        queries: float32 [nq, d] (C-contiguous); matrix_t: float32 [d, d_out], the map
            transposed; mean: float32 [d] subtracted first (zeros: none).
        out: float32 [nq, d_out].
    """
    queries, out = borrow(queries), borrow(out)
    n, dim = q1 - q0, queries.shape[1]
    centred = np.empty((n, dim), dtype=np.float32)
    for i in range(n):
        for j in range(dim):
            centred[i, j] = queries[q0 + i, j] - mean[j]
    products(centred, np.int64(0), n, matrix_t, matrix_t.shape[1] <= PROBE_COLUMNS, out[q0:q1])


#: probe_lists computes the products of this many queries with each group of centroids
PROBE_QUERIES = 16
#: and holds sums in registers up to this many centroids
PROBE_COLUMNS = 1024


@kernel(nogil=True)
def nearest_lean(x, centroids_t, c_norms, out_codes):
    """The nearest centroid of each of a few vectors, on the calling thread (the lean path of
    a vector quantizer's ``encode``): ``x`` float32 [n, d], ``centroids_t`` [d, K] (the
    centroids transposed), ``c_norms`` [K] their squared norms → ``out_codes`` [n] (any
    integer dtype; ties to the lower index). Distances are computed directly, not through a
    matrix product, so a near-tie may go the other way than in a large batch (faiss's
    ``distance_compute_blas_threshold`` does the same). False (and nothing done) if a vector
    holds a NaN or an infinity."""
    if not all_finite(x):
        return False
    n = x.shape[0]
    scores = np.empty((n, 1), dtype=np.float32)
    lists = np.empty((n, 1), dtype=np.int64)
    probe_lists(x, centroids_t, c_norms, L2, scores, lists)
    for i in range(n):
        out_codes[i] = lists[i, 0]
    return True


@kernel(nogil=True, fastmath=False)
def all_finite(x):
    """Whether every value of the float32 array ``x`` [n, d] is finite (one pass, no
    temporary: ``np.isfinite(x).all()`` costs a few µs more on a small array). A row at a
    time without a branch per value (``v - v`` is 0 but for NaN and ±inf), so that the
    loop is vector code: 3.8 µs for 330 × 128 queries where a test and exit per value took
    18.6 (Zen 3), a 20th of an HNSW search of them on one thread. ``fastmath=False`` said
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


@njit(nogil=True)
def probe_few(queries, coarse, nprobe, inner_product):
    """The coarse step of a lean IVF search into new arrays: the scores float32 [nq, nprobe]
    and the lists int64 [nq, nprobe]. ``coarse`` = (centroids_t float32 [d, nlist], c_norms
    float32 [nlist], *bound): :func:`probe_bounded` where ``bound`` (the four arrays it
    takes) has axes, the metric is L2 and there are at least ``BOUND_RATIO`` centroids for
    each it computes first, else :func:`probe_lists`."""
    nq = queries.shape[0]
    scores = np.empty((nq, nprobe), dtype=np.float32)
    probes = np.empty((nq, nprobe), dtype=np.int64)
    centroids_t, c_norms, axes_t, proj_t, proj_norms, rows = coarse
    few = c_norms.shape[0] < BOUND_RATIO * (nprobe + BOUND_SPARE)
    if inner_product or axes_t.shape[1] == 0 or few:
        probe_lists(queries, centroids_t, c_norms, inner_product, scores, probes)
    else:
        probe_bounded(queries, centroids_t, c_norms, axes_t, proj_t, proj_norms, rows, scores,
                      probes)  # fmt: skip
    return scores, probes


#: probe_bounded computes the exact distances of this many more centroids than nprobe first
BOUND_SPARE = 4
#: and takes over from probe_lists where there are at least this many centroids for each of
#: those (Zen 1, one core, 128 dimensions: 256 centroids 2.6 -> 2.1 us a query at nprobe 1,
#: equal at 4, slower at 12; 1,024 centroids 14.1 -> 6.4 at nprobe 1, 15.8 -> 9.9 at 12)
BOUND_RATIO = 32
#: and takes the whole coarse step for a query whose bound leaves more than this many
BOUND_MOST = 64


@njit(nogil=True, fastmath=True)
def probe_bounded(queries, centroids_t, c_norms, axes_t, proj_t, proj_norms, rows, out_scores,
                  out_lists):  # fmt: skip
    """:func:`probe_lists` (L2) with most centroids ruled out by a lower bound: the distance
    between the query's and a centroid's coordinates on a few orthonormal axes (the
    centroids' principal axes: :func:`vq.index.ivf.ivf_index.coarse_bound`) is at most their
    distance. The ``nprobe + BOUND_SPARE`` centroids of least bound get exact distances; T is the
    nprobe-th least of those; every other centroid whose bound is within a rounding margin
    of T gets one too; the ``nprobe`` least exact distances are the result. The same lists
    as :func:`probe_lists` (and the same scores, up to the order of a float32 sum: a near-tie
    may go the other way, as between this and the general path's BLAS products).

    Args:
        queries, centroids_t, c_norms, out_scores, out_lists: as :func:`probe_lists`'s.
        axes_t: float32 [d, r], the axes as columns; proj_t: float32 [r, nlist], the
            centroids' coordinates on them; proj_norms: float32 [nlist], their squared
            norms; rows: float32 [nlist, d], the centroids (C-contiguous).

    Work per query: d r + nlist r + (nprobe + a few) d products instead of nlist d (NSynth
    embeddings, 256 centroids of 128 dims, 32 axes: about 5 exact distances at nprobe 3 and
    18 at nprobe 12).
    """
    nq, dim = queries.shape
    nlist, r = c_norms.shape[0], axes_t.shape[1]
    nprobe = out_scores.shape[1]
    m = nprobe + BOUND_SPARE
    block = min(nq, PROBE_QUERIES)
    coords = np.empty((block, r), dtype=np.float32)
    bounds = np.empty((block, nlist), dtype=np.float32)
    values = row_scratch(nlist)
    near_d, near_i = np.empty(m, dtype=np.float32), np.empty(m, dtype=np.int64)
    exact = np.empty(nlist, dtype=np.float32)
    stamp = np.zeros(nlist, dtype=np.int64)
    picked = np.empty(BOUND_MOST, dtype=np.int64)
    full = np.empty((1, nlist), dtype=np.float32)
    c_max = np.float32(0.0)
    for c in range(nlist):
        c_max = max(c_max, c_norms[c])
    for q0 in range(0, nq, PROBE_QUERIES):
        q1 = min(nq, q0 + PROBE_QUERIES)
        products(queries, q0, q1, axes_t, r <= PROBE_COLUMNS, coords)
        products(coords, np.int64(0), q1 - q0, proj_t, nlist <= PROBE_COLUMNS, bounds)
        for q in range(q0, q1):
            x = queries[q]
            # values: every centroid's bound as probe_lists ranks it (near_*: the m least)
            _smallest_k_row(bounds[q - q0], coords[q - q0], proj_norms, L2, near_d, near_i,
                            values)  # fmt: skip
            q_norm = np.float32(0.0)
            for j in range(dim):
                q_norm += x[j] * x[j]
            # the nprobe-th least exact distance among the m of least bound
            for j in range(m):
                c = near_i[j]
                exact[c] = _exact_score(x, q_norm, rows, c_norms, c)
                stamp[c] = q + 1
                near_d[j] = exact[c]
            _sort_values(near_d)
            limit = near_d[nprobe - 1] + (dim + r + 16) * np.float32(2.0**-20) * (q_norm + c_max)
            count = 0
            for c in range(nlist):  # every centroid whose bound is below the limit, in order
                if values[c] <= limit:
                    if count == BOUND_MOST:
                        break
                    if stamp[c] != q + 1:
                        exact[c] = _exact_score(x, q_norm, rows, c_norms, c)
                    picked[count] = c
                    count += 1
            if count == BOUND_MOST or count < nprobe:  # a loose bound (or no finite one)
                products(queries, q, q + 1, centroids_t, nlist <= PROBE_COLUMNS, full)
                _smallest_k_row(full[0], x, c_norms, L2, out_scores[q], out_lists[q], values)
                continue
            size = 0
            for j in range(count):  # in column order: ties to the lower centroid
                c = picked[j]
                if size < nprobe or exact[c] < out_scores[q, nprobe - 1]:
                    size = _insert(out_scores[q], out_lists[q], size, exact[c], c)


@njit(inline="always", fastmath=True)
def _exact_score(x, q_norm, rows, c_norms, c):
    """‖x - c‖² as :func:`probe_lists` ranks it: ‖x‖² + ‖c‖² - 2 ⟨x, c⟩, clamped at 0."""
    dot = np.float32(0.0)
    for j in range(x.shape[0]):
        dot += x[j] * rows[c, j]
    return max((q_norm + c_norms[c]) - np.float32(2.0) * dot, np.float32(0.0))


@njit(inline="always")
def _sort_values(v):
    for a in range(1, v.shape[0]):  # (a few values: insertion)
        t = v[a]
        b = a - 1
        while b >= 0 and v[b] > t:
            v[b + 1] = v[b]
            b -= 1
        v[b + 1] = t


@kernel(nogil=True)
def ivf_flat_lean(queries, coarse, nprobe, vectors, offsets, prune, row_ids, sketch, ids,
                  inner_product, ref_vectors, ref_ids, k_candidates, out_dist, out_ids,
                  ranked):  # fmt: skip
    """A search of a few queries in an IVF-Flat index on the calling thread in one call, from
    the coarse step to ids (the lean path): :func:`probe_few` (``coarse`` as it takes it),
    :func:`vq.kernels.ivf_flat_range` over the ``nprobe`` lists of ``vectors`` [n, d] (CSR
    ``offsets``; ``prune``: heads first; ``row_ids``: each id once, for spilled lists, or
    [0]; ``sketch``: the rows' sketches, or :data:`vq.kernels.exact.exact_scans.NO_SKETCH`) for the
    ``k_candidates`` nearest, then :func:`vq.kernels.exact.exact_scans.finish_lean` (ids, or
    the re-ranking of a wrapping ``Refine`` with ``ref_vectors``/``ref_ids``): ``out_dist``
    float32 [nq, k] ascending (negated back to inner products with ``inner_product``; +inf /
    -inf padding), ``out_ids`` int64 [nq, k] (-1 padding). Returns False (and does nothing)
    if a query holds a NaN or an infinity."""
    if not all_finite(queries):
        return False
    nq, k = queries.shape[0], k_candidates
    _, probes = probe_few(queries, coarse, nprobe, inner_product)
    dist, rows = np.empty((nq, k), dtype=np.float32), np.empty((nq, k), dtype=np.int64)
    ivf_flat_range(np.int64(0), np.int64(nq), queries, vectors, probes, offsets,
                   np.zeros(0, dtype=np.uint8), inner_product, dist, rows, prune,
                   row_ids, sketch)  # fmt: skip
    finish_lean(queries, dist, rows, ids, inner_product, ref_vectors, ref_ids, out_dist, out_ids)
    return True
