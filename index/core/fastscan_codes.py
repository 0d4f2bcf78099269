"""4-bit PQ fast-scan for PQIndex and IVFPQ (faiss ``IndexPQFastScan`` /
``IndexIVFPQFastScan``, factory suffix ``x4fs``).

The index keeps its plain codes [ntotal, M] (what save/load, to_faiss, remove_ids, the torch
path and export read) and, on the CPU, a block-packed copy (see
:mod:`vq.kernels.fastscan.fastscan_scans`), built on the first search after the codes change (after
``remove_ids`` or ``add`` on an IVF index, only the lists they changed are packed again). A search
quantizes each query's float look-up tables to uint8, scans with byte shuffles into uint16 sums, and
returns distances mapped back to floats (approximate, as faiss's fast-scan distances are; wrap the
index in :class:`vq.Refine` for exact ones). The torch path (CUDA, export) uses the float tables.
"""

from __future__ import annotations

import threading

import numpy as np
import torch

from vq import _cpu
from vq._checks import check_flag
from vq.kernels.common.threads import parallel_for
from vq.kernels.fastscan import fastscan_scans as fastscan
from vq.kernels.fastscan.fastscan_pack import repack_lists

#: IVF codes of at least this many rows are packed on the thread pool
PARALLEL_ROWS = 1 << 16


def check_fast_scan(fast_scan: bool, M: int, nbits: int) -> bool:
    fast_scan = check_flag(fast_scan, "fast_scan")
    if fast_scan and (nbits != 4 or M % 2):
        raise ValueError(
            f"fast_scan needs 4-bit codes and an even M (sub-quantizers are packed in pairs), "
            f"got M={M}, nbits={nbits}; use e.g. PQIndex(dim, M=32, nbits=4, fast_scan=True)"
        )
    return fast_scan


class PackedCodes:
    """The block-packed copy of an index's codes, rebuilt when the codes (or list offsets)
    tensors are replaced or modified in place; after a removal or an add that said which lists
    changed (:meth:`moved`), only those lists are packed anew and the others' blocks copied
    (:func:`vq.kernels.fastscan.fastscan_pack.repack_lists`: the same bytes as a whole repack). It
    holds the tensors it was built from, so a new tensor can never be mistaken for them; it
    is rebuilt under its own lock (concurrent searches wait for one rebuild). Copies and
    pickles start empty."""

    def __init__(self):
        self._source: tuple = ()
        self._pending: tuple | None = None  # (the source it will be, changed lists: bool)
        self._lock = threading.Lock()
        self.packed = np.zeros((0, 32), dtype=np.uint8)
        self.list_blocks = np.zeros(1, dtype=np.int64)

    def __reduce__(self):
        return PackedCodes, ()

    @staticmethod
    def _key(codes: torch.Tensor, offsets: torch.Tensor | None) -> tuple:
        return (codes, codes._version, offsets, None if offsets is None else offsets._version)

    @staticmethod
    def _same(a: tuple, b: tuple) -> bool:
        return len(a) == 4 and all(
            x is y if isinstance(x, torch.Tensor) or x is None else x == y
            for x, y in zip(a, b, strict=True)
        )

    def get(self, codes: torch.Tensor, offsets: torch.Tensor | None = None) -> PackedCodes:
        source = self._key(codes, offsets)
        if self._same(self._source, source):
            return self
        with self._lock:
            if not self._same(self._source, source):
                self._rebuild(codes, offsets, source)
        return self

    def _rebuild(self, codes: torch.Tensor, offsets: torch.Tensor | None, source: tuple) -> None:
        c = codes.cpu().numpy().astype(np.uint8, copy=False)
        pending, self._pending = self._pending, None
        if offsets is None:
            self.packed = fastscan.pack_codes(c).reshape(-1, 32)
            self._source = source
            return
        o = offsets.cpu().numpy()
        blocks = np.zeros_like(o)
        np.cumsum(-(-np.diff(o) // fastscan.BLOCK), out=blocks[1:])
        packed = np.empty((int(blocks[-1]) * c.shape[1] // 2, 32), dtype=np.uint8)
        if pending is not None and self._same(pending[0], source):
            changed, old = pending[1], (self.packed.reshape(-1), self.list_blocks)
        else:  # every list packed
            changed, old = np.ones(o.shape[0] - 1, dtype=bool), (packed.reshape(-1), blocks)
        args = (c, o, changed, *old, packed.reshape(-1), blocks)
        if o[-1] >= PARALLEL_ROWS:
            parallel_for(repack_lists, o.shape[0] - 1, *args)
        else:  # a small index: the pool's wake-up would cost more (and it stays asleep)
            repack_lists(0, o.shape[0] - 1, *args)
        self.packed, self.list_blocks, self._source = packed, blocks, source

    def moved(self, before: tuple, codes: torch.Tensor, offsets: torch.Tensor, changed) -> None:
        """The rows were moved (``remove_ids``, ``add``): the codes and offsets were ``before``
        (the two tensors) and are now ``codes`` and ``offsets``; ``changed`` (bool [nlist])
        marks the lists that do not hold the same rows in the same order (the others only
        moved as a whole). If this copy was of ``before`` (or was to become it), the next
        :meth:`get` packs only the changed lists; otherwise it packs every list."""
        old = self._key(*before)
        with self._lock:
            if self._pending is not None and self._same(self._pending[0], old):
                marks = self._pending[1] | changed
            elif self._same(self._source, old):
                marks = np.array(changed, dtype=bool)
            else:
                self._pending = None
                return
            self._pending = (self._key(codes, offsets), marks)

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
    scanner(luts.reshape(-1, 32), packed.packed, n, allowed, dist, rows.numpy())
    return _to_float(dist[:nq], scale, offset), rows[:nq]


def pq_lean_search(codebooks_t, norms, packed: PackedCodes, n: int, ids, inner_product, work):
    """The lean search of a flat fast-scan index (see ``Index.lean_search``): one kernel call for a
    few queries on the calling thread (:func:`vq.kernels.fastscan.fastscan_scans.flat_lean`), or
    None for a call whose estimated ``work(nq, k)`` is not small (the general path splits it between
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
