"""Estimated distances from queries to RaBitQ codes, fused with top-k: faiss ``IndexRaBitQ``'s
search (:func:`rabitq_flat_scan`) and ``IndexIVFRaBitQ``'s (:func:`rabitq_ivf_scan`); the
estimator is :mod:`vq.quantizers.rabitq`'s.

A query arrives rotated and centred, ``q_c = q_r - c`` float32 [d] (``q_r = q @ rotation``;
``c`` the centre, or in an IVF index the rotated centroid of the probed list, subtracted
here), and the estimate needs ``<ō, q̂>``, ``ō = (2 b - 1) / sqrt(d)`` the code's signs and
``q̂`` the query as the estimate sees it:

- ``qb = 0`` (float query, ``q̂ = q_c``): one look-up table per code byte, ``table[b, v] =
  Σ_{bits j of v} 2 q_c[8 b + j] / sqrt(d)`` (256 entries a byte, built by doubling), so that
  ``<ō, q_c> = Σ_b table[b, code_b] - Σ_j q_c[j] / sqrt(d)``: ``ceil(d / 8)`` look-ups a vector.
- ``qb`` in 1..8 (faiss's default 4): ``q_c`` scalar-quantized to levels ``l_j`` in [0, 2**qb
  - 1] between its minimum and maximum, exactly as :func:`vq.quantizers.rabitq.quantized_levels`
  does (the same float32 operations, in IEEE arithmetic: :func:`quantize_planes` is compiled
  without fastmath, so both sides find the same levels), ``q̂_j = vmin + delta l_j``. The levels
  go into ``qb`` bit planes of 64-bit words (plane p holds bit p of every level), and with
  ``pc = popcount(b)`` and ``s = Σ_j b_j l_j = Σ_p 2**p popcount(b & plane_p)``,
  ``<ō, q̂> = ((2 pc - d) vmin + (2 s - Σ_j l_j) delta) / sqrt(d)``: ``ceil(d / 64) (qb + 1)``
  AND + popcount a vector, on the codes read as uint64 words (:func:`code_words`; LLVM's
  ``ctpop``, one ``popcnt`` each, or ``vpopcntq`` where it vectorises). That row loop is
  :mod:`vq.kernels.rabitq.rabitq_plane_template`, specialised on the words a code and ``qb``
  (:func:`plane_kernels`) so that it unrolls; an IVF scan quantizes the query once per probed
  list (about 0.2 us at d = 128).

Then, from the vector's factors (``or_minus_c_l2sqr``, ``dp_multiplier``), ``pre = f0 + ||q_c||²
- 2 f1 <ō, q̂>``; the value ranked (smaller is nearer) is ``max(pre, 0)`` (squared L2) or
``(pre - ||q_r||²) / 2``, the negated estimated inner product.

Arguments are plain arrays: ``codes`` uint8 [n, ceil(d / 8)], ``words`` uint64 [n, ceil(d /
64)] (the same bits), ``factors`` float32 [n, 3], ``allowed`` uint8 [n] (0: skipped) or [0];
outputs are caller-owned. Threads split the queries
(:func:`vq.kernels.common.threads.parallel_for`).
"""

from __future__ import annotations

import functools

import numpy as np
from numba import njit

from vq.kernels.common.constants import metric
from vq.kernels.common.heaps import heap_replace_top, heap_reset, heap_sorted
from vq.kernels.common.simd import borrow
from vq.kernels.common.threads import parallel_for
from vq.kernels.jit.cache import kernel, specialise

#: rows whose values a scan computes in one pass before offering them to the heap
BLOCK = 32


def code_words(codes: np.ndarray) -> np.ndarray:
    """uint64 [n, ceil(d / 64)]: the sign bits of uint8 codes [n, ceil(d / 8)] as 64-bit words
    (little-endian: dimension j is bit j % 64 of word j // 64, as in the bytes). A view where
    the code size is a multiple of 8 bytes (d a multiple of 64) and the rows C-contiguous,
    else a copy padded with zero bytes."""
    n, nb = codes.shape
    if nb % 8 == 0 and codes.flags.c_contiguous:
        return codes.view(np.uint64)
    padded = np.zeros((n, -(-nb // 8) * 8), np.uint8)
    padded[:, :nb] = codes
    return padded.view(np.uint64)


@njit(inline="always", fastmath=True)
def build_tables(q_hat, table):
    """``table`` float32 [ceil(d / 8) * 256] of ``q_hat`` float32 [d] (module docstring);
    returns ``Σ_j q_hat_j / sqrt(d)``, the constant subtracted from the table sums."""
    d = q_hat.shape[0]
    scale = np.float32(2.0 / np.sqrt(np.float64(d)))
    total = np.float32(0.0)
    for b in range((d + 7) >> 3):
        base = b << 8
        table[base] = np.float32(0.0)
        for j in range(8):
            dim = 8 * b + j
            v = q_hat[dim] * scale if dim < d else np.float32(0.0)
            if dim < d:
                total += q_hat[dim]
            width = 1 << j
            for low in range(width):
                table[base + width + low] = table[base + low] + v
    return total * np.float32(0.5) * scale


@njit(fastmath=True)
def min_max(v):
    """The least and greatest of ``v`` (float32 [d], finite; exact in any order)."""
    vmin, vmax = v[0], v[0]
    for j in range(1, v.shape[0]):
        vmin = min(vmin, v[j])
        vmax = max(vmax, v[j])
    return vmin, vmax


#: gathers the low bits of a uint64's 8 bytes into its top byte, byte t to bit t
_GATHER = np.uint64(0x0102040810204080)
_LOW_BITS = np.uint64(0x0101010101010101)


@njit
def level_scratch(d):
    """uint8 [ceil(d / 8) * 8], zeros: the levels :func:`quantize_planes` writes (the padding
    past d stays 0, so it is in no plane)."""
    return np.zeros(((d + 7) >> 3) * 8, dtype=np.uint8)


@njit(fastmath=False)
def quantize_planes(q_c, qb, planes, levels):
    """Scalar-quantize ``q_c`` (float32 [d]) to ``qb`` bits and write its bit planes into
    ``planes`` (uint64 [qb, ceil(d / 64)]; ``levels``: uint8 [ceil(d / 8) * 8], scratch, its
    padding 0: :func:`level_scratch`); returns ``(vmin, delta, Σ_j l_j)`` (float32, float32,
    int64). The levels are :func:`vq.quantizers.rabitq.quantized_levels`' to the bit (IEEE
    float32, no fastmath: a contracted multiply-add or a division by a reciprocal would move
    a level). A plane's byte of 8 dimensions is one multiply: bit p of each of 8 levels
    (bytes of a uint64) gathered into the top byte."""
    d = q_c.shape[0]
    vmin, vmax = min_max(q_c)
    top = np.float32((1 << qb) - 1)
    delta = np.float32((vmax - vmin) / top)
    inv = np.float32(np.float32(1.0) / delta) if delta > 0 else np.float32(0.0)
    total = 0
    for j in range(d):
        level = np.floor(np.float32(np.float32(q_c[j] - vmin) * inv) + np.float32(0.5))
        li = np.int64(min(max(level, np.float32(0.0)), top))
        levels[j] = np.uint8(li)
        total += li
    groups = levels.view(np.uint64)
    for p in range(qb):
        for w in range(planes.shape[1]):
            planes[p, w] = np.uint64(0)
        for g in range(groups.shape[0]):
            byte = (((groups[g] >> np.uint64(p)) & _LOW_BITS) * _GATHER) >> np.uint64(56)
            planes[p, g >> 3] |= byte << np.uint64(8 * (g & 7))
    return vmin, delta, total


@njit(inline="always", fastmath=True)
def finish(f0, f1, dot, q_c2, q_r2, inner_product):
    """The value ranked, from the factors and ``<ō, q̂>`` (module docstring)."""
    pre = f0 + q_c2 - np.float32(2.0) * f1 * dot
    if inner_product:
        return np.float32(0.5) * (pre - q_r2)
    return max(pre, np.float32(0.0))


@njit(inline="always", fastmath=True)
def offer_block(buf, s, e, allowed, heap, threshold):
    """Offer the values ``buf[: e - s]`` of rows ``s..e`` to the heap (a float max-heap pair)
    unless ``allowed`` skips them; returns the new threshold (the heap's root)."""
    heap_d, heap_i = heap
    filtered = allowed.shape[0] > 0
    for i in range(s, e):
        value = buf[i - s]
        if value < threshold and (not filtered or allowed[i] != 0):
            heap_replace_top(heap_d, heap_i, value, i)
            threshold = heap_d[0]
    return threshold


@njit(inline="always", fastmath=True)
def push_table_rows(
    codes, factors, r0, r1, table, offset, q_c2, q_r2, inner_product, allowed, heap, buf
):
    """Rows ``r0..r1`` scored from the byte tables of a float query (``qb = 0``) and offered
    to the heap, a block at a time."""
    threshold = heap[0][0]
    for s in range(r0, r1, BLOCK):
        e = min(s + BLOCK, r1)
        for i in range(s, e):
            acc = np.float32(0.0)
            for b in range(codes.shape[1]):
                acc += table[(b << 8) + np.int64(codes[i, b])]
            buf[i - s] = finish(
                factors[i, 0], factors[i, 1], acc - offset, q_c2, q_r2, inner_product
            )
        threshold = offer_block(buf, s, e, allowed, heap, threshold)


@njit(inline="always", fastmath=True)
def centred_squared(q_c):
    """``||q_c||²`` (float32)."""
    acc = np.float32(0.0)
    for j in range(q_c.shape[0]):
        acc += q_c[j] * q_c[j]
    return acc


@functools.cache  # a dictionary hit per call, not specialise()'s checks
def plane_kernels(words: int, qb: int):
    """The bit-plane kernels (``flat_range``, ``ivf_range``) for codes of ``words`` 64-bit
    words and queries of ``qb`` bits (:mod:`vq.kernels.rabitq.rabitq_plane_template`)."""
    return specialise("vq.kernels.rabitq.rabitq_plane_template", NW=int(words), QB=int(qb))


def _flat(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).reshape(-1)


def rabitq_flat_scan(q_c, constants, qb, codes, words, factors, allowed, inner_product, out):
    """Estimates to every code row fused with top-k; threads split the queries.

    Args:
        q_c: float32 [nq, d], the rotated, centred queries; constants: float32 [nq, 2],
            their ``||q_c||²`` and ``||q_r||²`` (:func:`vq.quantizers.rabitq.prepare_queries`
            with ``qb = 0`` gives both).
        qb: the query's bits, 0 (float query: byte tables) or 1..8 (bit planes).
        codes: uint8 [n, ceil(d / 8)] (read for ``qb = 0``); words: uint64 [n, ceil(d / 64)],
            the same codes as words (:func:`code_words`; read for ``qb > 0``); factors:
            float32 [n, 3].
        allowed: uint8 [n], 0 for rows a filtered search skips, or [0]: no filter.
        inner_product: False for squared L2 estimates, True for negated inner products.
        out: a :class:`~vq.kernels.common.bundles.TopK` [nq, k]: values ascending (+inf
            padding), rows (-1 padding).

    Cost a row: ``ceil(d / 8)`` table look-ups (``qb = 0``) or ``ceil(d / 64) (qb + 1)``
    AND + popcount.
    """
    ip, nq = metric(inner_product), q_c.shape[0]
    if qb == 0:
        parallel_for(rabitq_table_range, nq, q_c, constants, codes, factors, allowed, ip, out)
        return
    body = plane_kernels(words.shape[1], qb).flat_range
    parallel_for(body, nq, q_c, constants, _flat(words), _flat(factors), allowed, ip, out)


@kernel(nogil=True, fastmath=True)
def rabitq_table_range(q0, q1, q_c, constants, codes, factors, allowed, inner_product, out):
    """:func:`rabitq_flat_scan` with ``qb = 0`` for queries ``q0..q1`` (int64) on the calling
    thread."""
    q_c, constants, out = borrow(q_c), borrow(constants), borrow(out)
    codes, factors = borrow(codes), borrow(factors)
    k = out.distances.shape[1]
    heap = (np.empty(k, dtype=np.float32), np.empty(k, dtype=np.int64))
    table = np.empty(codes.shape[1] * 256, dtype=np.float32)
    buf = np.empty(BLOCK, dtype=np.float32)
    n = codes.shape[0]
    for q in range(q0, q1):
        heap_reset(heap[0], heap[1])
        offset = build_tables(q_c[q], table)
        q_c2, q_r2 = constants[q, 0], constants[q, 1]
        push_table_rows(
            codes, factors, 0, n, table, offset, q_c2, q_r2, inner_product, allowed, heap, buf
        )
        heap_sorted(heap[0], heap[1], out.distances[q], out.labels[q])


def rabitq_ivf_scan(
    q_r, centroids_r, offsets, probes, qb, codes, words, factors, allowed, inner_product, out
):
    """Estimates to the codes of the probed inverted lists fused with top-k (faiss
    ``IndexIVFRaBitQ``'s scan: each list's codes are those of the residuals to its
    centroid); threads split the queries.

    Args:
        q_r: float32 [nq, d], the rotated queries (``q @ rotation``).
        centroids_r: float32 [nlist, d], the rotated coarse centroids: the centre of each
            list (the query is centred on, and for ``qb > 0`` quantized for, every list it
            probes, as faiss does).
        offsets: int64 [nlist + 1], CSR: list l is rows ``offsets[l]:offsets[l + 1]``.
        probes: int64 [nq, nprobe], the lists to scan (-1: skip).
        qb, codes, words, factors, allowed, inner_product: as :func:`rabitq_flat_scan`
            (rows in list order).
        out: a :class:`~vq.kernels.common.bundles.TopK` [nq, k]: values ascending (+inf
            padding), storage rows (-1 padding).
    """
    ip, nq = metric(inner_product), q_r.shape[0]
    lists = (q_r, centroids_r, offsets, probes)
    if qb == 0:
        parallel_for(rabitq_ivf_table_range, nq, *lists, codes, factors, allowed, ip, out)
        return
    body = plane_kernels(words.shape[1], qb).ivf_range
    parallel_for(body, nq, *lists, _flat(words), _flat(factors), allowed, ip, out)


@kernel(nogil=True, fastmath=True)
def rabitq_ivf_table_range(
    q0, q1, q_r, centroids_r, offsets, probes, codes, factors, allowed, inner_product, out
):
    """:func:`rabitq_ivf_scan` with ``qb = 0`` for queries ``q0..q1`` (int64) on the calling
    thread."""
    q_r, centroids_r, out = borrow(q_r), borrow(centroids_r), borrow(out)
    codes, factors = borrow(codes), borrow(factors)
    d = q_r.shape[1]
    k = out.distances.shape[1]
    heap = (np.empty(k, dtype=np.float32), np.empty(k, dtype=np.int64))
    table = np.empty(codes.shape[1] * 256, dtype=np.float32)
    buf = np.empty(BLOCK, dtype=np.float32)
    q_c = np.empty(d, dtype=np.float32)
    for q in range(q0, q1):
        heap_reset(heap[0], heap[1])
        q_r2 = centred_squared(q_r[q])
        for p in range(probes.shape[1]):
            lst = probes[q, p]
            if lst < 0:
                continue
            r0, r1 = offsets[lst], offsets[lst + 1]
            if r1 == r0:
                continue
            for j in range(d):
                q_c[j] = q_r[q, j] - centroids_r[lst, j]
            offset = build_tables(q_c, table)
            q_c2 = centred_squared(q_c)
            push_table_rows(
                codes, factors, r0, r1, table, offset, q_c2, q_r2, inner_product, allowed, heap, buf
            )
        heap_sorted(heap[0], heap[1], out.distances[q], out.labels[q])
