"""Small SIMD helpers for the numba kernels, as LLVM vector code (``numba.extending.intrinsic``):
one 16-float vector per call, where numba's own loops over 16 values stay scalar (LLVM's
generic reductions lower to scalar code here, and numba's strided indexing defeats the
vectoriser). Generic LLVM vector operations, so every CPU runs them (wider ones in fewer
instructions); C-contiguous arrays only, indexed by flat element index.
"""

from __future__ import annotations

import functools

import numba
import numpy as np
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


def _row_min_of(width: int):
    """An intrinsic ``f(values, start)``: the least of the ``width`` float32 at flat index
    ``start`` of a C-contiguous array, by a shuffle tree."""
    vec, ints = ir.VectorType(_F32, width), ir.VectorType(ir.IntType(32), width)

    def row_min_n(typingctx, values, start):
        _c_array(values, f"row_min{width}")
        sig = types.float32(values, start)

        def codegen(context, builder, signature, args):
            data = context.make_array(signature.args[0])(context, builder, args[0]).data
            v = builder.load(
                builder.bitcast(builder.gep(data, [args[1]]), vec.as_pointer()), align=4
            )
            n = width
            while n > 1:
                n //= 2
                w = builder.shuffle_vector(
                    v, v, ir.Constant(ints, [(i + n) % width for i in range(width)])
                )
                v = builder.select(builder.fcmp_ordered("<", v, w), v, w)
            return builder.extract_element(v, ir.Constant(ir.IntType(32), 0))

        return sig, codegen

    row_min_n.__name__ = row_min_n.__qualname__ = f"row_min{width}"
    return intrinsic(row_min_n)


#: the least of 8 (4) float32 at a flat index, as :func:`row_min` for 16
row_min8 = _row_min_of(8)
row_min4 = _row_min_of(4)


def _row_compare(op: str):
    def row_bits(typingctx, values, start, limit):
        _c_array(values, "row_bits")
        sig = types.uint32(values, start, limit)

        def codegen(context, builder, signature, args):
            v = _load16(context, builder, signature.args[0], args[0], args[1])
            hits = builder.fcmp_ordered(op, v, _splat16(builder, args[2]))
            return builder.zext(builder.bitcast(hits, ir.IntType(16)), ir.IntType(32))

        return sig, codegen

    return row_bits


#: ``row_at_most(values, start, limit)``: the bits (uint32, bit j for value ``start + j``) of
#: the 16 float32 at flat index ``start`` of a C-contiguous array that are ``<= limit``
#: (float32; NaN: never); ``row_below``: those ``< limit``
row_at_most = intrinsic(_row_compare("<="))
row_below = intrinsic(_row_compare("<"))


@intrinsic
def trailing_zeros(typingctx, x):
    """The number of trailing zero bits of an unsigned integer (``cttz``; its width if 0)."""
    sig = x(x)

    def codegen(context, builder, signature, args):
        return builder.cttz(args[0], ir.Constant(ir.IntType(1), 0))

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


@functools.cache
def table_row_kernels(dsub: int):
    """Intrinsics for one 16-entry look-up table of a sub-quantizer of ``dsub`` dimensions
    (unrolled), from codebooks_t float32 [M, dsub, 16] (C-contiguous; flat index ``cb_start``
    = m * dsub * 16) and the query sub-vector x[x_start : x_start + dsub]:

    - ``ip_row(x, x_start, codebooks_t, cb_start, alpha, out, out_start)``:
      ``out[out_start + j] = alpha * Σ_s x_s c_sj``;
    - ``l2_row(x, x_start, codebooks_t, cb_start, norms, norm_start, out, out_start)``:
      ``out[out_start + j] = max(Σ_s x_s² - 2 Σ_s x_s c_sj + norms[norm_start + j], 0)``.
    """
    dsub = int(dsub)

    def dot(context, builder, sig, args):
        """The 16 inner products, and the sub-vector's squared norm."""
        x_type, cb_type = sig.args[0], sig.args[2]
        x_data = context.make_array(x_type)(context, builder, args[0]).data
        acc = ir.Constant(_V16F, [0.0] * 16)
        norm = ir.Constant(_F32, 0.0)
        for s in range(dsub):
            i = builder.add(args[1], ir.Constant(args[1].type, s))
            xs = builder.load(builder.gep(x_data, [i]))
            start = builder.add(args[3], ir.Constant(args[3].type, 16 * s))
            c = _load16(context, builder, cb_type, args[2], start)
            acc = builder.fadd(acc, builder.fmul(_splat16(builder, xs), c))
            norm = builder.fadd(norm, builder.fmul(xs, xs))
        return acc, norm

    def store(context, builder, array_type, array, start, v):
        data = context.make_array(array_type)(context, builder, array).data
        builder.store(v, builder.bitcast(builder.gep(data, [start]), _V16F.as_pointer()), align=4)

    @intrinsic
    def ip_row(typingctx, x, x_start, codebooks_t, cb_start, alpha, out, out_start):
        for arr in (x, codebooks_t, out):
            _c_array(arr, "ip_row")
        sig = types.void(x, x_start, codebooks_t, cb_start, alpha, out, out_start)

        def codegen(context, builder, signature, args):
            acc, _ = dot(context, builder, signature, args)
            v = builder.fmul(_splat16(builder, args[4]), acc)
            store(context, builder, signature.args[5], args[5], args[6], v)
            return context.get_dummy_value()

        return sig, codegen

    @intrinsic
    def l2_row(typingctx, x, x_start, codebooks_t, cb_start, norms, norm_start, out, out_start):
        for arr in (x, codebooks_t, norms, out):
            _c_array(arr, "l2_row")
        sig = types.void(x, x_start, codebooks_t, cb_start, norms, norm_start, out, out_start)

        def codegen(context, builder, signature, args):
            acc, norm = dot(context, builder, signature, args)
            c_norms = _load16(context, builder, signature.args[4], args[4], args[5])
            minus2 = ir.Constant(_V16F, [-2.0] * 16)
            v = builder.fadd(
                builder.fadd(_splat16(builder, norm), builder.fmul(minus2, acc)), c_norms
            )
            zero = ir.Constant(_V16F, [0.0] * 16)
            v = builder.select(builder.fcmp_ordered(">", v, zero), v, zero)
            store(context, builder, signature.args[6], args[6], args[7], v)
            return context.get_dummy_value()

        return sig, codegen

    return ip_row, l2_row


@intrinsic
def prefetch_line(typingctx, array, row, byte):
    """Ask the CPU to bring the cache line at byte ``byte`` of row ``row`` of an array into
    cache (``llvm.prefetch``; a hint, never a fault). For scattered reads such as the vectors
    of re-ranking candidates, where the next rows are known ahead of their use."""
    if not isinstance(array, types.Array) or array.ndim < 1:
        raise numba.core.errors.TypingError(f"prefetch_line: expected an array, got {array}")
    sig = types.void(array, row, byte)

    def codegen(context, builder, signature, args):
        a = context.make_array(signature.args[0])(context, builder, args[0])
        i64, i32, i8p = ir.IntType(64), ir.IntType(32), ir.IntType(8).as_pointer()
        stride = builder.extract_value(a.strides, 0)
        row_v = builder.sext(args[1], i64) if args[1].type.width < 64 else args[1]
        byte_v = builder.sext(args[2], i64) if args[2].type.width < 64 else args[2]
        offset = builder.add(builder.mul(row_v, stride), byte_v)
        addr = builder.add(builder.ptrtoint(a.data, i64), offset)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = builder.module.declare_intrinsic("llvm.prefetch", fnty=fnty)
        read, keep, data = ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)
        builder.call(fn, [builder.inttoptr(addr, i8p), read, keep, data])
        return context.get_dummy_value()

    return sig, codegen


#: the ``claim`` of a kernel call that takes all its work itself (no counter shared)
NO_CLAIM = np.zeros(0, dtype=np.int64)


@intrinsic
def fetch_add(typingctx, counter, value):
    """Add ``value`` to ``counter[0]`` (a C-contiguous int64 array) atomically and return the
    value before: threads that share the counter each get distinct values (work claimed in
    chunks, :func:`vq.kernels.graph.graph_search.hnsw_search_lean`)."""
    if not (isinstance(counter, types.Array) and counter.dtype == types.int64):
        raise numba.core.errors.TypingError(f"fetch_add: expected an int64 array, got {counter}")
    sig = types.int64(counter, types.int64)

    def codegen(context, builder, signature, args):
        a = context.make_array(signature.args[0])(context, builder, args[0])
        value = context.cast(builder, args[1], signature.args[1], types.int64)
        return builder.atomic_rmw("add", a.data, value, "monotonic")

    return sig, codegen


@intrinsic
def borrow(typingctx, array):
    """``array`` without its reference count: the same data, shape and strides, no owner (a
    tuple or named tuple: the same tuple with each of its arrays borrowed, nested tuples
    too, other fields as they are).

    Numba counts references to an array's memory with atomic instructions, at every view
    (``a[i]``, ``a[i:j]``) a kernel takes and drops. In a hot loop of a kernel called from
    Python those atomics cost more than the work (and two threads counting on one array
    contend for its cache line). A borrowed array's views count nothing. The caller keeps the
    real array alive for the call; a borrowed array (or a view of it) must not outlive it, nor
    be returned.
    """
    if not isinstance(array, types.Array | types.BaseTuple):
        raise numba.core.errors.TypingError(f"borrow: expected an array or a tuple, got {array}")

    def codegen(context, builder, signature, args):
        return _borrowed(context, builder, array, args[0])

    return array(array), codegen


def _borrowed(context, builder, typ, value):
    if isinstance(typ, types.Array):
        src = context.make_array(typ)(context, builder, value)
        out = context.make_array(typ)(context, builder)
        for field in ("nitems", "itemsize", "data", "shape", "strides"):
            setattr(out, field, getattr(src, field))
        out.meminfo = ir.Constant(out.meminfo.type, None)
        out.parent = ir.Constant(out.parent.type, None)
        return out._getvalue()
    if isinstance(typ, types.BaseTuple):
        items = [
            _borrowed(context, builder, t, builder.extract_value(value, i))
            for i, t in enumerate(typ.types)
        ]
        return context.make_tuple(builder, typ, items)
    if context.enable_nrt:  # (a scalar, None: nothing; anything else keeps its count right)
        context.nrt.incref(builder, typ, value)
    return value


if numba.config.DISABLE_JIT:  # the kernels run as plain Python (numba's debugging mode)

    def borrow(array):  # noqa: F811
        return array

    def _python_row_min(width: int):
        return lambda values, start: values.reshape(-1)[start : start + width].min()

    row_min8, row_min4 = _python_row_min(8), _python_row_min(4)  # noqa: F811

    def _bits(hits) -> np.uint32:
        return np.uint32(sum(1 << int(j) for j in np.flatnonzero(hits)))

    def row_min(values, start):  # noqa: F811
        return np.float32(values.reshape(-1)[start : start + 16].min())

    def row_at_most(values, start, limit):  # noqa: F811
        return _bits(values.reshape(-1)[start : start + 16] <= limit)

    def row_below(values, start, limit):  # noqa: F811
        return _bits(values.reshape(-1)[start : start + 16] < limit)

    def trailing_zeros(x):  # noqa: F811
        return type(x)((int(x) & -int(x)).bit_length() - 1 if x else 8 * np.dtype(type(x)).itemsize)
