"""Distances from float queries to scalar-quantizer codes (faiss's ``ScalarQuantizer`` bytes):
flat scans and inverted lists fused with top-k, and the one-row functions a graph traversal
calls.

The codes are uint8 [n, code_size], one of five kinds (the ``kind`` argument; the kernels take
it as :func:`sq_kind` gives it, a compile-time constant, so that each kind compiles its own
code: an IVF-SQ8 search compiles no 4-bit, 6-bit or 16-bit loop):

- ``SQ8``: one byte per dimension, the level l_j;
- ``SQ6``: four dimensions per three bytes (a little-endian 24-bit word, 6 bits each);
- ``SQ4``: two dimensions per byte, the even one in the low nibble;
- ``SQ_FP16``, ``SQ_BF16``: two bytes per dimension, a little-endian IEEE half (faiss's fp16)
  or bfloat16, decoded with integer operations that vectorise (no table look-up: a gather
  per dimension from a 65,536-entry table is slower).

Every kind decodes to ``x̂_j = offset_j + scale_j * v_j`` with v_j the level (``scale = vdiff
/ (2**bits - 1)``, ``offset = vmin + scale / 2``: the cell's centre) or the 16-bit value
(``scale = 1``, ``offset = 0``). A query is *prepared* once per code space: ``qa = q - c -
offset`` for squared L2 (c the list's centroid when the codes are residuals, else none), so
that the distance is ``Σ (qa_j - scale_j v_j)²``; ``qa = q * scale`` for inner products, with
the constant ``⟨q, c + offset⟩``, so that ``⟨q, x̂⟩ = const + Σ qa_j v_j``. These are the
numba twins of :func:`vq.quantizers.scalar_codes.sq_decode` (the same values up to float32
rounding) and are tested against the static searches built on it.

For kernels elsewhere (an HNSW traversal over SQ codes, say), two inlined njit functions:

``sq_prepare(q, centroid, offset, scale, inner_product, qa) -> float32``
    q, offset, scale float32 [d]; centroid float32 [d] or [0] (no centroid); writes ``qa``
    float32 [d] and returns the constant (0.0 for L2).

``sq_distance(codes, row, qa, const, scale, kind, inner_product) -> float32``
    The squared L2 distance, or the *negated* inner product (smaller is nearer in both), of
    the prepared query to row ``row`` of ``codes`` uint8 [n, code_size]; ``kind`` a
    :func:`sq_kind`.

Threads split the queries (:func:`vq.kernels.common.threads.parallel_for`); the ``*_range`` kernels
are one thread's share.
"""

from __future__ import annotations

import numpy as np
from numba import njit
from numba.core.errors import TypingError
from numba.extending import overload

from vq.kernels.common.bundles import Coarse, Finish, SQCodes, SQLists, TopK
from vq.kernels.common.constants import Static, metric, static_value
from vq.kernels.common.halves import half_value
from vq.kernels.common.heaps import heap_replace_top, heap_reset, heap_sorted
from vq.kernels.common.simd import borrow
from vq.kernels.common.threads import parallel_for
from vq.kernels.exact.coarse_probe import probe_few
from vq.kernels.exact.exact_scans import finish_lean, rows_to_ids
from vq.kernels.exact.lean_scans import all_finite
from vq.kernels.jit.cache import kernel

SQ8, SQ6, SQ4, SQ_FP16, SQ_BF16 = 0, 1, 2, 3, 4
_KINDS = tuple(
    Static(k, f"sq_kind({name})") for k, name in enumerate(("8", "6", "4", "fp16", "bf16"))
)


def sq_kind(kind) -> Static:
    """The kind (``SQ8`` … ``SQ_BF16``, or such a :class:`~vq.kernels.common.constants.Static`) as
    the kernels take it: a compile-time constant, so that each kind compiles its own kernel."""
    kind = int(kind)
    if not 0 <= kind < len(_KINDS):
        raise ValueError(f"unknown scalar-quantizer kind {kind}: expected SQ8 ... SQ_BF16 (0-4)")
    return _KINDS[kind]


_NO_CENTROID = np.zeros(0, np.float32)


@njit(inline="always", fastmath=True)
def sq_prepare(q, centroid, offset, scale, inner_product, qa):
    """The prepared query ``qa`` float32 [d] and its constant (see the module docstring)."""
    d = q.shape[0]
    const = np.float32(0.0)
    has_centroid = centroid.shape[0] > 0
    if inner_product:
        for j in range(d):
            qa[j] = q[j] * scale[j]
            const += q[j] * offset[j]
            if has_centroid:
                const += q[j] * centroid[j]
    else:
        for j in range(d):
            qa[j] = q[j] - offset[j]
            if has_centroid:
                qa[j] -= centroid[j]
    return const


@njit(inline="always", fastmath=True)
def _term(a, s, v, inner_product):
    if inner_product:
        return a * v
    diff = a - s * v
    return diff * diff


@njit(inline="always", fastmath=True)
def _sum8(codes, row, qa, scale, inner_product):
    acc = np.float32(0.0)
    if inner_product:
        for j in range(qa.shape[0]):
            acc += qa[j] * np.float32(codes[row, j])
    else:
        for j in range(qa.shape[0]):
            diff = qa[j] - scale[j] * np.float32(codes[row, j])
            acc += diff * diff
    return acc


@njit(inline="always", fastmath=True)
def _sum4(codes, row, qa, scale, inner_product):
    d = qa.shape[0]
    acc = np.float32(0.0)
    if inner_product:
        for b in range(d >> 1):
            byte = codes[row, b]
            acc += qa[2 * b] * np.float32(byte & 15) + qa[2 * b + 1] * np.float32(byte >> 4)
    else:
        for b in range(d >> 1):
            byte = codes[row, b]
            lo = qa[2 * b] - scale[2 * b] * np.float32(byte & 15)
            hi = qa[2 * b + 1] - scale[2 * b + 1] * np.float32(byte >> 4)
            acc += lo * lo + hi * hi
    if d & 1:
        j = d - 1
        acc += _term(qa[j], scale[j], np.float32(codes[row, j >> 1] & 15), inner_product)
    return acc


@njit(inline="always", fastmath=True)
def _sum6(codes, row, qa, scale, inner_product):
    d = qa.shape[0]
    size = codes.shape[1]
    acc = np.float32(0.0)
    full = d >> 2  # groups of four dimensions in three whole bytes
    for g in range(full):
        b = 3 * g
        word = np.int32(codes[row, b]) | (np.int32(codes[row, b + 1]) << 8)
        word |= np.int32(codes[row, b + 2]) << 16
        j = 4 * g
        acc += _term(qa[j], scale[j], np.float32(word & 63), inner_product)
        acc += _term(qa[j + 1], scale[j + 1], np.float32((word >> 6) & 63), inner_product)
        acc += _term(qa[j + 2], scale[j + 2], np.float32((word >> 12) & 63), inner_product)
        acc += _term(qa[j + 3], scale[j + 3], np.float32((word >> 18) & 63), inner_product)
    if d & 3:  # the last, partial group
        b = 3 * full
        word = np.int32(0)
        for i in range(min(3, size - b)):
            word |= np.int32(codes[row, b + i]) << (8 * i)
        for i in range(d & 3):
            j = 4 * full + i
            acc += _term(qa[j], scale[j], np.float32((word >> (6 * i)) & 63), inner_product)
    return acc


@njit(inline="always", fastmath=True)
def _sum_fp16(codes, row, qa, scale, inner_product):
    halves = codes[row].view(np.uint16)
    acc = np.float32(0.0)
    for j in range(qa.shape[0]):
        acc += _term(qa[j], scale[j], half_value(np.uint32(halves[j])), inner_product)
    return acc


@njit(inline="always", fastmath=True)
def _sum_bf16(codes, row, qa, scale, inner_product):
    words = codes[row].view(np.uint16)
    acc = np.float32(0.0)
    for j in range(qa.shape[0]):
        value = np.uint32(np.uint32(words[j]) << np.uint32(16)).view(np.float32)
        acc += _term(qa[j], scale[j], value, inner_product)
    return acc


#: each kind's sum, by kind
_SUMS = (_sum8, _sum6, _sum4, _sum_fp16, _sum_bf16)


def kind_sum(codes, row, qa, scale, kind, inner_product):
    """The sum over the dimensions of code row ``row`` of kind ``kind`` (a :func:`sq_kind`),
    before the constant and the sign (see the module docstring). In a kernel the kind is a
    compile-time constant: the overload below picks the kind's loop while typing, so a
    kernel holds that one loop."""
    return _SUMS[int(kind)](codes, row, qa, scale, inner_product)


@overload(kind_sum, inline="always", jit_options={"fastmath": True})
def _kind_sum(codes, row, qa, scale, kind, inner_product):
    value = static_value(kind)
    if value is None:
        raise TypingError(
            f"kind_sum: the scalar-quantizer kind must be a compile-time constant, got {kind}; "
            "pass vq.kernels.sq.sq_scans.sq_kind(kind)"
        )
    fn = _SUMS[int(value)]
    return lambda codes, row, qa, scale, kind, inner_product: fn(
        codes, row, qa, scale, inner_product
    )


@njit(inline="always", fastmath=True)
def sq_distance(codes, row, qa, const, scale, kind, inner_product):
    """Squared L2 distance or negated inner product of a prepared query to one code row (see
    the module docstring); ``kind`` a :func:`sq_kind`."""
    acc = kind_sum(codes, row, qa, scale, kind, inner_product)
    return -(const + acc) if inner_product else acc


#: rows whose distances a scan computes in one pass before offering them to the heap (a tight
#: loop per kind that vectorises, apart from the heap's branches)
BLOCK = 32


@njit(inline="always")
def block_distances(codes, r0, r1, qa, scale, kind, inner_product, out):
    """``out[i - r0]``: the kind's sum (before the constant and the sign) for rows r0..r1."""
    for i in range(r0, r1):
        out[i - r0] = kind_sum(codes, i, qa, scale, kind, inner_product)


@njit(inline="always")
def _push_rows(codes, r0, r1, query, kind, inner_product, allowed, heap, buf):
    """Offer rows ``r0..r1`` of ``codes`` (an :class:`~vq.kernels.common.bundles.SQCodes` or
    :class:`~vq.kernels.common.bundles.SQLists`: its codes and scale) to the max-heap ``heap``
    = (distances, rows), :data:`BLOCK` at a time (``buf`` float32 [BLOCK]), for the prepared
    ``query`` = (qa, const), the kind (a :func:`sq_kind`) a constant: a loop holding every
    kind's code runs several times slower. Rows whose ``allowed`` byte is 0 are skipped
    (``allowed`` empty: none is); the filter is read only for rows that would enter the heap,
    so that an unfiltered scan and a dense filter pay nearly nothing for it."""
    qa, const = query
    heap_d, heap_i = heap
    filtered = allowed.shape[0] > 0
    threshold = heap_d[0]
    for s in range(r0, r1, BLOCK):
        e = min(s + BLOCK, r1)
        block_distances(codes.codes, s, e, qa, codes.scale, kind, inner_product, buf)
        for i in range(s, e):
            acc = buf[i - s]
            dist = -(const + acc) if inner_product else acc
            if dist < threshold and (not filtered or allowed[i] != 0):
                heap_replace_top(heap_d, heap_i, dist, i)
                threshold = heap_d[0]


def sq_flat_scan(queries, codes, kind, allowed, inner_product, out):
    """Distances to every code row fused with top-k (faiss ``IndexScalarQuantizer``'s
    search); threads split the queries.

    Args:
        queries: float32 [nq, d].
        codes: an :class:`~vq.kernels.common.bundles.SQCodes`: codes uint8 [n, code_size],
            offset and scale float32 [d] (see the module docstring).
        kind: ``SQ8``, ``SQ6``, ``SQ4``, ``SQ_FP16`` or ``SQ_BF16``.
        allowed: uint8 [n], 0 for rows a filtered search skips, or [0]: no filter.
        inner_product: False for squared L2 distances, True for negated inner products.
        out: a :class:`~vq.kernels.common.bundles.TopK` [nq, k]: distances ascending (+inf
            padding), rows (-1 padding).
    """
    parallel_for(
        sq_flat_range,
        queries.shape[0],
        queries,
        codes,
        sq_kind(kind),
        allowed,
        metric(inner_product),
        out,
    )


@kernel(nogil=True, fastmath=True)
def sq_flat_range(q0, q1, queries, codes, kind, allowed, inner_product, out):
    """:func:`sq_flat_scan` for queries ``q0..q1`` (int64) on the calling thread."""
    queries, codes, out = borrow(queries), borrow(codes), borrow(out)
    k = out.distances.shape[1]
    heap = (np.empty(k, dtype=np.float32), np.empty(k, dtype=np.int64))
    qa = np.empty(queries.shape[1], dtype=np.float32)
    buf = np.empty(BLOCK, dtype=np.float32)
    n = codes.codes.shape[0]
    for q in range(q0, q1):
        heap_reset(heap[0], heap[1])
        const = sq_prepare(queries[q], _NO_CENTROID, codes.offset, codes.scale, inner_product, qa)
        _push_rows(codes, 0, n, (qa, const), kind, inner_product, allowed, heap, buf)
        heap_sorted(heap[0], heap[1], out.distances[q], out.labels[q])


@kernel(nogil=True)
def sq_flat_lean(queries, codes, kind, ids, inner_product, out):
    """A search of a few queries in a flat SQ index on the calling thread in one call (the
    lean path): :func:`sq_flat_range` over every row, then the rows mapped to ``ids`` (int64
    [n], or [0]: the rows are the ids) into ``out`` = (distances float32 [nq, k], negated back
    to inner products with ``inner_product``, +inf / -inf padding; ids int64 [nq, k], -1
    padding; k may exceed the rows). ``codes``: an :class:`~vq.kernels.common.bundles.SQCodes`
    as a plain tuple (:mod:`vq.kernels.common.bundles`). Returns False (and does nothing) if
    a query holds a NaN or an infinity."""
    codes = borrow(SQCodes(*codes))
    out_dist, out_ids = out
    if not all_finite(queries):
        return False
    nq, k = queries.shape[0], min(out_dist.shape[1], codes.codes.shape[0])
    found = TopK(np.empty((nq, k), dtype=np.float32), np.empty((nq, k), dtype=np.int64))
    no_filter = np.zeros(0, dtype=np.uint8)  # (not a global: see sq_ivf_lean)
    sq_flat_range(np.int64(0), np.int64(nq), queries, codes, kind, no_filter, inner_product, found)
    fill = np.float32(-np.inf) if inner_product else np.float32(np.inf)
    rows_to_ids(found.distances, found.labels, ids, inner_product, fill, out_dist, out_ids)
    return True


def sq_ivf_scan(queries, lists, kind, probes, allowed, inner_product, out):
    """Distances to the codes of the probed inverted lists fused with top-k (faiss
    ``IndexIVFScalarQuantizer``'s scan); threads split the queries.

    Args:
        queries: float32 [nq, d].
        lists: an :class:`~vq.kernels.common.bundles.SQLists`: CSR offsets, codes uint8
            [n, code_size] list after list, the coarse centroids float32 [nlist, d],
            ``by_residual`` (the codes of list l encode ``x - c_l``), offset and scale.
        kind, allowed, inner_product: as :func:`sq_flat_scan`.
        probes: int64 [nq, nprobe], the lists to scan (-1: skip).
        out: a :class:`~vq.kernels.common.bundles.TopK` [nq, k]: distances ascending (+inf
            padding), rows (-1 padding).
    """
    parallel_for(
        sq_ivf_range,
        queries.shape[0],
        queries,
        lists,
        sq_kind(kind),
        probes,
        allowed,
        metric(inner_product),
        out,
    )


@kernel(nogil=True, fastmath=True)
def sq_ivf_range(q0, q1, queries, lists, kind, probes, allowed, inner_product, out):
    """:func:`sq_ivf_scan` for queries ``q0..q1`` (int64) on the calling thread."""
    queries, lists, out = borrow(queries), borrow(lists), borrow(out)
    offsets, _, centroids, by_residual, offset, scale = lists
    k = out.distances.shape[1]
    heap = (np.empty(k, dtype=np.float32), np.empty(k, dtype=np.int64))
    qa = np.empty(queries.shape[1], dtype=np.float32)
    buf = np.empty(BLOCK, dtype=np.float32)
    for q in range(q0, q1):
        heap_reset(heap[0], heap[1])
        x = queries[q]
        const = np.float32(0.0)
        if not by_residual:
            const = sq_prepare(x, _NO_CENTROID, offset, scale, inner_product, qa)
        for p in range(probes.shape[1]):
            lst = probes[q, p]
            if lst < 0:
                continue
            if by_residual:
                const = sq_prepare(x, centroids[lst], offset, scale, inner_product, qa)
            r0, r1 = offsets[lst], offsets[lst + 1]
            _push_rows(lists, r0, r1, (qa, const), kind, inner_product, allowed, heap, buf)
        heap_sorted(heap[0], heap[1], out.distances[q], out.labels[q])


@kernel(nogil=True)
def sq_ivf_lean(
    queries, coarse, lists, kind, finish, inner_product, nprobe, k_candidates, out, ranked
):
    """A search of a few queries in an IVF-SQ index on the calling thread in one call, from
    the coarse step to ids (the lean path; see :func:`vq.kernels.exact.lean_scans.ivf_flat_lean`,
    whose arguments it shares, with an :class:`~vq.kernels.common.bundles.SQLists` and its
    ``kind`` in place of the vectors). Returns False (and does nothing) if a query holds a
    NaN or an infinity."""
    coarse, lists = borrow(Coarse(*coarse)), borrow(SQLists(*lists))
    finish = borrow(Finish(*finish))
    out_dist, out_ids = out
    if not all_finite(queries):
        return False
    nq, k = queries.shape[0], k_candidates
    _, probes = probe_few(queries, coarse, nprobe, inner_product)
    found = TopK(np.empty((nq, k), dtype=np.float32), np.empty((nq, k), dtype=np.int64))
    no_filter = np.zeros(0, dtype=np.uint8)  # (a global is typed read-only: this call would
    # compile the range kernel a second time, beside the general path's)
    sq_ivf_range(
        np.int64(0), np.int64(nq), queries, lists, kind, probes, no_filter, inner_product, found
    )
    finish_lean(queries, found.distances, found.labels, finish, inner_product, out_dist, out_ids)
    return True
