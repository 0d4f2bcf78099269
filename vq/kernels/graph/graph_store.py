"""What an HNSW traversal reads (the *store*) and how it computes a distance on it: the
float32 vectors, int8 codes with a scale per vector, or scalar-quantizer codes (faiss's
``IndexHNSWSQ``). :func:`node_distance`, :func:`prepare_query` and :func:`prefetch_node`
are numba overloads resolved by the store's type, and :func:`reranks` a constant of that
type, so that one traversal (:mod:`vq.kernels.graph.graph_search`) compiles for each:

- float32 [n, d]: :func:`vq.kernels.exact.exact_scans.exact_distance`;
- (codes int8 [n, d], factors float32 [n, 2]): :func:`int8_distance`;
- (codes uint8 [n, code_size], offset float32 [d], scale float32 [d], kind int64):
  :func:`vq.kernels.sq.sq_scans.sq_distance` on a query prepared by
  :func:`vq.kernels.sq.sq_scans.sq_prepare`.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, types
from numba.extending import intrinsic, overload

from vq.kernels.common.simd import prefetch_line
from vq.kernels.exact.exact_scans import exact_distance
from vq.kernels.sq.sq_scans import sq_distance, sq_prepare


@njit(inline="always", fastmath=True)
def int8_distance(x, store, i, inner_product):
    """:func:`exact_distance` estimated from int8 codes with a scale per vector:
    ``store`` = (codes int8 [n, d], factors float32 [n, 2]: the scale s and s²‖c‖²),
    ``x`` = (query float32 [d], ‖q‖²)."""
    q, qn = x
    codes, factors = store
    dot = np.float32(0.0)
    for j in range(q.shape[0]):
        dot += q[j] * np.float32(codes[i, j])
    s = factors[i, 0]
    if inner_product:
        return -s * dot
    return qn - np.float32(2.0) * s * dot + factors[i, 1]


def node_distance(x, store, i, inner_product):
    """The distance the traversal ranks by: :func:`exact_distance` for a float32 ``store``
    [n, d], :func:`int8_distance` for a tuple of int8 codes and factors (the one function
    a compressed layout replaces; a numba overload, resolved by the store's type)."""


def prepare_query(q, store, inner_product):
    """The query as :func:`node_distance` takes it for ``store``: ``q`` itself, ``(q,
    ‖q‖²)`` for int8 codes, or ``(qa, const)`` for scalar-quantizer codes
    (:func:`vq.kernels.sq.sq_scans.sq_prepare`)."""


def prefetch_node(store, i):
    """Ask the CPU for the cache lines of node i in ``store``."""


def reranks(store) -> bool:
    """Whether a traversal on ``store`` re-ranks its nodes on the vectors: for int8 codes.
    In a kernel, a constant of the store's type (a numba intrinsic: ``if reranks(store):``
    types its branch once, inside the kernel's own type inference, and LLVM drops it where
    it is false)."""
    return isinstance(store, tuple) and len(store) == 2


def reranked_type(store) -> bool:
    """Whether a store of numba type ``store`` is re-ranked (:func:`reranks`)."""
    return isinstance(store, types.BaseTuple) and len(store) == 2


if not numba.config.DISABLE_JIT:  # (with it, the kernels run as Python and call the above)

    @intrinsic
    def reranks(typingctx, store):  # noqa: F811
        value = reranked_type(store)

        def codegen(context, builder, signature, args):
            return context.get_constant(types.boolean, value)

        return types.boolean(store), codegen


def _is_sq(store) -> bool:  # (codes, offset, scale, kind): scalar-quantizer codes
    return isinstance(store, types.BaseTuple) and len(store) == 4


@overload(node_distance, jit_options={"fastmath": True})
def _node_distance(x, store, i, inner_product):
    if isinstance(store, types.Array):
        return lambda x, store, i, inner_product: exact_distance(x, store, i, inner_product)
    if _is_sq(store):
        return lambda x, store, i, inner_product: sq_distance(
            store[0], i, x[0], x[1], store[2], store[3], inner_product
        )
    return lambda x, store, i, inner_product: int8_distance(x, store, i, inner_product)


@overload(prepare_query, jit_options={"fastmath": True})
def _prepare_query(q, store, inner_product):
    if isinstance(store, types.Array):
        return lambda q, store, inner_product: q
    if _is_sq(store):

        def impl_sq(q, store, inner_product):
            qa = np.empty(q.shape[0], dtype=np.float32)
            no_centroid = np.empty(0, dtype=np.float32)
            const = sq_prepare(q, no_centroid, store[1], store[2], inner_product, qa)
            return qa, const

        return impl_sq

    def impl(q, store, inner_product):
        qn = np.float32(0.0)
        for j in range(q.shape[0]):
            qn += q[j] * q[j]
        return q, qn

    return impl


@overload(prefetch_node)
def _prefetch_node(store, i):
    if isinstance(store, types.Array):

        def impl(store, i):
            for byte in range(0, store.shape[1] * 4, 64):
                prefetch_line(store, i, byte)

        return impl

    def impl_codes(store, i):
        codes = store[0]
        for byte in range(0, codes.shape[1] * codes.itemsize, 64):
            prefetch_line(codes, i, byte)

    return impl_codes


def int8_codes(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """int8 codes with one scale per vector, for the traversal: codes int8 [n, d] =
    round(x / s) with s = max|x| / 127, and factors float32 [n, 2] = (s, s² ‖c‖²)."""
    s = np.abs(x).max(axis=1) / 127.0
    s = np.where(s > 0, s, 1.0).astype(np.float32)
    codes = np.clip(np.rint(x / s[:, None]), -127, 127).astype(np.int8)
    norms = (codes.astype(np.float32) ** 2).sum(1) * s * s
    return codes, np.stack([s, norms], axis=1).astype(np.float32)
