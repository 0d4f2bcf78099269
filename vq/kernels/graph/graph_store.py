"""What an HNSW traversal reads (the *store*) and how it computes a distance on it: the
float32 vectors, int8 codes with a scale per vector, or scalar-quantizer codes (faiss's
``IndexHNSWSQ``). :func:`node_distance`, :func:`prepare_query` and :func:`prefetch_node`
are numba overloads resolved by the store's type, and :func:`reranks` a constant of that
type, so that one traversal (:mod:`vq.kernels.graph.graph_search`) compiles for each
(and :func:`fresh_distances`, the distances of a node's unvisited neighbours in a beam):

- float32 [n, d]: :func:`vq.kernels.exact.exact_scans.exact_distance`;
- (codes int8 [n, d], factors float32 [n, 2]): :func:`int8_distance`;
- (codes uint8 [n, code_size], offset float32 [d], scale float32 [d], kind int64):
  :func:`vq.kernels.sq.sq_scans.sq_distance` on a query prepared by
  :func:`vq.kernels.sq.sq_scans.sq_prepare`;
- (words uint64 [n, ceil(d / 64)], factors float32 [n, 3], transform float32 [d + 1, d],
  vectors float32 [n, d]): RaBitQ's 1-bit codes beside the vectors. The distances are the
  exact ones, but a beam computes one only where RaBitQ's estimate
  (:func:`rabitq_estimate`, of a query rotated and quantized to :data:`RABITQ_QB` bits by
  :func:`rabitq_prepare`) less its error bound is nearer than the beam's farthest node: the
  bits decide what is read of the vectors.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, types
from numba.extending import intrinsic, overload

from vq.kernels.common.bitmask import popcount
from vq.kernels.common.simd import prefetch_line
from vq.kernels.exact.exact_scans import exact_distance
from vq.kernels.rabitq.rabitq_scans import finish, level_scratch, quantize_planes
from vq.kernels.sq.sq_scans import sq_distance, sq_prepare

#: the bits of a query walking RaBitQ codes (faiss's default ``qb``)
RABITQ_QB = 4


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


@njit(fastmath=True)
def rabitq_prepare(q, transform):
    """A query as :func:`rabitq_estimate` takes it: ``q_c = q @ rotation - center``
    (``transform`` float32 [d + 1, d]: the rotation's d rows, then the rotated centre)
    quantized to :data:`RABITQ_QB` bit planes by
    :func:`vq.kernels.rabitq.rabitq_scans.quantize_planes` (uint64 [RABITQ_QB, ceil(d /
    64)]); returns (q, planes, vmin / sqrt(d), delta / sqrt(d), Σ levels, ||q_c||², ||q_r||²,
    ||q_c||): the query itself, then the terms of
    :mod:`vq.kernels.rabitq.rabitq_scans`' estimate and of its error bound. Cost: d²
    multiply-adds."""
    d = q.shape[0]
    q_c = np.zeros(d, dtype=np.float32)
    for i in range(d):
        qi = q[i]
        for j in range(d):
            q_c[j] += qi * transform[i, j]
    q_r2 = np.float32(0.0)
    q_c2 = np.float32(0.0)
    for j in range(d):
        q_r2 += q_c[j] * q_c[j]
        q_c[j] -= transform[d, j]
        q_c2 += q_c[j] * q_c[j]
    planes = np.empty((RABITQ_QB, (d + 63) >> 6), dtype=np.uint64)
    vmin, delta, total = quantize_planes(q_c, RABITQ_QB, planes, level_scratch(d))
    scale = np.float32(1.0 / np.sqrt(np.float64(d)))
    return q, planes, vmin * scale, delta * scale, total, q_c2, q_r2, np.sqrt(q_c2)


@njit(inline="always", fastmath=True)
def rabitq_estimate(x, store, i, inner_product):
    """:func:`exact_distance` estimated from RaBitQ's 1-bit codes (faiss ``IndexRaBitQ``'s
    estimate with ``qb = 4``, :mod:`vq.kernels.rabitq.rabitq_scans`): ``store`` = (words
    uint64 [n, ceil(d / 64)], factors float32 [n, 3] (:data:`vq.quantizers.rabitq.FACTORS`),
    transform, vectors), ``x`` from :func:`rabitq_prepare`; ``ceil(d / 64) (RABITQ_QB + 1)``
    AND + popcount a node."""
    _, planes, a, b, level_sum, q_c2, q_r2, _ = x
    words, factors, transform, _ = store
    pc = np.int64(0)
    sm = np.int64(0)
    for w in range(words.shape[1]):
        c = words[i, w]
        pc += np.int64(popcount(c))
        for p in range(RABITQ_QB):
            sm += np.int64(popcount(c & planes[p, w])) << p
    d = transform.shape[1]
    dot = np.float32(2 * pc - d) * a + np.float32(2 * sm - level_sum) * b
    return finish(factors[i, 0], factors[i, 1], dot, q_c2, q_r2, inner_product)


def node_distance(x, store, i, inner_product):
    """The distance the traversal ranks by: :func:`exact_distance` for a float32 ``store``
    [n, d] or RaBitQ codes beside the vectors, :func:`int8_distance` for a tuple of int8
    codes and factors (the one function a compressed layout replaces; a numba overload,
    resolved by the store's type)."""


def fresh_distances(x, store, inner_product, nodes, count, dist, gate, worst):
    """``dist[:count]`` := the distances of the nodes ``nodes[:count]`` (a beam's unvisited
    neighbours of the node it expands): :func:`node_distance` of each; for RaBitQ codes,
    where ``gate`` (the beam is full) holds, the exact distance only of nodes whose estimate
    less its error bound is below ``worst`` (the beam's farthest), the others' estimate
    (which that bound puts at or past ``worst``, so that the beam passes them over)."""


def prepare_query(q, store, inner_product):
    """The query as :func:`node_distance` takes it for ``store``: ``q`` itself, ``(q,
    ‖q‖²)`` for int8 codes, ``(qa, const)`` for scalar-quantizer codes
    (:func:`vq.kernels.sq.sq_scans.sq_prepare`), or :func:`rabitq_prepare`'s terms."""


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
    return isinstance(store, types.BaseTuple) and len(store) == 4 and not _is_rabitq(store)


def _is_rabitq(store) -> bool:  # (words, factors, transform, vectors): RaBitQ codes
    return (
        isinstance(store, types.BaseTuple) and len(store) == 4 and isinstance(store[3], types.Array)
    )


@overload(node_distance, jit_options={"fastmath": True})
def _node_distance(x, store, i, inner_product):
    if isinstance(store, types.Array):
        return lambda x, store, i, inner_product: exact_distance(x, store, i, inner_product)
    if _is_sq(store):
        return lambda x, store, i, inner_product: sq_distance(
            store[0], i, x[0], x[1], store[2], store[3], inner_product
        )
    if _is_rabitq(store):  # (the exact distance: x[0] is the query)
        return lambda x, store, i, inner_product: exact_distance(x[0], store[3], i, inner_product)
    return lambda x, store, i, inner_product: int8_distance(x, store, i, inner_product)


@overload(fresh_distances, jit_options={"fastmath": True})
def _fresh_distances(x, store, inner_product, nodes, count, dist, gate, worst):
    if not _is_rabitq(store):

        def impl(x, store, inner_product, nodes, count, dist, gate, worst):
            for j in range(count):
                dist[j] = node_distance(x, store, nodes[j], inner_product)

        return impl

    def impl_rabitq(x, store, inner_product, nodes, count, dist, gate, worst):
        factors, data, norm = store[1], store[3], x[7]
        if gate:  # estimates first, the vectors of those that may enter asked for ahead
            for j in range(count):
                w = nodes[j]
                dist[j] = rabitq_estimate(x, store, w, inner_product)
                if dist[j] - factors[w, 2] * norm < worst:
                    for byte in range(0, data.shape[1] * 4, 64):
                        prefetch_line(data, w, byte)
        for j in range(count):
            w = nodes[j]
            if not gate or dist[j] - factors[w, 2] * norm < worst:
                dist[j] = exact_distance(x[0], data, w, inner_product)

    return impl_rabitq


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
    if _is_rabitq(store):
        return lambda q, store, inner_product: rabitq_prepare(q, store[2])

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

    if not _is_rabitq(store):
        return impl_codes

    def impl_rabitq(store, i):  # the sign bits (one line up to 512 dimensions) and the factors
        words = store[0]
        for byte in range(0, words.shape[1] * 8, 64):
            prefetch_line(words, i, byte)
        prefetch_line(store[1], i, 0)

    return impl_rabitq


def int8_codes(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """int8 codes with one scale per vector, for the traversal: codes int8 [n, d] =
    round(x / s) with s = max|x| / 127, and factors float32 [n, 2] = (s, s² ‖c‖²)."""
    s = np.abs(x).max(axis=1) / 127.0
    s = np.where(s > 0, s, 1.0).astype(np.float32)
    codes = np.clip(np.rint(x / s[:, None]), -127, 127).astype(np.int8)
    norms = (codes.astype(np.float32) ** 2).sum(1) * s * s
    return codes, np.stack([s, norms], axis=1).astype(np.float32)
