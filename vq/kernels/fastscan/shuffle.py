"""The fast-scan block kernel as LLVM vector code: the uint16 distances of one block of 32
vectors to a few queries, by byte shuffles of their uint8 tables (the layout is in
:mod:`vq.kernels.fastscan.fastscan_scans`).

``vpshufb`` looks a byte up within each 128-bit half of a vector: shuffling a pair's 32-byte
table row by the low nibbles of a 32-byte code row gives the 16 + 16 table entries of vectors
0..15, by the high nibbles those of 16..31. Entries are summed per 16-bit lane as "all"
(even byte + 256 × odd byte, modulo 2**16) and "odd" (odd bytes alone); the even sums are
``all - 256 × odd``, exact since they fit 16 bits. With AVX-512BW one 64-byte shuffle reads
two pairs, whose sums are then folded onto one pair's lanes.

AVX2 CPUs have 16 vector registers. The 32-byte kernel keeps its sums in them, in load order
(:func:`_pin`), and serves more than :data:`JOINT_QUERIES` queries with one pass over the
rows per nibble half (2 sums per query in registers, the rows read twice from L1).
"""

from __future__ import annotations

import functools

import numba
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

_I8, _I16, _I32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)
_V16I16, _V32I16 = ir.VectorType(_I16, 16), ir.VectorType(_I16, 32)
#: AVX2 blocks of up to this many queries sum both nibble halves in one pass over the rows
#: (4 sums per query: 12 registers, of 16, for 3); larger ones make a pass per half
JOINT_QUERIES = 3


def _splat(ty: ir.VectorType, value: int) -> ir.Constant:
    return ir.Constant(ty, [ir.Constant(ty.element, value)] * ty.count)


def _mask(indices) -> ir.Constant:
    indices = list(indices)
    return ir.Constant(ir.VectorType(_I32, len(indices)), [ir.Constant(_I32, i) for i in indices])


def _accumulate(
    builder,
    codes_base,
    luts_base,
    width,
    first_pair,
    pairs_per_load,
    count,
    nibbles=(0, 1),
    pinned=False,
    multiply=False,
):
    """Sums over ``count`` loads of ``pairs_per_load`` rows from row ``first_pair``: for each
    query, [all, odd] of each nibble half in ``nibbles`` (0: low, vectors 0..15; 1: high,
    16..31), e.g. [lo_all, lo_odd, hi_all, hi_odd], as ``width``-byte vectors of 16-bit lanes.

    ``pinned``: each load's sums pass through :func:`_pin`, so that they are added in load
    order. Otherwise LLVM reassociates the additions into trees over several rows, whose
    shuffle results then live at once and spill: with AVX2's 16 vector registers, about 4
    stack stores per row for 3 queries instead of about 1.

    ``multiply`` (32-byte loads only): the odd bytes are taken by ``vpmaddubsw`` with weights
    (0, 1), not by a shift: on CPUs that issue shifts on the pipes that also shuffle and
    multiplies on the others, a gain for 4-5 queries a pass (one nibble half each), a loss for
    1-3 (both halves, where the extra weight register is short)."""
    vb, vw = ir.VectorType(_I8, width), ir.VectorType(_I16, width // 2)
    name = "llvm.x86.avx2.pshuf.b" if width == 32 else "llvm.x86.avx512.pshuf.b.512"
    pshufb = builder.module.declare_intrinsic(name, fnty=ir.FunctionType(vb, [vb, vb]))
    low4, four, eight = _splat(vb, 15), _splat(vb, 4), _splat(vw, 8)
    if multiply:
        assert width == 32, "vpmaddubsw is used on 32-byte vectors only"
        maddubs = builder.module.declare_intrinsic(
            "llvm.x86.avx2.pmadd.ub.sw", fnty=ir.FunctionType(vw, [vb, vb])
        )
        odd_weights = ir.Constant(vb, [ir.Constant(_I8, i % 2) for i in range(width)])
    acc = [[ir.Constant(vw, None)] * (2 * len(nibbles)) for _ in luts_base]
    for i in range(count):
        off = ir.Constant(_I32, 32 * (first_pair + i * pairs_per_load))
        c = builder.load(builder.bitcast(builder.gep(codes_base, [off]), vb.as_pointer()), align=1)
        indices = [builder.and_(builder.lshr(c, four) if h else c, low4) for h in nibbles]
        for q, base in enumerate(luts_base):
            lut = builder.load(builder.bitcast(builder.gep(base, [off]), vb.as_pointer()), align=1)
            for h, idx in enumerate(indices):
                r = builder.bitcast(builder.call(pshufb, [lut, idx]), vw)
                a = acc[q]
                a[2 * h] = builder.add(a[2 * h], r)
                if multiply:  # odd byte x 1 + even byte x 0 per 16-bit lane
                    odd = builder.call(maddubs, [builder.bitcast(r, vb), odd_weights])
                else:
                    odd = builder.lshr(r, eight)
                a[2 * h + 1] = builder.add(a[2 * h + 1], odd)
        if pinned:
            acc = [[_pin(builder, v) for v in a] for a in acc]
    return acc


def _pin(builder, value):
    """``value`` through an empty asm: the same register, opaque to LLVM's optimisations."""
    return builder.asm(
        ir.FunctionType(value.type, [value.type]), "", "=x,0", [value], side_effect=False
    )


def _sums_wide(builder, codes_base, luts_base, n_pairs: int):
    """Every query's four 32-byte sums over the ``n_pairs`` rows of the block, by 64-byte
    shuffles (AVX-512BW)."""
    acc = _accumulate(builder, codes_base, luts_base, 64, 0, 2, n_pairs // 2)
    low, high = _mask(range(16)), _mask(range(16, 32))  # fold the two pairs' lanes
    acc = [
        [
            builder.add(builder.shuffle_vector(v, v, low), builder.shuffle_vector(v, v, high))
            for v in a
        ]
        for a in acc
    ]
    if n_pairs % 2:  # an odd pair left: one 32-byte load
        tail = _accumulate(builder, codes_base, luts_base, 32, n_pairs - 1, 1, 1)
        acc = [
            [builder.add(u, v) for u, v in zip(a, t, strict=True)]
            for a, t in zip(acc, tail, strict=True)
        ]
    return acc


def _half(builder, all_, odd):
    """One nibble half's 16 distances in vector order from its [all, odd] sums."""
    even = builder.sub(all_, builder.shl(odd, _splat(_V16I16, 8)))
    parts = []
    for s in (even, odd):
        x = builder.shuffle_vector(s, s, _mask(range(8)))
        y = builder.shuffle_vector(s, s, _mask(range(8, 16)))
        parts.append(builder.add(x, y))  # lane 0 + lane 1: both tables of the pair
    return builder.shuffle_vector(parts[0], parts[1], _mask(range(16)))


def _threshold(builder, thr_p, q):
    return builder.trunc(builder.load(builder.gep(thr_p, [ir.Constant(_I32, q)])), _I16)


def _store_wide(builder, a, q, dist_p, thr_p, mask_p) -> None:
    """Query q's distances in vector order into ``dist_p`` (uint16 [q, 32]) and the bits of
    those below its threshold into ``mask_p[q]``, as 64-byte values."""
    ab, cd = _half(builder, a[0], a[1]), _half(builder, a[2], a[3])
    dist = builder.shuffle_vector(ab, cd, _mask(range(32)))  # vector order
    dptr = builder.gep(dist_p, [ir.Constant(_I32, 32 * q)])
    builder.store(dist, builder.bitcast(dptr, _V32I16.as_pointer()), align=2)
    thr = _threshold(builder, thr_p, q)
    below = builder.icmp_unsigned("<", dist, _broadcast(builder, thr, _V32I16))
    builder.store(builder.bitcast(below, _I32), builder.gep(mask_p, [ir.Constant(_I32, q)]))


def _store_half(builder, half, h, q, dist_p) -> None:
    """Nibble half h's 16 distances (vectors 16 h ...) into ``dist_p`` (uint16 [q, 32])."""
    dptr = builder.gep(dist_p, [ir.Constant(_I32, 32 * q + 16 * h)])
    builder.store(half, builder.bitcast(dptr, _V16I16.as_pointer()), align=2)


def _store_mask(builder, halves, q, thr, mask_p) -> None:
    """The bits of the 32 distances ``halves`` (two 32-byte halves) below ``thr`` into
    ``mask_p[q]``, never a 64-byte value: one would be split on an AVX2-only CPU, and where
    AVX-512 exists, its 512-bit operations would idle one of the ports that the 32-byte
    shuffles and adds use."""
    thr_v = _broadcast(builder, thr, _V16I16)
    # lanes at or above the threshold (AVX2 has no unsigned "<": max and equal give ">=" in
    # two operations, the bits are inverted once)
    above = [builder.icmp_unsigned(">=", half, thr_v) for half in halves]
    bits = builder.not_(_movemask(builder, above))
    builder.store(bits, builder.gep(mask_p, [ir.Constant(_I32, q)]))


def _load_half(builder, h, q, dist_p):
    """Nibble half h's 16 distances back from ``dist_p`` (what :func:`_store_half` wrote)."""
    dptr = builder.gep(dist_p, [ir.Constant(_I32, 32 * q + 16 * h)])
    return builder.load(builder.bitcast(dptr, _V16I16.as_pointer()), align=2)


def _movemask(builder, halves) -> ir.Value:
    """The i32 of two <16 x i1> (lanes 0..15, then 16..31) by byte packing and
    ``vpmovmskb``, 32-byte operations only (an empty asm keeps LLVM from fusing the halves
    into one 64-byte truncation where AVX-512 exists)."""
    vb = ir.VectorType(_I8, 32)
    packs = builder.module.declare_intrinsic(
        "llvm.x86.avx2.packsswb", fnty=ir.FunctionType(vb, [_V16I16, _V16I16])
    )
    movemask = builder.module.declare_intrinsic(
        "llvm.x86.avx2.pmovmskb", fnty=ir.FunctionType(_I32, [vb])
    )
    opaque = ir.FunctionType(_V16I16, [_V16I16])
    words = [
        builder.asm(opaque, "", "=x,0", [builder.sext(h, _V16I16)], side_effect=False)
        for h in halves
    ]
    packed = builder.call(packs, words)  # 8-byte groups: 0..7, 16..23, 8..15, 24..31
    v4i64 = ir.VectorType(ir.IntType(64), 4)
    quads = builder.bitcast(packed, v4i64)
    quads = builder.shuffle_vector(quads, quads, _mask([0, 2, 1, 3]))  # lane order
    return builder.call(movemask, [builder.bitcast(quads, vb)])


def _broadcast(builder, value, ty: ir.VectorType):
    v = builder.insert_element(ir.Constant(ty, ir.Undefined), value, ir.Constant(_I32, 0))
    return builder.shuffle_vector(v, v, _mask([0] * ty.count))


@functools.cache
def shuffle_block(n_pairs: int, n_queries: int, wide: bool = False):
    """An intrinsic computing the uint16 distances of one block of 32 vectors to
    ``n_queries`` queries with byte shuffles, unrolled over ``n_pairs`` rows: AVX2 (one
    32-byte row per shuffle; in two passes over the rows, one per nibble half, for more
    than :data:`JOINT_QUERIES` queries) or, with ``wide``, AVX-512BW (two rows per 64-byte
    shuffle).

    ``block(codes, code_row, luts, lut_rows, thresholds, out_dist, out_mask)``: codes uint8
    [rows, 32] with the block at ``code_row``; luts uint8 [rows, 32], query q's tables at
    rows ``lut_rows[q]`` (int64 [n_queries]) onwards; thresholds int32 [n_queries]; writes
    out_dist uint16 [n_queries, 32] and out_mask int32 [n_queries] (bit v set when vector
    v's distance is below the query's threshold).
    """

    @intrinsic
    def block(typingctx, codes, code_row, luts, lut_rows, thresholds, out_dist, out_mask):
        sig = types.void(codes, code_row, luts, lut_rows, thresholds, out_dist, out_mask)

        def codegen(context, builder, signature, args):
            arrays = [
                context.make_array(signature.args[i])(context, builder, args[i])
                for i in (0, 2, 3, 4, 5, 6)
            ]
            codes_p, luts_p, rows_p, thr_p, dist_p, mask_p = (a.data for a in arrays)
            row_bytes = ir.Constant(args[1].type, 32)
            codes_base = builder.gep(codes_p, [builder.mul(args[1], row_bytes)])
            luts_base = []  # query q's first table row
            for q in range(n_queries):
                row = builder.load(builder.gep(rows_p, [ir.Constant(_I32, q)]))
                luts_base.append(builder.gep(luts_p, [builder.mul(row, row_bytes)]))
            if wide:
                acc = _sums_wide(builder, codes_base, luts_base, n_pairs)
                for q in range(n_queries):
                    _store_wide(builder, acc[q], q, dist_p, thr_p, mask_p)
                return context.get_dummy_value()
            if n_queries <= JOINT_QUERIES:
                acc = _accumulate(builder, codes_base, luts_base, 32, 0, 1, n_pairs, (0, 1), True)
                for q in range(n_queries):
                    a = acc[q]
                    halves = (_half(builder, a[0], a[1]), _half(builder, a[2], a[3]))
                    for h, half in enumerate(halves):
                        _store_half(builder, half, h, q, dist_p)
                    _store_mask(builder, halves, q, _threshold(builder, thr_p, q), mask_p)
                return context.get_dummy_value()
            # one pass over the rows per nibble half, the low half's distances stored before
            # the high pass starts (LLVM cannot move the loads of that pass above the stores)
            for h in range(2):
                acc = _accumulate(
                    builder,
                    codes_base,
                    luts_base,
                    32,
                    0,
                    1,
                    n_pairs,
                    (h,),
                    pinned=True,
                    multiply=True,
                )
                for q in range(n_queries):
                    _store_half(builder, _half(builder, *acc[q]), h, q, dist_p)
            for q in range(n_queries):
                halves = [_load_half(builder, h, q, dist_p) for h in range(2)]
                _store_mask(builder, halves, q, _threshold(builder, thr_p, q), mask_p)
            return context.get_dummy_value()

        return sig, codegen

    return block


@intrinsic
def rank_filter(typingctx, dist, row, mask, k):
    """The bits of ``mask`` (uint32, bit v for vector v of a block) whose distance in row
    ``row`` of ``dist`` (uint16 [rows, 32], C-contiguous) has fewer than ``k`` distances of
    other set bits strictly below it: the only ones that can be among the k smallest
    (distance, row) keys of those vectors, whatever else is kept. 32 broadcast compares of
    32-byte vectors (AVX2; k < 32). A block whose many vectors pass the threshold (the first
    of a query, before its k-th best has settled) then offers about k to the heap instead of
    all of them."""
    if not isinstance(mask, types.Integer) or mask.bitwidth < 32:
        raise numba.core.errors.TypingError(
            f"rank_filter: mask must be a 32-bit or wider integer, got {mask}"
        )
    sig = types.uint32(dist, row, mask, k)

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        base = builder.gep(data, [builder.mul(args[1], ir.Constant(args[1].type, 32))])
        mask = builder.trunc(args[2], _I32) if args[2].type.width > 32 else args[2]
        lane_bits = ir.Constant(_V16I16, [ir.Constant(_I16, 1 << i) for i in range(16)])
        bias, top = _splat(_V16I16, 0x8000), _splat(_V16I16, 0xFFFF)
        halves = []
        for h in range(2):
            ptr = builder.gep(base, [ir.Constant(_I32, 16 * h)])
            d = builder.load(builder.bitcast(ptr, _V16I16.as_pointer()), align=2)
            bits = builder.trunc(builder.lshr(mask, ir.Constant(_I32, 16 * h)), _I16)
            member = builder.icmp_unsigned(
                "!=",
                builder.and_(_broadcast(builder, bits, _V16I16), lane_bits),
                _splat(_V16I16, 0),
            )
            # others: the greatest value, never below anything; biased for signed compares
            halves.append(builder.xor(builder.select(member, d, top), bias))
        counts = [_splat(_V16I16, 0), _splat(_V16I16, 0)]
        for j in range(32):
            other = builder.extract_element(halves[j // 16], ir.Constant(_I32, j % 16))
            other = _broadcast(builder, other, _V16I16)
            for h in range(2):  # lanes whose distance is above vector j's: one more below
                below = builder.sext(builder.icmp_signed("<", other, halves[h]), _V16I16)
                counts[h] = builder.sub(counts[h], below)
        k16 = _broadcast(builder, builder.trunc(args[3], _I16), _V16I16)
        few = [builder.icmp_unsigned("<", c, k16) for c in counts]
        return builder.and_(mask, _movemask(builder, few))

    return sig, codegen
