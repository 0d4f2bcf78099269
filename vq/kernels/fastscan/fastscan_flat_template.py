"""Template: the flat fast-scan (a flat array of packed 4-bit codes) for M = 2 N_PAIRS
sub-quantizers of DSUB dimensions: the queries' quantized tables (``build``), the scan of
N_QUERIES queries per pass over a block, fused with top-k, with the block kernel of ISA
unrolled over N_PAIRS rows (``scan``), and the whole search of a few queries in one call
(``lean_search``). See :func:`vq.kernels.fastscan.fastscan_scans.flat_tables`,
:func:`vq.kernels.fastscan.fastscan_scans.pq_fastscan_scanner` and
:func:`vq.kernels.fastscan.fastscan_scans.flat_lean`, which specialise it through
:func:`vq.kernels.jit.cache.specialise`; never imported as it is."""

import numpy as np
from numba import njit

from vq.kernels.common.constants import metric
from vq.kernels.common.heaps import (
    EMPTY_KEY,
    heap_sorted,
    key_row,
    key_value,
    row_key,
    smallest_keys,
)
from vq.kernels.common.simd import borrow, table_row_kernels
from vq.kernels.common.threads import get_num_threads, parallel_for
from vq.kernels.exact.exact_scans import rows_to_ids
from vq.kernels.exact.lean_scans import all_finite
from vq.kernels.fastscan.fastscan_scans import (
    BLOCK,
    _offer,
    block_kernel,
    portable_block,
    quantize_tables,
)
from vq.kernels.jit.cache import kernel

# -- specialised constants (vq.kernels.jit.cache.specialise writes these lines) --
DSUB = 1
ISA = "portable"
N_PAIRS = 1
N_QUERIES = 1
# -- end of specialised constants --

M = 2 * N_PAIRS
ip_row, l2_row = table_row_kernels(DSUB)

Q = N_QUERIES
block = block_kernel(ISA, N_PAIRS, Q)
SIMD = block is not None


def scan(luts, packed, n, allowed, out_dist, out_idx):
    """luts uint8 [nq * N_PAIRS, 32] (nq a multiple of N_QUERIES), packed uint8
    [nblocks * N_PAIRS, 32], n the number of vectors; allowed uint8 [n] (0: skipped) or [0];
    out_dist float32 [nq, k] quantized
    distances ascending (+inf padding), out_idx int64 [nq, k] rows (-1 padding).

    Threads split the groups of N_QUERIES queries; with fewer groups than threads, each
    group's blocks are split into parts as well, whose top-k are merged at the end."""
    nq, k = out_dist.shape
    nblocks = packed.shape[0] // N_PAIRS
    groups = nq // Q
    threads = get_num_threads()
    parts = 1 if groups >= threads else max(1, min(threads // max(groups, 1), nblocks))
    if parts == 1:
        parallel_for(scan_tasks, groups, luts, packed, n, allowed, 1, out_dist[None], out_idx[None])
        return
    part_d = np.empty((parts, nq, k), dtype=np.float32)
    part_i = np.empty((parts, nq, k), dtype=np.int64)
    parallel_for(scan_tasks, groups * parts, luts, packed, n, allowed, parts, part_d, part_i)
    merge_parts(part_d, part_i, out_dist, out_idx)


@kernel(nogil=True)
def scan_tasks(t0, t1, luts, packed, n, allowed, parts, out_dist, out_idx):
    """Tasks t0..t1 of a scan cut into ``parts`` parts per group: task t is part t % parts
    of group t // parts, written into ``out_dist[part]``/``out_idx[part]`` [parts, nq, k]."""
    out_dist, out_idx = borrow(out_dist), borrow(out_idx)  # (views: see simd.borrow)
    nblocks = packed.shape[0] // N_PAIRS
    for t in range(t0, t1):
        g, part = t // parts, t % parts
        b0, b1 = part * nblocks // parts, (part + 1) * nblocks // parts
        _scan_blocks(luts, packed, n, allowed, g, b0, b1, out_dist[part], out_idx[part])


@njit(nogil=True)
def _scan_blocks(luts, packed, n, allowed, g, b0, b1, out_dist, out_idx):
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
                thr[q] = _offer(heap_d, heap_i, q, dist, m, b * BLOCK, n, allowed)
    for q in range(Q):
        heap_sorted(heap_d[q], heap_i[q], out_dist[g * Q + q], out_idx[g * Q + q])


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
            keys[e] = row_key(d, r) if r >= 0 else EMPTY_KEY
        smallest_keys(keys, best)
        for e in range(k):
            if best[e] == EMPTY_KEY:
                out_dist[q, e] = np.inf
                out_idx[q, e] = -1
            else:
                out_dist[q, e] = np.float32(key_value(best[e]))
                out_idx[q, e] = key_row(best[e])


def build(queries, codebooks_t, norms, inner_product, out_luts, out_scale, out_offset):
    """queries float32 [nq, M * DSUB]; codebooks_t float32 [M, DSUB, 16]; norms float32
    [M, 16] (their squared norms); tables of squared L2 distances, or of negated inner
    products (smaller is nearer in both) → out_luts uint8 [>= nq, M / 2, 32] (rows past nq
    untouched), out_scale and out_offset float32 [nq] (see ``quantize_tables``). Threads
    split the queries."""
    parallel_for(
        build_range,
        queries.shape[0],
        queries,
        codebooks_t,
        norms,
        metric(inner_product),
        out_luts,
        out_scale,
        out_offset,
    )


@kernel(nogil=True)
def build_range(
    q0, q1, queries, codebooks_t, norms, inner_product, out_luts, out_scale, out_offset
):
    """``build`` for queries q0..q1 on the calling thread."""
    queries, out_luts = borrow(queries), borrow(out_luts)  # (views per query: simd.borrow)
    table = np.empty((1, M, 16), dtype=np.float32)  # one work space per thread
    bias = np.zeros(1, dtype=np.float32)
    bias_q = np.empty(1, dtype=np.int32)
    for q in range(q0, q1):
        x = queries[q]
        for m in range(M):
            if inner_product:
                ip_row(x, m * DSUB, codebooks_t, m * DSUB * 16, np.float32(-1.0), table, m * 16)
            else:
                l2_row(x, m * DSUB, codebooks_t, m * DSUB * 16, norms, m * 16, table, m * 16)
        sc, of = quantize_tables(table, bias, out_luts[q : q + 1], bias_q)
        out_scale[q] = sc
        out_offset[q] = of


@kernel(nogil=True)
def lean_search(queries, codebooks_t, norms, packed, n, ids, inner_product, out_dist, out_ids):
    """A search of a few queries in one call on the calling thread (the lean path: see
    :func:`vq.kernels.fastscan.fastscan_scans.flat_lean`; N_QUERIES is 1); False (and nothing done)
    if a query holds a NaN or an infinity."""
    if not all_finite(queries):
        return False
    nq = queries.shape[0]
    luts = np.empty((nq, N_PAIRS, 32), dtype=np.uint8)
    scale_offset = np.empty((2, nq), dtype=np.float32)
    build_range(
        np.int64(0),
        np.int64(nq),
        queries,
        codebooks_t,
        norms,
        inner_product,
        luts,
        scale_offset[0],
        scale_offset[1],
    )
    flat_luts = luts.reshape((nq * N_PAIRS, 32))
    nblocks = packed.shape[0] // N_PAIRS
    none = np.zeros(0, dtype=np.uint8)
    for g in range(nq // Q):
        _scan_blocks(
            flat_luts, packed, n, none, np.int64(g), np.int64(0), nblocks, out_dist, out_ids
        )
    for q in range(nq):  # quantized distances back to floats (+inf stays +inf)
        for e in range(out_dist.shape[1]):
            out_dist[q, e] = out_dist[q, e] / scale_offset[0, q] + scale_offset[1, q]
    fill = np.float32(-np.inf) if inner_product else np.float32(np.inf)
    rows_to_ids(out_dist, out_ids, ids, inner_product, fill, out_dist, out_ids)  # in place
    return True
