"""Packing CSR inverted lists of 4-bit codes into fast-scan blocks, list by list, reusing the
blocks of the lists that did not change (the layout: :mod:`vq.kernels.fastscan.fastscan_scans`).

An IVF fast-scan index keeps a block-packed copy of its codes. After ``remove_ids`` or ``add``
most lists hold the same rows in the same order as before (only their place moved), so
:func:`repack_lists` copies their blocks as they are and packs only the lists that changed,
straight from the codes; its output is byte for byte what packing every list anew gives.
"""

from __future__ import annotations

import numpy as np

from vq.kernels.fastscan.fastscan_scans import BLOCK, PERM
from vq.kernels.jit.cache import kernel

_PERM = PERM.astype(np.int64)


@kernel(nogil=True)
def repack_lists(l0, l1, codes, offsets, changed, old_packed, old_blocks, packed, list_blocks):
    """Lists ``l0 <= l < l1`` of ``packed`` (a ``parallel_for`` body).

    Args:
        codes: uint8 [n_rows, M] (values < 16, M even), CSR lists by ``offsets`` int64
            [nlist + 1].
        changed: bool [nlist]: list l is packed from its codes where set, else its blocks are
            copied from ``old_packed`` (uint8 [old blocks * M * 16]) at ``old_blocks[l]``
            (int64 [nlist + 1], the block starts of the copy it was packed into, with the same
            rows in the same order).
        packed: uint8 [blocks * M * 16] (blocks of M / 2 rows of 32 bytes, flat), written from
            block ``list_blocks[l]`` (int64 [nlist + 1], ``ceil(size / 32)`` blocks a list;
            vectors past a list's end have code 0).

    A block of 32 vectors is the [M, 16] byte matrix whose entry (m, j) holds sub-quantizer
    m's code of vector ``PERM[j]`` in its low nibble and of vector ``16 + PERM[j]`` in its
    high nibble (byte ``(m // 2) * 32 + (m % 2) * 16 + j`` is ``m * 16 + j``): each pair of
    code rows is combined at once, then transposed into the block.
    """
    M = codes.shape[1]
    size = M * 16  # bytes a block
    pair = np.zeros((16, M), dtype=np.uint8)
    words, old_words = packed.view(np.uint64), old_packed.view(np.uint64)  # (size % 8 == 0)
    for lst in range(l0, l1):
        b0, b1 = list_blocks[lst], list_blocks[lst + 1]
        if not changed[lst]:
            src, dst, n = old_blocks[lst] * size // 8, b0 * size // 8, (b1 - b0) * size // 8
            for w in range(n):  # (a slice assignment compiles its shape error's formatting,
                words[dst + w] = old_words[src + w]  # seconds of a first compile)
            continue
        first, end = offsets[lst], offsets[lst + 1]
        for b in range(b1 - b0):
            v0 = first + b * BLOCK
            for j in range(16):
                lo, hi = v0 + _PERM[j], v0 + 16 + _PERM[j]
                if hi < end:
                    for m in range(M):
                        pair[j, m] = codes[lo, m] | (codes[hi, m] << np.uint8(4))
                elif lo < end:
                    for m in range(M):
                        pair[j, m] = codes[lo, m]
                else:
                    pair[j, :] = 0
            out = (b0 + b) * size
            for m in range(M):
                for j in range(16):
                    packed[out + m * 16 + j] = pair[j, m]
