"""The metric as part of a kernel's signature: :data:`L2` and :data:`IP` are two values of two
numba types, so a kernel called with one compiles (and caches) the code of that metric only.

A kernel whose loops test a run-time ``inner_product`` flag gets scalar code (LLVM does not take
the test out of the loop), so the graph kernels used to test the flag once and run their whole
body twice, inlined with the literal ``True`` and ``False``: both copies compiled on the first
call, whichever metric the index has (HNSW's first search 30 s on Zen 1, its first add 48 s).
With the metric a type, ``if metric:`` is a constant in each compilation: LLVM drops the
other branch before it optimises the loops, and an L2 index never compiles the inner-product
code. Inside a kernel the value stands where a bool flag did (``if inner_product:``, ``x if
inner_product else y``, passed on to helpers).
"""

from __future__ import annotations

from numba import types
from numba.core import cgutils
from numba.core.datamodel import models
from numba.extending import NativeValue, overload, register_model, unbox


class MetricType(types.Dummy):
    """The numba type of :data:`L2` (``inner_product`` False) or :data:`IP` (True)."""

    def __init__(self, inner_product: bool):
        self.inner_product = bool(inner_product)
        super().__init__(name=f"metric({'ip' if self.inner_product else 'l2'})")

    @property
    def key(self):
        return self.inner_product


register_model(MetricType)(models.OpaqueModel)


class Metric:
    """A kernel's metric argument: negated inner products (``inner_product``) or squared L2."""

    __slots__ = ("inner_product", "_numba_type_")

    def __init__(self, inner_product: bool):
        self.inner_product = bool(inner_product)
        self._numba_type_ = MetricType(inner_product)

    def __bool__(self) -> bool:
        return self.inner_product

    def __repr__(self) -> str:
        return "vq.kernels.metric.IP" if self.inner_product else "vq.kernels.metric.L2"

    def __reduce__(self):
        return metric, (self.inner_product,)


L2 = Metric(False)
IP = Metric(True)


def metric(inner_product) -> Metric:
    """:data:`IP` for a true ``inner_product`` (a bool, or a :class:`Metric`), else :data:`L2`."""
    return IP if inner_product else L2


@unbox(MetricType)
def _unbox(typ, obj, c):
    return NativeValue(c.context.get_dummy_value(), is_error=cgutils.false_bit)


@overload(bool)
def _truth(m):
    if isinstance(m, MetricType):
        value = m.inner_product
        return lambda m: value
    return None


def constant_metric(typ) -> bool | None:
    """For an overload: the ``inner_product`` fixed by the numba type of a metric argument
    (a :class:`MetricType`, or a literal bool), None for a run-time flag."""
    if isinstance(typ, MetricType):
        return typ.inner_product
    if isinstance(typ, types.BooleanLiteral):
        return bool(typ.literal_value)
    return None


__all__ = ["IP", "L2", "Metric", "MetricType", "constant_metric", "metric"]
