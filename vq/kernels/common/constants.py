"""Values a kernel compiles in as constants: a :class:`Static` is a Python value whose numba type
carries it, so that each value compiles a kernel of its own.

numba specialises a kernel on its arguments' types, not their values. A flag or a small
enumeration that picks a loop (the metric; the scalar-quantizer kind) had two ways in:

- tested at run time: LLVM keeps a test inside a loop where it is (scalar code, several
  times slower);
- tested once, each branch calling an inlined copy of the loop with a literal: fast, but every
  copy compiles on the first call, whichever one the data needs (twice the first search's
  compile for two metrics, five times for five SQ kinds).

A :class:`Static` argument is the third: ``if value:``, ``value == X`` and ``value != X`` are
constants in each compilation, which LLVM folds before it optimises the loops, so a kernel
compiles only the code its value selects, and runs the literal copy's speed.

The metric is one: :data:`L2` and :data:`IP` (:func:`metric`), in the kernels' signatures as
``metric(l2)`` / ``metric(ip)``. The Python wrappers of the kernels (``ivf_flat_scan``,
``smallest_k_rows``, ...) turn a bool into one; a kernel that calls another with a fixed metric
names :data:`L2` rather than the literal ``False``, which numba would compile as a signature
of its own beside the one its L2 callers use.
"""

from __future__ import annotations

import operator

from numba import types
from numba.core import cgutils
from numba.core.datamodel import models
from numba.core.imputils import lower_constant
from numba.extending import NativeValue, overload, register_model, unbox


class StaticType(types.Dummy):
    """The numba type of a :class:`Static`: its value (a bool or an int) and a label."""

    def __init__(self, value: bool | int, label: str):
        self.value = value
        super().__init__(name=label)

    @property
    def key(self):
        return (type(self.value).__name__, self.value, self.name)


register_model(StaticType)(models.OpaqueModel)


class Static:
    """A bool or int a kernel compiles in as a constant (see the module docstring); ``label``
    names it in the kernels' signatures."""

    __slots__ = ("value", "label", "_numba_type_")

    def __init__(self, value: bool | int, label: str):
        self.value, self.label = value, label
        self._numba_type_ = StaticType(value, label)

    def __bool__(self) -> bool:
        return bool(self.value)

    def __index__(self) -> int:
        return int(self.value)

    def __eq__(self, other) -> bool:  # (as its value: kernels run as Python with
        return self.value == (other.value if isinstance(other, Static) else other)  # no JIT)

    def __hash__(self) -> int:
        return hash(self.value)

    def __repr__(self) -> str:
        return f"Static({self.value!r}, {self.label!r})"

    def __reduce__(self):
        return Static, (self.value, self.label)


def static_value(typ):
    """For an overload: the value a numba type fixes at compile time (a :class:`StaticType`,
    or a bool or int literal); None for a run-time value."""
    if isinstance(typ, StaticType):
        return typ.value
    if isinstance(typ, (types.BooleanLiteral, types.IntegerLiteral)):
        return typ.literal_value
    return None


#: squared L2 distances / negated inner products, as a kernel's metric argument
L2 = Static(False, "metric(l2)")
IP = Static(True, "metric(ip)")


def metric(inner_product) -> Static:
    """:data:`IP` for a true ``inner_product`` (a bool, or :data:`L2` / :data:`IP`), else
    :data:`L2`."""
    return IP if inner_product else L2


def constant_metric(typ) -> bool | None:
    """For an overload: the ``inner_product`` fixed by the numba type of a metric argument
    (:data:`L2` / :data:`IP`, or a literal bool), None for a run-time flag."""
    value = static_value(typ)
    return None if value is None else bool(value)


# -- in a kernel ------------------------------------------------------------------------------
@unbox(StaticType)
def _unbox(typ, obj, c):
    return NativeValue(c.context.get_dummy_value(), is_error=cgutils.false_bit)


@lower_constant(StaticType)
def _constant(context, builder, typ, value):  # a kernel may name L2 / IP (a global)
    return context.get_dummy_value()


@overload(bool)
def _truth(s):
    if isinstance(s, StaticType):
        value = bool(s.value)
        return lambda s: value
    return None


def _comparison(op):
    def compare(a, b):
        if isinstance(a, StaticType) and isinstance(b, types.Integer):
            value = a.value
            return lambda a, b: op(value, b)
        if isinstance(b, StaticType) and isinstance(a, types.Integer):
            value = b.value
            return lambda a, b: op(a, value)
        return None

    return compare


overload(operator.eq)(_comparison(operator.eq))
overload(operator.ne)(_comparison(operator.ne))
