"""Template: the kernel building and quantizing every query's tables for a flat fast-scan,
specialised for M sub-quantizers of DSUB dimensions (see :func:`vq.kernels.fastscan.flat_tables`,
which specialises it through :func:`vq.kernels.cache.specialise`; never imported as it is)."""

import numpy as np

from vq.kernels.cache import kernel
from vq.kernels.fastscan import quantize_tables
from vq.kernels.simd import borrow, table_row_kernels
from vq.kernels.threads import parallel_for

# -- specialised constants (vq.kernels.cache.specialise writes these lines) --
M = 2
DSUB = 1
# -- end of specialised constants --

ip_row, l2_row = table_row_kernels(DSUB)


def build(queries, codebooks_t, norms, inner_product, out_luts, out_scale, out_offset):
    """queries float32 [nq, M * DSUB]; codebooks_t float32 [M, DSUB, 16]; norms float32
    [M, 16] (their squared norms); tables of squared L2 distances, or of negated inner
    products (smaller is nearer in both) → out_luts uint8 [>= nq, M / 2, 32] (rows past nq
    untouched), out_scale and out_offset float32 [nq] (see ``quantize_tables``). Threads
    split the queries."""
    parallel_for(build_range, queries.shape[0], queries, codebooks_t, norms,
                 bool(inner_product), out_luts, out_scale, out_offset)  # fmt: skip


@kernel(nogil=True)
def build_range(q0, q1, queries, codebooks_t, norms, inner_product, out_luts, out_scale,
                out_offset):  # fmt: skip
    """``build`` for queries q0..q1 on the calling thread."""
    queries, out_luts = borrow(queries), borrow(out_luts)  # (views per query: simd.borrow)
    table = np.empty((1, M, 16), dtype=np.float32)  # one work space per thread
    bias = np.zeros(1, dtype=np.float32)
    bias_q = np.empty(1, dtype=np.int32)
    for q in range(q0, q1):
        x = queries[q]
        for m in range(M):
            if inner_product:
                ip_row(x, m * DSUB, codebooks_t, m * DSUB * 16, np.float32(-1.0), table,
                       m * 16)  # fmt: skip
            else:
                l2_row(x, m * DSUB, codebooks_t, m * DSUB * 16, norms, m * 16, table,
                       m * 16)  # fmt: skip
        sc, of = quantize_tables(table, bias, out_luts[q : q + 1], bias_q)
        out_scale[q] = sc
        out_offset[q] = of
