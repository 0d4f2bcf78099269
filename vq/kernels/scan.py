"""Scans fused with top-k selection: ADC over PQ codes, and exact distances, on flat arrays or
CSR inverted lists (``offsets[l]:offsets[l + 1]`` are the rows of list l).

Every scan keeps, per query, a max-heap of the k smallest distances seen; a candidate enters
only if it is strictly smaller than the heap's root, so among equal distances the first one
scanned stays. Kernels that look up tables are built per number of tables (M) so that LLVM
unrolls the inner sum.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import njit

from vq.kernels.cache import kernel, specialise
from vq.kernels.heaps import smallest_keys
from vq.kernels.simd import borrow, prefetch_line, row_min
from vq.kernels.threads import parallel_for

_ADC_QUERY_BLOCK = 8
_ADC_CODE_BLOCK = 2048


@njit(inline="always")
def _sift_down(dist, idx, size, d, i):
    """Put (d, i) at the root of the max-heap ``dist[:size]``/``idx[:size]`` and sift it down."""
    pos = 0
    while True:
        child = 2 * pos + 1
        if child >= size:
            break
        if child + 1 < size and dist[child + 1] > dist[child]:
            child += 1
        if dist[child] <= d:
            break
        dist[pos] = dist[child]
        idx[pos] = idx[child]
        pos = child
    dist[pos] = d
    idx[pos] = i


@njit(inline="always")
def _heap_replace_top(dist, idx, d, i):
    """Replace the root of a max-heap (``dist``/``idx``, size k) by (d, i) and sift it down."""
    _sift_down(dist, idx, dist.shape[0], d, i)


@njit(inline="always")
def _heap_replace_top_row(dist, idx, r, d, i):
    """:func:`_heap_replace_top` on row r of the 2-D heaps ``dist``/``idx``, indexed in
    place: a row view taken in a hot loop costs an atomic reference count in and out (a
    kernel called from Python holds reference-counted arrays)."""
    size = dist.shape[1]
    pos = 0
    while True:
        child = 2 * pos + 1
        if child >= size:
            break
        if child + 1 < size and dist[r, child + 1] > dist[r, child]:
            child += 1
        if dist[r, child] <= d:
            break
        dist[r, pos] = dist[r, child]
        idx[r, pos] = idx[r, child]
        pos = child
    dist[r, pos] = d
    idx[r, pos] = i


@njit(inline="always")
def _heap_sorted(dist, idx, out_dist, out_idx):
    """Write a max-heap's content in ascending order of distance, ties by lower index (a heap
    sort, in place and without allocation; the heap is consumed)."""
    k = dist.shape[0]
    for size in range(k, 0, -1):
        out_dist[size - 1] = dist[0]
        out_idx[size - 1] = idx[0]
        _sift_down(dist, idx, size - 1, dist[size - 1], idx[size - 1])
    # equal distances: order by index, as a stable full sort of (distance, index) would
    j = 0
    while j < k:
        e = j + 1
        while e < k and out_dist[e] == out_dist[j]:
            e += 1
        for a in range(j + 1, e):  # insertion sort of the (short) run
            v = out_idx[a]
            b = a - 1
            while b >= j and out_idx[b] > v:
                out_idx[b + 1] = out_idx[b]
                b -= 1
            out_idx[b + 1] = v
        j = e


def words_layout(codes, ksub: int) -> bool:
    """Whether a scan may read ``codes`` [n, M] as 32-bit words (4 codes per load): uint8,
    C-contiguous, M a multiple of 4 and 256 entries per table."""
    return (
        codes.dtype == np.uint8
        and codes.shape[1] % 4 == 0
        and ksub == 256
        and codes.flags.c_contiguous
    )


@njit(inline="always")
def _code_distance(t, codes, i, n_tables, words):
    """The sum over m of ``t[m * ksub + code_m]`` for row i of ``codes``, with a flat table
    ``t`` [M * ksub].

    With ``words`` (a compile-time constant) ``codes`` is the uint32 view [n, M / 4] of uint8
    codes with ksub = 256, read a word (4 codes) per load and summed over four accumulators,
    which breaks the chain of dependent additions: about 1.6x faster than a byte load and one
    accumulator per table.
    """
    if words:
        d0 = np.float32(0.0)
        d1 = np.float32(0.0)
        d2 = np.float32(0.0)
        d3 = np.float32(0.0)
        for j in range(n_tables // 4):
            word = np.uint32(codes[i, j])
            row = j << 10
            d0 += t[row + (word & np.uint32(255))]
            d1 += t[row + 256 + ((word >> np.uint32(8)) & np.uint32(255))]
            d2 += t[row + 512 + ((word >> np.uint32(16)) & np.uint32(255))]
            d3 += t[row + 768 + (word >> np.uint32(24))]
        return (d0 + d1) + (d2 + d3)
    ksub = t.shape[0] // n_tables
    d = np.float32(0.0)
    for m in range(n_tables):
        d += t[m * ksub + codes[i, m]]
    return d


def code_view(codes: np.ndarray, ksub: int) -> tuple[np.ndarray, bool]:
    """What the scans read: ``(codes.view(uint32), True)`` when :func:`words_layout` allows
    it, else ``(codes, False)``."""
    if words_layout(codes, ksub):
        return codes.view(np.uint32), True
    return codes, False


@functools.cache  # a dictionary hit per call, not specialise()'s checks
def adc_scanner(n_tables: int, words: bool = False):
    """ADC scan fused with top-k selection, specialised for ``n_tables`` look-up tables (M).

    The returned kernel ``adc_scan(tables, codes, out_dist, out_idx)`` takes:
        tables: float32 [nq, M * ksub], per-query look-up tables (smaller is better), the
            table of sub-quantizer m at ``m * ksub``.
        codes: uint8/int16/int32 [n, M], the database codes, or with ``words=True`` their
            uint32 view from :func:`code_view`.
        out_dist: float32 [nq, k] receives the k smallest ``Σ_m tables[q, m, codes[i, m]]`` in
            ascending order (+inf where fewer than k vectors exist).
        out_idx: int64 [nq, k] receives their row numbers in ``codes`` (-1 for padding).

    Queries are processed in blocks of 8 over code blocks of 2048 vectors, so each block of
    codes is read from memory once per 8 queries while their tables stay in cache; threads split
    the query blocks.
    """
    module = specialise("vq.kernels.pq_scan_template", N_TABLES=int(n_tables), WORDS=bool(words))
    return module.adc_scan


@functools.cache
def pq_lean(n_tables: int, words: bool = False):
    """A search of a few queries in a flat array of PQ codes on the calling thread, in one
    call (the lean path): ``lean_search(queries, codebooks_t, norms, codes, ids,
    inner_product, out_dist, out_ids)`` builds each query's tables (``codebooks_t`` float32
    [M, dsub, ksub] and their squared norms ``norms`` [M, ksub]: squared L2 distances, or
    negated inner products with ``inner_product``), scans ``codes`` as :func:`adc_scanner`
    does and maps rows to ``ids`` int64 [n] ([0]: the rows are the ids): ``out_dist`` float32
    [nq, k] ascending (negated back to inner products; +inf / -inf padding), ``out_ids``
    int64 [nq, k] (-1 padding). Returns False (and does nothing) if a query is not finite."""
    module = specialise("vq.kernels.pq_scan_template", N_TABLES=int(n_tables), WORDS=bool(words))
    return module.lean_search


@njit(inline="always", fastmath=True)
def _inner_product_table(x, codebooks_t, out, n_tables, dsub, alpha):
    """``out[m * ksub + j] = alpha · ⟨x_m, c_mj⟩`` for codebooks_t float32 [M, dsub, ksub].

    ``n_tables`` and ``dsub`` are compile-time constants: the sum over the sub-vector unrolls
    and the loop over the ksub centroids vectorises.
    """
    ksub = codebooks_t.shape[2]
    for m in range(n_tables):
        for j in range(ksub):
            acc = np.float32(0.0)
            for s in range(dsub):
                acc += x[m * dsub + s] * codebooks_t[m, s, j]
            out[m * ksub + j] = alpha * acc


@njit(inline="always", fastmath=True)
def _l2_table(x, codebooks_t, norms, out, n_tables, dsub):
    """``out[m * ksub + j] = ||x_m - c_mj||²`` (expanded, clamped at 0); norms [M, ksub]."""
    ksub = codebooks_t.shape[2]
    _inner_product_table(x, codebooks_t, out, n_tables, dsub, np.float32(-2.0))
    for m in range(n_tables):
        xn = np.float32(0.0)
        for s in range(dsub):
            xn += x[m * dsub + s] * x[m * dsub + s]
        for j in range(ksub):
            out[m * ksub + j] = max(xn + out[m * ksub + j] + norms[m, j], np.float32(0.0))


#: the look-up tables an IVF-PQ scan builds (see ``ivfpq_scanner``)
IP_TABLE, L2_TABLE, RESIDUAL_L2_TABLE = 0, 1, 2


@functools.cache  # a dictionary hit per call, not specialise()'s checks
def ivfpq_scanner(n_tables: int, words: bool, dsub: int):
    """ADC scan of the probed inverted lists, fused with top-k, specialised for M tables of
    sub-vectors of ``dsub`` dimensions.

    The returned kernel ``ivfpq_scan(queries, codebooks_t, norms, centroids, list_tables,
    kind, alpha, base, probes, codes, offsets, out_dist, out_idx)`` builds each query's tables
    itself (cheaper than materialising [nq, M, ksub] in memory) and takes:
        queries: float32 [nq, d].
        codebooks_t: float32 [M, dsub, ksub], the PQ codebooks transposed; norms: float32
            [M, ksub], their squared norms.
        centroids: float32 [nlist, d], the coarse centroids (read for RESIDUAL_L2_TABLE).
        list_tables: float32 [nlist, M * ksub] added to the query's table for each probed list
            (faiss's precomputed ``||r||² + 2⟨c, r⟩``), or [0, M * ksub] for none.
        kind: IP_TABLE (``alpha · ⟨x_m, c⟩``), L2_TABLE (``||x_m - c||²``) or
            RESIDUAL_L2_TABLE (``||(x - centroid)_m - c||²``, one table per probe).
        alpha: float, the factor of IP_TABLE (-2 with precomputed L2 terms, -1 for inner
            products, so that smaller is nearer).
        base: float32 [nq, nprobe], added to every distance of that probe (the coarse term).
        probes: int64 [nq, nprobe], the lists to scan (-1: skip).
        codes: [n, M] in list order (the uint32 view with ``words``, see :func:`code_view`);
            offsets: int64 [nlist + 1].
        out_dist: float32 [nq, k], the k smallest distances ascending (+inf padding);
        out_idx: int64 [nq, k], their rows in ``codes`` (-1 padding).

    Threads split the queries.
    """
    return _ivfpq_module(n_tables, words, dsub).ivfpq_scan


@functools.cache
def ivfpq_lean(n_tables: int, words: bool, dsub: int):
    """A search of a few queries on the calling thread in one call, from the coarse step to
    ids (the lean path): ``lean_search(queries, centroids_t, c_norms, nprobe, codebooks_t,
    norms, centroids, list_tables, kind, alpha, coarse_base, codes, offsets, ids,
    inner_product, out_dist, out_ids, ranked)``, results always ranked. ``centroids_t``
    float32 [d, nlist] (the centroids transposed) and ``c_norms`` [nlist] (their squared
    norms, read for l2) choose each query's ``nprobe`` lists as
    :func:`vq.kernels.probe_lists` does; ``coarse_base``: whether the coarse scores are the
    ``base`` of :func:`ivfpq_scanner` (else 0); ``ids`` int64 [ntotal] (or [0]: the rows are
    the ids); ``out_dist`` float32 [nq, k] ascending (negated back to inner products with
    ``inner_product``; +inf / -inf padding) and ``out_ids`` int64 [nq, k] (-1 padding); the
    other inputs are :func:`ivfpq_scanner`'s."""
    return _ivfpq_module(n_tables, words, dsub).lean_search


def _ivfpq_module(n_tables: int, words: bool, dsub: int):
    template = "vq.kernels.ivfpq_scan_template"
    return specialise(template, N_TABLES=int(n_tables), WORDS=bool(words), DSUB=int(dsub))


@njit(inline="always", fastmath=True)
def _exact_distance(x, vectors, i, inner_product):
    """Squared L2 distance of the float32 vector x to row i of ``vectors``, or their negated
    inner product (the row indexed in place, not taken as a view: see
    :func:`_heap_replace_top_row`)."""
    d = np.float32(0.0)
    if inner_product:
        for j in range(x.shape[0]):
            d -= x[j] * vectors[i, j]
    else:
        for j in range(x.shape[0]):
            diff = x[j] - vectors[i, j]
            d += diff * diff
    return d


def ivf_flat_scan(queries, vectors, probes, offsets, inner_product, out_dist, out_idx):
    """Exact distances to the vectors of the probed inverted lists, fused with top-k; threads
    split the queries.

    Args:
        queries: float32 [nq, d]; vectors: float32 [n, d], stored list after list.
        probes: int64 [nq, nprobe], the lists to scan (-1: skip); offsets: int64 [nlist + 1].
        inner_product: False for squared L2 distances, True for negated inner products (so
            that smaller is better in both cases).
        out_dist: float32 [nq, k] ascending (+inf padding); out_idx: int64 [nq, k] rows in
            ``vectors`` (-1 padding).
    """
    parallel_for(ivf_flat_range, probes.shape[0], queries, vectors, probes, offsets,
                 bool(inner_product), out_dist, out_idx)  # fmt: skip


@kernel(nogil=True, fastmath=True)
def ivf_flat_range(q0, q1, queries, vectors, probes, offsets, inner_product, out_dist, out_idx):
    """:func:`ivf_flat_scan` for queries ``q0..q1`` (int64) on the calling thread."""
    queries, out_dist, out_idx = borrow(queries), borrow(out_dist), borrow(out_idx)
    nprobe = probes.shape[1]
    k = out_dist.shape[1]
    heap_d = np.empty(k, dtype=np.float32)
    heap_i = np.empty(k, dtype=np.int64)
    for q in range(q0, q1):
        for e in range(k):  # loops: slice assignments take numba seconds to compile
            heap_d[e] = np.inf
            heap_i[e] = -1
        x = queries[q]
        for p in range(nprobe):
            lst = probes[q, p]
            if lst < 0:
                continue
            threshold = heap_d[0]
            for i in range(offsets[lst], offsets[lst + 1]):
                d = _exact_distance(x, vectors, i, inner_product)
                if d < threshold:
                    _heap_replace_top(heap_d, heap_i, d, i)
                    threshold = heap_d[0]
        _heap_sorted(heap_d, heap_i, out_dist[q], out_idx[q])


_PREFETCH_AHEAD = 4  # candidates whose vectors refine_scan fetches before their turn


@njit(inline="always")
def _prefetch_vector(vectors, row, row_bytes):
    if row >= 0:
        for byte in range(0, row_bytes, 64):
            prefetch_line(vectors, row, byte)


def refine_scan(queries, vectors, candidates, inner_product, out_dist, out_idx):
    """Exact distances to given candidate rows, fused with top-k: the re-ranking step of
    ``Refine`` (faiss ``IndexRefineFlat``); threads split the queries.

    Args:
        queries: float32 [nq, d]; vectors: float32 [n, d].
        candidates: int64 [nq, C] rows of ``vectors`` to rank (-1: skip).
        inner_product: False for squared L2 distances, True for negated inner products.
        out_dist: float32 [nq, k] ascending (+inf padding); out_idx: int64 [nq, k] rows of
            ``vectors`` (-1 padding).
    """
    parallel_for(refine_range, candidates.shape[0], queries, vectors, candidates,
                 bool(inner_product), out_dist, out_idx)  # fmt: skip


@kernel(nogil=True, fastmath=True)
def refine_range(q0, q1, queries, vectors, candidates, inner_product, out_dist, out_idx):
    """:func:`refine_scan` for queries ``q0..q1`` (int64) on the calling thread."""
    queries, out_dist, out_idx = borrow(queries), borrow(out_dist), borrow(out_idx)
    n_cand = candidates.shape[1]
    k = out_dist.shape[1]
    row_bytes = vectors.shape[1] * 4
    heap_d = np.empty(k, dtype=np.float32)
    heap_i = np.empty(k, dtype=np.int64)
    for q in range(q0, q1):
        for e in range(k):  # loops: slice assignments take numba seconds to compile
            heap_d[e] = np.inf
            heap_i[e] = -1
        x = queries[q]
        threshold = heap_d[0]
        for c in range(min(_PREFETCH_AHEAD, n_cand)):
            _prefetch_vector(vectors, candidates[q, c], row_bytes)
        for c in range(n_cand):
            # scattered rows: fetch a few candidates ahead (1.5x at 1M vectors)
            if c + _PREFETCH_AHEAD < n_cand:
                _prefetch_vector(vectors, candidates[q, c + _PREFETCH_AHEAD], row_bytes)
            i = candidates[q, c]
            if i < 0:
                continue
            d = _exact_distance(x, vectors, i, inner_product)
            if d < threshold:
                _heap_replace_top(heap_d, heap_i, d, i)
                threshold = heap_d[0]
        _heap_sorted(heap_d, heap_i, out_dist[q], out_idx[q])


@kernel(nogil=True)
def refine_lean(queries, vectors, candidates, ids, inner_product, out_dist, out_ids):
    """:func:`refine_range` for every query, then ids, in one call on the calling thread (the
    lean path of ``Refine``): ``ids`` int64 [n] (or [0]: the rows are the ids); ``out_dist``
    float32 [nq, k] ascending (negated back to inner products with ``inner_product``;
    +inf / -inf padding), ``out_ids`` int64 [nq, k] (-1 padding)."""
    nq, k = out_dist.shape
    dist, rows = np.empty((nq, k), dtype=np.float32), np.empty((nq, k), dtype=np.int64)
    refine_range(np.int64(0), np.int64(nq), queries, vectors, candidates, inner_product, dist,
                 rows)  # fmt: skip
    fill = np.float32(-np.inf) if inner_product else np.float32(np.inf)
    rows_to_ids(dist, rows, ids, inner_product, fill, out_dist, out_ids)


def heap_push_block(scores, x_norms, first, inner_product, heap_d, heap_i):
    """Offer a block of columns to per-query top-k max-heaps (the Flat index's selection
    step, fused with the distance arithmetic, applied block after block of the database so
    that the scores stay in cache); threads split the queries.

    Args:
        scores: float32 [nq, b] inner products ⟨q, x⟩ of the queries with vectors
            ``first .. first + b``.
        x_norms: float32 [b] their squared norms ‖x‖² (read for L2 only).
        first: row number of the block's first vector.
        inner_product: False: rank by ‖x‖² − 2⟨q, x⟩ (the squared L2 distance minus the
            query's constant ‖q‖², which the caller adds); True: rank by −⟨q, x⟩.
        heap_d: float32 [nq, k], heap_i: int64 [nq, k]: max-heaps, +inf/-1 when empty;
            finish them with :func:`heaps_sorted`.
    """
    parallel_for(heap_push_range, scores.shape[0], scores, x_norms, int(first),
                 bool(inner_product), heap_d, heap_i)  # fmt: skip


@kernel(nogil=True, fastmath=True)
def heap_push_range(q0, q1, scores, x_norms, first, inner_product, heap_d, heap_i):
    """:func:`heap_push_block` for queries ``q0..q1`` on the calling thread."""
    scores, heap_d, heap_i = borrow(scores), borrow(heap_d), borrow(heap_i)
    b = scores.shape[1]
    for q in range(q0, q1):
        hd = heap_d[q]
        hi = heap_i[q]
        row = scores[q]
        threshold = hd[0]
        for s in range(0, b, 16):
            e = min(s + 16, b)
            # a vectorisable pass finds whether any of 16 beats the threshold
            best = np.float32(np.inf)
            for i in range(s, e):
                d = -row[i] if inner_product else x_norms[i] - np.float32(2.0) * row[i]
                best = min(best, d)
            if best >= threshold:
                continue
            for i in range(s, e):
                d = -row[i] if inner_product else x_norms[i] - np.float32(2.0) * row[i]
                if d < threshold:
                    _heap_replace_top(hd, hi, d, first + i)
                    threshold = hd[0]


def smallest_k_rows(products, queries, x_norms, inner_product, out_dist, out_idx):
    """The k nearest columns of each row of inner products: for a small k kept sorted by
    insertion (few insertions once the k-th value has settled), for a larger one selected
    among sort keys (:func:`_smallest_k_by_keys`).

    Args:
        products: float32 [nq, n], ⟨q_i, x_j⟩.
        queries: float32 [nq, dim], the q_i (their norms, for l2).
        x_norms: float32 [n], ‖x_j‖² (l2; unused for inner products).
        inner_product: rank by -⟨q, x⟩ rather than by squared L2 distance.
        out_dist: float32 [nq, k], ascending: ‖q‖² + ‖x‖² - 2⟨q, x⟩ clamped at 0 (as faiss
            computes it), or -⟨q, x⟩; out_idx: int64 [nq, k] columns; ties by lower column.
            k <= n.
    """
    parallel_for(smallest_k_range, products.shape[0], products, queries, x_norms,
                 bool(inner_product), out_dist, out_idx)  # fmt: skip


@kernel(nogil=True)
def smallest_k_range(q0, q1, products, queries, x_norms, inner_product, out_dist, out_idx):
    """:func:`smallest_k_rows` for rows ``q0..q1`` on the calling thread."""
    products, queries = borrow(products), borrow(queries)  # (views per row: simd.borrow)
    out_dist, out_idx = borrow(out_dist), borrow(out_idx)
    for q in range(q0, q1):
        _smallest_k_row(products[q], queries[q], x_norms, inner_product, out_dist[q], out_idx[q])


@njit(nogil=True)
def _smallest_k_row(row, query, x_norms, inner_product, dist, idx):
    """smallest_k_rows for one row (a function of its own, not inlined: the loop around it
    compiles in a fraction of the time a loop holding all of this takes)."""
    n, k = row.shape[0], dist.shape[0]
    padded = -(-n // 16) * 16
    q_norm = np.float32(0.0)
    if not inner_product:
        for d in range(query.shape[0]):
            q_norm += query[d] * query[d]
    values = np.empty(padded, dtype=np.float32)  # the ranked values, +inf padding
    for j in range(n):
        if inner_product:
            values[j] = -row[j]
        else:
            values[j] = max((q_norm + x_norms[j]) - np.float32(2.0) * row[j], np.float32(0))
    values[n:] = np.inf
    if k > _INSERTION_K:
        _smallest_k_by_keys(values[:n], dist, idx)
        return
    size = 0
    threshold = np.float32(np.inf)
    for s in range(0, n, 16):
        if size == k and row_min(values, s) >= threshold:
            continue  # none of these 16 is kept: one vector test
        for j in range(s, min(s + 16, n)):
            d = values[j]
            if size < k or d < threshold:
                pos = size if size < k else k - 1
                while pos > 0 and dist[pos - 1] > d:
                    if pos < k:
                        dist[pos] = dist[pos - 1]
                        idx[pos] = idx[pos - 1]
                    pos -= 1
                dist[pos] = d
                idx[pos] = j
                if size < k:
                    size += 1
                threshold = dist[k - 1] if size == k else np.float32(np.inf)


#: smallest_k_rows keeps up to this many by insertion, more by selecting sort keys
_INSERTION_K = 32


@njit(inline="always")
def _smallest_k_by_keys(values, out_dist, out_idx):
    """smallest_k_rows for one row and a larger k: every column as an int64 key that orders
    as (value, column) — the float's bits made monotonic, above the column — then a
    selection of the k smallest keys and a sort of those."""
    n = values.shape[0]
    k = out_dist.shape[0]
    bits = values.view(np.int32)
    keys = np.empty(n, dtype=np.int64)
    for j in range(n):
        b = np.int64(bits[j])
        b ^= (b >> 31) & 0x7FFFFFFF  # negative floats: reversed, below the positive ones
        keys[j] = (b << 32) | j
    best = np.empty(k, dtype=np.int64)
    smallest_keys(keys, best)
    for e in range(k):
        j = best[e] & 0xFFFFFFFF
        out_idx[e] = j
        out_dist[e] = values[j]


@kernel(nogil=True)
def heaps_sorted(heap_d, heap_i, out_dist, out_idx):
    """Each row's max-heap (``heap_d``/``heap_i`` [nq, k], consumed) in ascending order."""
    heap_d, heap_i = borrow(heap_d), borrow(heap_i)
    out_dist, out_idx = borrow(out_dist), borrow(out_idx)
    for q in range(heap_d.shape[0]):
        _heap_sorted(heap_d[q], heap_i[q], out_dist[q], out_idx[q])


@kernel(nogil=True)
def rows_to_ids(dist, rows, ids, negate, fill, out_dist, out_ids):
    """Search results by stored row → by id, padded: what every CPU search returns (a pass
    over nq * k entries: one thread).

    Args:
        dist: float32 [nq, kk] distances of ``rows`` int64 [nq, kk] (-1 where missing).
        ids: int64 [ntotal], the id of each row, or [0] when ids are the rows themselves.
        negate: write ``-dist`` (inner products ranked as negated values).
        fill: the distance of a missing result (+inf, or -inf for inner products).
        out_dist: float32 [nq, k], out_ids: int64 [nq, k], k >= kk: columns past kk are
            missing results. They may be ``dist`` and ``rows`` themselves (in place).
    """
    kk = rows.shape[1]
    mapped = ids.shape[0] > 0
    for q in range(rows.shape[0]):
        for j in range(out_ids.shape[1]):
            r = rows[q, j] if j < kk else -1
            if r < 0:
                out_ids[q, j] = -1
                out_dist[q, j] = fill
            else:
                out_ids[q, j] = ids[r] if mapped else r
                out_dist[q, j] = -dist[q, j] if negate else dist[q, j]
