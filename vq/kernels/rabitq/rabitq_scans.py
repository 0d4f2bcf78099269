"""Estimated distances from prepared queries to RaBitQ codes, fused with top-k (faiss
``IndexRaBitQ``'s search; the estimator is :mod:`vq.quantizers.rabitq`'s).

A query comes prepared by the torch side (:func:`vq.quantizers.rabitq.prepare_queries`, the
same function the static search runs): ``q_hat`` float32 [d], the rotated, centred and (for
``qb > 0``) scalar-quantized query, and two constants, ``||q_r - c||²`` and ``||q_r||²``. The
kernel turns ``q_hat`` into one look-up table per code byte, ``table[b, v] = Σ_{bits j of v}
2 q_hat[8 b + j] / sqrt(d)`` (256 entries a byte, built by doubling: 256 additions), so that
``<ō, q_hat> = Σ_b table[b, code_b] - Σ_j q_hat_j / sqrt(d)``: ``ceil(d / 8)`` look-ups a
vector, summed in order of b. Then, from the vector's factors (``or_minus_c_l2sqr``,
``dp_multiplier``), ``pre = f0 + ||q_r - c||² - 2 f1 <ō, q_hat>``; the value ranked (smaller is
nearer) is ``max(pre, 0)`` (squared L2) or ``(pre - ||q_r||²) / 2``, the negated estimated
inner product.

Arguments are plain arrays: ``codes`` uint8 [n, ceil(d / 8)], ``factors`` float32 [n, 3],
``allowed`` uint8 [n] (0: skipped) or [0]; outputs are caller-owned. Threads split the
queries (:func:`vq.kernels.common.threads.parallel_for`).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from vq.kernels.common.constants import metric
from vq.kernels.common.heaps import heap_replace_top, heap_reset, heap_sorted
from vq.kernels.common.simd import borrow
from vq.kernels.common.threads import parallel_for
from vq.kernels.jit.cache import kernel

#: rows whose values a scan computes in one pass before offering them to the heap
BLOCK = 32


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


@njit(inline="always", fastmath=True)
def estimate(codes, factors, row, table, offset, q_c2, q_r2, inner_product):
    """The value ranked for one code row (squared L2, or the negated inner product)."""
    acc = np.float32(0.0)
    for b in range(codes.shape[1]):
        acc += table[(b << 8) + np.int64(codes[row, b])]
    pre = factors[row, 0] + q_c2 - np.float32(2.0) * factors[row, 1] * (acc - offset)
    if inner_product:
        return np.float32(0.5) * (pre - q_r2)
    return max(pre, np.float32(0.0))


def rabitq_flat_scan(q_hat, constants, codes, factors, allowed, inner_product, out):
    """Estimates to every code row fused with top-k; threads split the queries.

    Args:
        q_hat: float32 [nq, d], the prepared queries; constants: float32 [nq, 2], their
            ``||q_r - c||²`` and ``||q_r||²`` (module docstring).
        codes: uint8 [n, ceil(d / 8)]; factors: float32 [n, 3].
        allowed: uint8 [n], 0 for rows a filtered search skips, or [0]: no filter.
        inner_product: False for squared L2 estimates, True for negated inner products.
        out: a :class:`~vq.kernels.common.bundles.TopK` [nq, k]: values ascending (+inf
            padding), rows (-1 padding).
    """
    parallel_for(
        rabitq_flat_range,
        q_hat.shape[0],
        q_hat,
        constants,
        codes,
        factors,
        allowed,
        metric(inner_product),
        out,
    )


@kernel(nogil=True, fastmath=True)
def rabitq_flat_range(q0, q1, q_hat, constants, codes, factors, allowed, inner_product, out):
    """:func:`rabitq_flat_scan` for queries ``q0..q1`` (int64) on the calling thread."""
    q_hat, constants, out = borrow(q_hat), borrow(constants), borrow(out)
    codes, factors = borrow(codes), borrow(factors)
    k = out.distances.shape[1]
    heap_d, heap_i = np.empty(k, dtype=np.float32), np.empty(k, dtype=np.int64)
    table = np.empty(codes.shape[1] * 256, dtype=np.float32)
    buf = np.empty(BLOCK, dtype=np.float32)
    n = codes.shape[0]
    filtered = allowed.shape[0] > 0
    for q in range(q0, q1):
        heap_reset(heap_d, heap_i)
        offset = build_tables(q_hat[q], table)
        q_c2, q_r2 = constants[q, 0], constants[q, 1]
        threshold = heap_d[0]
        for s in range(0, n, BLOCK):
            e = min(s + BLOCK, n)
            for i in range(s, e):
                buf[i - s] = estimate(codes, factors, i, table, offset, q_c2, q_r2, inner_product)
            for i in range(s, e):
                value = buf[i - s]
                if value < threshold and (not filtered or allowed[i] != 0):
                    heap_replace_top(heap_d, heap_i, value, i)
                    threshold = heap_d[0]
        heap_sorted(heap_d, heap_i, out.distances[q], out.labels[q])
