"""4-bit PQ fast-scan: uint8 look-up tables read with byte shuffles, codes packed 32 vectors
to a block (André, Kermarrec & Le Scouarnec, "Cache locality is not enough: high-performance
nearest neighbor search with product quantization fast scan", VLDB 2015; faiss's
``IndexPQFastScan``).

Layout. For M sub-quantizers of 16 centroids (M even), a block of 32 vectors takes M/2 rows of
32 bytes, one row per pair of sub-quantizers (2p, 2p + 1):

- byte j (0..15) holds the code of sub-quantizer 2p for vector v = PERM[j] in its low nibble
  and for vector 16 + v in its high nibble, with PERM = 0, 8, 1, 9, …, 7, 15;
- byte 16 + j holds the same for sub-quantizer 2p + 1.

This is faiss's layout (``pq4_pack_codes`` with 32-vector blocks), so packed codes convert
as they are. PERM makes the even bytes of a 16-bit lane hold vectors 0..7 and the odd bytes
8..15, which is the order the uint16 accumulation below produces them in.

A query's table for the pair is 32 bytes too: the 16 entries of table 2p, then those of 2p + 1.
A 256-bit byte shuffle (``vpshufb``, which looks up within each 128-bit half) of the table by
the low nibbles gives the 16 + 16 entries of vectors 0..15, by the high nibbles those of
16..31. Sums are accumulated in uint16 lanes; the tables are quantized so that no sum can
overflow (:func:`quantize_tables`).

Two implementations give identical (integer) distances: one emits AVX2 shuffles through LLVM
intrinsics (``numba.extending.intrinsic``), one is plain numba for CPUs without AVX2.
"""

from __future__ import annotations

import functools

import llvmlite.binding as llvm
import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from vq.kernels.scan import _heap_replace_top, _heap_sorted

BLOCK = 32  # vectors per block
PERM = np.array([0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15])
_POSITION = np.argsort(PERM)  # byte of vector v (0..15)
_U16_MAX = 65535


def has_avx2() -> bool:
    """Whether this CPU has AVX2 (then the shuffle kernel is used)."""
    return bool(llvm.get_host_cpu_features().get("avx2", False))


# -- packing -----------------------------------------------------------------------------------
def pack_codes(codes: np.ndarray) -> np.ndarray:
    """Block-pack 4-bit codes.

    Args:
        codes: uint8 [n, M], values < 16, M even.

    Returns:
        uint8 [ceil(n / 32), M / 2, 32]; vectors past n (padding) have code 0.
    """
    n, M = codes.shape
    if M % 2:
        raise ValueError(f"fast-scan packs sub-quantizers in pairs: M must be even, got {M}")
    nblocks = -(-n // BLOCK)
    c = np.zeros((nblocks * BLOCK, M), dtype=np.uint8)
    c[:n] = codes
    c = c.reshape(nblocks, 2, 16, M // 2, 2)[:, :, PERM]  # block, half, byte j, pair, sq
    packed = c[:, 0] | (c[:, 1] << 4)  # [nblocks, 16 (j), M/2, 2]
    return np.ascontiguousarray(packed.transpose(0, 2, 3, 1).reshape(nblocks, M // 2, 32))


def unpack_codes(packed: np.ndarray, n: int) -> np.ndarray:
    """Inverse of :func:`pack_codes`: uint8 [n, M]."""
    nblocks, pairs, _ = packed.shape
    p = packed.reshape(nblocks, pairs, 2, 16).transpose(0, 3, 1, 2)  # block, j, pair, sq
    codes = np.stack([p & 15, p >> 4], axis=1)[:, :, _POSITION]  # block, half, vector, pair, sq
    return np.ascontiguousarray(codes.reshape(nblocks * BLOCK, pairs * 2)[:n])


# -- tables ------------------------------------------------------------------------------------
@njit(inline="always")
def quantize_tables(tables, bias, out_luts, out_bias):
    """Quantize one query's float tables to uint8 with one scale for all of them.

    Args:
        tables: float32 [P, M, 16]: the query's tables for P table sets (one per probed list,
            or P = 1).
        bias: float32 [P]: a constant added to every distance of set p (e.g. the coarse term).
        out_luts: uint8 [P, M / 2, 32] in the packed pair layout.
        out_bias: int32 [P]: quantized biases.

    Returns:
        (scale, offset): float distance ≈ (bias_q + Σ lut) / scale + offset. The scale is the
        largest that keeps every entry ≤ 255 and every total ≤ 65535 (uint16).
    """
    P, M, ksub = tables.shape
    span = np.float32(0.0)
    lows = np.empty((P, M), dtype=np.float32)
    lo_total = np.empty(P, dtype=np.float32)
    hi_total = np.empty(P, dtype=np.float32)
    for p in range(P):
        lo_sum = bias[p]
        hi_sum = bias[p]
        for m in range(M):
            lo = tables[p, m, 0]
            hi = tables[p, m, 0]
            for j in range(1, ksub):
                v = tables[p, m, j]
                lo = min(lo, v)
                hi = max(hi, v)
            lows[p, m] = lo
            span = max(span, hi - lo)
            lo_sum += lo
            hi_sum += hi
        lo_total[p] = lo_sum
        hi_total[p] = hi_sum
    offset = lo_total.min()
    total_span = np.float32(0.0)
    for p in range(P):
        total_span = max(total_span, hi_total[p] - offset)
    scale = np.float32(np.inf)
    if span > 0:
        scale = min(scale, np.float32(255.0) / span)
    if total_span > 0:
        scale = min(scale, np.float32(_U16_MAX - M) / total_span)
    if not np.isfinite(scale):
        scale = np.float32(1.0)
    for p in range(P):
        for m in range(M):
            lo = lows[p, m]
            half = (m & 1) * 16
            for j in range(ksub):
                # non-negative, so truncation rounds half up
                v = (tables[p, m, j] - lo) * scale + np.float32(0.5)
                out_luts[p, m >> 1, half + j] = np.uint8(min(v, np.float32(255.0)))
        b = np.floor((lo_total[p] - offset) * scale + np.float32(0.5))
        out_bias[p] = np.int32(min(max(b, np.float32(0.0)), np.float32(_U16_MAX - M * 255)))
    return scale, offset


# -- one block of 32 vectors against Q queries ---------------------------------------------------
@functools.cache
def _shuffle_block(n_pairs: int, n_queries: int):
    """An intrinsic computing the uint16 distances of one block of 32 vectors to
    ``n_queries`` queries with AVX2 byte shuffles, unrolled over ``n_pairs`` rows.

    ``block(codes, code_row, luts, lut_row, thresholds, out_dist, out_mask)``: codes uint8
    [rows, 32] with the block at ``code_row``; luts uint8 [rows, 32], query q's tables at
    ``lut_row + q * n_pairs``; thresholds int32 [n_queries]; writes out_dist uint16
    [n_queries, 32] and out_mask int32 [n_queries] (bit v set when vector v's
    distance is below the query's threshold).
    """
    i8, i16, i32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)
    v32i8, v16i16, v32i16 = ir.VectorType(i8, 32), ir.VectorType(i16, 16), ir.VectorType(i16, 32)

    def splat(ty, value):
        return ir.Constant(ty, [ir.Constant(ty.element, value)] * ty.count)

    def const_mask(indices):
        return ir.Constant(ir.VectorType(i32, len(indices)), [ir.Constant(i32, i) for i in indices])

    @intrinsic
    def block(typingctx, codes, code_row, luts, lut_row, thresholds, out_dist, out_mask):
        sig = types.void(codes, code_row, luts, lut_row, thresholds, out_dist, out_mask)

        def codegen(context, builder, signature, args):
            codes_a, code_row_v, luts_a, lut_row_v, thr_a, dist_a, mask_a = args
            arr = [
                context.make_array(signature.args[i])(context, builder, args[i])
                for i in (0, 2, 4, 5, 6)
            ]
            codes_p, luts_p, thr_p, dist_p, mask_p = (a.data for a in arr)
            module = builder.module
            fnty = ir.FunctionType(v32i8, [v32i8, v32i8])
            pshufb = module.declare_intrinsic("llvm.x86.avx2.pshuf.b", fnty=fnty)
            row_bytes = ir.Constant(code_row_v.type, 32)
            codes_base = builder.gep(codes_p, [builder.mul(code_row_v, row_bytes)])
            luts_base = builder.gep(luts_p, [builder.mul(lut_row_v, row_bytes)])
            low4 = splat(v32i8, 15)
            four = splat(v32i8, 4)
            eight = splat(v16i16, 8)
            zero16 = ir.Constant(v16i16, None)
            acc = [[zero16] * 4 for _ in range(n_queries)]  # lo_all, lo_odd, hi_all, hi_odd
            for p in range(n_pairs):
                ptr = builder.gep(codes_base, [ir.Constant(i32, 32 * p)])
                c = builder.load(builder.bitcast(ptr, v32i8.as_pointer()), align=1)
                lo = builder.and_(c, low4)
                hi = builder.and_(builder.lshr(c, four), low4)
                for q in range(n_queries):
                    off = ir.Constant(i32, 32 * (q * n_pairs + p))
                    lptr = builder.bitcast(builder.gep(luts_base, [off]), v32i8.as_pointer())
                    lut = builder.load(lptr, align=1)
                    for h, idx in enumerate((lo, hi)):
                        r = builder.bitcast(builder.call(pshufb, [lut, idx]), v16i16)
                        a = acc[q]
                        a[2 * h] = builder.add(a[2 * h], r)
                        a[2 * h + 1] = builder.add(a[2 * h + 1], builder.lshr(r, eight))
            first_half = const_mask(range(8))
            second_half = const_mask(range(8, 16))
            for q in range(n_queries):
                a = acc[q]
                parts = []
                for h in range(2):
                    even = builder.sub(a[2 * h], builder.shl(a[2 * h + 1], eight))
                    for s in (even, a[2 * h + 1]):
                        x = builder.shuffle_vector(s, s, first_half)
                        y = builder.shuffle_vector(s, s, second_half)
                        parts.append(builder.add(x, y))  # lane 0 + lane 1: both tables
                ab = builder.shuffle_vector(parts[0], parts[1], const_mask(range(16)))
                cd = builder.shuffle_vector(parts[2], parts[3], const_mask(range(16)))
                dist = builder.shuffle_vector(ab, cd, const_mask(range(32)))  # vector order
                dptr = builder.gep(dist_p, [ir.Constant(i32, 32 * q)])
                builder.store(dist, builder.bitcast(dptr, v32i16.as_pointer()), align=2)
                thr = builder.trunc(builder.load(builder.gep(thr_p, [ir.Constant(i32, q)])), i16)
                thr_v = builder.insert_element(
                    ir.Constant(v32i16, ir.Undefined), thr, ir.Constant(i32, 0)
                )
                thr_v = builder.shuffle_vector(thr_v, thr_v, const_mask([0] * 32))
                below = builder.icmp_unsigned("<", dist, thr_v)
                bits = builder.bitcast(below, i32)
                builder.store(bits, builder.gep(mask_p, [ir.Constant(i32, q)]))
            return context.get_dummy_value()

        return sig, codegen

    return block


@njit(inline="always")
def _portable_block(codes, code_row, luts, lut_row, n_pairs, thresholds, out_dist, out_mask):
    """The shuffle kernel's arithmetic in plain numba (identical uint16 results)."""
    for q in range(out_dist.shape[0]):
        base = lut_row + q * n_pairs
        mask = np.int64(0)
        for v in range(BLOCK):
            j = v & 15
            j = 2 * j if j < 8 else 2 * j - 15  # the byte holding vector v (see PERM)
            shift = 4 if v >= 16 else 0
            d = 0
            for p in range(n_pairs):
                c0 = (codes[code_row + p, j] >> shift) & 15
                c1 = (codes[code_row + p, 16 + j] >> shift) & 15
                d += luts[base + p, c0] + luts[base + p, 16 + c1]
            out_dist[q, v] = d
            if d < thresholds[q]:
                mask |= np.int64(1) << v
        out_mask[q] = np.int32(np.int64(mask) - (np.int64(1) << 32) if mask >= 2**31 else mask)


@njit(parallel=True, nogil=True, cache=True)
def quantize_all(tables, bias, out_luts, out_bias, out_scale, out_offset):
    """:func:`quantize_tables` for every query: tables float32 [nq, P, M, 16], bias float32
    [nq, P] → out_luts uint8 [nq, P, M / 2, 32], out_bias int32 [nq, P], out_scale and
    out_offset float32 [nq]."""
    for q in prange(tables.shape[0]):
        s, o = quantize_tables(tables[q], bias[q], out_luts[q], out_bias[q])
        out_scale[q] = s
        out_offset[q] = o


@njit(inline="always")
def _offer(heap_d, heap_i, dist, mask, base, first_row, end_row, shift):
    """Offer the vectors of a block whose bit is set in ``mask`` to a top-k heap; returns the
    new uint16 threshold. ``dist`` uint16 [32]; vector v is row ``first_row + v`` (kept only
    below ``end_row``) with distance ``base + dist[v]``."""
    for v in range(BLOCK):
        if (mask >> v) & 1:
            row = first_row + v
            if row < end_row:
                d = np.float32(base + np.int64(dist[v]))
                if d < heap_d[0]:
                    _heap_replace_top(heap_d, heap_i, d, row)
    return min(np.int64(heap_d[0]) if heap_d[0] < 65536 else 65535, 65535) - shift


@functools.cache
def pq_fastscan_scanner(n_pairs: int, n_queries: int, simd: bool):
    """Fast-scan of a flat array of packed codes, ``n_queries`` queries per pass over a block,
    fused with top-k (per query).

    ``scan(luts, packed, n, out_dist, out_idx)``: luts uint8 [nq * n_pairs, 32] (nq a multiple
    of ``n_queries``), packed uint8 [nblocks * n_pairs, 32], n the number of vectors;
    out_dist float32 [nq, k] quantized distances ascending (+inf padding), out_idx int64
    [nq, k] rows (-1 padding).
    """
    Q = n_queries
    block = _shuffle_block(n_pairs, Q) if simd else None

    @njit(parallel=True, nogil=True)
    def scan(luts, packed, n, out_dist, out_idx):
        nq, k = out_dist.shape
        nblocks = packed.shape[0] // n_pairs
        for g in prange(nq // Q):
            heap_d = np.full((Q, k), np.inf, dtype=np.float32)
            heap_i = np.full((Q, k), -1, dtype=np.int64)
            thr = np.full(Q, 65535, dtype=np.int32)
            dist = np.empty((Q, BLOCK), dtype=np.uint16)
            mask = np.empty(Q, dtype=np.int32)
            lut_row = g * Q * n_pairs
            for b in range(nblocks):
                if simd:
                    block(packed, b * n_pairs, luts, lut_row, thr, dist, mask)
                else:
                    _portable_block(packed, b * n_pairs, luts, lut_row, n_pairs, thr, dist, mask)
                for q in range(Q):
                    if mask[q] != 0:
                        m = np.int64(mask[q]) & np.int64(0xFFFFFFFF)
                        thr[q] = _offer(heap_d[q], heap_i[q], dist[q], m, 0, b * BLOCK, n, 0)
            for q in range(Q):
                _heap_sorted(heap_d[q], heap_i[q], out_dist[g * Q + q], out_idx[g * Q + q])

    return scan


def pack_lists(codes: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pack CSR inverted lists of 4-bit codes list by list, each padded to whole blocks.

    Returns:
        (packed uint8 [nblocks * M / 2, 32], list_blocks int64 [nlist + 1]).
    """
    sizes = np.diff(offsets)
    list_blocks = np.zeros(len(sizes) + 1, dtype=np.int64)
    list_blocks[1:] = np.cumsum(-(-sizes // BLOCK))
    pairs = codes.shape[1] // 2
    packed = np.zeros((int(list_blocks[-1]), pairs, 32), dtype=np.uint8)
    for lst in np.flatnonzero(sizes):
        packed[list_blocks[lst] : list_blocks[lst + 1]] = pack_codes(
            codes[offsets[lst] : offsets[lst + 1]]
        )
    return packed.reshape(-1, 32), list_blocks


#: (query, probe) pairs sharing one pass over a list's blocks in the IVF scan
IVF_QUERY_BLOCK = 3


@functools.cache
def ivf_fastscan_lists(n_pairs: int, dsub: int, simd: bool):
    """IVF fast-scan, list-major: every list is read once per group of
    ``IVF_QUERY_BLOCK`` (query, probe) pairs that probe it, the way faiss serves batches.

    The returned ``scan(queries, codebooks_t, norms, centroids, list_tables, kind, alpha,
    base, probes, list_blocks, offsets, packed, out_dist, out_idx, out_scale, out_offset)``
    takes the arguments of :func:`vq.kernels.ivfpq_scanner` (16-entry tables; ``kind`` one of
    its IP_TABLE / L2_TABLE / RESIDUAL_L2_TABLE) plus the packed lists of
    :func:`pack_lists`, and writes quantized distances ascending (+inf padding) and rows
    (-1 padding) [nq, k], with the per-query ``out_scale`` and ``out_offset`` that map them
    back (``d / scale + offset``).

    Three parallel passes: tables (per query: build the float tables of every probe,
    quantize them with one scale), scans (per group of pairs: a top-k heap per pair), merge
    (per query: the k best of its probes' heaps). Among equal distances the
    earlier probe, then the lower row, wins (as a sequential scan keeps them).
    """
    from vq.kernels.scan import IP_TABLE, L2_TABLE, _inner_product_table, _l2_table

    n_pairs, dsub, simd = int(n_pairs), int(dsub), bool(simd)
    Q = IVF_QUERY_BLOCK
    M = 2 * n_pairs
    block = _shuffle_block(n_pairs, Q) if simd else None

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
    ):
        nq, nprobe = probes.shape
        k = out_dist.shape[1]
        summed = list_tables.shape[0] > 0
        luts = np.empty((nq * nprobe, n_pairs, 32), dtype=np.uint8)
        shifts = np.empty((nq, nprobe), dtype=np.int32)
        # 1. tables, quantized per query
        for q in prange(nq):
            table = np.empty(M * 16, dtype=np.float32)
            residual = np.empty(queries.shape[1], dtype=np.float32)
            scratch = np.empty((nprobe, M, 16), dtype=np.float32)
            x = queries[q]
            if kind == IP_TABLE:
                _inner_product_table(x, codebooks_t, table, M, dsub, alpha)
            elif kind == L2_TABLE:
                _l2_table(x, codebooks_t, norms, table, M, dsub)
            for p in range(nprobe):
                lst = max(probes[q, p], 0)
                if kind != IP_TABLE and kind != L2_TABLE:  # residual tables, one per probe
                    for s in range(x.shape[0]):
                        residual[s] = x[s] - centroids[lst, s]
                    _l2_table(residual, codebooks_t, norms, table, M, dsub)
                for m in range(M):
                    for j in range(16):
                        v = table[m * 16 + j]
                        if summed:
                            v += list_tables[lst, m * 16 + j]
                        scratch[p, m, j] = v
            s, o = quantize_tables(scratch, base[q], luts[q * nprobe : (q + 1) * nprobe], shifts[q])
            out_scale[q] = s
            out_offset[q] = o
        # 2. group the (query, probe) pairs by list, Q to a group
        pairs = probes.ravel()
        order = np.argsort(pairs, kind="mergesort")
        group_start = np.empty(order.shape[0], dtype=np.int64)  # at most one group per pair
        group_size = np.empty(order.shape[0], dtype=np.int64)
        n_groups = 0
        start = 0
        while start < order.shape[0]:
            end = start
            while end < order.shape[0] and pairs[order[end]] == pairs[order[start]]:
                end += 1
            if pairs[order[start]] >= 0:
                for s in range(start, end, Q):
                    group_start[n_groups] = s
                    group_size[n_groups] = min(Q, end - s)
                    n_groups += 1
            start = end
        heap_d = np.full((nq * nprobe, k), np.inf, dtype=np.float32)
        heap_i = np.full((nq * nprobe, k), -1, dtype=np.int64)
        # 3. scans: one pass over a list's blocks per group
        # a query's k-th best distance so far, over all its pairs: every full heap bounds it.
        # Threads share it without locks; a lost update only prunes less. Candidates equal to
        # it still enter, so ties resolve as in a sequential scan.
        bound = np.full(nq, 65535, dtype=np.int64)
        for g in prange(n_groups):
            lut = np.zeros((Q * n_pairs, 32), dtype=np.uint8)
            thr = np.zeros(Q, dtype=np.int32)
            dist = np.empty((Q, BLOCK), dtype=np.uint16)
            mask = np.empty(Q, dtype=np.int32)
            size = group_size[g]
            pair = np.empty(Q, dtype=np.int64)
            shift = np.zeros(Q, dtype=np.int64)
            for t in range(size):
                pair[t] = order[group_start[g] + t]
                lut[t * n_pairs : (t + 1) * n_pairs] = luts[pair[t]]
                shift[t] = shifts[pair[t] // nprobe, pair[t] % nprobe]
            lst = pairs[pair[0]]
            first, end = offsets[lst], offsets[lst + 1]
            for b in range(list_blocks[lst], list_blocks[lst + 1]):
                live = False
                for t in range(size):
                    top = heap_d[pair[t], 0]
                    own = np.int64(top) if top < 65536 else 65535
                    limit = min(own, bound[pair[t] // nprobe] + 1) - shift[t]
                    thr[t] = max(limit, 0)
                    live = live or limit > 0
                if not live:
                    break
                if simd:
                    block(packed, b * n_pairs, lut, 0, thr, dist, mask)
                else:
                    _portable_block(packed, b * n_pairs, lut, 0, n_pairs, thr, dist, mask)
                row0 = first + (b - list_blocks[lst]) * BLOCK
                for t in range(size):
                    if mask[t] != 0:
                        m = np.int64(mask[t]) & np.int64(0xFFFFFFFF)
                        r = pair[t]
                        _offer(heap_d[r], heap_i[r], dist[t], m, shift[t], row0, end, 0)
                        if heap_d[r, 0] < 65536:
                            q = r // nprobe
                            bound[q] = min(bound[q], np.int64(heap_d[r, 0]))
        # 4. merge each query's probes
        for q in prange(nq):
            hd = np.full(k, np.inf, dtype=np.float32)
            hi = np.full(k, -1, dtype=np.int64)
            sd = np.empty(k, dtype=np.float32)
            si = np.empty(k, dtype=np.int64)
            for p in range(nprobe):
                r = q * nprobe + p
                _heap_sorted(heap_d[r], heap_i[r], sd, si)  # scan order among equal distances
                for e in range(k):
                    if sd[e] < hd[0]:
                        _heap_replace_top(hd, hi, sd[e], si[e])
            _heap_sorted(hd, hi, out_dist[q], out_idx[q])

    return scan
