"""Template: the ADC scan of a flat array of codes fused with top-k, for N_TABLES look-up tables
read a byte (or with WORDS a uint32 word) at a time (see :func:`vq.kernels.adc_scanner`, which
specialises it through :func:`vq.kernels.cache.specialise` and documents it; never imported as
it is)."""

import numpy as np

from vq.kernels.cache import kernel
from vq.kernels.scan import (
    _ADC_CODE_BLOCK,
    _ADC_QUERY_BLOCK,
    _code_distance,
    _heap_replace_top,
    _heap_sorted,
)
from vq.kernels.simd import borrow
from vq.kernels.threads import parallel_for

# -- specialised constants (vq.kernels.cache.specialise writes these lines) --
N_TABLES = 1
WORDS = False
# -- end of specialised constants --


def adc_scan(tables, codes, out_dist, out_idx):
    """Threads split the queries, in blocks of 8."""
    parallel_for(adc_range, tables.shape[0], tables, codes, out_dist, out_idx,
                 grain=_ADC_QUERY_BLOCK)  # fmt: skip


@kernel(nogil=True)
def adc_range(q_start, q_end, tables, codes, out_dist, out_idx):
    """Queries q_start..q_end, 8 at a time against every code, a block of codes at a time."""
    tables, out_dist, out_idx = borrow(tables), borrow(out_dist), borrow(out_idx)
    n, k = codes.shape[0], out_dist.shape[1]
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
                    d = _code_distance(t, codes, i, N_TABLES, WORDS)
                    if d < threshold:
                        _heap_replace_top(hd, hi, d, i)
                        threshold = hd[0]
        for q in range(q0, q1):
            _heap_sorted(heap_d[q - q0], heap_i[q - q0], out_dist[q], out_idx[q])
