"""Packing CSR inverted lists of 4-bit codes into fast-scan blocks, list by list, reusing the
blocks of the lists that did not change (the layout: :mod:`vq.kernels.fastscan`).

An IVF fast-scan index keeps a block-packed copy of its codes. After ``remove_ids`` or ``add``
most lists hold the same rows in the same order as before (only their place moved), so
:func:`repack_lists` copies their blocks as they are and packs only the lists that changed,
straight from the codes; its output is byte for byte what packing every list anew gives.
"""

from __future__ import annotations

import numpy as np

from vq.kernels.cache import kernel
from vq.kernels.fastscan import BLOCK, PERM

_PERM = PERM.astype(np.int64)


@kernel(nogil=True)
def repack_lists(l0, l1, codes, offsets, changed, old_packed, old_blocks, packed, list_blocks):
    """Lists ``l0 <= l < l1`` of ``packed`` (a ``parallel_for`` body).

    Args:
        codes: uint8 [n_rows, M] (values < 16, M even), CSR lists by ``offsets`` int64
            [nlist + 1].
        changed: bool [nlist]: list l is packed from its codes where set, else its blocks are
            copied from ``old_packed`` (uint8 [old blocks, M / 2, 32]) at ``old_blocks[l]``
            (int64 [nlist + 1], the block starts of the copy it was packed into, with the same
            rows in the same order).
        packed: uint8 [blocks, M / 2, 32], written from ``list_blocks[l]`` (int64 [nlist + 1],
            ``ceil(size / 32)`` blocks a list; vectors past a list's end have code 0).
    """
    M = codes.shape[1]
    pairs = M // 2
    for lst in range(l0, l1):
        b0, b1 = list_blocks[lst], list_blocks[lst + 1]
        if not changed[lst]:
            src = old_blocks[lst]
            for b in range(b1 - b0):
                for p in range(pairs):
                    for j in range(2 * 16):
                        packed[b0 + b, p, j] = old_packed[src + b, p, j]
            continue
        first, end = offsets[lst], offsets[lst + 1]
        for b in range(b1 - b0):
            v0 = first + b * BLOCK
            for j in range(16):
                lo, hi = v0 + _PERM[j], v0 + 16 + _PERM[j]
                for m in range(M):
                    low = np.int64(codes[lo, m]) if lo < end else np.int64(0)
                    high = np.int64(codes[hi, m]) if hi < end else np.int64(0)
                    packed[b0 + b, m >> 1, (m & 1) * 16 + j] = np.uint8(low | (high << 4))
