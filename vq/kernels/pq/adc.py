"""Asymmetric distance computation (ADC): look-up-table scans of PQ codes fused with top-k,
over a flat code array or CSR inverted lists (``offsets[l]:offsets[l + 1]`` are the rows of
list l), and the per-query tables they read.

Every scan keeps, per query, a max-heap of the k smallest distances seen; a candidate enters
only if it is strictly smaller than the heap's root, so among equal distances the first one
scanned stays. Kernels that look up tables are built per number of tables (M) so that LLVM
unrolls the inner sum (the ``*_template`` modules, specialised through
:func:`vq.kernels.jit.cache.specialise`).
"""

from __future__ import annotations

import functools

import numpy as np
from numba import njit

from vq.kernels.jit.cache import specialise

_ADC_QUERY_BLOCK = 8
_ADC_CODE_BLOCK = 2048


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
    which breaks the chain of dependent additions (faster than a byte load and one accumulator
    per table).
    """
    if words:  # unsigned subscripts: numba tests signed ones for negative values, each load
        d0 = np.float32(0.0)
        d1 = np.float32(0.0)
        d2 = np.float32(0.0)
        d3 = np.float32(0.0)
        u = np.uint64(i)
        for j in range(n_tables // 4):
            word = np.uint64(codes[u, np.uint64(j)])
            row = np.uint64(j << 10)
            d0 += t[row + (word & np.uint64(255))]
            d1 += t[row + np.uint64(256) + ((word >> np.uint64(8)) & np.uint64(255))]
            d2 += t[row + np.uint64(512) + ((word >> np.uint64(16)) & np.uint64(255))]
            d3 += t[row + np.uint64(768) + (word >> np.uint64(24))]
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

    The returned kernel ``adc_scan(tables, codes, allowed, out_dist, out_idx)`` takes:
        tables: float32 [nq, M * ksub], per-query look-up tables (smaller is better), the
            table of sub-quantizer m at ``m * ksub``.
        codes: uint8/int16/int32 [n, M], the database codes, or with ``words=True`` their
            uint32 view from :func:`code_view`.
        allowed: uint8 [n], 0 for rows a filtered search skips, or [0]: no filter.
        out_dist: float32 [nq, k] receives the k smallest ``Σ_m tables[q, m, codes[i, m]]`` in
            ascending order (+inf where fewer than k vectors exist).
        out_idx: int64 [nq, k] receives their row numbers in ``codes`` (-1 for padding).

    Queries are processed in blocks of 8 over code blocks of 2048 vectors, so each block of
    codes is read from memory once per 8 queries while their tables stay in cache; threads split
    the query blocks.
    """
    module = specialise("vq.kernels.pq.pq_scan_template", N_TABLES=int(n_tables), WORDS=bool(words))
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
    module = specialise("vq.kernels.pq.pq_scan_template", N_TABLES=int(n_tables), WORDS=bool(words))
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

    The returned kernel ``ivfpq_scan(queries, tables, lists, probes, allowed, out)`` builds
    each query's tables itself (cheaper than materialising [nq, M, ksub] in memory) and takes:
        queries: float32 [nq, d].
        tables: a :class:`~vq.kernels.common.bundles.Tables`:
            codebooks_t float32 [M, dsub, ksub], the PQ codebooks transposed, and norms
            float32 [M, ksub], their squared norms; centroids float32 [nlist, d], the coarse
            centroids (read for RESIDUAL_L2_TABLE); list_tables float32 [nlist, M * ksub],
            added to the query's table for each probed list (faiss's precomputed ``||r||² +
            2⟨c, r⟩``), or [0, M * ksub] for none; kind: IP_TABLE (``alpha · ⟨x_m, c⟩``),
            L2_TABLE (``||x_m - c||²``) or RESIDUAL_L2_TABLE (``||(x - centroid)_m - c||²``,
            one table per probe); alpha: the factor of IP_TABLE (-2 with precomputed L2
            terms, -1 for inner products, so that smaller is nearer); coarse_base (read by
            the lean kernel only).
        lists: a :class:`~vq.kernels.common.bundles.PQLists`: codes [n, M] in list order (the
            uint32 view with ``words``, see :func:`code_view`) and offsets int64 [nlist + 1].
        probes: a :class:`~vq.kernels.common.bundles.Probes`: the lists to scan, int64
            [nq, nprobe] (-1: skip), and base float32 [nq, nprobe], added to every distance
            of that probe (the coarse term).
        allowed: uint64 [ceil(n / 64)], the rows a filtered search may return as bit words
            (:mod:`vq.kernels.common.bitmask`), or [0]: no filter.
        out: a :class:`~vq.kernels.common.bundles.TopK` [nq, k]: the k smallest distances
            ascending (+inf padding), their rows in ``codes`` (-1 padding).

    Threads split the queries.
    """
    return _ivfpq_module(n_tables, words, dsub).ivfpq_scan


@functools.cache
def ivfpq_hits(n_tables: int, words: bool, dsub: int):
    """Range search over the probed inverted lists (:func:`ivfpq_scanner`'s tables and
    values): ``ivfpq_hits(queries, tables, lists, probes, allowed, hits, row_terms)`` writes
    query q's rows whose value is below its threshold, and their values, into ``hits`` (a
    :class:`~vq.kernels.common.bundles.RangeHits` with room for every row it probes);
    ``row_terms`` float32 [n] is added to each row's value, or [0]. A flat PQ code array is
    one list (offsets [0, n], probes zeros [nq, 1])."""
    return _ivfpq_module(n_tables, words, dsub).ivfpq_hits


@functools.cache
def ivfpq_lean(n_tables: int, words: bool, dsub: int):
    """A search of a few queries on the calling thread in one call, from the coarse step to
    ids (the lean path): ``lean_search(queries, coarse, tables, lists, finish,
    inner_product, nprobe, k_candidates, out, ranked)``, results always ranked: ``coarse`` (a
    :class:`~vq.kernels.common.bundles.Coarse`) chooses each query's ``nprobe`` lists as
    :func:`vq.kernels.exact.coarse_probe.probe_few` does; ``tables`` and ``lists`` are
    :func:`ivfpq_scanner`'s (``tables.coarse_base``: whether the coarse scores are the base
    of the distances, else 0); ``finish`` (a :class:`~vq.kernels.common.bundles.Finish`)
    maps rows to ids or re-ranks them; ``out`` = (distances float32 [nq, k] ascending,
    negated back to inner products with ``inner_product``, +inf / -inf padding; ids int64
    [nq, k], -1 padding). The bundles are plain tuples (:mod:`vq.kernels.common.bundles`)."""
    return _ivfpq_module(n_tables, words, dsub).lean_search


def _ivfpq_module(n_tables: int, words: bool, dsub: int):
    template = "vq.kernels.pq.ivfpq_scan_template"
    return specialise(template, N_TABLES=int(n_tables), WORDS=bool(words), DSUB=int(dsub))
