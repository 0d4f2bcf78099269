"""Inner products of one vector with a block of columns, as LLVM vector code: the coarse step
of a small IVF search (:func:`vq.kernels.exact.coarse_probe.probe_lists`), where the sums of 16
columns stay in one vector register across the whole vector (a numba loop over the columns stores
and reloads them at every component). Generic LLVM vector operations, so every CPU runs them;
plain numpy under numba's DISABLE_JIT.
"""

from __future__ import annotations

import numba
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from vq.kernels.common.simd import _V16F, _c_array, _splat16
from vq.kernels.fastscan.fastscan_scans import has_avx512


def _column_dots(blocks: int, rows: int = 1):
    """An intrinsic ``f(x, x_start, ct, c0, out, out_start)`` (``rows`` 1) or ``f(x, x_start,
    x_stride, ct, c0, out, out_start, out_stride)``: for r < ``rows`` and l < 16 * blocks,
    ``out[out_start + r * out_stride + l] = Σ_j x[x_start + r * x_stride + j] * ct[j, c0 + l]``
    over the rows j of the C-contiguous float32 ``ct`` [d, n] (d >= 1; flat indices for ``x``
    and ``out``): the inner products of ``rows`` vectors with 16 * blocks columns, each
    block's sums kept in one vector register across the whole loop over j (a numba loop over
    the columns stores and reloads them at every j, and cannot keep 16 scalars in one
    register); the terms added in order of j, each product fused with its sum where the CPU
    can. Several vectors share each load of the columns and keep more sums in flight: one
    vector's four chains of fused products wait on each other's latency, where the
    ``rows * blocks`` chains of several fill both of the CPU's multiply-add units. Each
    sum is computed alike whatever ``rows`` is (the same terms, in the same order)."""

    def check(x, ct, out):
        for arr in (x, ct, out):
            _c_array(arr, "column_dots")
        if ct.ndim != 2:
            raise numba.core.errors.TypingError(f"column_dots: expected a 2-d ct, got {ct}")

    def one(typingctx, x, x_start, ct, c0, out, out_start):
        check(x, ct, out)
        return types.void(x, x_start, ct, c0, out, out_start), codegen

    def several(typingctx, x, x_start, x_stride, ct, c0, out, out_start, out_stride):
        check(x, ct, out)
        return types.void(x, x_start, x_stride, ct, c0, out, out_start, out_stride), codegen

    def codegen(context, builder, signature, values):
        return _dots_codegen(context, builder, signature, values, blocks, rows)

    dots = one if rows == 1 else several
    dots.__name__ = dots.__qualname__ = f"column_dots{16 * blocks}" + (
        f"x{rows}" if rows > 1 else ""
    )
    return intrinsic(dots)


def _dots_codegen(context, builder, signature, values, blocks: int, rows: int):
    """:func:`_column_dots`'s code: the arguments read, the loop over j (:func:`_dots_loop`),
    the sums stored."""
    i64 = ir.IntType(64)
    if rows == 1:
        x_at, ct_at, out_at = 0, 2, 4
        x_start, c0, out_start = (_i64(builder, values[i]) for i in (1, 3, 5))
        x_stride = out_stride = ir.Constant(i64, 0)
    else:
        x_at, ct_at, out_at = 0, 3, 5
        x_start, x_stride, c0, out_start, out_stride = (
            _i64(builder, values[i]) for i in (1, 2, 4, 6, 7)
        )
    x_data = context.make_array(signature.args[x_at])(context, builder, values[x_at]).data
    cts = context.make_array(signature.args[ct_at])(context, builder, values[ct_at])
    x_rows = [builder.add(x_start, builder.mul(x_stride, ir.Constant(i64, r))) for r in range(rows)]
    nexts = _dots_loop(builder, x_data, x_rows, cts, c0, blocks)
    out_data = context.make_array(signature.args[out_at])(context, builder, values[out_at]).data
    for r in range(rows):
        at = builder.add(out_start, builder.mul(out_stride, ir.Constant(i64, r)))
        for b in range(blocks):
            ptr = builder.gep(out_data, [builder.add(at, ir.Constant(i64, 16 * b))])
            builder.store(nexts[r * blocks + b], builder.bitcast(ptr, _V16F.as_pointer()), align=4)
    return context.get_dummy_value()


def _dots_loop(builder, x_data, x_rows, cts, c0, blocks: int) -> list:
    """The loop over the rows j of ``cts``: for each vector (flat starts ``x_rows``) and block,
    its 16 sums in one vector register; their values after the last j (vector r's block b at
    ``r * blocks + b``)."""
    i64 = ir.IntType(64)
    rows = len(x_rows)
    d = builder.extract_value(cts.shape, 0)
    n = builder.extract_value(cts.shape, 1)
    zero = ir.Constant(_V16F, [0.0] * 16)
    entry = builder.basic_block
    loop = builder.append_basic_block("column_dots.loop")
    done = builder.append_basic_block("column_dots.done")
    builder.branch(loop)
    builder.position_at_end(loop)
    j = builder.phi(i64)
    j.add_incoming(ir.Constant(i64, 0), entry)
    accs = []
    for _ in range(rows * blocks):
        acc = builder.phi(_V16F)
        acc.add_incoming(zero, entry)
        accs.append(acc)
    row = builder.add(builder.mul(j, n), c0)
    columns = []
    for b in range(blocks):
        start = builder.add(row, ir.Constant(i64, 16 * b))
        columns.append(
            builder.load(
                builder.bitcast(builder.gep(cts.data, [start]), _V16F.as_pointer()), align=4
            )
        )
    nexts = []
    for r in range(rows):
        xj = _splat16(builder, builder.load(builder.gep(x_data, [builder.add(x_rows[r], j)])))
        for b in range(blocks):
            acc = accs[r * blocks + b]
            nexts.append(
                builder.fadd(
                    acc, builder.fmul(xj, columns[b], flags=("contract",)), flags=("contract",)
                )
            )
    j_next = builder.add(j, ir.Constant(i64, 1))
    j.add_incoming(j_next, builder.basic_block)
    for acc, nxt in zip(accs, nexts, strict=True):
        acc.add_incoming(nxt, builder.basic_block)
    builder.cbranch(builder.icmp_signed("<", j_next, d), loop, done)
    builder.position_at_end(done)
    return nexts


def _i64(builder, v):
    return builder.sext(v, ir.IntType(64)) if v.type.width < 64 else v


#: :func:`_column_dots` for 16 columns
column_dots16 = _column_dots(1)

#: the widest block the coarse step computes: ``DOT_ROWS`` queries by ``DOT_COLUMNS`` columns
#: (:func:`column_dots_rows`), and one query by ``DOT_COLUMNS`` (:func:`column_dots_wide`) —
#: 4 x 64 sums (16 vector registers of 32) with AVX-512, 2 x 32 (8 of 16) with AVX2, where
#: more spill
DOT_ROWS, DOT_COLUMNS = (4, 64) if has_avx512() else (2, 32)
column_dots_rows = _column_dots(DOT_COLUMNS // 16, DOT_ROWS)
column_dots_wide = _column_dots(DOT_COLUMNS // 16)


if numba.config.DISABLE_JIT:  # the kernels run as plain Python (numba's debugging mode)

    def _python_column_dots(width: int):
        def dots(x, x_start, ct, c0, out, out_start):
            d = ct.shape[0]
            flat = x.reshape(-1)[x_start : x_start + d]
            out.reshape(-1)[out_start : out_start + width] = flat @ ct[:, c0 : c0 + width]

        return dots

    def _python_column_dots_rows(width: int, rows: int):
        def dots(x, x_start, x_stride, ct, c0, out, out_start, out_stride):
            one = _python_column_dots(width)
            for r in range(rows):
                one(x, x_start + r * x_stride, ct, c0, out, out_start + r * out_stride)

        return dots

    column_dots16 = _python_column_dots(16)  # noqa: F811
    column_dots_wide = _python_column_dots(DOT_COLUMNS)  # noqa: F811
    column_dots_rows = _python_column_dots_rows(DOT_COLUMNS, DOT_ROWS)  # noqa: F811
