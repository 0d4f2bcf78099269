"""Template: the ADC scan of a flat array of codes fused with top-k, for N_TABLES look-up tables
read a byte (or with WORDS a uint32 word) at a time (see :func:`vq.kernels.adc_scanner`, which
specialises it through :func:`vq.kernels.jit.cache.specialise` and documents it; never imported as
it is)."""

import numpy as np

from vq.kernels.common.heaps import heap_replace_top, heap_sorted
from vq.kernels.common.simd import borrow
from vq.kernels.common.threads import parallel_for
from vq.kernels.exact.exact_scans import rows_to_ids
from vq.kernels.exact.lean_scans import all_finite
from vq.kernels.jit.cache import kernel
from vq.kernels.pq.adc import (
    _ADC_CODE_BLOCK,
    _ADC_QUERY_BLOCK,
    _code_distance,
    _inner_product_table,
    _l2_table,
)

# -- specialised constants (vq.kernels.jit.cache.specialise writes these lines) --
N_TABLES = 1
WORDS = False
# -- end of specialised constants --


def adc_scan(tables, codes, allowed, out_dist, out_idx):
    """Threads split the queries, in blocks of 8."""
    parallel_for(
        adc_range,
        tables.shape[0],
        tables,
        codes,
        allowed,
        out_dist,
        out_idx,
        grain=_ADC_QUERY_BLOCK,
    )


@kernel(nogil=True)
def adc_range(q_start, q_end, tables, codes, allowed, out_dist, out_idx):
    """Queries q_start..q_end, 8 at a time against every code, a block of codes at a time."""
    tables, out_dist, out_idx = borrow(tables), borrow(out_dist), borrow(out_idx)
    n, k = codes.shape[0], out_dist.shape[1]
    filtered = allowed.shape[0] > 0
    heap_d = np.empty((_ADC_QUERY_BLOCK, k), dtype=np.float32)
    heap_i = np.empty((_ADC_QUERY_BLOCK, k), dtype=np.int64)
    for q0 in range(q_start, q_end, _ADC_QUERY_BLOCK):
        q1 = min(q_end, q0 + _ADC_QUERY_BLOCK)
        for q in range(q1 - q0):
            for e in range(k):  # loops: slice assignments take numba seconds to compile
                heap_d[q, e] = np.inf
                heap_i[q, e] = -1
        for c0 in range(0, n, _ADC_CODE_BLOCK):
            c1 = min(n, c0 + _ADC_CODE_BLOCK)
            for q in range(q0, q1):
                t = tables[q]
                hd = heap_d[q - q0]
                hi = heap_i[q - q0]
                threshold = hd[0]
                for i in range(c0, c1):
                    if filtered and allowed[i] == 0:
                        continue
                    d = _code_distance(t, codes, i, N_TABLES, WORDS)
                    if d < threshold:
                        heap_replace_top(hd, hi, d, i)
                        threshold = hd[0]
        for q in range(q0, q1):
            heap_sorted(heap_d[q - q0], heap_i[q - q0], out_dist[q], out_idx[q])


@kernel(nogil=True)
def lean_search(queries, codebooks_t, norms, codes, ids, inner_product, out_dist, out_ids):
    """A search of a few queries on the calling thread in one call (the lean path: see
    :func:`vq.kernels.pq_lean`); False (and nothing done) if a query holds a NaN or an
    infinity."""
    if not all_finite(queries):
        return False
    nq, k = out_dist.shape
    dsub, ksub = codebooks_t.shape[1], codebooks_t.shape[2]
    tables = np.empty((nq, N_TABLES * ksub), dtype=np.float32)
    for q in range(nq):
        if inner_product:  # negated: the scan keeps the smallest sums
            _inner_product_table(
                queries[q], codebooks_t, tables[q], N_TABLES, dsub, np.float32(-1.0)
            )
        else:
            _l2_table(queries[q], codebooks_t, norms, tables[q], N_TABLES, dsub)
    dist, rows = np.empty((nq, k), dtype=np.float32), np.empty((nq, k), dtype=np.int64)
    adc_range(np.int64(0), np.int64(nq), tables, codes, np.zeros(0, dtype=np.uint8), dist, rows)
    fill = np.float32(-np.inf) if inner_product else np.float32(np.inf)
    rows_to_ids(dist, rows, ids, inner_product, fill, out_dist, out_ids)
    return True
