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


def flat_range_block(scores, x_norms, first, thresholds, allowed, inner_product, out_rows,
                     out_dist, counts):  # fmt: skip
    """The hits of a block of a Flat search: scores float32 [nq, b] (⟨q, x⟩ of vectors
    ``first .. first + b``), x_norms float32 [b] (l2), thresholds float32 [nq] on ``‖x‖² −
    2⟨q, x⟩`` (l2: the radius minus ‖q‖²) or on ``−⟨q, x⟩`` (ip), allowed uint8 [b] or [0]
    → out_rows int64 [nq, b], out_dist float32 [nq, b] (the ranked values) and counts int64
    [nq]: query q's hits are the first counts[q] entries of its row."""
    parallel_for(flat_range_rows, scores.shape[0], scores, x_norms, int(first), thresholds,
                 allowed, metric(inner_product), out_rows, out_dist, counts)  # fmt: skip


@kernel(nogil=True, fastmath=True)
def flat_range_rows(q0, q1, scores, x_norms, first, thresholds, allowed, inner_product,
                    out_rows, out_dist, counts):  # fmt: skip
    """:func:`flat_range_block` for queries ``q0..q1`` on the calling thread."""
    scores, out_rows, out_dist = borrow(scores), borrow(out_rows), borrow(out_dist)
    filtered = allowed.shape[0] > 0
    for q in range(q0, q1):
        t = thresholds[q]
        c = 0
        for i in range(scores.shape[1]):
            s = scores[q, i]
            d = -s if inner_product else x_norms[i] - np.float32(2.0) * s
            if d < t and (not filtered or allowed[i] != 0):
                out_rows[q, c] = first + i
                out_dist[q, c] = d
                c += 1
        counts[q] = c


def ivf_flat_range_search(queries, vectors, probes, offsets, starts, thresholds, allowed,
                          inner_product, out_rows, out_dist, counts):  # fmt: skip
    """The hits of an IVF-Flat search: exact values of the rows of the probed lists
    (``probes`` int64 [nq, nprobe], -1: skip; CSR ``offsets``) below ``thresholds`` float32
    [nq] (squared L2, or negated inner products), of those ``allowed`` uint8 [n] (or [0])
    lets through → query q's region of out_rows int64 / out_dist float32 [total] starts at
    ``starts[q]`` (int64 [nq], room for every row it probes); counts int64 [nq]."""
    parallel_for(ivf_flat_range_rows, probes.shape[0], queries, vectors, probes, offsets, starts,
                 thresholds, allowed, metric(inner_product), out_rows, out_dist,
                 counts)  # fmt: skip


@kernel(nogil=True, fastmath=True)
def ivf_flat_range_rows(q0, q1, queries, vectors, probes, offsets, starts, thresholds, allowed,
                        inner_product, out_rows, out_dist, counts):  # fmt: skip
    """:func:`ivf_flat_range_search` for queries ``q0..q1`` on the calling thread."""
    queries = borrow(queries)
    if inner_product:  # the metric a constant in each copy (see exact_distance)
        _flat_hits(q0, q1, queries, vectors, probes, offsets, starts, thresholds, allowed, True,
                   out_rows, out_dist, counts)  # fmt: skip
    else:
        _flat_hits(q0, q1, queries, vectors, probes, offsets, starts, thresholds, allowed, False,
                   out_rows, out_dist, counts)  # fmt: skip


@njit(inline="always", fastmath=True)
def _flat_hits(q0, q1, queries, vectors, probes, offsets, starts, thresholds, allowed,
               inner_product, out_rows, out_dist, counts):  # fmt: skip
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


def sq_hits(queries, probes, offsets, codes, centroids, by_residual, offset, scale,
            kind, starts, thresholds, allowed, inner_product, out_rows, out_dist,
            counts):  # fmt: skip
    """Range search (faiss ``range_search`` of ``IndexScalarQuantizer`` /
    ``IndexIVFScalarQuantizer``): the rows of the probed lists whose value (the top-k scans':
    squared L2, or negated inner product) is below ``thresholds[q]`` float32 [nq], written
    from ``starts[q]`` (int64 [nq]: room for every row query q probes) of out_rows int64 /
    out_dist float32 [total], their number into counts int64 [nq]. The other arguments are
    :func:`vq.kernels.sq.sq_scans.sq_ivf_scan`'s; a flat code array is one list (offsets [0, n],
    probes zeros [nq, 1], by_residual False). Threads split the queries."""
    parallel_for(sq_hits_range, queries.shape[0], queries, probes, offsets, codes, centroids,
                 bool(by_residual), offset, scale, sq_kind(kind), starts, thresholds,
                 allowed, metric(inner_product), out_rows, out_dist, counts)  # fmt: skip


@kernel(nogil=True, fastmath=True)
def sq_hits_range(q0, q1, queries, probes, offsets, codes, centroids, by_residual, offset,
                  scale, kind, starts, thresholds, allowed, inner_product, out_rows,
                  out_dist, counts):  # fmt: skip
    """:func:`sq_hits` for queries ``q0..q1`` (int64) on the calling thread."""
    queries, codes = borrow(queries), borrow(codes)
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
            c = _hits_rows(codes, offsets[lst], offsets[lst + 1], qa, const, scale, kind,
                           inner_product, allowed, thresholds[q], out_rows, out_dist, c,
                           buf)  # fmt: skip
        counts[q] = c - starts[q]


@njit(inline="always")
def _hits_rows(codes, r0, r1, qa, const, scale, kind, inner_product, allowed, t,
               out_rows, out_dist, c, buf):  # fmt: skip
    """Rows ``r0..r1`` below ``t`` written from slot ``c`` of out_rows / out_dist, distances
    computed :data:`BLOCK` rows at a time as the top-k scan does (the kind a
    :func:`vq.kernels.sq.sq_scans.sq_kind`); returns the next slot."""
    filtered = allowed.shape[0] > 0
    for s in range(r0, r1, BLOCK):
        e = min(s + BLOCK, r1)
        block_distances(codes, s, e, qa, scale, kind, inner_product, buf)
        for i in range(s, e):
            acc = buf[i - s]
            dist = -(const + acc) if inner_product else acc
            if dist < t and (not filtered or allowed[i] != 0):
                out_rows[c] = i
                out_dist[c] = dist
                c += 1
    return c
