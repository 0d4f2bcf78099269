"""Template: the ADC scan of probed inverted lists fused with top-k, for N_TABLES look-up tables
of sub-vectors of DSUB dimensions, codes read a byte (or with WORDS a uint32 word) at a time
(see :func:`vq.kernels.ivfpq_scanner`, which specialises it through
:func:`vq.kernels.jit.cache.specialise` and documents it; never imported as it is)."""

import numpy as np
from numba import njit

from vq.kernels.common.bitmask import list_word, trailing_zeros
from vq.kernels.common.bundles import Coarse, Finish, PQLists, Probes, Tables, TopK
from vq.kernels.common.heaps import heap_replace_top, heap_reset, heap_sorted
from vq.kernels.common.simd import borrow
from vq.kernels.common.threads import parallel_for
from vq.kernels.exact.coarse_probe import probe_few
from vq.kernels.exact.exact_scans import finish_lean
from vq.kernels.exact.lean_scans import all_finite
from vq.kernels.jit.cache import kernel
from vq.kernels.pq.adc import (
    IP_TABLE,
    L2_TABLE,
    RESIDUAL_L2_TABLE,
    _code_distance,
    _inner_product_table,
    _l2_table,
)

# -- specialised constants (vq.kernels.jit.cache.specialise writes these lines) --
DSUB = 1
N_TABLES = 1
WORDS = False
# -- end of specialised constants --


def ivfpq_scan(queries, tables, lists, probes, allowed, out):
    """Threads split the queries (the work buffers are allocated once per thread)."""
    parallel_for(ivfpq_range, probes.lists.shape[0], queries, tables, lists, probes, allowed, out)


@kernel(nogil=True)
def ivfpq_range(q0, q1, queries, tables, lists, probes, allowed, out):
    """Queries q0..q1 on the calling thread: each one's tables, then its probed lists."""
    queries, tables, lists = borrow(queries), borrow(tables), borrow(lists)  # (simd.borrow)
    probes, out = borrow(probes), borrow(out)
    codes, offsets = lists
    k = out.distances.shape[1]
    filtered = allowed.shape[0] > 0
    heap_d = np.empty(k, dtype=np.float32)
    heap_i = np.empty(k, dtype=np.int64)
    table, buf, residual = _work_buffers(queries, tables)
    for q in range(q0, q1):
        heap_reset(heap_d, heap_i)
        x = queries[q]
        _query_table(x, tables, table)
        for p in range(probes.lists.shape[1]):
            lst = probes.lists[q, p]
            if lst < 0:
                continue
            t = _probe_table(x, lst, tables, table, buf, residual)
            b = probes.base[q, p]
            lo, hi = offsets[lst], offsets[lst + 1]
            if filtered:
                if hi > lo:
                    _scan_allowed(t, codes, lo, hi, b, allowed, heap_d, heap_i)
                continue
            threshold = heap_d[0]
            for i in range(lo, hi):
                d = b + _code_distance(t, codes, i, N_TABLES, WORDS)
                if d < threshold:
                    heap_replace_top(heap_d, heap_i, d, i)
                    threshold = heap_d[0]
        heap_sorted(heap_d, heap_i, out.distances[q], out.labels[q])


@njit(inline="always")
def _scan_allowed(t, codes, lo, hi, b, bits, heap_d, heap_i):
    """The rows lo..hi - 1 (hi > lo) that ``bits`` allows, in ascending order (as the
    unfiltered loop, so ties resolve alike): their set bits walked a word at a time."""
    threshold = heap_d[0]
    for w in range(lo >> 6, ((hi - 1) >> 6) + 1):
        word = list_word(bits, w, lo, hi)
        while word != np.uint64(0):
            i = (w << 6) + np.int64(trailing_zeros(word))
            word &= word - np.uint64(1)
            d = b + _code_distance(t, codes, i, N_TABLES, WORDS)
            if d < threshold:
                heap_replace_top(heap_d, heap_i, d, i)
                threshold = heap_d[0]


NO_TERMS = np.zeros(0, dtype=np.float32)


def ivfpq_hits(queries, tables, lists, probes, allowed, hits, row_terms=NO_TERMS):
    """Range search: ``ivfpq_scan``'s values below the thresholds of ``hits`` (a
    :class:`~vq.kernels.common.bundles.RangeHits`; see :mod:`vq.kernels.exact.range_scans`);
    ``row_terms`` float32 [n], added to each row's value (faiss's per-vector ``||r||² +
    2⟨c, r⟩`` of L2 by residual, with IP tables and no list tables), or [0]. Threads split
    the queries."""
    parallel_for(
        ivfpq_hits_range,
        probes.lists.shape[0],
        queries,
        tables,
        lists,
        probes,
        allowed,
        hits,
        row_terms,
    )


@kernel(nogil=True)
def ivfpq_hits_range(q0, q1, queries, tables, lists, probes, allowed, hits, row_terms):
    """:func:`ivfpq_hits` for queries q0..q1 on the calling thread."""
    queries, tables, lists, hits = borrow(queries), borrow(tables), borrow(lists), borrow(hits)
    codes, offsets = lists
    starts, thresholds, out_rows, out_dist, counts = hits
    filtered = allowed.shape[0] > 0
    by_row = row_terms.shape[0] > 0
    table, buf, residual = _work_buffers(queries, tables)
    for q in range(q0, q1):
        x = queries[q]
        limit = thresholds[q]
        c = starts[q]
        _query_table(x, tables, table)
        for p in range(probes.lists.shape[1]):
            lst = probes.lists[q, p]
            if lst < 0:
                continue
            t = _probe_table(x, lst, tables, table, buf, residual)
            b = probes.base[q, p]
            for i in range(offsets[lst], offsets[lst + 1]):
                if filtered and allowed[i] == 0:
                    continue
                d = b + _code_distance(t, codes, i, N_TABLES, WORDS)
                if by_row:
                    d += row_terms[i]
                if d < limit:
                    out_rows[c] = i
                    out_dist[c] = d
                    c += 1
        counts[q] = c - starts[q]


@kernel(nogil=True)
def _work_buffers(queries, tables):
    list_tables = tables.list_tables
    size = list_tables.shape[1] if list_tables.shape[0] else tables.norms.size
    table = np.empty(size, dtype=np.float32)
    buf = np.empty(size, dtype=np.float32)
    return table, buf, np.empty(queries.shape[1], dtype=np.float32)


@kernel(nogil=True)
def _query_table(x, tables, table):
    """The query's own table (IP_TABLE, L2_TABLE; RESIDUAL_L2_TABLE builds one per probe)."""
    if tables.kind == IP_TABLE:
        _inner_product_table(x, tables.codebooks_t, table, N_TABLES, DSUB, tables.alpha)
    elif tables.kind == L2_TABLE:
        _l2_table(x, tables.codebooks_t, tables.norms, table, N_TABLES, DSUB)


@kernel(nogil=True)
def _probe_table(x, lst, tables, table, buf, residual):
    """The table of probe ``lst``: the residual's (into ``buf``), the query's plus the list's
    precomputed terms (into ``buf``), or the query's own."""
    if tables.kind == RESIDUAL_L2_TABLE:
        centroids = tables.centroids
        for s in range(x.shape[0]):
            residual[s] = x[s] - centroids[lst, s]
        _l2_table(residual, tables.codebooks_t, tables.norms, buf, N_TABLES, DSUB)
        return buf
    if tables.list_tables.shape[0] > 0:
        lt = tables.list_tables[lst]
        for j in range(buf.shape[0]):
            buf[j] = table[j] + lt[j]
        return buf
    return table


@kernel(nogil=True)
def lean_search(
    queries, coarse, tables, lists, finish, inner_product, nprobe, k_candidates, out, ranked
):
    """A few queries on the calling thread, from the coarse step to ids (and through the
    re-ranking of a wrapping ``Refine``), in one call (the lean path: see
    :func:`vq.kernels.pq.adc.ivfpq_lean`); results always ranked. False (and nothing done) if a
    query holds a NaN or an infinity."""
    coarse, tables = borrow(Coarse(*coarse)), borrow(Tables(*tables))
    lists, finish = borrow(PQLists(*lists)), borrow(Finish(*finish))
    out_dist, out_ids = out
    if not all_finite(queries):
        return False
    nq, k = queries.shape[0], k_candidates
    scores, probed = probe_few(queries, coarse, nprobe, inner_product)
    base = scores if tables.coarse_base else np.zeros((nq, nprobe), dtype=np.float32)
    found = TopK(np.empty((nq, k), dtype=np.float32), np.empty((nq, k), dtype=np.int64))
    no_filter = np.zeros(0, dtype=np.uint64)
    ivfpq_range(
        np.int64(0), np.int64(nq), queries, tables, lists, Probes(probed, base), no_filter, found
    )
    finish_lean(queries, found.distances, found.labels, finish, inner_product, out_dist, out_ids)
    return True
