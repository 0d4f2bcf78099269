"""The per-list term of IVF-PQ search by residual (faiss's precomputed table), a list at a time.

For L2 search by residual, ``||x - c - r||² = ||x - c||² + (||r||² + 2⟨c, r⟩) - 2⟨x, r⟩``; the
middle term depends on the list (its centroid c) and the code (r), not on the query, and is
summed sub-quantizer by sub-quantizer: row l of the table, [M, ksub], holds
``||cb[m, j]||² + 2⟨c_l[m], cb[m, j]⟩`` for sub-quantizer m and code j. Filling rows one list
at a time (only those that searches probe) gives bit-for-bit the values a whole-table fill
gives: each value is one fixed sequence of float32 operations (no fast-math reassociation).
"""

from __future__ import annotations

import numpy as np

from vq.kernels.jit.cache import kernel


@kernel(nogil=True)
def list_table_rows(start, stop, lists, centroids, codebooks_t, norms, out):
    """Fill row ``lists[i]`` of ``out`` for i in ``start..stop`` (the body of a
    ``parallel_for`` over the lists).

    Args:
        lists: int64 [n], lists to fill (each in ``[0, nlist)``).
        centroids: float32 [nlist, M * dsub], the coarse centroids.
        codebooks_t: float32 [M, dsub, ksub], the PQ codebooks transposed.
        norms: float32 [M, ksub], the squared norms of the codewords.
        out: float32 [nlist, M * ksub], written in the rows of ``lists`` only:
            ``out[l, m * ksub + j] = norms[m, j] + 2 * sum_d centroids[l, m * dsub + d] *
            codebooks_t[m, d, j]`` (the sum in order of d).
    """
    M, dsub, ksub = codebooks_t.shape
    acc = np.empty(ksub, dtype=np.float32)
    two = np.float32(2.0)
    for i in range(start, stop):
        lst = lists[i]
        for m in range(M):
            for j in range(ksub):
                acc[j] = np.float32(0.0)
            for d in range(dsub):
                c = centroids[lst, m * dsub + d]
                for j in range(ksub):
                    acc[j] += c * codebooks_t[m, d, j]
            base = m * ksub
            for j in range(ksub):
                out[lst, base + j] = norms[m, j] + two * acc[j]
