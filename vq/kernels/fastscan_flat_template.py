"""Template: fast-scan of a flat array of packed codes, N_QUERIES queries per pass over a
block, fused with top-k, with the block kernel of ISA unrolled over N_PAIRS rows (see
:func:`vq.kernels.fastscan.pq_fastscan_scanner`, which specialises it through
:func:`vq.kernels.cache.specialise`; never imported as it is)."""

import numpy as np
from numba import prange

from vq.kernels.cache import kernel
from vq.kernels.fastscan import BLOCK, _offer, block_kernel, portable_block
from vq.kernels.heaps import smallest_keys
from vq.kernels.scan import _heap_sorted
from vq.kernels.simd import thread_count

# -- specialised constants (vq.kernels.cache.specialise writes these lines) --
ISA = "portable"
N_PAIRS = 1
N_QUERIES = 1
# -- end of specialised constants --

Q = N_QUERIES
block = block_kernel(ISA, N_PAIRS, Q)
SIMD = block is not None
# a constant, not np.iinfo inside the kernel: that would tie the compiled kernel to numba's
# arraymath module, whose import (scipy's BLAS check) costs a cached load 0.3 s
_EMPTY = np.iinfo(np.int64).max


@kernel(parallel=True, nogil=True)
def scan(luts, packed, n, out_dist, out_idx):
    """luts uint8 [nq * N_PAIRS, 32] (nq a multiple of N_QUERIES), packed uint8
    [nblocks * N_PAIRS, 32], n the number of vectors; out_dist float32 [nq, k] quantized
    distances ascending (+inf padding), out_idx int64 [nq, k] rows (-1 padding).

    Each parallel loop calls one kernel of its own: a loop body written inline takes numba
    several times longer to compile."""
    nq, k = out_dist.shape
    nblocks = packed.shape[0] // N_PAIRS
    groups = nq // Q
    # fewer groups of queries than threads: each group's blocks are split between threads
    # (a part each), the parts' top-k merged at the end
    threads = thread_count()
    parts = 1 if groups >= threads else max(1, min(threads // max(groups, 1), nblocks))
    if parts == 1:
        first = np.int64(0)
        for g in prange(groups):  # (int64 arguments: the loop index is unsigned in the
            # parallel body, and each distinct type would compile the callee once more)
            _scan_blocks(luts, packed, n, np.int64(g), first, nblocks, out_dist, out_idx)
        return
    part_d = np.empty((parts, nq, k), dtype=np.float32)
    part_i = np.empty((parts, nq, k), dtype=np.int64)
    for task in prange(groups * parts):
        g, part = np.int64(task) // parts, np.int64(task) % parts
        b0, b1 = part * nblocks // parts, (part + 1) * nblocks // parts
        _scan_blocks(luts, packed, n, g, b0, b1, part_d[part], part_i[part])
    for q in prange(nq):
        _merge_parts(part_d, part_i, np.int64(q), out_dist, out_idx)


@kernel(nogil=True)
def _scan_blocks(luts, packed, n, g, b0, b1, out_dist, out_idx):
    """Blocks b0..b1 against query group g: its queries' top-k into ``out_dist``/``out_idx``
    [nq, k] (their rows g * Q ...)."""
    k = out_dist.shape[1]
    heap_d = np.full((Q, k), np.inf, dtype=np.float32)
    heap_i = np.full((Q, k), -1, dtype=np.int64)
    thr = np.full(Q, 65535, dtype=np.int32)
    dist = np.empty((Q, BLOCK), dtype=np.uint16)
    mask = np.empty(Q, dtype=np.int32)
    lut_rows = np.empty(Q, dtype=np.int64)
    for q in range(Q):
        lut_rows[q] = (g * Q + q) * N_PAIRS
    for b in range(b0, b1):
        if SIMD:
            block(packed, b * N_PAIRS, luts, lut_rows, thr, dist, mask)
        else:
            portable_block(packed, b * N_PAIRS, luts, lut_rows, N_PAIRS, thr, dist, mask)
        for q in range(Q):
            if mask[q] != 0:
                m = np.uint32(mask[q])
                thr[q] = _offer(heap_d[q], heap_i[q], dist[q], m, b * BLOCK, n)
    for q in range(Q):
        _heap_sorted(heap_d[q], heap_i[q], out_dist[g * Q + q], out_idx[g * Q + q])


@kernel(nogil=True)
def _merge_parts(part_d, part_i, q, out_dist, out_idx):
    """Query q's k smallest (distance, row) over the parts [parts, nq, k] (distances are
    whole numbers)."""
    parts, _, k = part_d.shape
    keys = np.empty(parts * k, dtype=np.int64)
    for e in range(parts * k):
        d, r = part_d[e // k, q, e % k], part_i[e // k, q, e % k]
        keys[e] = (np.int64(d) << 40) | r if r >= 0 else _EMPTY
    best = np.empty(k, dtype=np.int64)
    smallest_keys(keys, best)
    for e in range(k):
        if best[e] == _EMPTY:
            out_dist[q, e] = np.inf
            out_idx[q, e] = -1
        else:
            out_dist[q, e] = np.float32(best[e] >> 40)
            out_idx[q, e] = best[e] & ((1 << 40) - 1)
