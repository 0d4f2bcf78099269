"""IVF fast-scan: the probed inverted lists of block-packed 4-bit codes, scanned list by list
with byte shuffles (faiss ``IndexIVFPQFastScan``; the layout and the block kernel are in
:mod:`vq.kernels.fastscan`).

How a batch is served. Each query's tables are built and quantized (in parallel over queries).
Then the queries are cut into one slice per thread; a thread sorts its (query, probe) pairs by
list and reads each list once per group of ``IVF_QUERY_BLOCK`` queries that probe it, so that
every loaded block of codes serves several queries. Each query keeps one top-k heap over all
its probes, whose k-th best distance is the threshold that the SIMD compare skips vectors
with. A batch smaller than the thread count is cut by probes instead (thread s takes every
query's probes s, s + threads, ...), with a heap per thread and query, merged at the end.

Heap entries are int64 keys ``distance << 40 | row``: the k smallest keys are the k nearest by
(quantized distance, row), whatever order the lists were read in, so results do not depend on
the thread count or on which query shares a pass with which.
"""

from __future__ import annotations

import functools

import numba
import numpy as np
from numba import njit, prange

from vq.kernels.fastscan import (
    BLOCK,
    block_kernel,
    check_isa,
    portable_block,
    quantize_tables,
    trailing_zeros,
)
from vq.kernels.scan import IP_TABLE, L2_TABLE
from vq.kernels.simd import add_row, copy_row, table_row_kernels

#: queries sharing one pass over a list's blocks
IVF_QUERY_BLOCK = 3
_ROW_BITS = 40  # rows below 2**40; distances (< 2**17) above them
_ROW_MASK = (1 << _ROW_BITS) - 1
_EMPTY = np.iinfo(np.int64).max


@njit(inline="always")
def _sift_down(heap, k, key, i=0):
    """Put ``key`` at node i (the root by default) of the int64 max-heap ``heap[:k]`` and
    sift it down."""
    while True:
        c = 2 * i + 1
        if c >= k:
            break
        if c + 1 < k:
            c += np.int64(heap[c + 1] > heap[c])  # the larger child, without a branch
        if heap[c] <= key:
            break
        heap[i] = heap[c]
        i = c
    heap[i] = key


@njit(inline="always")
def _heapify(heap):
    k = heap.shape[0]
    for i in range(k // 2 - 1, -1, -1):
        _sift_down(heap, k, heap[i], i)


@njit(inline="always")
def _push(heap, counts, q, key):
    """Offer ``key`` (< heap[0]) to query q's heap of its k smallest keys. The first k are
    stored from the end, the root staying _EMPTY so that nothing is refused, and heapified
    at once when the heap is full (``counts[q]`` keys so far): cheaper than k sift-downs when
    most candidates are kept, as with a large k and short lists."""
    k = heap.shape[0]
    n = counts[q]
    if n < k:
        heap[k - 1 - n] = key
        counts[q] = n + 1
        if n + 1 == k:
            _heapify(heap)
    else:
        _sift_down(heap, k, key)


@njit(inline="always")
def _write_sorted(heap, count, scale, offset, out_dist, out_idx):
    """A heap of ``count`` keys (consumed) as float distances ascending (+inf padding) and
    rows (-1)."""
    if count < heap.shape[0]:
        _heapify(heap)
    for size in range(heap.shape[0], 0, -1):
        key = heap[0]
        last = heap[size - 1]
        _sift_down(heap, size - 1, last)
        _write_key(key, scale, offset, out_dist, out_idx, size - 1)


@njit(inline="always")
def _write_key(key, scale, offset, out_dist, out_idx, e):
    """Entry e of the results: the key's row and its distance mapped back to a float
    (``d / scale + offset``); +inf and -1 for an empty slot."""
    if key == _EMPTY:
        out_dist[e] = np.inf
        out_idx[e] = -1
    else:
        out_dist[e] = np.float32(key >> _ROW_BITS) / scale + offset
        out_idx[e] = key & _ROW_MASK


@functools.cache
def ivf_fastscan_lists(n_pairs: int, dsub: int, isa: str):
    """The IVF fast-scan kernel for M = 2 ``n_pairs`` sub-quantizers of ``dsub`` dimensions.

    The returned ``scan(queries, codebooks_t, norms, centroids, list_tables, kind, alpha,
    base, probes, list_blocks, offsets, packed, out_dist, out_idx, out_scale, out_offset,
    ranked)``
    takes the arguments of :func:`vq.kernels.ivfpq_scanner` (16-entry tables; ``kind`` one of
    its IP_TABLE / L2_TABLE / RESIDUAL_L2_TABLE; the tables are built per probe only when the
    list changes them) plus the packed lists of :func:`vq.kernels.fastscan.pack_lists`. It
    finds the k smallest quantized distances d, ties by lower row, and writes their rows (-1
    padding) into ``out_idx`` [nq, k], ``d / scale + offset`` (ascending, +inf padding) into
    ``out_dist`` [nq, k], and each query's ``scale`` and ``offset`` into ``out_scale`` and
    ``out_offset`` [nq]. With ``ranked`` False the k results may come in any order (the
    candidates of a re-ranking step, spared a sort that costs as much as their scan at a k of
    100 or more).
    """
    n_pairs, dsub, isa = int(n_pairs), int(dsub), check_isa(isa)
    Q = IVF_QUERY_BLOCK
    M = 2 * n_pairs
    # one block kernel per group size, so that a group of one query does one query's work
    block1, block2, block3 = (block_kernel(isa, n_pairs, g) for g in (1, 2, 3))
    ip_row, l2_row = table_row_kernels(dsub)
    simd = isa != "portable"

    @njit(nogil=True)
    def scan_slice(q0, q1, p0, p1, parts, luts, T, shifts, probes, list_blocks, offsets,
                   packed, heaps, counts):  # fmt: skip
        """A thread's share: the probes p0, p0 + parts, ... (< p1) of queries q0..q1, sorted
        by list, each list read once per group of Q of its queries."""
        nprobe = probes.shape[1]
        nlist = list_blocks.shape[0] - 1
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
                    lut_rows[t] = (r if T > 1 else query[t]) * n_pairs
                    shift[t] = shifts[query[t], r % nprobe]
                for t in range(size, Q):
                    thr[t] = 0  # an empty slot (the portable block reads it): nothing passes
                    lut_rows[t] = 0
                for b in range(b0, b1):
                    live = False
                    for t in range(size):
                        # distances equal to the k-th best may still win on their row
                        limit = min((heaps[query[t], 0] >> _ROW_BITS) + 1, 65535) - shift[t]
                        thr[t] = max(limit, 0)
                        live = live or limit > 0
                    if not live:
                        break
                    code_row = b * n_pairs
                    if simd:
                        if size == 3:
                            block3(packed, code_row, luts, lut_rows, thr, dist, mask)
                        elif size == 2:
                            block2(packed, code_row, luts, lut_rows, thr, dist, mask)
                        else:
                            block1(packed, code_row, luts, lut_rows, thr, dist, mask)
                    else:
                        portable_block(packed, code_row, luts, lut_rows, n_pairs, thr, dist, mask)
                    row0 = first + (b - b0) * BLOCK
                    for t in range(size):
                        m = np.uint32(mask[t])
                        heap = heaps[query[t]]
                        while m != 0:
                            v = trailing_zeros(m)
                            m &= m - np.uint32(1)
                            row = row0 + v
                            if row < end:
                                key = ((shift[t] + np.int64(dist[t, v])) << _ROW_BITS) | row
                                if key < heap[0]:
                                    _push(heap, counts, query[t], key)

    @njit(nogil=True)
    def tables(q, queries, codebooks_t, norms, centroids, list_tables, kind, alpha, base, probes,
               T, luts, shifts, out_scale, out_offset, table, residual, scratch):  # fmt: skip
        """Query q's tables (T of them: one per probe, or one for all), quantized with one
        scale into ``luts[q * T : (q + 1) * T]`` and shifts[q]; ``table`` [M * 16],
        ``residual`` [dim] and ``scratch`` [T, M, 16] are the calling thread's work space."""
        summed = list_tables.shape[0] > 0
        x = queries[q]
        if kind == IP_TABLE:
            for m in range(M):
                ip_row(x, m * dsub, codebooks_t, m * dsub * 16, alpha, table, m * 16)
        elif kind == L2_TABLE:
            for m in range(M):
                l2_row(x, m * dsub, codebooks_t, m * dsub * 16, norms, m * 16, table, m * 16)
        for t in range(T):
            lst = max(probes[q, t], 0)
            if kind != IP_TABLE and kind != L2_TABLE:  # residual tables, per probe
                for d in range(x.shape[0]):
                    residual[d] = x[d] - centroids[lst, d]
                for m in range(M):
                    l2_row(residual, m * dsub, codebooks_t, m * dsub * 16, norms, m * 16, table,
                           m * 16)  # fmt: skip
            for m in range(M):  # vector rows: numba's loop here stays scalar
                if summed:
                    add_row(
                        table, m * 16, list_tables, (lst * M + m) * 16, scratch, (t * M + m) * 16
                    )
                else:
                    copy_row(table, m * 16, scratch, (t * M + m) * 16)
        sc, of = quantize_tables(scratch, base[q], luts[q * T : (q + 1) * T], shifts[q])
        out_scale[q] = sc
        out_offset[q] = of

    @njit(nogil=True)
    def tables_range(q0, q1, queries, codebooks_t, norms, centroids, list_tables, kind, alpha,
                     base, probes, T, luts, shifts, out_scale, out_offset):  # fmt: skip
        """``tables`` for queries q0..q1, with one work space."""
        table = np.empty(M * 16, dtype=np.float32)
        residual = np.empty(queries.shape[1], dtype=np.float32)
        scratch = np.empty((T, M, 16), dtype=np.float32)
        for q in range(q0, q1):
            tables(q, queries, codebooks_t, norms, centroids, list_tables, kind, alpha, base,
                probes, T, luts, shifts, out_scale, out_offset, table, residual, scratch
            )  # fmt: skip

    @njit(parallel=True, nogil=True)
    def scan(
        queries,
        codebooks_t,
        norms,
        centroids,
        list_tables,
        kind,
        alpha,
        base,
        probes,
        list_blocks,
        offsets,
        packed,
        out_dist,
        out_idx,
        out_scale,
        out_offset,
        ranked,
    ):
        nq, nprobe = probes.shape
        k = out_dist.shape[1]
        summed = list_tables.shape[0] > 0
        # one table per probe where the list changes it, else one per query for all probes
        T = nprobe if summed or (kind != IP_TABLE and kind != L2_TABLE) else 1
        luts = np.empty((nq * T, n_pairs, 32), dtype=np.uint8)
        flat_luts = luts.reshape((nq * T * n_pairs, 32))  # the rows the block kernels read
        shifts = np.empty((nq, nprobe), dtype=np.int32)
        threads = numba.get_num_threads()
        # a batch of at least one query per thread: each thread takes a slice of the queries;
        # a smaller one: each thread takes every query's probes p with p % parts == its part
        parts = 1 if nq >= threads else max(1, min(threads, nprobe))
        n_slices = max(1, min(nq, threads)) if parts == 1 else parts  # nq may be 0
        per = -(-nq // n_slices) if parts == 1 else nq
        heaps = np.full((parts, nq, k), _EMPTY, dtype=np.int64)
        counts = np.zeros((parts, nq), dtype=np.int64)  # keys in each heap
        if parts == 1:  # one parallel region: each thread its slice, tables to results
            for s in prange(n_slices):
                q0, q1 = np.int64(s) * per, min(nq, (np.int64(s) + 1) * per)
                tables_range(q0, q1, queries, codebooks_t, norms, centroids, list_tables, kind,
                    alpha, base, probes, T, luts, shifts, out_scale, out_offset
                )  # fmt: skip
                # every query's nearest list first: its k-th best settles sooner
                for p0, p1 in ((0, min(1, nprobe)), (1, nprobe)):
                    scan_slice(
                        q0, q1, p0, p1, 1, flat_luts, T, shifts, probes, list_blocks, offsets,
                        packed, heaps[0], counts[0],
                    )  # fmt: skip
                for q in range(q0, q1):
                    scale, offset = out_scale[q], out_offset[q]
                    if ranked:
                        _write_sorted(heaps[0, q], counts[0, q], scale, offset, out_dist[q],
                                      out_idx[q])  # fmt: skip
                    else:  # candidates for re-ranking, not sorted: leaves (the nearer
                        # half, roughly) first, which lets the re-ranking heap settle sooner
                        for e in range(k):
                            key = heaps[0, q, k - 1 - e]
                            _write_key(key, scale, offset, out_dist[q], out_idx[q], e)
            return
        for q in prange(nq):  # a small batch: tables, probes split between threads, merge
            tables_range(q, q + 1, queries, codebooks_t, norms, centroids, list_tables, kind,
                         alpha, base, probes, T, luts, shifts, out_scale, out_offset)  # fmt: skip
        for part in prange(parts):
            scan_slice(
                0, nq, np.int64(part), nprobe, parts, flat_luts, T, shifts, probes, list_blocks,
                offsets, packed, heaps[part], counts[part],
            )  # fmt: skip
        for q in prange(nq):  # the parts' heaps hold distinct rows
            keys = np.sort(heaps[:, q].ravel())[:k]
            for e in range(k):
                _write_key(keys[e], out_scale[q], out_offset[q], out_dist[q], out_idx[q], e)

    return scan
