"""Small SIMD helpers for the numba kernels, as LLVM vector code (``numba.extending.intrinsic``):
one 16-float vector per call, where numba's own loops over 16 values stay scalar (LLVM's
generic reductions lower to scalar code here, and numba's strided indexing defeats the
vectoriser). Generic LLVM vector operations, so every CPU runs them (wider ones in fewer
instructions); C-contiguous arrays only, indexed by flat element index.
"""

from __future__ import annotations

import numba
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

_F32 = ir.FloatType()
_V16F = ir.VectorType(_F32, 16)
_V16I = ir.VectorType(ir.IntType(32), 16)


def _c_array(arr, what: str) -> None:
    if not isinstance(arr, types.Array) or arr.layout != "C":
        raise numba.core.errors.TypingError(f"{what}: expected a C-contiguous array, got {arr}")


def _load16(context, builder, array_type, array, start):
    """The 16 float32 at flat index ``start`` of a C-contiguous array, as one vector."""
    data = context.make_array(array_type)(context, builder, array).data
    return builder.load(builder.bitcast(builder.gep(data, [start]), _V16F.as_pointer()), align=4)


def _splat16(builder, x):
    v = builder.insert_element(ir.Constant(_V16F, ir.Undefined), x, ir.Constant(ir.IntType(32), 0))
    return builder.shuffle_vector(v, v, ir.Constant(_V16I, [0] * 16))


def _reduce16(builder, v, op: str):
    """The least (op "<") or greatest (">") of a 16-float vector, by a shuffle tree."""
    n = 16
    while n > 1:
        n //= 2
        w = builder.shuffle_vector(v, v, ir.Constant(_V16I, [(i + n) % 16 for i in range(16)]))
        v = builder.select(builder.fcmp_ordered(op, v, w), v, w)
    return builder.extract_element(v, ir.Constant(ir.IntType(32), 0))


@intrinsic
def row_range(typingctx, values, start):
    """(min, max) of the 16 float32 at flat index ``start`` of a C-contiguous array."""
    _c_array(values, "row_range")
    sig = types.UniTuple(types.float32, 2)(values, start)

    def codegen(context, builder, signature, args):
        v = _load16(context, builder, signature.args[0], args[0], args[1])
        low, high = _reduce16(builder, v, "<"), _reduce16(builder, v, ">")
        return context.make_tuple(builder, signature.return_type, [low, high])

    return sig, codegen


@intrinsic
def row_min(typingctx, values, start):
    """The least of the 16 float32 at flat index ``start`` of a C-contiguous array."""
    _c_array(values, "row_min")
    sig = types.float32(values, start)

    def codegen(context, builder, signature, args):
        v = _load16(context, builder, signature.args[0], args[0], args[1])
        return _reduce16(builder, v, "<")

    return sig, codegen


@intrinsic
def quantize_row(typingctx, tables, start, low, scale, out):
    """``out[start + j] = uint8(min((tables[start + j] - low) * scale + 0.5, 255))`` for
    j < 16 (flat indices of C-contiguous arrays; entries >= low, so truncation rounds)."""
    _c_array(tables, "quantize_row")
    _c_array(out, "quantize_row")
    sig = types.void(tables, start, low, scale, out)

    def codegen(context, builder, signature, args):
        v = _load16(context, builder, signature.args[0], args[0], args[1])
        x = builder.fmul(builder.fsub(v, _splat16(builder, args[2])), _splat16(builder, args[3]))
        x = builder.fadd(x, ir.Constant(_V16F, [0.5] * 16))
        cap = ir.Constant(_V16F, [255.0] * 16)
        x = builder.select(builder.fcmp_ordered("<", x, cap), x, cap)
        data = context.make_array(signature.args[4])(context, builder, args[4]).data
        ptr = builder.bitcast(
            builder.gep(data, [args[1]]), ir.VectorType(ir.IntType(8), 16).as_pointer()
        )
        builder.store(builder.fptoui(x, ir.VectorType(ir.IntType(8), 16)), ptr, align=1)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def add_row(typingctx, a, a_start, b, b_start, out, out_start):
    """``out[out_start + j] = a[a_start + j] + b[b_start + j]`` for j < 16 (float32, flat
    indices of C-contiguous arrays)."""
    for arr in (a, b, out):
        _c_array(arr, "add_row")
    sig = types.void(a, a_start, b, b_start, out, out_start)

    def codegen(context, builder, signature, args):
        x = _load16(context, builder, signature.args[0], args[0], args[1])
        y = _load16(context, builder, signature.args[2], args[2], args[3])
        data = context.make_array(signature.args[4])(context, builder, args[4]).data
        ptr = builder.bitcast(builder.gep(data, [args[5]]), _V16F.as_pointer())
        builder.store(builder.fadd(x, y), ptr, align=4)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def copy_row(typingctx, a, a_start, out, out_start):
    """``out[out_start + j] = a[a_start + j]`` for j < 16 (float32, flat indices of
    C-contiguous arrays)."""
    for arr in (a, out):
        _c_array(arr, "copy_row")
    sig = types.void(a, a_start, out, out_start)

    def codegen(context, builder, signature, args):
        x = _load16(context, builder, signature.args[0], args[0], args[1])
        data = context.make_array(signature.args[2])(context, builder, args[2]).data
        ptr = builder.bitcast(builder.gep(data, [args[3]]), _V16F.as_pointer())
        builder.store(x, ptr, align=4)
        return context.get_dummy_value()

    return sig, codegen
