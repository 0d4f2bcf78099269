"""Template: fast-scan of a flat array of packed codes, N_QUERIES queries per pass over a
block, fused with top-k, with the block kernel of ISA unrolled over N_PAIRS rows (see
:func:`vq.kernels.fastscan.pq_fastscan_scanner`, which specialises it through
:func:`vq.kernels.cache.specialise`; never imported as it is)."""

import numpy as np
from numba import njit

from vq.kernels.cache import kernel
from vq.kernels.fastscan import BLOCK, _offer, block_kernel, portable_block
from vq.kernels.heaps import smallest_keys
from vq.kernels.scan import _heap_sorted
from vq.kernels.simd import borrow
from vq.kernels.threads import get_num_threads, parallel_for

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


def scan(luts, packed, n, out_dist, out_idx):
    """luts uint8 [nq * N_PAIRS, 32] (nq a multiple of N_QUERIES), packed uint8
    [nblocks * N_PAIRS, 32], n the number of vectors; out_dist float32 [nq, k] quantized
    distances ascending (+inf padding), out_idx int64 [nq, k] rows (-1 padding).

    Threads split the groups of N_QUERIES queries; with fewer groups than threads, each
    group's blocks are split into parts as well, whose top-k are merged at the end."""
    nq, k = out_dist.shape
    nblocks = packed.shape[0] // N_PAIRS
    groups = nq // Q
    threads = get_num_threads()
    parts = 1 if groups >= threads else max(1, min(threads // max(groups, 1), nblocks))
    if parts == 1:
        parallel_for(scan_tasks, groups, luts, packed, n, 1, out_dist[None], out_idx[None])
        return
    part_d = np.empty((parts, nq, k), dtype=np.float32)
    part_i = np.empty((parts, nq, k), dtype=np.int64)
    parallel_for(scan_tasks, groups * parts, luts, packed, n, parts, part_d, part_i)
    merge_parts(part_d, part_i, out_dist, out_idx)


@kernel(nogil=True)
def scan_tasks(t0, t1, luts, packed, n, parts, out_dist, out_idx):
    """Tasks t0..t1 of a scan cut into ``parts`` parts per group: task t is part t % parts
    of group t // parts, written into ``out_dist[part]``/``out_idx[part]`` [parts, nq, k]."""
    out_dist, out_idx = borrow(out_dist), borrow(out_idx)  # (views: see simd.borrow)
    nblocks = packed.shape[0] // N_PAIRS
    for t in range(t0, t1):
        g, part = t // parts, t % parts
        b0, b1 = part * nblocks // parts, (part + 1) * nblocks // parts
        _scan_blocks(luts, packed, n, g, b0, b1, out_dist[part], out_idx[part])


@njit(nogil=True)
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
                thr[q] = _offer(heap_d, heap_i, q, dist, m, b * BLOCK, n)
    for q in range(Q):
        _heap_sorted(heap_d[q], heap_i[q], out_dist[g * Q + q], out_idx[g * Q + q])


@kernel(nogil=True)
def merge_parts(part_d, part_i, out_dist, out_idx):
    """Each query's k smallest (distance, row) over the parts [parts, nq, k] (distances are
    whole numbers)."""
    out_dist, out_idx = borrow(out_dist), borrow(out_idx)
    parts, nq, k = part_d.shape
    keys = np.empty(parts * k, dtype=np.int64)
    best = np.empty(k, dtype=np.int64)
    for q in range(nq):
        for e in range(parts * k):
            d, r = part_d[e // k, q, e % k], part_i[e // k, q, e % k]
            keys[e] = (np.int64(d) << 40) | r if r >= 0 else _EMPTY
        smallest_keys(keys, best)
        for e in range(k):
            if best[e] == _EMPTY:
                out_dist[q, e] = np.inf
                out_idx[q, e] = -1
            else:
                out_dist[q, e] = np.float32(best[e] >> 40)
                out_idx[q, e] = best[e] & ((1 << 40) - 1)
