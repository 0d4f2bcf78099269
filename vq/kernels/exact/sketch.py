"""Sketches: 7-bit codes of stored float32 rows that bound each row's distance to a query, so
that an exact scan computes the distance only of rows that may still enter its top k (the
same results as scanning every row, bit for bit; :class:`vq.index.IVFFlat` with
``sketch=True``).

A row x in the list of centroid c is stored as (:func:`vq.index.ivf.sketches.sketch_rows`):

- its codes u_j = clip(round((x_j - low_j) / step_j), 0, 127), uint8 [width] (``width`` =
  d rounded up to 32, zeros past d), from per-dimension ranges ``low``/``step`` float32 [d];
- four factors float32: ⟨c, e⟩, ‖e‖, ‖u - 64‖ and ‖x‖², with e = x - (low + step ∘ u) the
  row's coding error.

A query q is *prepared* once (:func:`sketch_prepare`): w_j = q_j step_j, quantized to int8
codes w'_j = round(w_j / s) with s = max|w| / 127, error r = w - s w'; and per probed list
ρ = ‖q - c‖. Then exactly

    ⟨q, x⟩ = ⟨q, low⟩ + 64 Σ r_j + s ⟨w', u⟩ + ⟨c, e⟩ + ⟨r, u - 64⟩ + ⟨q - c, e⟩

where the last two terms are at most ‖r‖ ‖u - 64‖ + ρ ‖e‖ in size (Cauchy-Schwarz): the
integer product ⟨w', u⟩ of one row is a few instructions (:func:`sketch_dots4`: ``vpmaddubsw``
then ``vpmaddwd`` with AVX2, 32 dimensions a step, four rows at a time), and the rest is
per-row factors. The bound ``lower`` (:func:`sketch_lower`) is that estimate less the error
terms and a rounding margin (every float32 sum here is within (d + 32) 2⁻²⁰ (‖q‖² + ‖x‖²) of
its exact value); a row whose lower bound reaches the heap's threshold cannot enter the heap,
so the scan skips its exact distance. On 128-dimension NSynth embeddings in lists of ~26
rows, about a fifth of the probed rows then need one.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core.errors import TypingError
from numba.extending import intrinsic

from vq.kernels.fastscan.fastscan_scans import has_avx2

#: the largest code: 7 bits, so that a pair of products (u8 code x s8 query) fits int16
LEVELS = 127
#: codes are offset by this before their norm (‖u - 64‖, the centred codes)
CENTRE = 64
#: dimensions of one integer step (a 32-byte vector)
STEP = 32
#: factor columns: ⟨c, e⟩, ‖e‖, ‖u - 64‖, ‖x‖²
FACTORS = 4

_I8, _I16, _I32, _I64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
_V32B, _V16W, _V8D = ir.VectorType(_I8, 32), ir.VectorType(_I16, 16), ir.VectorType(_I32, 8)
_V32D = ir.VectorType(_I32, 32)


def sketch_width(d: int) -> int:
    """Bytes of one row's codes: ``d`` rounded up to a multiple of :data:`STEP`."""
    return -(-d // STEP) * STEP


def _sum_lanes(builder, v):
    """The int32 lanes of ``v`` (8 or 32 of them) summed by a shuffle tree."""
    n = v.type.count
    while n > 1:
        n //= 2
        idx = [ir.Constant(_I32, i) for i in range(n)]
        lo = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, n), idx))
        idx = [ir.Constant(_I32, i + n) for i in range(n)]
        hi = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, n), idx))
        v = builder.add(lo, hi)
    return builder.extract_element(v, ir.Constant(_I32, 0))


def _step_avx2(builder, acc, codes, query):
    """acc (int32 x 8) + the products of 32 uint8 codes and 32 int8 query codes, by
    ``vpmaddubsw`` (pairs of products into int16: at most 2 * 127 * 127, no saturation) and
    ``vpmaddwd`` with ones (pairs of those into int32)."""
    module = builder.module
    ubsw = module.declare_intrinsic(
        "llvm.x86.avx2.pmadd.ub.sw", fnty=ir.FunctionType(_V16W, [_V32B, _V32B])
    )
    wd = module.declare_intrinsic(
        "llvm.x86.avx2.pmadd.wd", fnty=ir.FunctionType(_V8D, [_V16W, _V16W])
    )
    ones = ir.Constant(_V16W, [ir.Constant(_I16, 1)] * 16)
    return builder.add(acc, builder.call(wd, [builder.call(ubsw, [codes, query]), ones]))


def _step_generic(builder, acc, codes, query):
    """:func:`_step_avx2` in generic vector code (any CPU): 32 int32 lanes."""
    return builder.add(acc, builder.mul(builder.zext(codes, _V32D), builder.sext(query, _V32D)))


def _dots_codegen(rows: int, avx2: bool):
    step, acc_type = (_step_avx2, _V8D) if avx2 else (_step_generic, _V32D)

    def codegen(context, builder, signature, args):
        q = context.make_array(signature.args[0])(context, builder, args[0])
        codes = context.make_array(signature.args[1])(context, builder, args[1])
        width = builder.extract_value(codes.shape, 1)
        steps = builder.lshr(width, ir.Constant(_I64, 5))
        ptrs = []
        for r in range(rows):
            i = args[2 + r]
            i = builder.sext(i, _I64) if i.type.width < 64 else i
            ptrs.append(builder.gep(codes.data, [builder.mul(i, width)]))
        entry = builder.basic_block
        loop = builder.append_basic_block("sketch.steps")
        done = builder.append_basic_block("sketch.done")
        zero = ir.Constant(acc_type, None)
        builder.cbranch(builder.icmp_unsigned(">", steps, ir.Constant(_I64, 0)), loop, done)
        builder.position_at_end(loop)
        s = builder.phi(_I64)
        s.add_incoming(ir.Constant(_I64, 0), entry)
        accs = [builder.phi(acc_type) for _ in ptrs]
        for acc in accs:
            acc.add_incoming(zero, entry)
        at = builder.shl(s, ir.Constant(_I64, 5))
        qv = builder.load(builder.bitcast(builder.gep(q.data, [at]), _V32B.as_pointer()), align=1)
        nexts = []
        for ptr, acc in zip(ptrs, accs, strict=True):
            cv = builder.load(builder.bitcast(builder.gep(ptr, [at]), _V32B.as_pointer()), align=1)
            nexts.append(step(builder, acc, cv, qv))
        s_next = builder.add(s, ir.Constant(_I64, 1))
        s.add_incoming(s_next, builder.basic_block)
        for acc, nxt in zip(accs, nexts, strict=True):
            acc.add_incoming(nxt, builder.basic_block)
        builder.cbranch(builder.icmp_unsigned("<", s_next, steps), loop, done)
        loop_end = builder.basic_block
        builder.position_at_end(done)
        totals = [builder.phi(acc_type) for _ in nexts]  # (phi nodes first in their block)
        for total, nxt in zip(totals, nexts, strict=True):
            total.add_incoming(zero, entry)
            total.add_incoming(nxt, loop_end)
        sums = [_sum_lanes(builder, total) for total in totals]
        return sums[0] if rows == 1 else context.make_tuple(builder, signature.return_type, sums)

    return codegen


def _check(q, codes) -> None:
    ok = (
        isinstance(q, types.Array)
        and q.ndim == 1
        and q.dtype == types.int8
        and q.layout == "C"
        and isinstance(codes, types.Array)
        and codes.ndim == 2
        and codes.dtype == types.uint8
        and codes.layout == "C"
    )
    if not ok:
        raise TypingError(
            f"sketch_dots4: expected C-contiguous int8 [width] query codes and uint8 [n, width] "
            f"row codes, got {q} and {codes}"
        )


def dots_intrinsic(rows: int, avx2: bool | None = None):
    """The intrinsic of :func:`sketch_dot` (``rows`` 1) or :func:`sketch_dots4` (4), with the
    AVX2 instructions or the generic vector code (``avx2`` None: as the CPU allows)."""

    def typer(typingctx, q, codes, *at):
        _check(q, codes)
        result = types.int32 if rows == 1 else types.UniTuple(types.int32, rows)
        return result(q, codes, *at), _dots_codegen(rows, has_avx2() if avx2 is None else avx2)

    if rows == 1:

        def one(typingctx, q, codes, i):
            return typer(typingctx, q, codes, i)

        return intrinsic(one)

    def four(typingctx, q, codes, i0, i1, i2, i3):
        return typer(typingctx, q, codes, i0, i1, i2, i3)

    return intrinsic(four)


#: ``sketch_dot(q, codes, i)``: ``⟨q, codes[i]⟩`` as int32, ``q`` int8 [width], ``codes`` uint8
#: [n, width] (width a multiple of :data:`STEP`, codes at most :data:`LEVELS`), C-contiguous;
#: ``sketch_dots4(q, codes, i0, i1, i2, i3)``: four rows (they may repeat) in one pass
sketch_dot = dots_intrinsic(1)
sketch_dots4 = dots_intrinsic(4)


@njit(inline="always", fastmath=True)
def sketch_prepare(x, low, step, qc):
    """The prepared query (see the module docstring): writes its int8 codes into ``qc`` int8
    [width] (zeros past d) and returns (s, const, ‖r‖, ‖x‖²), const = ⟨x, low⟩ + 64 Σ r_j."""
    d = x.shape[0]
    top = np.float32(0.0)
    x_norm = np.float32(0.0)
    for j in range(d):
        top = max(top, abs(x[j] * step[j]))
        x_norm += x[j] * x[j]
    s = top / np.float32(LEVELS) if top > 0 else np.float32(1.0)
    inv = np.float32(1.0) / s
    const = np.float32(0.0)
    r_sum = np.float32(0.0)
    r_norm = np.float32(0.0)
    for j in range(d):
        w = x[j] * step[j]
        c = min(max(np.rint(w * inv), np.float32(-LEVELS)), np.float32(LEVELS))
        qc[j] = np.int8(np.int32(c))
        r = w - s * c
        r_sum += r
        r_norm += r * r
        const += x[j] * low[j]
    for j in range(d, qc.shape[0]):
        qc[j] = 0
    return s, const + np.float32(CENTRE) * r_sum, np.sqrt(r_norm), x_norm


@njit(inline="always", fastmath=True)
def centre_distance(x, centroids, c):
    """ρ = ‖x - centroids[c]‖ (float32 [d], [nlist, d])."""
    acc = np.float32(0.0)
    for j in range(x.shape[0]):
        diff = x[j] - centroids[c, j]
        acc += diff * diff
    return np.sqrt(acc)


@njit(inline="always", fastmath=True)
def sketch_lower(dot, factors, row, prepared, rho, margin, inner_product):
    """A lower bound of row ``row``'s exact distance (squared L2, or negated inner product)
    from its integer product ``dot`` with the query's codes: ``factors`` float32 [n, 4],
    ``prepared`` :func:`sketch_prepare`'s tuple, ``rho`` the query's distance to the row's
    centroid, ``margin`` (d + 32) 2⁻²⁰ (float rounding, relative to ‖q‖² + ‖x‖²)."""
    s, const, r_norm, x_norm = prepared
    ip = const + s * np.float32(dot) + factors[row, 0]
    err = rho * factors[row, 1] + r_norm * factors[row, 2]
    slack = margin * (x_norm + factors[row, 3])
    if inner_product:
        return -ip - err - slack
    return (x_norm + factors[row, 3]) - np.float32(2.0) * (ip + err) - slack
