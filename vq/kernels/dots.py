"""Inner products of one vector with a block of columns, as LLVM vector code: the coarse step
of a small IVF search (:func:`vq.kernels.small.probe_lists`), where the sums of 16 columns stay
in one vector register across the whole vector (a numba loop over the columns stores and
reloads them at every component). Generic LLVM vector operations, so every CPU runs them;
plain numpy under numba's DISABLE_JIT.
"""

from __future__ import annotations

import numba
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from vq.kernels.simd import _V16F, _c_array, _splat16


def _column_dots(blocks: int):
    """An intrinsic ``f(x, x_start, ct, c0, out, out_start)``: for l < 16 * blocks,
    ``out[out_start + l] = Σ_j x[x_start + j] * ct[j, c0 + l]`` over the rows j of the
    C-contiguous float32 ``ct`` [d, n] (d >= 1; flat indices for ``x`` and ``out``): the
    inner products of a vector with 16 * blocks columns, each block's sums kept in one
    vector register across the whole loop over j (a numba loop over the columns stores and
    reloads them at every j, and cannot keep 16 scalars in one register); the terms added in
    order of j, each product fused with its sum where the CPU can."""

    def dots(typingctx, x, x_start, ct, c0, out, out_start):
        for arr in (x, ct, out):
            _c_array(arr, "column_dots")
        if ct.ndim != 2:
            raise numba.core.errors.TypingError(f"column_dots: expected a 2-d ct, got {ct}")
        sig = types.void(x, x_start, ct, c0, out, out_start)

        def codegen(context, builder, signature, args):
            i64 = ir.IntType(64)
            x_data = context.make_array(signature.args[0])(context, builder, args[0]).data
            cts = context.make_array(signature.args[2])(context, builder, args[2])
            d = builder.extract_value(cts.shape, 0)
            n = builder.extract_value(cts.shape, 1)
            x_start, c0, out_start = (_i64(builder, args[i]) for i in (1, 3, 5))
            zero = ir.Constant(_V16F, [0.0] * 16)
            entry = builder.basic_block
            loop = builder.append_basic_block("column_dots.loop")
            done = builder.append_basic_block("column_dots.done")
            builder.branch(loop)
            builder.position_at_end(loop)
            j = builder.phi(i64)
            j.add_incoming(ir.Constant(i64, 0), entry)
            accs = []
            for _ in range(blocks):
                acc = builder.phi(_V16F)
                acc.add_incoming(zero, entry)
                accs.append(acc)
            xj = _splat16(builder, builder.load(builder.gep(x_data, [builder.add(x_start, j)])))
            row = builder.add(builder.mul(j, n), c0)
            nexts = []
            for b, acc in enumerate(accs):
                start = builder.add(row, ir.Constant(i64, 16 * b))
                c = builder.load(builder.bitcast(builder.gep(cts.data, [start]),
                                                 _V16F.as_pointer()), align=4)  # fmt: skip
                nexts.append(builder.fadd(acc, builder.fmul(xj, c, flags=("contract",)),
                                          flags=("contract",)))  # fmt: skip
            j_next = builder.add(j, ir.Constant(i64, 1))
            j.add_incoming(j_next, builder.basic_block)
            for acc, nxt in zip(accs, nexts, strict=True):
                acc.add_incoming(nxt, builder.basic_block)
            builder.cbranch(builder.icmp_signed("<", j_next, d), loop, done)
            builder.position_at_end(done)
            out_data = context.make_array(signature.args[4])(context, builder, args[4]).data
            for b, nxt in enumerate(nexts):
                ptr = builder.gep(out_data, [builder.add(out_start, ir.Constant(i64, 16 * b))])
                builder.store(nxt, builder.bitcast(ptr, _V16F.as_pointer()), align=4)
            return context.get_dummy_value()

        return sig, codegen

    dots.__name__ = dots.__qualname__ = f"column_dots{16 * blocks}"
    return intrinsic(dots)


def _i64(builder, v):
    return builder.sext(v, ir.IntType(64)) if v.type.width < 64 else v


#: :func:`_column_dots` for 64 columns (four registers in flight) and for 16
column_dots64 = _column_dots(4)
column_dots16 = _column_dots(1)


if numba.config.DISABLE_JIT:  # the kernels run as plain Python (numba's debugging mode)

    def _python_column_dots(width: int):
        def dots(x, x_start, ct, c0, out, out_start):
            d = ct.shape[0]
            flat = x.reshape(-1)[x_start : x_start + d]
            out.reshape(-1)[out_start : out_start + width] = flat @ ct[:, c0 : c0 + width]

        return dots

    column_dots64, column_dots16 = _python_column_dots(64), _python_column_dots(16)  # noqa: F811
