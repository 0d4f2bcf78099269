"""Exact distances of a query to stored float32 rows, as LLVM vector code
(``numba.extending.intrinsic``), in two parts: a *head* over the first dimensions and a *tail*
over the rest, so that a scan can skip a row's tail once its head alone reaches the scan's
threshold.

A squared L2 distance is a sum of non-negative terms, and adding a non-negative float never
makes a sum smaller, so ``head >= threshold`` implies ``head + tail >= threshold``: a scan that
skips those tails keeps exactly the rows it would keep without skipping. How many it skips
depends on how much of the distance the head carries: most of it once the vectors are rotated
into their principal axes (``vq.PCA``, ``"PCA128,IVF1024,Flat"``), since the first axes carry
most of the variance (partial-distance pruning with an orthogonal transform: Gao and Long,
"High-Dimensional Approximate Nearest Neighbor Search: with Reliable and Efficient Distance
Comparison Operations", SIGMOD 2023; Kuffo, Krippner and Boncz, "PDX: A Data Layout for
Vector Similarity Search", SIGMOD 2025). Negated inner products are not monotone in their
terms: their scans compute whole rows (:func:`ip_row`).

Every float32 distance of the scans is one fixed sequence of operations, whichever function
computes it, so a row's distance is the same bit for bit alone, four at a time, or as head
then tail (a row's distance never depends on its place in a list, nor on whether its head was
tested first):

- dimensions 8 a vector step; the head is the first :func:`head_dims` dimensions (a quarter,
  rounded up to a multiple of 8, where the vectors have at least :data:`MIN_SPLIT`), the tail
  the rest;
- within each part, even steps summed in one 8-lane accumulator and odd steps in another (each
  product fused with its sum where the CPU can), the two added, the 8 lanes summed by a fixed
  tree (4 + 4, 2 + 2, 1 + 1), then the part's last ``d % 8`` dimensions added one by one;
- the distance is ``head + tail``.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

#: vectors of fewer dimensions than this have no tail (their head is all of them)
MIN_SPLIT = 64

_F32 = ir.FloatType()
_I32 = ir.IntType(32)
_I64 = ir.IntType(64)
_V8F = ir.VectorType(_F32, 8)
_FLAGS = ("contract",)


def head_dims(d: int) -> int:
    """How many of ``d`` dimensions a row's head holds: a quarter of them rounded up to a
    multiple of 8 (32 of 128, 96 of 384) where ``d >= MIN_SPLIT``, else all of them."""
    return 8 * -(-d // 32) if d >= MIN_SPLIT else d


def _check(x, vectors, what: str) -> None:
    for arr, name in ((x, "x"), (vectors, "vectors")):
        if not isinstance(arr, types.Array) or arr.layout != "C" or arr.dtype != types.float32:
            raise numba.core.errors.TypingError(
                f"{what}: expected a C-contiguous float32 array for {name}, got {arr}"
            )
    if x.ndim != 1 or vectors.ndim != 2:
        raise numba.core.errors.TypingError(f"{what}: expected x [d] and vectors [n, d]")


def _const(v: int):
    return ir.Constant(_I64, v)


def _load8(builder, ptr, at):
    return builder.load(builder.bitcast(builder.gep(ptr, [at]), _V8F.as_pointer()), align=4)


def _term(builder, acc, a, b, inner_product: bool):
    """acc + a·b (inner products) or acc + (a - b)² (squared L2), fused where the CPU can."""
    if inner_product:
        return builder.fadd(acc, builder.fmul(a, b, flags=_FLAGS), flags=_FLAGS)
    diff = builder.fsub(a, b)
    return builder.fadd(acc, builder.fmul(diff, diff, flags=_FLAGS), flags=_FLAGS)


def _sum8(builder, v):
    """The 8 lanes of ``v`` summed by the fixed tree 4 + 4, 2 + 2, 1 + 1."""
    for width in (4, 2, 1):
        lanes = ir.VectorType(_I32, width)
        lo = builder.shuffle_vector(v, v, ir.Constant(lanes, list(range(width))))
        hi = builder.shuffle_vector(v, v, ir.Constant(lanes, list(range(width, 2 * width))))
        v = builder.fadd(lo, hi)
    return builder.extract_element(v, ir.Constant(_I32, 0))


def _part(builder, x_ptr, row_ptrs, start, steps, end, inner_product: bool):
    """The sums of one part for each row: ``steps`` (an i64 value) vector steps of 8 from
    dimension ``start``, then the dimensions from ``start + 8 * steps`` to ``end`` one by one
    (all i64 values), by the module's fixed sequence."""
    sums, pairs = _paired_steps(builder, x_ptr, row_ptrs, start, steps, inner_product)
    totals = _reduced(builder, x_ptr, row_ptrs, start, steps, pairs, sums, inner_product)
    return _scalar_tail(builder, x_ptr, row_ptrs, start, steps, end, totals, inner_product)


def _paired_steps(builder, x_ptr, row_ptrs, start, steps, inner_product: bool):
    """The vector steps of a part two at a time, even steps into one accumulator and odd ones
    into another: each row's (even, odd) accumulators, and the number of pairs."""
    zero_v = ir.Constant(_V8F, [0.0] * 8)
    entry = builder.basic_block
    pairs = builder.lshr(steps, _const(1))
    loop = builder.append_basic_block("rowdist.pairs")
    after = builder.append_basic_block("rowdist.after_pairs")
    builder.cbranch(builder.icmp_unsigned(">", pairs, _const(0)), loop, after)

    builder.position_at_end(loop)
    m = builder.phi(_I64)
    m.add_incoming(_const(0), entry)
    accs = []
    for _ in row_ptrs:
        pair = (builder.phi(_V8F), builder.phi(_V8F))
        for acc in pair:
            acc.add_incoming(zero_v, entry)
        accs.append(pair)
    at = builder.add(start, builder.shl(m, _const(4)))
    at_odd = builder.add(at, _const(8))
    x_even, x_odd = _load8(builder, x_ptr, at), _load8(builder, x_ptr, at_odd)
    nexts = []
    for ptr, (even, odd) in zip(row_ptrs, accs, strict=True):
        nexts.append(
            (
                _term(builder, even, x_even, _load8(builder, ptr, at), inner_product),
                _term(builder, odd, x_odd, _load8(builder, ptr, at_odd), inner_product),
            )
        )
    m_next = builder.add(m, _const(1))
    m.add_incoming(m_next, builder.basic_block)
    for (even, odd), (n_even, n_odd) in zip(accs, nexts, strict=True):
        even.add_incoming(n_even, builder.basic_block)
        odd.add_incoming(n_odd, builder.basic_block)
    builder.cbranch(builder.icmp_unsigned("<", m_next, pairs), loop, after)
    loop_end = builder.basic_block

    builder.position_at_end(after)
    sums = []
    for n_even, n_odd in nexts:
        even, odd = builder.phi(_V8F), builder.phi(_V8F)
        even.add_incoming(zero_v, entry)
        even.add_incoming(n_even, loop_end)
        odd.add_incoming(zero_v, entry)
        odd.add_incoming(n_odd, loop_end)
        sums.append((even, odd))
    return sums, pairs


def _reduced(builder, x_ptr, row_ptrs, start, steps, pairs, sums, inner_product: bool):
    """Each row's accumulators after an odd step left over (into the even one), the two added
    and their 8 lanes summed (:func:`_sum8`)."""
    last = builder.add(start, builder.shl(pairs, _const(4)))
    odd_step = builder.append_basic_block("rowdist.odd_step")
    reduce = builder.append_basic_block("rowdist.reduce")
    before_odd = builder.basic_block
    has_odd = builder.trunc(builder.and_(steps, _const(1)), ir.IntType(1))
    builder.cbranch(has_odd, odd_step, reduce)
    builder.position_at_end(odd_step)
    x_last = _load8(builder, x_ptr, last)
    stepped = [
        _term(builder, even, x_last, _load8(builder, ptr, last), inner_product)
        for ptr, (even, _) in zip(row_ptrs, sums, strict=True)
    ]
    builder.branch(reduce)

    builder.position_at_end(reduce)
    merged = []  # (phi nodes first in their block)
    for (even, _), done in zip(sums, stepped, strict=True):
        phi = builder.phi(_V8F)
        phi.add_incoming(even, before_odd)
        phi.add_incoming(done, odd_step)
        merged.append(phi)
    totals = [
        _sum8(builder, builder.fadd(even, odd)) for even, (_, odd) in zip(merged, sums, strict=True)
    ]
    return totals


def _scalar_tail(builder, x_ptr, row_ptrs, start, steps, end, totals, inner_product: bool):
    """Each row's ``totals`` plus the part's dimensions left after its vector steps, one at a
    time."""
    tail_start = builder.add(start, builder.shl(steps, _const(3)))
    tail = builder.append_basic_block("rowdist.scalar")
    done = builder.append_basic_block("rowdist.done")
    before_tail = builder.basic_block
    builder.cbranch(builder.icmp_unsigned("<", tail_start, end), tail, done)
    builder.position_at_end(tail)
    j = builder.phi(_I64)
    j.add_incoming(tail_start, before_tail)
    partial = []
    for total in totals:
        s = builder.phi(_F32)
        s.add_incoming(total, before_tail)
        partial.append(s)
    xj = builder.load(builder.gep(x_ptr, [j]))
    stepped = []
    for ptr, s in zip(row_ptrs, partial, strict=True):
        stepped.append(_term(builder, s, xj, builder.load(builder.gep(ptr, [j])), inner_product))
    j_next = builder.add(j, _const(1))
    j.add_incoming(j_next, builder.basic_block)
    for s, nxt in zip(partial, stepped, strict=True):
        s.add_incoming(nxt, builder.basic_block)
    builder.cbranch(builder.icmp_unsigned("<", j_next, end), tail, done)
    tail_end = builder.basic_block

    builder.position_at_end(done)
    values = []
    for total, nxt in zip(totals, stepped, strict=True):
        v = builder.phi(_F32)
        v.add_incoming(total, before_tail)
        v.add_incoming(nxt, tail_end)
        values.append(v)
    return values


def _bounds(builder, d):
    """(head_end, tail_steps): the head covers dimensions [0, head_end), the tail the rest
    (8-dimension steps from head_end, then one by one)."""
    split = builder.icmp_unsigned(">=", d, _const(MIN_SPLIT))
    quarter = builder.shl(builder.lshr(builder.add(d, _const(31)), _const(5)), _const(3))
    head_end = builder.select(split, quarter, d)
    tail_steps = builder.lshr(builder.sub(d, head_end), _const(3))
    return head_end, tail_steps


def _head(builder, x_ptr, ptrs, d):
    head_end, _ = _bounds(builder, d)
    steps = builder.lshr(head_end, _const(3))
    return _part(builder, x_ptr, ptrs, _const(0), steps, head_end, False)


def _tail(builder, x_ptr, ptrs, d):
    head_end, tail_steps = _bounds(builder, d)
    return _part(builder, x_ptr, ptrs, head_end, tail_steps, d, False)


def _whole(builder, x_ptr, ptrs, d, inner_product: bool):
    if inner_product:  # one part: no pruning
        steps = builder.lshr(d, _const(3))
        return [builder.fneg(v) for v in _part(builder, x_ptr, ptrs, _const(0), steps, d, True)]
    heads, tails = _head(builder, x_ptr, ptrs, d), _tail(builder, x_ptr, ptrs, d)
    return [builder.fadd(h, t) for h, t in zip(heads, tails, strict=True)]


def _intrinsic(name: str, rows: int, body):
    """An intrinsic ``name(x, vectors, i0[, i1, i2, i3])`` returning ``body``'s value(s)."""

    def codegen(context, builder, signature, args):
        x = context.make_array(signature.args[0])(context, builder, args[0])
        vectors = context.make_array(signature.args[1])(context, builder, args[1])
        d = builder.extract_value(vectors.shape, 1)
        ptrs = []
        for r in range(rows):
            i = args[2 + r]
            i = builder.sext(i, _I64) if i.type.width < 64 else i
            ptrs.append(builder.gep(vectors.data, [builder.mul(i, d)]))
        values = body(builder, x.data, ptrs, d)
        if rows == 1:
            return values[0]
        return context.make_tuple(builder, signature.return_type, values)

    if rows == 1:

        def typer(typingctx, x, vectors, i):
            _check(x, vectors, name)
            return types.float32(x, vectors, i), codegen

    else:

        def typer(typingctx, x, vectors, i0, i1, i2, i3):
            _check(x, vectors, name)
            return types.UniTuple(types.float32, 4)(x, vectors, i0, i1, i2, i3), codegen

    typer.__name__ = typer.__qualname__ = name
    return intrinsic(typer)


#: ``l2_row(x, vectors, i)``: the squared L2 distance of ``x`` float32 [d] to row i of
#: ``vectors`` float32 [n, d] (both C-contiguous), head + tail; ``ip_row``: their negated
#: inner product
l2_row = _intrinsic("l2_row", 1, lambda b, x, p, d: _whole(b, x, p, d, False))
ip_row = _intrinsic("ip_row", 1, lambda b, x, p, d: _whole(b, x, p, d, True))
#: ``l2_heads4(x, vectors, i0, i1, i2, i3)``: the heads of four rows (rows may repeat);
#: ``l2_tail(x, vectors, i)``: a row's tail (0 where the vectors have no tail)
l2_heads4 = _intrinsic("l2_heads4", 4, _head)
l2_tail = _intrinsic("l2_tail", 1, _tail)


if numba.config.DISABLE_JIT:  # the kernels run as plain Python (numba's debugging mode)

    def _python_part(x, v, lo, hi):
        diff = x[lo:hi].astype(np.float64) - v[lo:hi].astype(np.float64)
        return np.float32(np.dot(diff, diff))

    def l2_row(x, vectors, i):  # noqa: F811
        return l2_heads4(x, vectors, i, i, i, i)[0] + l2_tail(x, vectors, i)

    def ip_row(x, vectors, i):  # noqa: F811
        return -np.float32(np.dot(x.astype(np.float64), vectors[i].astype(np.float64)))

    def l2_heads4(x, vectors, i0, i1, i2, i3):  # noqa: F811
        h = head_dims(vectors.shape[1])
        return tuple(_python_part(x, vectors[i], 0, h) for i in (i0, i1, i2, i3))

    def l2_tail(x, vectors, i):  # noqa: F811
        d = vectors.shape[1]
        return _python_part(x, vectors[i], head_dims(d), d)
