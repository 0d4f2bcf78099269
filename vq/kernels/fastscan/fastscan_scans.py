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

Three variants give identical (integer) distances (:func:`best_isa` picks one): byte shuffles
emitted through LLVM intrinsics (``numba.extending.intrinsic``) on 64-byte vectors, two pairs
at a time (AVX-512BW), or on 32-byte vectors (AVX2) (:mod:`vq.kernels.fastscan.shuffle`); and plain
numba for other CPUs. The IVF scan is in :mod:`vq.kernels.fastscan.fastscan_ivf`.
"""

from __future__ import annotations

import functools
import os

import llvmlite.binding as llvm
import numpy as np
from numba import njit
from numba.core import config as numba_config
from numba.extending import intrinsic

from vq.kernels.common.heaps import heap_replace_top_row
from vq.kernels.common.simd import quantize_row, row_range, trailing_zeros
from vq.kernels.fastscan.shuffle import shuffle_block
from vq.kernels.jit.cache import kernel, specialise

BLOCK = 32  # vectors per block
PERM = np.array([0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15])
_POSITION = np.argsort(PERM)  # byte of vector v (0..15)
_U16_MAX = 65535


@functools.cache
def target_features() -> dict[str, bool]:
    """The CPU features numba compiles for: ``NUMBA_CPU_FEATURES`` ("+avx2,-avx512f,..."),
    where set, else the host's. A kernel using instructions outside them would abort the
    process in LLVM's instruction selection."""
    if numba_config.CPU_FEATURES:
        return {f[1:]: f[0] == "+" for f in numba_config.CPU_FEATURES.split(",") if f[:1] in "+-"}
    return dict(llvm.get_host_cpu_features())


def has_avx2() -> bool:
    """Whether numba compiles for AVX2 (then the shuffle kernel is used)."""
    return target_features().get("avx2", False)


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
@kernel(fastmath=True, nogil=True)
def quantize_tables(tables, bias, out_luts, out_bias):
    """Quantize one query's float tables to uint8 with one scale for all of them.

    Args:
        tables: float32 [T, M, 16], C-contiguous: the query's tables, one set per probed list
            (T = P) or one set shared by all of them (T = 1).
        bias: float32 [P]: a constant added to every distance of probe p (e.g. the coarse
            term).
        out_luts: uint8 [T, M / 2, 32], C-contiguous, in the packed pair layout.
        out_bias: int32 [P]: quantized biases.

    Returns:
        (scale, offset): float distance ≈ (bias_q + Σ lut) / scale + offset. The scale is the
        largest that keeps every entry ≤ 255 and every total ≤ 65535 (uint16).
    """
    T, M, _ = tables.shape
    P = bias.shape[0]
    # pass 1: the widest table (entries <= 255) and the range of the totals (sums <= 65535);
    # no work arrays: this runs once per query, where an allocation costs as much as a pass
    span = np.float32(0.0)
    offset = np.float32(np.inf)  # the least total
    top = -np.float32(np.inf)  # the greatest
    for t in range(T):
        lo_sum = np.float32(0.0)
        hi_sum = np.float32(0.0)
        for m in range(M):
            lo, hi = row_range(tables, (t * M + m) * 16)
            span = max(span, hi - lo)
            lo_sum += lo
            hi_sum += hi
        for p in range(t, P if T == 1 else t + 1):  # the probes table t serves
            offset = min(offset, bias[p] + lo_sum)
            top = max(top, bias[p] + hi_sum)
    total_span = max(top - offset, np.float32(0.0))
    scale = np.float32(np.inf)
    if span > 0:
        scale = min(scale, np.float32(255.0) / span)
    if total_span > 0:
        scale = min(scale, np.float32(_U16_MAX - M) / total_span)
    if not np.isfinite(scale):
        scale = np.float32(1.0)
    # pass 2: entries above each table's least, and the biases that leaves
    for t in range(T):
        lo_sum = np.float32(0.0)
        for m in range(M):  # table (t, m) is row m & 1 of pair m >> 1: the same flat index
            lo, _ = row_range(tables, (t * M + m) * 16)
            lo_sum += lo
            quantize_row(tables, (t * M + m) * 16, lo, scale, out_luts)
        for p in range(t, P if T == 1 else t + 1):
            b = np.floor((bias[p] + lo_sum - offset) * scale + np.float32(0.5))
            out_bias[p] = np.int32(min(max(b, np.float32(0.0)), np.float32(_U16_MAX - M * 255)))
    return scale, offset


@intrinsic
def popcount(typingctx, x):
    """The number of set bits of an unsigned integer (``ctpop``: one instruction)."""
    sig = x(x)

    def codegen(context, builder, signature, args):
        return builder.ctpop(args[0])

    return sig, codegen


# -- one block of 32 vectors against Q queries ---------------------------------------------------
def has_avx512() -> bool:
    """Whether numba compiles for AVX-512BW (then the shuffle kernel reads two pairs at a
    time)."""
    features = target_features()
    return features.get("avx512bw", False) and features.get("avx512f", False)


#: the kernel variants: byte shuffles on 64-byte or 32-byte vectors, or plain numba
ISAS = ("avx512", "avx2", "portable")


def best_isa() -> str:
    """The fastest kernel variant this CPU runs (``VQ_FASTSCAN_ISA`` overrides it)."""
    forced = os.environ.get("VQ_FASTSCAN_ISA")
    if forced is not None:
        if forced not in ISAS:
            raise ValueError(f"VQ_FASTSCAN_ISA must be one of {', '.join(ISAS)}, got {forced!r}")
        return forced
    return "avx512" if has_avx512() else "avx2" if has_avx2() else "portable"


def check_isa(isa: str) -> str:
    if isa not in ISAS:
        raise ValueError(f"isa must be one of {', '.join(ISAS)}, got {isa!r}")
    if (isa == "avx512" and not has_avx512()) or (isa == "avx2" and not has_avx2()):
        raise ValueError(f"this CPU lacks {isa}; use fastscan.best_isa()")
    return isa


def block_kernel(isa: str, n_pairs: int, n_queries: int):
    """The SIMD block intrinsic of ``isa``, or None for the portable path."""
    if isa == "portable":
        return None
    return shuffle_block(n_pairs, n_queries, isa == "avx512")


@njit(inline="always")
def portable_block(codes, code_row, luts, lut_rows, n_pairs, thresholds, out_dist, out_mask):
    """The shuffle kernel's arithmetic in plain numba (identical uint16 results)."""
    for q in range(out_dist.shape[0]):
        base = lut_rows[q]
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


@kernel(nogil=True)
def quantize_all(tables, bias, out_luts, out_bias, out_scale, out_offset):
    """:func:`quantize_tables` for every query: tables float32 [nq, P, M, 16], bias float32
    [nq, P] → out_luts uint8 [nq, P, M / 2, 32], out_bias int32 [nq, P], out_scale and
    out_offset float32 [nq]."""
    for q in range(tables.shape[0]):
        s, o = quantize_tables(tables[q], bias[q], out_luts[q], out_bias[q])
        out_scale[q] = s
        out_offset[q] = o


@functools.cache  # a dictionary hit per call, not specialise()'s checks
def flat_tables(M: int, dsub: int):
    """The kernel building and quantizing every query's tables for a flat fast-scan, for M
    sub-quantizers of ``dsub`` dimensions (disk-cached per configuration:
    :mod:`vq.kernels.fastscan.fastscan_flat_template`).

    ``build(queries, codebooks_t, norms, inner_product, out_luts, out_scale, out_offset)``:
    queries float32 [nq, M * dsub]; codebooks_t float32 [M, dsub, 16]; norms float32 [M, 16]
    (their squared norms); tables of squared L2 distances, or of negated inner products
    (smaller is nearer in both) → out_luts uint8 [>= nq, M / 2, 32] (rows past nq untouched),
    out_scale and out_offset float32 [nq] (see :func:`quantize_tables`).
    """
    return _flat_module(M // 2, 1, best_isa(), dsub).build


@functools.cache
def flat_lean(n_pairs: int, dsub: int, isa: str):
    """A whole flat fast-scan search of a few queries in one call on the calling thread (the
    lean path), for M = 2 ``n_pairs`` sub-quantizers of ``dsub`` dimensions:
    ``lean_search(queries, codebooks_t, norms, packed, n, ids, inner_product, out_dist,
    out_ids)`` builds each query's tables as :func:`flat_tables` does, scans the ``n``
    vectors of ``packed`` as :func:`pq_fastscan_scanner` does, and writes float distances
    (negated back to inner products with ``inner_product``; +inf / -inf padding) into
    ``out_dist`` float32 [nq, k] and ids (``ids`` int64 [n], or [0]: the rows) into
    ``out_ids`` int64 [nq, k] (-1 padding). Returns False (and does nothing) if a query is
    not finite."""
    return _flat_module(n_pairs, 1, isa, dsub).lean_search


def _flat_module(n_pairs: int, n_queries: int, isa: str, dsub: int):
    return specialise(
        "vq.kernels.fastscan.fastscan_flat_template",
        N_PAIRS=int(n_pairs),
        N_QUERIES=int(n_queries),
        ISA=check_isa(isa),
        DSUB=int(dsub),
    )


@njit(inline="always")
def _offer(heap_d, heap_i, q, dist, mask, first_row, end_row, allowed):
    """Offer the vectors of a block whose bit is set in ``mask`` to row q of the top-k heaps
    ``heap_d``/``heap_i`` [Q, k]; returns the new uint16 threshold. ``dist`` uint16 [Q, 32]
    (row q read); vector v is row ``first_row + v`` (kept only below ``end_row``, and where
    ``allowed`` uint8 [n] is not 0 unless it is empty) with distance ``dist[q, v]``. Rows are
    indexed in place: a view costs two atomics."""
    filtered = allowed.shape[0] > 0
    while mask != 0:
        v = trailing_zeros(mask)
        mask &= mask - np.uint32(1)
        row = first_row + v
        if row < end_row and (not filtered or allowed[row] != 0):
            d = np.float32(dist[q, v])
            if d < heap_d[q, 0]:
                heap_replace_top_row(heap_d, heap_i, q, d, row)
    top = heap_d[q, 0]
    return min(np.int64(top) if top < 65536 else 65535, 65535)


#: the query counts the flat scan serves per pass over a block, per kernel variant (the
#: largest that a batch fills is used): AVX2 passes once per nibble half above 3 queries
#: (:data:`vq.kernels.fastscan.shuffle.JOINT_QUERIES`), which keeps 5 queries' sums in its 16
#: registers
FLAT_QUERY_BLOCKS = {"avx512": (3, 1), "avx2": (5, 3, 1), "portable": (3, 1)}


def flat_query_block(isa: str, nq: int) -> int:
    """Queries per pass of the flat scan of ``nq`` queries with kernel variant ``isa``."""
    return next(q for q in FLAT_QUERY_BLOCKS[isa] if q <= max(nq, 1))


@functools.cache  # a dictionary hit per call, not specialise()'s checks
def pq_fastscan_scanner(n_pairs: int, n_queries: int, isa: str, dsub: int = 1):
    """Fast-scan of a flat array of packed codes, ``n_queries`` queries per pass over a block,
    fused with top-k (per query); disk-cached per configuration
    (:mod:`vq.kernels.fastscan.fastscan_flat_template`, whose tables are for sub-vectors of ``dsub``
    dimensions: the scan itself does not depend on it).

    ``scan(luts, packed, n, allowed, out_dist, out_idx)``: luts uint8 [nq * n_pairs, 32] (nq a
    multiple of ``n_queries``), packed uint8 [nblocks * n_pairs, 32], n the number of vectors;
    allowed uint8 [n], 0 for rows a filtered search skips, or [0]: no filter;
    out_dist float32 [nq, k] quantized distances ascending (+inf padding), out_idx int64
    [nq, k] rows (-1 padding).
    """
    return _flat_module(n_pairs, n_queries, isa, dsub).scan


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
