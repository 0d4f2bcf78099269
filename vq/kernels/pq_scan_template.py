"""Template: the ADC scan of a flat array of codes fused with top-k, for N_TABLES look-up tables
read a byte (or with WORDS a uint32 word) at a time (see :func:`vq.kernels.adc_scanner`, which
specialises it through :func:`vq.kernels.cache.specialise` and documents it; never imported as
it is)."""

import numpy as np
from numba import prange

from vq.kernels.cache import kernel
from vq.kernels.scan import (
    _ADC_CODE_BLOCK,
    _ADC_QUERY_BLOCK,
    _code_distance,
    _heap_replace_top,
    _heap_sorted,
)

# -- specialised constants (vq.kernels.cache.specialise writes these lines) --
N_TABLES = 1
WORDS = False
# -- end of specialised constants --


@kernel(parallel=True, nogil=True)
def adc_scan(tables, codes, out_dist, out_idx):
    """Threads split the blocks of queries (one kernel per block: a loop body written inline
    takes numba several times longer to compile)."""
    n_qblocks = (tables.shape[0] + _ADC_QUERY_BLOCK - 1) // _ADC_QUERY_BLOCK
    for qb in prange(n_qblocks):
        adc_block(np.int64(qb), tables, codes, out_dist, out_idx)


@kernel(nogil=True)
def adc_block(qb, tables, codes, out_dist, out_idx):
    """Queries qb * 8 ... against every code, a block of codes at a time."""
    nq, n, k = tables.shape[0], codes.shape[0], out_dist.shape[1]
    q0 = qb * _ADC_QUERY_BLOCK
    q1 = min(nq, q0 + _ADC_QUERY_BLOCK)
    heap_d = np.full((q1 - q0, k), np.inf, dtype=np.float32)
    heap_i = np.full((q1 - q0, k), -1, dtype=np.int64)
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
