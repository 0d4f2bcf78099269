"""Writing and moving 4-bit codes inside fast-scan blocks (the layout:
:mod:`vq.kernels.fastscan.fastscan_scans`), where a fast-scan index holds its codes.

A fast-scan index keeps its codes only as blocks (faiss's layout: 32 vectors a block, M / 2
bytes a vector, each inverted list padded to whole blocks). :func:`write_codes` writes
vectors' codes into their slots (``add``); :func:`move_blocks` lays the blocks out anew after
rows moved (``remove_ids``, ``add`` growing lists): each block whose rows are the same rows in
the same slots as before is copied whole, the others are gathered slot by slot from the old
blocks (a block at a time through a scratch block, so the output may be the input when no row
moves to a later block: a flat index compacts in place). Padding slots (past a list's end)
hold code 0, so the bytes equal those of packing the codes anew.

Where vector v (0..31) of a block is: sub-quantizer m's code sits in byte ``m * 16 + j`` of
the block, j = POSITION[v % 16] (PERM's inverse), in the low nibble for v < 16, else the high.
"""

from __future__ import annotations

import numpy as np

from vq.kernels.fastscan.fastscan_scans import BLOCK, PERM
from vq.kernels.jit import cache
from vq.kernels.jit.cache import kernel

#: the byte (0..15) of a block row holding vector v % 16 (PERM's inverse)
POSITION = np.argsort(PERM).astype(np.int64)


@kernel(nogil=True)
def write_codes(packed, blocks, slots, codes):
    """Write vector i's codes ``codes[i]`` (uint8 [b, M], values < 16) into slot ``slots[i]``
    (0..31) of block ``blocks[i]`` (int64 [b] each) of ``packed`` (uint8 [nblocks, M * 16]),
    leaving the other slots as they are."""
    M = codes.shape[1]
    for i in range(codes.shape[0]):
        block, slot = blocks[i], slots[i]
        j = POSITION[slot % 16]
        if slot < 16:
            for m in range(M):
                at = m * 16 + j
                packed[block, at] = (packed[block, at] & np.uint8(0xF0)) | codes[i, m]
        else:
            for m in range(M):
                at = m * 16 + j
                packed[block, at] = (packed[block, at] & np.uint8(0x0F)) | (
                    codes[i, m] << np.uint8(4)
                )


def write_codes_ahead() -> None:
    """Start compiling :func:`write_codes` in the background server (see
    :func:`vq.kernels.common.rows.insertion_ahead`)."""
    codes, at = np.zeros((0, 1), np.uint8), np.zeros(0, np.int64)
    cache.prefetch(write_codes, codes, at, at, codes)


@kernel(nogil=True)
def move_blocks(l0, l1, old, old_blocks, old_offsets, rowmap, offsets, blocks, out):
    """Lists ``l0 <= l < l1`` of ``out`` (a ``parallel_for`` body): the rows of list l, CSR
    ``offsets`` (int64 [nlist + 1]) in blocks from ``blocks[l]`` (int64 [nlist + 1], ceil(size
    / 32) a list), row r being the old row ``rowmap[r]`` (int64 [n_rows]; -1: none, code 0)
    of the same list in ``old`` (uint8 [old blocks, M * 16], CSR ``old_offsets``, blocks from
    ``old_blocks``). ``out`` (uint8 [blocks[-1], M * 16]) may be ``old`` itself where every
    block's rows come from that block or later ones (each block is built in a scratch block,
    then written): a flat index's removal, rows moving down in order."""
    width = out.shape[1]
    M = width // 16
    scratch = np.zeros(width, dtype=np.uint8)
    for lst in range(l0, l1):
        first, end, b0 = offsets[lst], offsets[lst + 1], blocks[lst]
        ofirst, oend, ob0 = old_offsets[lst], old_offsets[lst + 1], old_blocks[lst]
        for b in range(blocks[lst + 1] - b0):
            p0 = b * BLOCK
            valid = min(BLOCK, end - first - p0)
            old_valid = min(BLOCK, max(0, oend - ofirst - p0))
            same = valid == old_valid
            for t in range(valid):
                if not same:
                    break
                same = rowmap[first + p0 + t] == ofirst + p0 + t
            if same:  # the same rows in the same slots: the whole block
                for w in range(width):
                    out[b0 + b, w] = old[ob0 + b, w]
                continue
            scratch[:] = 0
            for t in range(valid):
                src = rowmap[first + p0 + t]
                if src < 0:
                    continue
                q = src - ofirst
                oblock, oslot = ob0 + q // BLOCK, q % BLOCK
                oj, oshift = POSITION[oslot % 16], 4 * (oslot // 16)
                j, shift = POSITION[t % 16], 4 * (t // 16)
                for m in range(M):
                    code = (old[oblock, m * 16 + oj] >> np.uint8(oshift)) & np.uint8(15)
                    scratch[m * 16 + j] |= code << np.uint8(shift)
            for w in range(width):
                out[b0 + b, w] = scratch[w]
