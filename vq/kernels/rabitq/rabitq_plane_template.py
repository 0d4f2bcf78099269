"""Template: the bit-plane scans of RaBitQ codes for QB query bits and NW 64-bit words a code
(see :mod:`vq.kernels.rabitq.rabitq_scans`, which specialises it through
:func:`vq.kernels.jit.cache.specialise` and documents the arithmetic; never imported as it
is).

With NW and QB constants the ``NW (QB + 1)`` AND + popcount of a row unroll into straight
code, and the rows' words and factors are read from flat arrays at constant strides (``NW``
and 3 elements a row): a 2-D array's row stride is a run-time value to LLVM.
"""

import numpy as np
from numba import njit

from vq.kernels.common.bitmask import popcount
from vq.kernels.common.heaps import heap_reset, heap_sorted
from vq.kernels.common.simd import borrow
from vq.kernels.jit.cache import kernel
from vq.kernels.rabitq.rabitq_scans import (
    BLOCK,
    centred_squared,
    finish,
    level_scratch,
    offer_block,
    quantize_planes,
)

# -- specialised constants (vq.kernels.jit.cache.specialise writes these lines) --
NW = 2
QB = 4
# -- end of specialised constants --


@njit(inline="always", fastmath=True)
def push_rows(
    words,
    factors,
    r0,
    r1,
    planes,
    a,
    b,
    level_sum,
    d,
    q_c2,
    q_r2,
    inner_product,
    allowed,
    heap,
    buf,
):
    """Rows ``r0..r1`` scored against the bit planes (uint64 [QB * NW], plane p's word w at
    ``p * NW + w``) of a quantized query and offered to the heap, a block at a time:
    ``<ō, q̂> = (2 pc - d) a + (2 s - level_sum) b``; ``words`` uint64 [n * NW] and
    ``factors`` float32 [n * 3], flat."""
    threshold = heap[0][0]
    for s in range(r0, r1, BLOCK):
        e = min(s + BLOCK, r1)
        for i in range(s, e):
            pc = np.int64(0)
            sm = np.int64(0)
            for w in range(NW):
                c = words[i * NW + w]
                pc += np.int64(popcount(c))
                for p in range(QB):
                    sm += np.int64(popcount(c & planes[p * NW + w])) << p
            dot = np.float32(2 * pc - d) * a + np.float32(2 * sm - level_sum) * b
            buf[i - s] = finish(factors[3 * i], factors[3 * i + 1], dot, q_c2, q_r2, inner_product)
        threshold = offer_block(buf, s, e, allowed, heap, threshold)


@kernel(nogil=True, fastmath=True)
def flat_range(q0, q1, q_c, constants, words, factors, allowed, inner_product, out):
    """``rabitq_flat_scan`` with ``qb = QB`` for queries ``q0..q1`` on the calling thread
    (``words`` uint64 [n * NW], ``factors`` float32 [n * 3]: flat)."""
    q_c, constants, out = borrow(q_c), borrow(constants), borrow(out)
    words, factors = borrow(words), borrow(factors)
    d = q_c.shape[1]
    k = out.distances.shape[1]
    heap = (np.empty(k, dtype=np.float32), np.empty(k, dtype=np.int64))
    planes = np.empty((QB, NW), dtype=np.uint64)
    flat_planes = planes.reshape(QB * NW)
    levels = level_scratch(d)
    buf = np.empty(BLOCK, dtype=np.float32)
    inv_sqrt_d = np.float32(1.0 / np.sqrt(np.float64(d)))
    n = words.shape[0] // NW
    for q in range(q0, q1):
        heap_reset(heap[0], heap[1])
        vmin, delta, level_sum = quantize_planes(q_c[q], QB, planes, levels)
        push_rows(
            words,
            factors,
            0,
            n,
            flat_planes,
            vmin * inv_sqrt_d,
            delta * inv_sqrt_d,
            level_sum,
            d,
            constants[q, 0],
            constants[q, 1],
            inner_product,
            allowed,
            heap,
            buf,
        )
        heap_sorted(heap[0], heap[1], out.distances[q], out.labels[q])


@kernel(nogil=True, fastmath=True)
def ivf_range(
    q0, q1, q_r, centroids_r, offsets, probes, words, factors, allowed, inner_product, out
):
    """``rabitq_ivf_scan`` with ``qb = QB`` for queries ``q0..q1`` on the calling thread
    (``words`` uint64 [n * NW], ``factors`` float32 [n * 3]: flat)."""
    q_r, centroids_r, out = borrow(q_r), borrow(centroids_r), borrow(out)
    words, factors = borrow(words), borrow(factors)
    d = q_r.shape[1]
    k = out.distances.shape[1]
    heap = (np.empty(k, dtype=np.float32), np.empty(k, dtype=np.int64))
    planes = np.empty((QB, NW), dtype=np.uint64)
    flat_planes = planes.reshape(QB * NW)
    levels = level_scratch(d)
    buf = np.empty(BLOCK, dtype=np.float32)
    q_c = np.empty(d, dtype=np.float32)
    inv_sqrt_d = np.float32(1.0 / np.sqrt(np.float64(d)))
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
            vmin, delta, level_sum = quantize_planes(q_c, QB, planes, levels)
            push_rows(
                words,
                factors,
                r0,
                r1,
                flat_planes,
                vmin * inv_sqrt_d,
                delta * inv_sqrt_d,
                level_sum,
                d,
                centred_squared(q_c),
                q_r2,
                inner_product,
                allowed,
                heap,
                buf,
            )
        heap_sorted(heap[0], heap[1], out.distances[q], out.labels[q])
