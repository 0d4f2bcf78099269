"""The coarse step of a lean IVF search on the calling thread: the ``nprobe`` nearest centroids
of each of a few queries, from inner products computed here (no matrix product of a BLAS
library, whose threads would spin on the cores the search needs).

- :func:`probe_lists`: every centroid's score, and the ``nprobe`` least (as
  :func:`vq.kernels.smallest_k_rows` ranks them);
- :func:`probe_bounded`: the same lists with most centroids ruled out by a lower bound on a
  few principal axes (:class:`~vq.kernels.common.bundles.Coarse` holds them);
- :func:`probe_few`: the one the lean kernels call, which picks between the two;
- :func:`products`: the inner products of a block of queries with columns, shared with a
  pre-transform's map (:func:`vq.kernels.exact.lean_scans.project_range`).

Each is a disk-cached kernel of its own, called by the lean kernels of every IVF kind: a
process that compiles one of those loads these from the cache rather than compiling them
again (about 7 s of numba for the four).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from vq.kernels.common.constants import L2
from vq.kernels.common.dots import (
    DOT_COLUMNS,
    DOT_ROWS,
    column_dots16,
    column_dots_rows,
    column_dots_wide,
)
from vq.kernels.common.select import _insert, _smallest_k_row, row_scratch
from vq.kernels.common.simd import borrow
from vq.kernels.jit.cache import kernel

#: probe_lists computes the products of this many queries with each group of centroids
PROBE_QUERIES = 16
#: and holds sums in registers up to this many centroids (numba's loop, a query at a time, past
#: it: with several queries sharing each load of the columns, the registers pay at any nlist)
PROBE_COLUMNS = 1 << 16
#: probe_bounded computes the exact distances of this many more centroids than nprobe first
BOUND_SPARE = 4
#: and takes over from probe_lists where there are at least this many centroids for each of
#: those (below, computing every centroid's distance costs less than the bound)
BOUND_RATIO = 32
#: and takes the whole coarse step for a query whose bound leaves more than this many
BOUND_MOST = 64


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

    The products, up to :data:`PROBE_COLUMNS` centroids, hold their sums in vector registers
    (:func:`vq.kernels.common.dots.column_dots_rows` over ``DOT_COLUMNS`` centroids and
    ``DOT_ROWS`` queries at a time), for up to :data:`PROBE_QUERIES` queries in turn, so that
    those centroids stay in cache for all of them; with more centroids, numba's loop, a query
    at a time.
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
            _smallest_k_row(
                rows[q - q0],
                queries[q],
                c_norms,
                inner_product,
                out_scores[q],
                out_lists[q],
                values,
            )


@kernel(nogil=True, fastmath=True)
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
        rest = out[q - q0, first:]  # (a loop from a variable start does not vectorise)
        for c in range(n - first):
            rest[c] = 0.0
        for j in range(dim):
            xj = queries[q, j]
            columns = columns_t[j, first:]
            for c in range(n - first):
                rest[c] += xj * columns[c]


@kernel(nogil=True)
def probe_few(queries, coarse, nprobe, inner_product):
    """The coarse step of a lean IVF search into new arrays: the scores float32 [nq, nprobe]
    and the lists int64 [nq, nprobe]. ``coarse``: a :class:`~vq.kernels.common.bundles.Coarse`;
    :func:`probe_bounded` where it has a bound (axes), the metric is L2 and there are at least
    ``BOUND_RATIO`` centroids for each it computes first, else :func:`probe_lists`."""
    nq = queries.shape[0]
    scores = np.empty((nq, nprobe), dtype=np.float32)
    probes = np.empty((nq, nprobe), dtype=np.int64)
    few = coarse.norms.shape[0] < BOUND_RATIO * (nprobe + BOUND_SPARE)
    if inner_product or coarse.axes_t.shape[1] == 0 or few:
        probe_lists(queries, coarse.centroids_t, coarse.norms, inner_product, scores, probes)
    else:
        probe_bounded(queries, coarse, scores, probes)
    return scores, probes


@kernel(nogil=True, fastmath=True)
def probe_bounded(queries, coarse, out_scores, out_lists):
    """:func:`probe_lists` (L2) with most centroids ruled out by a lower bound: the distance
    between the query's and a centroid's coordinates on a few orthonormal axes (the
    centroids' principal axes: :func:`vq.index.ivf.ivf_index.coarse_bound`) is at most their
    distance. The ``nprobe + BOUND_SPARE`` centroids of least bound get exact distances; T is
    the nprobe-th least of those; every other centroid whose bound is within a rounding margin
    of T gets one too; the ``nprobe`` least exact distances are the result. The same lists
    as :func:`probe_lists` (and the same scores, up to the order of a float32 sum: a near-tie
    may go the other way, as between this and the general path's BLAS products).

    Args:
        queries, out_scores, out_lists: as :func:`probe_lists`'s.
        coarse: a :class:`~vq.kernels.common.bundles.Coarse` whose bound has axes (r > 0).

    Work per query: d r + nlist r + (nprobe + a few) d products instead of nlist d.
    """
    nq, dim = queries.shape
    centroids_t, c_norms, axes_t, proj_t, proj_norms, rows = coarse
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
            _smallest_k_row(bounds[q - q0], coords[q - q0], proj_norms, L2, near_d, near_i, values)
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
