"""IVF fast-scan: the probed inverted lists of block-packed 4-bit codes, scanned list by list
with byte shuffles (faiss ``IndexIVFPQFastScan``; the layout and the block kernel are in
:mod:`vq.kernels.fastscan.fastscan_scans`).

How a batch is served. Each query's tables are built and quantized (in parallel over queries).
Then the queries are cut into one slice per thread; a thread sorts its (query, probe) pairs by
list and reads each list once per group of ``IVF_QUERY_BLOCK`` queries that probe it, so that
every loaded block of codes serves several queries. Each query keeps one top-k heap over all
its probes, whose k-th best distance is the threshold that the SIMD compare skips vectors
with. A batch smaller than the thread count is cut by probes instead (thread s takes every
query's probes s, s + threads, ...), with a heap per thread and query, merged at the end.

Heap entries are int64 keys ``distance << 40 | row`` (:func:`vq.kernels.common.heaps.row_key`): the
k smallest keys are the k nearest by (quantized distance, row), whatever order the lists were
read in, so results do not depend on the thread count or on which query shares a pass with
which.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import njit

from vq.kernels.common.heaps import (
    EMPTY_KEY,
    heapify,
    heapify_row,
    key_row,
    key_value,
    sift_down,
    sift_down_row,
)
from vq.kernels.fastscan.fastscan_scans import check_isa
from vq.kernels.jit.cache import kernel, specialise

#: queries sharing one pass over a list's blocks
IVF_QUERY_BLOCK = 3


#: heaps of at most this many keys are kept sorted (descending), larger ones as binary heaps
SORTED_K = 16


@njit(inline="always")
def _push(heaps, counts, q, key):
    """Offer ``key`` (< heaps[q, 0]) to query q's heap of its k smallest keys (row q of
    ``heaps`` [nq, k], ``counts[q]`` keys so far), whose root ``heaps[q, 0]`` is the greatest
    (EMPTY_KEY until k are kept, so that nothing is refused).

    Up to :data:`SORTED_K` keys, the row is kept in descending order (a max-heap too), by
    one pass without branches: the keys above ``key`` move up a slot, over the root, and
    ``key`` takes the slot they leave (a sift-down's unpredictable exit costs more at such
    sizes). Larger heaps store their first k keys from the end and heapify once full
    (cheaper than k sift-downs when most candidates are kept, as with a large k and short
    lists), then sift down."""
    k = heaps.shape[1]
    n = counts[q]
    if k <= SORTED_K:
        for j in range(k - 1):
            above = heaps[q, j + 1]
            heaps[q, j] = above if above > key else min(heaps[q, j], key)
        heaps[q, k - 1] = min(heaps[q, k - 1], key)
        counts[q] = min(n + 1, k)
    elif n < k:
        heaps[q, k - 1 - n] = key
        counts[q] = n + 1
        if n + 1 == k:
            heapify_row(heaps, q)
    else:
        sift_down_row(heaps, q, k, key)


@njit(inline="always")
def _write_sorted(heap, count, scale, offset, out_dist, out_idx):
    """A heap of ``count`` keys (consumed) as float distances ascending (+inf padding) and
    rows (-1)."""
    if count < heap.shape[0]:
        heapify(heap)
    for size in range(heap.shape[0], 0, -1):
        key = heap[0]
        last = heap[size - 1]
        sift_down(heap, size - 1, last)
        _write_key(key, scale, offset, out_dist, out_idx, size - 1)


@njit(inline="always")
def _write_key(key, scale, offset, out_dist, out_idx, e):
    """Entry e of the results: the key's row and its distance mapped back to a float
    (``d / scale + offset``); +inf and -1 for an empty slot."""
    if key == EMPTY_KEY:
        out_dist[e] = np.inf
        out_idx[e] = -1
    else:
        out_dist[e] = np.float32(key_value(key)) / scale + offset
        out_idx[e] = key_row(key)


@functools.cache  # a dictionary hit per call, not specialise()'s checks
def ivf_fastscan_lists(n_pairs: int, dsub: int, isa: str):
    """The IVF fast-scan kernel for M = 2 ``n_pairs`` sub-quantizers of ``dsub`` dimensions.

    The returned ``scan(queries, tables, lists, probes, allowed, out, ranked)`` takes
    :func:`vq.kernels.pq.adc.ivfpq_scanner`'s ``queries``, ``tables`` (16-entry tables, built
    per probe only when the list changes them) and ``probes``, the packed lists of
    :func:`vq.kernels.fastscan.fastscan_scans.pack_lists` (a
    :class:`~vq.kernels.common.bundles.PackedLists`), and ``allowed``: uint32 [nblocks], the
    rows of each block a filtered search may return (:func:`block_bits`: a block with none
    is not read, and only the allowed rows among those that pass the SIMD compare are
    offered to the heap), or [0]: no filter. It finds the k smallest quantized distances d,
    ties by lower row, and writes into ``out`` (a
    :class:`~vq.kernels.common.bundles.ScaledTopK` [nq, k]) their rows (-1 padding),
    ``d / scale + offset`` (ascending, +inf padding) and each query's ``scale`` and
    ``offset``. With ``ranked`` False the k results may come in any order (the candidates of
    a re-ranking step, spared a sort that costs as much as their scan at a k of 100 or
    more).
    """
    return _module(n_pairs, dsub, isa).scan


@kernel(nogil=True)
def block_bits(bits, offsets, list_blocks, out):
    """The filter of a fast-scan by blocks: bits uint64 [ceil(n / 64)], the allowed rows
    (:mod:`vq.kernels.common.bitmask`); CSR ``offsets`` int64 [nlist + 1] and ``list_blocks`` int64
    [nlist + 1] (:func:`vq.kernels.fastscan.fastscan_scans.pack_lists`) → out uint32 [nblocks]: bit
    v of block b is set where the block's vector v is a stored row (not padding) and allowed."""
    for lst in range(offsets.shape[0] - 1):
        first, end = offsets[lst], offsets[lst + 1]
        for b in range(list_blocks[lst], list_blocks[lst + 1]):
            row0 = first + (b - list_blocks[lst]) * 32
            w, s = row0 >> 6, row0 & 63
            v = bits[w] >> np.uint64(s)
            if s > 32 and w + 1 < bits.shape[0]:
                v |= bits[w + 1] << np.uint64(64 - s)
            n = min(end - row0, 32)
            v &= (np.uint64(1) << np.uint64(n)) - np.uint64(1)
            out[b] = np.uint32(v & np.uint64(0xFFFFFFFF))


@functools.cache
def ivf_fastscan_lean(n_pairs: int, dsub: int, isa: str):
    """A search of a few queries on the calling thread in one call, from the coarse step to
    ids (the lean path, which a thread-pool wake-up or a step per call would cost more than
    the work): ``lean_search(queries, coarse, tables, lists, finish, inner_product, nprobe,
    k_candidates, out, ranked)``, whose bundles (plain tuples: :mod:`vq.kernels.common.bundles`)
    are those of :func:`vq.kernels.pq.adc.ivfpq_lean` with the packed lists of
    ``ivf_fastscan_lists`` in place of the codes: ``out`` = (distances float32 [nq, k],
    negated back to inner products with ``inner_product``, -inf / +inf padding; ids int64
    [nq, k], -1 padding), in ascending order of distance if ``ranked``.
    """
    return _module(n_pairs, dsub, isa).lean_search


def _module(n_pairs: int, dsub: int, isa: str):
    template = "vq.kernels.fastscan.fastscan_ivf_template"
    return specialise(template, N_PAIRS=int(n_pairs), DSUB=int(dsub), ISA=check_isa(isa))
