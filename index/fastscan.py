"""4-bit PQ fast-scan for PQIndex and IVFPQ (faiss ``IndexPQFastScan`` /
``IndexIVFPQFastScan``, factory suffix ``x4fs``).

The index keeps its plain codes [ntotal, M] (what save/load, to_faiss, remove_ids, the torch
path and export read) and, on the CPU, a block-packed copy (see :mod:`vq.kernels.fastscan`),
built on the first search after the codes change. A search quantizes each query's float
look-up tables to uint8, scans with byte shuffles into uint16 sums, and returns distances
mapped back to floats (approximate, as faiss's fast-scan distances are; wrap the index in
:class:`vq.Refine` for exact ones). The torch path (CUDA, export) uses the float tables.
"""

from __future__ import annotations

import numpy as np
import torch

from vq import _cpu
from vq.kernels import fastscan

#: queries served per pass over a block of codes by the flat scan (3 measured best with AVX2)
QUERY_BLOCK = 3


def check_fast_scan(fast_scan: bool, M: int, nbits: int) -> bool:
    if not isinstance(fast_scan, bool):
        raise TypeError(f"fast_scan must be True or False, got {fast_scan!r}")
    if fast_scan and (nbits != 4 or M % 2):
        raise ValueError(
            f"fast_scan needs 4-bit codes and an even M (sub-quantizers are packed in pairs), "
            f"got M={M}, nbits={nbits}; use e.g. PQIndex(dim, M=32, nbits=4, fast_scan=True)"
        )
    return fast_scan


class PackedCodes:
    """The block-packed copy of an index's codes, rebuilt when the codes (or list offsets)
    tensors are replaced or modified in place. It holds the tensors it was built from, so a
    new tensor can never be mistaken for them."""

    def __init__(self):
        self._source: tuple = ()
        self.packed = np.zeros((0, 32), dtype=np.uint8)
        self.list_blocks = np.zeros(1, dtype=np.int64)

    def get(self, codes: torch.Tensor, offsets: torch.Tensor | None = None) -> PackedCodes:
        source = (codes, codes._version, offsets, None if offsets is None else offsets._version)
        same = len(self._source) == 4 and all(
            a is b if isinstance(a, torch.Tensor) or a is None else a == b
            for a, b in zip(self._source, source, strict=True)
        )
        if not same:
            c = codes.cpu().numpy().astype(np.uint8, copy=False)
            if offsets is None:
                self.packed = fastscan.pack_codes(c).reshape(-1, 32)
            else:
                self.packed, self.list_blocks = fastscan.pack_lists(c, offsets.cpu().numpy())
            self._source = source
        return self

    def clear(self) -> None:
        self.__init__()


def _to_float(dist: np.ndarray, scale: np.ndarray, offset: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(dist / scale[:, None] + offset[:, None])  # inf stays inf


def pq_search(queries, codebooks: tuple, inner_product: bool, packed: PackedCodes, n, k, allowed):
    """Fast-scan of a flat code array: queries float32 [nq, dim], codebooks (transposed [M,
    dsub, 16], squared norms [M, 16]), ``allowed`` uint8 [n] (0: skipped) or empty →
    distances float32 [nq, k] (squared L2, or negated
    inner products; smaller is nearer) and rows int64 [nq, k]."""
    nq = queries.shape[0]
    codebooks_t, norms = codebooks
    M, dsub, _ = codebooks_t.shape
    Q = QUERY_BLOCK if nq >= QUERY_BLOCK else 1
    padded = -(-nq // Q) * Q
    luts = np.empty((padded, M // 2, 32), dtype=np.uint8)
    luts[nq:] = 0  # the padding queries of the last pass
    scale, offset = np.empty(nq, np.float32), np.empty(nq, np.float32)
    fastscan.flat_tables(M, dsub)(queries, codebooks_t, norms, inner_product, luts, scale, offset)
    dist = np.empty((padded, k), dtype=np.float32)
    rows = _cpu.empty((padded, k), torch.int64)
    scanner = fastscan.pq_fastscan_scanner(M // 2, Q, fastscan.best_isa(), dsub)
    scanner(luts.reshape(-1, 32), packed.packed, n, allowed, dist, rows.numpy())
    return _to_float(dist[:nq], scale, offset), rows[:nq]


def pq_lean_search(codebooks_t, norms, packed: PackedCodes, n: int, ids, inner_product, work):
    """The lean search of a flat fast-scan index (see ``Index._lean``): one kernel call for a
    few queries on the calling thread (:func:`vq.kernels.fastscan.flat_lean`), or None for a
    call whose estimated ``work(nq, k)`` is not small (the general path splits it between
    the threads)."""
    M, dsub, _ = codebooks_t.shape
    kernel = fastscan.flat_lean(M // 2, dsub, fastscan.best_isa())
    codes = packed.packed

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
