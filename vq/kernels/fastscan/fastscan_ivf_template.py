"""Template: the IVF fast-scan kernel for M = 2 N_PAIRS sub-quantizers of DSUB dimensions with
the block kernels of ISA (see :func:`vq.kernels.fastscan.fastscan_ivf.ivf_fastscan_lists`, which
specialises it through :func:`vq.kernels.jit.cache.specialise` and documents ``scan``; never
imported as it is)."""

import numpy as np
from numba import njit

from vq.kernels.common.bundles import (
    Coarse,
    Finish,
    PackedLists,
    Probes,
    ScaledTopK,
    ScanState,
    Tables,
)
from vq.kernels.common.heaps import EMPTY_KEY, key_value, row_key, smallest_keys
from vq.kernels.common.simd import add_row, borrow, copy_row, table_row_kernels
from vq.kernels.common.threads import get_num_threads, parallel_for
from vq.kernels.exact.coarse_probe import probe_few
from vq.kernels.exact.exact_scans import finish_lean
from vq.kernels.exact.lean_scans import all_finite
from vq.kernels.fastscan.fastscan_ivf import IVF_QUERY_BLOCK, _push, _write_key, _write_sorted
from vq.kernels.fastscan.fastscan_scans import (
    BLOCK,
    block_kernel,
    popcount,
    portable_block,
    quantize_tables,
    trailing_zeros,
)
from vq.kernels.fastscan.shuffle import rank_filter
from vq.kernels.jit.cache import kernel
from vq.kernels.pq.adc import IP_TABLE, L2_TABLE, RESIDUAL_L2_TABLE

# -- specialised constants (vq.kernels.jit.cache.specialise writes these lines) --
DSUB = 1
ISA = "portable"
N_PAIRS = 1
# -- end of specialised constants --

Q = IVF_QUERY_BLOCK
M = 2 * N_PAIRS
# one block kernel per group size, so that a group of one query does one query's work
block1, block2, block3 = (block_kernel(ISA, N_PAIRS, g) for g in (1, 2, 3))
ip_row, l2_row = table_row_kernels(DSUB)
SIMD = ISA != "portable"


@njit(inline="always")
def _valid(m, row0, end):
    """The bits of ``m`` of the block's stored rows (below ``end``, not padding)."""
    if end - row0 < BLOCK:
        return np.uint32(m & ((np.uint32(1) << np.uint32(end - row0)) - np.uint32(1)))
    return np.uint32(m)


@kernel(nogil=True)
def scan_slice(q0, q1, p0, p1, parts, lists, probes, allowed, state):
    """A thread's share: the probes p0, p0 + parts, ... (< p1) of queries q0..q1, sorted
    by list, each list read once per group of Q of its queries."""
    lists, probes, state = borrow(lists), borrow(probes), borrow(state)  # (see simd.borrow)
    list_blocks, offsets, packed = lists
    T, _, luts, shifts, heaps, counts = state
    nprobe, k = probes.shape[1], heaps.shape[1]
    nlist = list_blocks.shape[0] - 1
    filtered = allowed.shape[0] > 0
    start = np.zeros(nlist + 1, dtype=np.int64)  # counting sort of the pairs by list
    for q in range(q0, q1):
        for p in range(p0, p1, parts):
            if probes[q, p] >= 0:
                start[probes[q, p] + 1] += 1
    for lst in range(nlist):
        start[lst + 1] += start[lst]
    fill = start[:nlist].copy()
    order = np.empty(start[nlist], dtype=np.int64)
    for q in range(q0, q1):
        for p in range(p0, p1, parts):
            lst = probes[q, p]
            if lst >= 0:
                order[fill[lst]] = q * nprobe + p
                fill[lst] += 1
    lut_rows = np.zeros(Q, dtype=np.int64)  # the group's tables: rows of luts
    thr = np.zeros(Q, dtype=np.int32)
    dist = np.empty((Q, BLOCK), dtype=np.uint16)
    mask = np.zeros(Q, dtype=np.int32)
    query = np.zeros(Q, dtype=np.int64)
    shift = np.zeros(Q, dtype=np.int64)
    for lst in range(nlist):
        first, end = offsets[lst], offsets[lst + 1]
        b0, b1 = list_blocks[lst], list_blocks[lst + 1]
        for g in range(start[lst], start[lst + 1], Q):
            size = min(Q, start[lst + 1] - g)
            for t in range(size):
                r = order[g + t]
                query[t] = r // nprobe
                lut_rows[t] = (r if T > 1 else query[t]) * N_PAIRS
                shift[t] = shifts[query[t], r % nprobe]
            for t in range(size, Q):
                thr[t] = 0  # an empty slot (the portable block reads it): nothing passes
                lut_rows[t] = 0
            for b in range(b0, b1):
                if filtered and allowed[b] == 0:
                    continue  # no allowed row in the block: not read
                live = False
                for t in range(size):
                    # distances equal to the k-th best may still win on their row
                    limit = min(key_value(heaps[query[t], 0]) + 1, 65535) - shift[t]
                    thr[t] = max(limit, 0)
                    live = live or limit > 0
                if not live:
                    break
                code_row = b * N_PAIRS
                if SIMD:
                    if size == 3:
                        block3(packed, code_row, luts, lut_rows, thr, dist, mask)
                    elif size == 2:
                        block2(packed, code_row, luts, lut_rows, thr, dist, mask)
                    else:
                        block1(packed, code_row, luts, lut_rows, thr, dist, mask)
                else:
                    portable_block(packed, code_row, luts, lut_rows, N_PAIRS, thr, dist, mask)
                row0 = first + (b - b0) * BLOCK
                for t in range(size):
                    m = np.uint32(mask[t])
                    if filtered:
                        m &= allowed[b]
                    if SIMD and popcount(m) > k:  # at most about k of them can be kept
                        m = rank_filter(dist, t, _valid(m, row0, end), k)
                    qt = query[t]
                    while m != 0:
                        v = trailing_zeros(m)
                        m &= m - np.uint32(1)
                        row = row0 + v
                        if row < end:
                            key = row_key(shift[t] + np.int64(dist[t, v]), row)
                            if key < heaps[qt, 0]:
                                _push(heaps, counts, qt, key)


@njit(nogil=True)
def scan_one(q, lists, probes, allowed, state):
    """Query q alone, its probes in their order (the nearest list first: its k-th best
    settles soonest): what a slice of one query needs, without ``scan_slice``'s sort of the
    probes by list (which lets a group of queries share each list's reads)."""
    list_blocks, offsets, packed = lists
    T, _, luts, shifts, heaps, counts = state
    nprobe, k = probes.shape[1], heaps.shape[1]
    filtered = allowed.shape[0] > 0
    lut_rows = np.zeros(Q, dtype=np.int64)
    thr = np.zeros(Q, dtype=np.int32)  # slots past the first stay 0: nothing passes
    dist = np.empty((Q, BLOCK), dtype=np.uint16)
    mask = np.zeros(Q, dtype=np.int32)
    for p in range(nprobe):
        lst = probes[q, p]
        if lst < 0:
            continue
        lut_rows[0] = (q * nprobe + p if T > 1 else q) * N_PAIRS
        shift = np.int64(shifts[q, p])
        first, end = offsets[lst], offsets[lst + 1]
        b0, b1 = list_blocks[lst], list_blocks[lst + 1]
        for b in range(b0, b1):
            if filtered and allowed[b] == 0:
                continue  # no allowed row in the block: not read
            # distances equal to the k-th best may still win on their row
            limit = min(key_value(heaps[q, 0]) + 1, 65535) - shift
            if limit <= 0:
                break
            thr[0] = limit
            if SIMD:
                block1(packed, b * N_PAIRS, luts, lut_rows, thr, dist, mask)
            else:
                portable_block(packed, b * N_PAIRS, luts, lut_rows, N_PAIRS, thr, dist, mask)
            m = np.uint32(mask[0])
            if filtered:
                m &= allowed[b]
            row0 = first + (b - b0) * BLOCK
            if SIMD and popcount(m) > k:  # at most about k of them can be kept
                m = rank_filter(dist, 0, _valid(m, row0, end), k)
            while m != 0:
                v = trailing_zeros(m)
                m &= m - np.uint32(1)
                row = row0 + v
                if row < end:
                    key = row_key(shift + np.int64(dist[0, v]), row)
                    if key < heaps[q, 0]:
                        _push(heaps, counts, q, key)


@kernel(nogil=True)
def build_tables(q, queries, tables, probes, state, out, space):
    """Query q's tables (T of them: one per probe, or one for all), quantized with one
    scale into ``state.luts[q * T : (q + 1) * T]`` and ``state.shifts[q]``, its scale and
    offset into ``out``; ``space`` = (table [M * 16], residual [dim], scratch [T, M, 16]) is
    the calling thread's work space."""
    codebooks_t, norms, centroids, list_tables, kind, alpha, _ = tables
    table, residual, scratch = space
    T = state.per_query
    summed = list_tables.shape[0] > 0
    x = queries[q]
    if kind == IP_TABLE:
        for m in range(M):
            ip_row(x, m * DSUB, codebooks_t, m * DSUB * 16, alpha, table, m * 16)
    elif kind == L2_TABLE:
        for m in range(M):
            l2_row(x, m * DSUB, codebooks_t, m * DSUB * 16, norms, m * 16, table, m * 16)
    for t in range(T):
        lst = max(probes.lists[q, t], 0)
        if kind != IP_TABLE and kind != L2_TABLE:  # residual tables, per probe
            for d in range(x.shape[0]):
                residual[d] = x[d] - centroids[lst, d]
            for m in range(M):
                l2_row(residual, m * DSUB, codebooks_t, m * DSUB * 16, norms, m * 16, table, m * 16)
        for m in range(M):  # vector rows: numba's loop here stays scalar
            if summed:
                add_row(table, m * 16, list_tables, (lst * M + m) * 16, scratch, (t * M + m) * 16)
            else:
                copy_row(table, m * 16, scratch, (t * M + m) * 16)
    luts = state.luts[q * T : (q + 1) * T]
    sc, of = quantize_tables(scratch, probes.base[q], luts, state.shifts[q])
    _, _, out_scale, out_offset = out  # (written through names: see vq.kernels.common.bundles)
    out_scale[q] = sc
    out_offset[q] = of


@kernel(nogil=True)
def tables_range(q0, q1, queries, tables, probes, state, out):
    """``build_tables`` for queries q0..q1, with one work space."""
    queries, probes, state = borrow(queries), borrow(probes), borrow(state)
    space = (
        np.empty(M * 16, dtype=np.float32),
        np.empty(queries.shape[1], dtype=np.float32),
        np.empty((state.per_query, M, 16), dtype=np.float32),
    )
    for q in range(q0, q1):
        build_tables(q, queries, tables, probes, state, out, space)


def scan(queries, tables, lists, probes, allowed, out, ranked):
    """See :func:`vq.kernels.fastscan.fastscan_ivf.ivf_fastscan_lists`. Threads take slices of the
    queries; a batch smaller than the thread count has its tables built first, then each
    thread takes every query's probes p with p % parts == its part, into heaps of its own,
    merged at the end."""
    nq, nprobe = probes.lists.shape
    k = out.distances.shape[1]
    # one table per probe where the list changes it, else one per query for all probes
    per_query = nprobe if tables.list_tables.shape[0] > 0 or tables.kind == RESIDUAL_L2_TABLE else 1
    luts = np.empty((nq * per_query, N_PAIRS, 32), dtype=np.uint8)
    lut_rows = luts.reshape((nq * per_query * N_PAIRS, 32))  # the rows the block kernels read
    shifts = np.empty((nq, nprobe), dtype=np.int32)
    threads = get_num_threads()
    parts = 1 if nq >= threads else max(1, min(threads, nprobe))
    heaps = np.full((parts, nq, k), EMPTY_KEY, dtype=np.int64)
    counts = np.zeros((parts, nq), dtype=np.int64)  # keys in each heap
    if parts == 1:  # each thread a slice of the queries, from tables to results
        state = ScanState(per_query, luts, lut_rows, shifts, heaps[0], counts[0])
        parallel_for(serve_slice, nq, queries, tables, lists, probes, allowed, state, out, ranked)
        return
    state = ScanState(per_query, luts, lut_rows, shifts, heaps[0], counts[0])
    tables_range(0, nq, queries, tables, probes, state, out)
    parts_states = [
        ScanState(per_query, luts, lut_rows, shifts, heaps[p], counts[p]) for p in range(parts)
    ]

    def scan_parts(part0: int, part1: int) -> None:
        for part in range(part0, part1):
            scan_slice(0, nq, part, nprobe, parts, lists, probes.lists, allowed, parts_states[part])

    parallel_for(scan_parts, parts)
    merge_parts(heaps, out)  # distinct rows per part


@kernel(nogil=True)
def lean_search(
    queries, coarse, tables, lists, finish, inner_product, nprobe, k_candidates, out, ranked
):
    """A few queries on the calling thread, from the coarse step to ids (and through the
    re-ranking of a wrapping ``Refine``), in one call (the lean path: see
    :func:`vq.kernels.fastscan.fastscan_ivf.ivf_fastscan_lean`); False (and nothing done) if a
    query holds a NaN or an infinity."""
    coarse, tables = borrow(Coarse(*coarse)), borrow(Tables(*tables))
    lists, finish = borrow(PackedLists(*lists)), borrow(Finish(*finish))
    out_dist, out_ids = out
    if not all_finite(queries):
        return False
    nq, k = queries.shape[0], k_candidates
    scores, probed = probe_few(queries, coarse, nprobe, inner_product)
    base = scores if tables.coarse_base else np.zeros((nq, nprobe), dtype=np.float32)
    summed = tables.list_tables.shape[0] > 0
    T = nprobe if summed or tables.kind == RESIDUAL_L2_TABLE else 1
    luts = np.empty((nq * T, N_PAIRS, 32), dtype=np.uint8)
    lut_rows = luts.reshape((nq * T * N_PAIRS, 32))
    shifts = np.empty((nq, nprobe), dtype=np.int32)
    state = ScanState(
        T,
        luts,
        lut_rows,
        shifts,
        np.full((nq, k), EMPTY_KEY, dtype=np.int64),
        np.zeros(nq, dtype=np.int64),
    )
    scale_offset = np.empty((2, nq), dtype=np.float32)
    found = ScaledTopK(
        np.empty((nq, k), dtype=np.float32),
        np.empty((nq, k), dtype=np.int64),
        scale_offset[0],
        scale_offset[1],
    )
    no_filter = np.zeros(0, dtype=np.uint32)
    serve_slice(
        np.int64(0),
        np.int64(nq),
        queries,
        tables,
        lists,
        Probes(probed, base),
        no_filter,
        state,
        found,
        ranked,
    )
    finish_lean(queries, found.distances, found.labels, finish, inner_product, out_dist, out_ids)
    return True


@kernel(nogil=True)
def serve_slice(q0, q1, queries, tables, lists, probes, allowed, state, out, ranked):
    """Queries q0..q1, from their tables to their results."""
    lists, state, out = borrow(lists), borrow(state), borrow(out)  # (views: see simd.borrow)
    heaps, counts = state.heaps, state.counts
    k = out.distances.shape[1]
    nprobe = probes.lists.shape[1]
    tables_range(q0, q1, queries, tables, probes, state, out)
    if q1 - q0 == 1:
        scan_one(q0, lists, probes.lists, allowed, state)
    else:  # every query's nearest list first: its k-th best settles sooner
        one = np.int64(1)
        for p0, p1 in ((np.int64(0), min(one, nprobe)), (one, nprobe)):
            scan_slice(q0, q1, p0, p1, one, lists, probes.lists, allowed, state)
    for q in range(q0, q1):
        scale, offset = out.scale[q], out.offset[q]
        if ranked:
            _write_sorted(heaps[q], counts[q], scale, offset, out.distances[q], out.labels[q])
        else:  # candidates for re-ranking, not sorted: leaves (the nearer half, roughly)
            # first, which lets the re-ranking heap settle sooner
            for e in range(k):
                _write_key(heaps[q, k - 1 - e], scale, offset, out.distances[q], out.labels[q], e)


@kernel(nogil=True)
def merge_parts(heaps, out):
    """Each query's k smallest keys over the parts' heaps [parts, nq, k], as results into
    ``out`` (a :class:`~vq.kernels.common.bundles.ScaledTopK`, whose scale and offset are
    read)."""
    out = borrow(out)
    out_dist, out_idx, out_scale, out_offset = out
    parts, nq, k = heaps.shape
    keys = np.empty(parts * k, dtype=np.int64)
    best = np.empty(k, dtype=np.int64)
    for q in range(nq):
        for e in range(parts * k):
            keys[e] = heaps[e // k, q, e % k]
        smallest_keys(keys, best)
        for e in range(k):
            _write_key(best[e], out_scale[q], out_offset[q], out_dist[q], out_idx[q], e)
