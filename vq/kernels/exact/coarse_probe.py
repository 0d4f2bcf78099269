"""The coarse step of a lean IVF search on the calling thread: the ``nprobe`` nearest centroids
of each of a few queries, from inner products computed here (no matrix product of a BLAS
library, whose threads would spin on the cores the search needs).

- :func:`probe_lists`: every centroid's score, and the ``nprobe`` least (as
  :func:`vq.kernels.smallest_k_rows` ranks them);
- :func:`probe_bounded`: the same lists with most centroids ruled out by a lower bound on a
  few principal axes (:class:`~vq.kernels.common.bundles.Coarse` holds them);
- :func:`probe_few`: the one the lean kernels call, which picks between the two;
- :func:`products`: the inner products of a block of queries with columns laid out as
  :func:`column_panels` lays them, shared with a pre-transform's map
  (:func:`vq.kernels.exact.lean_scans.project_range`).

Each is a disk-cached kernel of its own, called by the lean kernels of every IVF kind: a
process that compiles one of those loads these from the cache rather than compiling them
again (about 7 s of numba for the four).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from vq.kernels.common.constants import L2
from vq.kernels.common.dots import (
    DOT_BLOCKS,
    DOT_ROWS,
    ONE_BLOCKS,
    PANEL,
    panel_dots16,
    panel_dots_block,
    panel_dots_one,
    panel_dots_rows,
)
from vq.kernels.common.select import _insert, _smallest_k_row, row_scratch
from vq.kernels.common.simd import borrow
from vq.kernels.jit.cache import kernel

#: probe_lists computes the products of this many queries with each panel of centroids (while
#: the panel stays in the nearest cache), ``DOT_ROWS`` at a time
PROBE_QUERIES = 4 * DOT_ROWS
#: probe_bounded computes the exact distances of this many more centroids than nprobe first
BOUND_SPARE = 4
#: and takes over from probe_lists where there are at least this many centroids for each of
#: those (below, computing every centroid's distance costs less than the bound)
BOUND_RATIO = 32
#: and takes the whole coarse step for a query whose bound leaves more than this many
BOUND_MOST = 64


def column_panels(columns_t: np.ndarray) -> np.ndarray:
    """The columns of ``columns_t`` (float32 [d, n]) as :func:`products` reads them: float32
    [ceil(n / 16), d, 16], C-contiguous, panel p holding columns 16 p .. 16 p + 15 row after
    row (``panels[p, j, l] = columns_t[j, 16 p + l]``), zeros past column n. Made once per
    matrix (the centroids of an index, a pre-transform's map), as a transposed copy is."""
    columns_t = np.asarray(columns_t, dtype=np.float32)
    if columns_t.ndim != 2:
        raise ValueError(f"column_panels expects a 2-d [d, n] array, got shape {columns_t.shape}")
    d, n = columns_t.shape
    count = -(-n // PANEL)
    padded = np.zeros((d, count * PANEL), dtype=np.float32)
    padded[:, :n] = columns_t
    return np.ascontiguousarray(padded.reshape(d, count, PANEL).transpose(1, 0, 2))


@kernel(nogil=True, fastmath=True)
def probe_lists(queries, panels, c_norms, inner_product, out_scores, out_lists):
    """The ``nprobe`` nearest centroids of each query, on the calling thread.

    Args:
        queries: float32 [nq, d]; panels: float32 [ceil(nlist / 16), d, 16], the centroids
            as :func:`column_panels` lays out their transpose; c_norms: float32 [nlist],
            their squared norms (read for l2; its length is nlist for either metric).
        inner_product: rank by -⟨q, c⟩ rather than by squared L2 distance.
        out_scores: float32 [nq, nprobe], ascending: ‖q - c‖² clamped at 0, or -⟨q, c⟩;
            out_lists: int64 [nq, nprobe], their centroids (ties by lower number).

    Raises ValueError where the panels do not match the queries' dimension or hold fewer
    columns than ``c_norms``, the dimension is 0, or the outputs are not [nq, nprobe] both
    (reading or writing past them would touch memory that is not theirs).

    The products (:func:`products`) of up to :data:`PROBE_QUERIES` queries at a time, each
    panel of 16 centroids read for all of them in turn while it stays in the nearest cache,
    then each query's ``nprobe`` least.
    """
    queries, out_scores, out_lists = borrow(queries), borrow(out_scores), borrow(out_lists)
    nq = queries.shape[0]
    nlist = c_norms.shape[0]
    if panels.shape[1] != queries.shape[1] or panels.shape[0] * PANEL < nlist:
        raise ValueError(
            "probe_lists: panels must be column_panels(centroids.T) of the centroids whose "
            "norms are c_norms, with the queries' dimension"
        )
    if queries.shape[1] < 1:
        raise ValueError("probe_lists: the queries and centroids must have a dimension >= 1")
    if (
        out_scores.shape[0] < nq
        or out_lists.shape[0] < nq
        or out_lists.shape[1] != out_scores.shape[1]
    ):
        raise ValueError(
            "probe_lists: out_scores and out_lists must both be [nq, nprobe], one row per query"
        )
    rows = np.empty((min(nq, PROBE_QUERIES), nlist), dtype=np.float32)
    values = row_scratch(nlist)
    for q0 in range(0, nq, PROBE_QUERIES):
        q1 = min(nq, q0 + PROBE_QUERIES)
        products(queries, q0, q1, panels, nlist, rows)
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
def products(queries, q0, q1, panels, n, out):
    """``out[i - q0, :n] = queries[i] @ columns_t`` for i in ``q0..q1``: queries float32 [nq, d]
    (C-contiguous, d >= 1), panels float32 [>= ceil(n / 16), d, 16] (the columns as
    :func:`column_panels` lays them out), out float32 [>= q1 - q0, >= n] (C-contiguous).

    Sums in vector registers (:mod:`vq.kernels.common.dots`): ``DOT_ROWS`` queries by
    ``DOT_BLOCKS`` panels at a time, each panel's loads serving every block of queries in turn;
    the queries past a multiple of ``DOT_ROWS`` one at a time by ``ONE_BLOCKS`` panels; the
    columns of a last, partial panel through a scratch row. Work: ``(q1 - q0) d n`` multiply-adds.
    Each product is the same, bit for bit, whichever way it is computed (the same terms in the
    same order)."""
    dim, width = queries.shape[1], out.shape[1]
    full = n // PANEL
    wide = full - full % DOT_BLOCKS
    main = q0 + (q1 - q0) // DOT_ROWS * DOT_ROWS
    for p in range(0, wide, DOT_BLOCKS):  # several queries at a time
        for q in range(q0, main, DOT_ROWS):
            panel_dots_rows(
                queries, q * dim, dim, panels, p, out, (q - q0) * width + p * PANEL, width
            )
    for p in range(wide, full):
        for q in range(q0, main, DOT_ROWS):
            panel_dots_block(
                queries, q * dim, dim, panels, p, out, (q - q0) * width + p * PANEL, width
            )
    one_wide = full - full % ONE_BLOCKS
    for q in range(main, q1):  # the rest, one query at a time
        for p in range(0, one_wide, ONE_BLOCKS):
            panel_dots_one(queries, q * dim, dim, panels, p, out, (q - q0) * width + p * PANEL, 0)
        for p in range(one_wide, full):
            panel_dots16(queries, q * dim, dim, panels, p, out, (q - q0) * width + p * PANEL, 0)
    if full * PANEL < n:  # the last panel's columns before n
        last = np.empty(PANEL, dtype=np.float32)
        for q in range(q0, q1):
            panel_dots16(queries, q * dim, dim, panels, full, last, 0, 0)
            for c in range(full * PANEL, n):
                out[q - q0, c] = last[c - full * PANEL]


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
    if inner_product or coarse.proj.shape[1] == 0 or few:
        probe_lists(queries, coarse.panels, coarse.norms, inner_product, scores, probes)
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
    panels, c_norms, axes, proj, proj_norms, rows = coarse
    nlist, r = c_norms.shape[0], proj.shape[1]
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
        products(queries, q0, q1, axes, r, coords)
        products(coords, np.int64(0), q1 - q0, proj, nlist, bounds)
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
                products(queries, q, q + 1, panels, nlist, full)
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
