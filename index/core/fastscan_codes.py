"""4-bit PQ fast-scan for PQIndex and IVFPQ (faiss ``IndexPQFastScan`` /
``IndexIVFPQFastScan``, factory suffix ``x4fs``): the codes held once, as blocks.

A fast-scan index holds its codes only in faiss's block layout (``packed_codes``: uint8
[blocks, M * 16], 32 vectors a block, M / 2 bytes a vector; an IVF index pads each inverted
list to whole blocks, list l in blocks ``list_blocks[l]:list_blocks[l + 1]``, derived from the
offsets), what the numba scan reads as it is (:mod:`vq.kernels.fastscan.fastscan_scans`), so an
index takes faiss's bytes per vector. The plain codes [n, M] (``index.codes``) are unpacked on
demand, by the torch functions here, for what reads them: the torch search (CUDA, export),
``to_faiss``, range search, ``reconstruct``. ``add`` writes new codes into their slots, and
``remove_ids`` moves the blocks (:mod:`vq.kernels.fastscan.fastscan_pack`: blocks whose rows
did not change copied whole, the others gathered slot by slot).

A search quantizes each query's float look-up tables to uint8, scans with byte shuffles into
uint16 sums, and returns distances mapped back to floats (approximate, as faiss's fast-scan
distances are; wrap the index in :class:`vq.Refine` for exact ones). The torch path (CUDA,
export) uses the float tables.
"""

from __future__ import annotations

import numpy as np
import torch

from vq import _cpu
from vq._checks import check_flag
from vq.kernels.common.threads import parallel_for
from vq.kernels.fastscan import fastscan_scans as fastscan
from vq.kernels.fastscan.fastscan_pack import POSITION, move_blocks, write_codes, write_codes_ahead

BLOCK = fastscan.BLOCK
#: IVF lists of at least this many rows are moved on the thread pool
PARALLEL_ROWS = 1 << 16
#: rows :func:`codes_at` unpacks at a time (bounds its temporaries)
_CHUNK = 1 << 16


def check_fast_scan(fast_scan: bool, M: int, nbits: int) -> bool:
    fast_scan = check_flag(fast_scan, "fast_scan")
    if fast_scan and (nbits != 4 or M % 2):
        raise ValueError(
            f"fast_scan needs 4-bit codes and an even M (sub-quantizers are packed in pairs), "
            f"got M={M}, nbits={nbits}; use e.g. PQIndex(dim, M=32, nbits=4, fast_scan=True)"
        )
    return fast_scan


def blocks_for(rows: int) -> int:
    """Blocks that hold ``rows`` vectors."""
    return -(-int(rows) // BLOCK)


def list_blocks(offsets: torch.Tensor) -> torch.Tensor:
    """int64 [nlist + 1]: the first block of each inverted list (CSR ``offsets`` int64 [nlist +
    1]; ``ceil(size / 32)`` blocks a list), on the offsets' device."""
    out = torch.zeros_like(offsets)
    torch.cumsum(
        torch.div(offsets.diff() + (BLOCK - 1), BLOCK, rounding_mode="floor"), 0, out=out[1:]
    )
    return out


def row_slots(offsets: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
    """int64 [n_rows]: the slot (block * 32 + position) of every stored row of CSR lists
    ``offsets`` whose blocks start at ``starts`` (:func:`list_blocks`)."""
    sizes = offsets.diff()
    lists = torch.repeat_interleave(torch.arange(sizes.shape[0], device=offsets.device), sizes)
    rows = torch.arange(int(offsets[-1]), device=offsets.device)
    return rows - offsets[:-1][lists] + starts[:-1][lists] * BLOCK


def unpack_blocks(packed: torch.Tensor, M: int) -> torch.Tensor:
    """uint8 [blocks * 32, M]: the codes of every slot of ``packed`` (uint8 [blocks, M * 16]),
    padding slots included; torch only (any device, a static-shape graph)."""
    nb = packed.shape[0]
    p = packed.reshape(nb, M, 16)
    halves = torch.stack([p & 15, p >> 4], 1)  # [blocks, 2, M, 16]: vectors v and 16 + v
    position = torch.as_tensor(POSITION, device=packed.device)
    halves = halves.index_select(3, position)  # [blocks, 2, M, 16 (vector)]
    return halves.permute(0, 1, 3, 2).reshape(nb * BLOCK, M)


def codes_at(packed: torch.Tensor, slots: torch.Tensor, M: int) -> torch.Tensor:
    """uint8 [b, M]: the codes in ``slots`` (int64 [b], block * 32 + position) of ``packed``
    (uint8 [blocks, M * 16]), a chunk of rows at a time; torch only (any device)."""
    out = torch.empty((slots.shape[0], M), dtype=torch.uint8, device=packed.device)
    position = torch.as_tensor(POSITION, device=packed.device)
    columns = torch.arange(M, device=packed.device) * 16
    for s in range(0, slots.shape[0], _CHUNK):
        part = slots[s : s + _CHUNK].to(packed.device)
        block, v = torch.div(part, BLOCK, rounding_mode="floor"), part % BLOCK
        at = columns[None, :] + position[v % 16][:, None]  # [b, M]
        byte = packed[block[:, None], at]
        shift = (4 * torch.div(v, 16, rounding_mode="floor")).to(torch.uint8)[:, None]
        out[s : s + _CHUNK] = (byte >> shift) & 15
    return out


def pack_rows(codes: torch.Tensor, offsets: torch.Tensor | None = None) -> torch.Tensor:
    """uint8 [blocks, M * 16]: plain codes [n, M] (values < 16) as blocks, every list of CSR
    ``offsets`` padded to whole blocks (None: one list), on the codes' device."""
    c = codes.detach().cpu().numpy().astype(np.uint8, copy=False)
    M = c.shape[1]
    if offsets is None:
        packed = fastscan.pack_codes(c)
    else:
        packed = fastscan.pack_lists(c, offsets.cpu().numpy())[0]
    return torch.from_numpy(packed.reshape(-1, M * 16)).to(codes.device)


def write_rows_ahead() -> None:
    """Start compiling :func:`write_rows`'s kernel in the background (see
    ``Index.kernels_ahead``)."""
    write_codes_ahead()


def write_rows(packed: torch.Tensor, slots: np.ndarray, codes: torch.Tensor) -> None:
    """Write ``codes`` (uint8 [b, M]) into ``slots`` (int64 [b], block * 32 + position) of
    ``packed`` (uint8 [blocks, M * 16], in place; on the CPU, or copied there and back)."""
    target = packed if packed.device.type == "cpu" else packed.cpu()
    c = codes.detach().cpu().numpy().astype(np.uint8, copy=False)
    write_codes(target.numpy(), slots // BLOCK, slots % BLOCK, np.ascontiguousarray(c))
    if target is not packed:
        packed.copy_(target)


def moved_blocks(packed, old_offsets, rowmap: np.ndarray, offsets, out=None) -> torch.Tensor:
    """The blocks of CSR lists ``offsets`` (int64 [nlist + 1]) whose row r is the old row
    ``rowmap[r]`` (int64 [n_rows], -1: code 0) of lists ``old_offsets`` in ``packed`` (uint8
    [old blocks, M * 16]): a new tensor, or ``out`` (``packed`` itself where each block's
    rows come from it or later blocks: a flat removal); see
    :func:`vq.kernels.fastscan.fastscan_pack.move_blocks`."""
    old_o = np.ascontiguousarray(old_offsets.cpu().numpy(), dtype=np.int64)
    new_o = np.ascontiguousarray(offsets.cpu().numpy(), dtype=np.int64)
    old_b = list_blocks(torch.from_numpy(old_o)).numpy()
    new_b = list_blocks(torch.from_numpy(new_o)).numpy()
    source = packed.detach().cpu()
    if out is None:
        target = torch.empty((int(new_b[-1]), packed.shape[1]), dtype=torch.uint8)
    else:
        target = out if out.device.type == "cpu" else out.cpu()
    args = (source.numpy(), old_b, old_o, rowmap, new_o, new_b, target.numpy())
    nlist = new_o.shape[0] - 1
    if new_o[-1] >= PARALLEL_ROWS and nlist > 1 and out is None:
        parallel_for(move_blocks, nlist, *args)
    else:  # a small index: the pool's wake-up would cost more (and it stays asleep)
        move_blocks(0, nlist, *args)
    if out is not None and target is not out:
        out.copy_(target)
        return out
    return target.to(packed.device)


def _to_float(dist: np.ndarray, scale: np.ndarray, offset: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(dist / scale[:, None] + offset[:, None])  # inf stays inf


def pq_search(queries, codebooks: tuple, inner_product: bool, packed: np.ndarray, n, k, allowed):
    """Fast-scan of a flat code array: queries float32 [nq, dim], codebooks (transposed [M,
    dsub, 16], squared norms [M, 16]), ``packed`` uint8 [blocks, M * 16] (the index's blocks),
    ``allowed`` uint8 [n] (0: skipped) or empty →
    distances float32 [nq, k] (squared L2, or negated
    inner products; smaller is nearer) and rows int64 [nq, k]."""
    nq = queries.shape[0]
    codebooks_t, norms = codebooks
    M, dsub, _ = codebooks_t.shape
    isa = fastscan.best_isa()
    Q = fastscan.flat_query_block(isa, nq)  # queries per pass over a block of codes
    padded = -(-nq // Q) * Q
    luts = np.empty((padded, M // 2, 32), dtype=np.uint8)
    luts[nq:] = 0  # the padding queries of the last pass
    scale, offset = np.empty(nq, np.float32), np.empty(nq, np.float32)
    fastscan.flat_tables(M, dsub)(queries, codebooks_t, norms, inner_product, luts, scale, offset)
    dist = np.empty((padded, k), dtype=np.float32)
    rows = _cpu.empty((padded, k), torch.int64)
    scanner = fastscan.pq_fastscan_scanner(M // 2, Q, isa, dsub)
    scanner(luts.reshape(-1, 32), packed.reshape(-1, 32), n, allowed, dist, rows.numpy())
    return _to_float(dist[:nq], scale, offset), rows[:nq]


def pq_lean_search(codebooks_t, norms, packed: np.ndarray, n: int, ids, inner_product, work):
    """The lean search of a flat fast-scan index (see ``Index.lean_search``): one kernel call for a
    few queries on the calling thread (:func:`vq.kernels.fastscan.fastscan_scans.flat_lean`), or
    None for a call whose estimated ``work(nq, k)`` is not small (the general path splits it between
    the threads)."""
    M, dsub, _ = codebooks_t.shape
    kernel = fastscan.flat_lean(M // 2, dsub, fastscan.best_isa())
    codes = packed.reshape(-1, 32)

    def search(q: np.ndarray, k: int, ranked: bool, params: dict):
        nq = q.shape[0]
        if work(nq, min(k, n)) >= _cpu.SERIAL_WORK:
            return None
        out_dist = np.empty((nq, k), np.float32)
        out_ids = np.empty((nq, k), np.int64)
        if not kernel(q, codebooks_t, norms, codes, n, ids, inner_product, out_dist, out_ids):
            return None  # a NaN or an infinity: the general path says so
        return out_dist, out_ids

    return search
