"""Inner products of a few vectors with blocks of 16 columns, as LLVM vector code: the coarse
step of a small IVF search (:func:`vq.kernels.exact.coarse_probe.products`), where the sums of
each 16 columns stay in one vector register across the whole vector (a numba loop over the
columns stores and reloads them at every component). The columns are read as panels
(:func:`vq.kernels.exact.coarse_probe.column_panels`: float32 [P, d, 16], panel p holding
columns 16 p .. 16 p + 15 row after row), so that one panel's loads run through consecutive
memory whatever the number of columns: read as rows of a [d, n] matrix, each component's 16
columns lie a whole row apart, and past a few hundred columns every load of a query's loop
starts a new page. Generic LLVM vector operations, so every CPU runs them; plain numpy under
numba's DISABLE_JIT.
"""

from __future__ import annotations

import numba
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from vq.kernels.common.simd import _V16F, _c_array, _splat16
from vq.kernels.fastscan.fastscan_scans import has_avx512

#: the columns of one panel (one vector of 16 float32)
PANEL = 16


def _panel_dots(blocks: int, rows: int):
    """An intrinsic ``f(x, x_start, x_stride, panels, p0, out, out_start, out_stride)``: for
    r < ``rows``, b < ``blocks`` and l < 16, ``out[out_start + r * out_stride + 16 b + l] =
    Σ_j x[x_start + r * x_stride + j] * panels[p0 + b, j, l]`` over the rows j of the
    C-contiguous float32 ``panels`` [P, d, 16] (d >= 1; flat indices for ``x`` and ``out``):
    the inner products of ``rows`` vectors with the 16 * blocks columns of ``blocks`` panels,
    each panel's sums for each vector kept in one vector register across the whole loop over
    j; the terms added in order of j, each product fused with its sum where the CPU can.
    Several vectors share each load of the columns and keep more sums in flight: one vector's
    chains of fused products wait on each other's latency, where the ``rows * blocks`` chains
    of several fill both of the CPU's multiply-add units. Each sum is computed alike whatever
    ``rows`` and ``blocks`` are (the same terms, in the same order)."""

    def dots(typingctx, x, x_start, x_stride, panels, p0, out, out_start, out_stride):
        for arr in (x, panels, out):
            _c_array(arr, "panel_dots")
        if panels.ndim != 3:
            raise numba.core.errors.TypingError(f"panel_dots: expected 3-d panels, got {panels}")
        sig = types.void(x, x_start, x_stride, panels, p0, out, out_start, out_stride)
        return sig, codegen

    def codegen(context, builder, signature, values):
        return _dots_codegen(context, builder, signature, values, blocks, rows)

    dots.__name__ = dots.__qualname__ = f"panel_dots{blocks}x{rows}"
    return intrinsic(dots)


def _dots_codegen(context, builder, signature, values, blocks: int, rows: int):
    """:func:`_panel_dots`'s code: the arguments read, the loop over j (:func:`_dots_loop`),
    the sums stored."""
    i64 = ir.IntType(64)
    x_start, x_stride, p0, out_start, out_stride = (
        _i64(builder, values[i]) for i in (1, 2, 4, 6, 7)
    )
    x_data = context.make_array(signature.args[0])(context, builder, values[0]).data
    panels = context.make_array(signature.args[3])(context, builder, values[3])
    x_rows = [builder.add(x_start, builder.mul(x_stride, ir.Constant(i64, r))) for r in range(rows)]
    nexts = _dots_loop(builder, x_data, x_rows, panels, p0, blocks)
    out_data = context.make_array(signature.args[5])(context, builder, values[5]).data
    for r in range(rows):
        at = builder.add(out_start, builder.mul(out_stride, ir.Constant(i64, r)))
        for b in range(blocks):
            ptr = builder.gep(out_data, [builder.add(at, ir.Constant(i64, PANEL * b))])
            builder.store(nexts[r * blocks + b], builder.bitcast(ptr, _V16F.as_pointer()), align=4)
    return context.get_dummy_value()


def _dots_loop(builder, x_data, x_rows, panels, p0, blocks: int) -> list:
    """The loop over the rows j of the panels: for each vector (flat starts ``x_rows``) and
    panel, its 16 sums in one vector register; their values after the last j (vector r's panel
    b at ``r * blocks + b``)."""
    i64 = ir.IntType(64)
    rows = len(x_rows)
    d = builder.extract_value(panels.shape, 1)
    panel_size = builder.mul(d, ir.Constant(i64, PANEL))
    first = builder.mul(p0, panel_size)
    zero = ir.Constant(_V16F, [0.0] * 16)
    entry = builder.basic_block
    loop = builder.append_basic_block("panel_dots.loop")
    done = builder.append_basic_block("panel_dots.done")
    builder.branch(loop)
    builder.position_at_end(loop)
    j = builder.phi(i64)
    j.add_incoming(ir.Constant(i64, 0), entry)
    accs = []
    for _ in range(rows * blocks):
        acc = builder.phi(_V16F)
        acc.add_incoming(zero, entry)
        accs.append(acc)
    row = builder.add(first, builder.mul(j, ir.Constant(i64, PANEL)))
    columns = []
    for b in range(blocks):
        start = builder.add(row, builder.mul(panel_size, ir.Constant(i64, b)))
        ptr = builder.bitcast(builder.gep(panels.data, [start]), _V16F.as_pointer())
        columns.append(builder.load(ptr, align=4))
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


#: the block :func:`vq.kernels.exact.coarse_probe.products` computes for several vectors:
#: ``DOT_ROWS`` vectors by ``DOT_BLOCKS`` panels (:func:`panel_dots_rows`) — 4 x 64 sums (16
#: vector registers of 32) with AVX-512, 6 x 16 (12 of 16) with AVX2, where 2 x 64 spill —
#: and for one vector, ``ONE_BLOCKS`` panels (:func:`panel_dots_one`)
DOT_ROWS, DOT_BLOCKS = (4, 4) if has_avx512() else (6, 1)
ONE_BLOCKS = 4
panel_dots_rows = _panel_dots(DOT_BLOCKS, DOT_ROWS)
panel_dots_block = _panel_dots(1, DOT_ROWS)  # (the panels past a multiple of DOT_BLOCKS)
panel_dots_one = _panel_dots(ONE_BLOCKS, 1)
panel_dots16 = _panel_dots(1, 1)


if numba.config.DISABLE_JIT:  # the kernels run as plain Python (numba's debugging mode)

    def _python_panel_dots(blocks: int, rows: int):
        def dots(x, x_start, x_stride, panels, p0, out, out_start, out_stride):
            flat_x, flat_out = x.reshape(-1), out.reshape(-1)
            d = panels.shape[1]
            columns = panels[p0 : p0 + blocks].transpose(1, 0, 2).reshape(d, PANEL * blocks)
            for r in range(rows):
                at = x_start + r * x_stride
                to = out_start + r * out_stride
                flat_out[to : to + PANEL * blocks] = flat_x[at : at + d] @ columns

        return dots

    panel_dots_rows = _python_panel_dots(DOT_BLOCKS, DOT_ROWS)  # noqa: F811
    panel_dots_block = _python_panel_dots(1, DOT_ROWS)  # noqa: F811
    panel_dots_one = _python_panel_dots(ONE_BLOCKS, 1)  # noqa: F811
    panel_dots16 = _python_panel_dots(1, 1)  # noqa: F811
