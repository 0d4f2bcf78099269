"""Filtered search: :class:`IdFilter`, the set of ids a search may return.

A search restricted to a subset of ids (metadata filters) takes ``allowed=``: an id array, a
boolean mask over the id space, or an :class:`IdFilter` (built once, reusable across calls and
indexes). The scans never post-filter a short list: each index turns the filter into a mask
over its stored rows (:meth:`IdFilter.row_mask`, uint8 [ntotal], kept in the filter for the
index's current ids) and the numba kernels test it for every row they would keep, so a
filtered search returns the k nearest *allowed* vectors (faiss ``SearchParameters(sel=...)``
with ``IDSelectorBatch`` / ``IDSelectorBitmap``). The IVF-PQ and IVF fast-scan kernels take
the mask as bit words instead (:func:`row_bits`, :func:`block_bits`: 64 rows to a load, the
set bits walked; blocks of 32 with none allowed skipped), derived once per mask
(:func:`derived`). IVF indexes probe further lists until k allowed vectors are among the
probed ones (see :class:`vq.index.IVFIndex`).
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import numpy as np
import torch

from vq._checks import check_positive
from vq.kernels.common.bitmask import pack_rows
from vq.kernels.fastscan import fastscan_ivf


class IdFilter:
    """The ids a search may return: sorted distinct ids, or a boolean mask over the id space.

    Args:
        allowed: an integer array-like of ids (numpy, torch, list; any order, repeats
            ignored; each in [0, 2**63)), or a boolean array [n] over the id space (id i is
            allowed where ``allowed[i]``; it must cover every stored id of an index it
            filters: n > the largest stored id).

    Attributes:
        ids: int64 [m], sorted distinct (None for a mask); mask: bool [n] (None for ids).

    faiss: ``IDSelectorBatch`` (ids) / ``IDSelectorBitmap`` (mask;
    :meth:`from_bitmap` reads faiss's packed bitmap).
    """

    def __init__(self, allowed: Any):
        if isinstance(allowed, IdFilter):
            self.ids, self.mask = allowed.ids, allowed.mask
        else:
            a = _as_array(allowed)
            if a.dtype == np.bool_:
                self.ids, self.mask = None, np.ascontiguousarray(a)
            else:
                self.ids, self.mask = _sorted_ids(a), None
        self._cache: tuple = ()
        self._lock = threading.Lock()

    @classmethod
    def of(cls, allowed: Any) -> IdFilter | None:
        """``allowed`` as an IdFilter (itself if it is one); None stays None."""
        if allowed is None or isinstance(allowed, IdFilter):
            return allowed
        return cls(allowed)

    @classmethod
    def from_bitmap(cls, bitmap: Any, n: int) -> IdFilter:
        """A mask filter from faiss's ``IDSelectorBitmap`` layout: uint8 [ceil(n / 8)], id i
        allowed where bit ``i & 7`` of byte ``i >> 3`` is set."""
        b = _as_array(bitmap)
        if b.dtype != np.uint8 or b.ndim != 1 or b.shape[0] * 8 < n:
            raise ValueError(
                f"bitmap: expected uint8 [{-(-n // 8)}] (faiss's IDSelectorBitmap), got "
                f"{b.dtype} {tuple(b.shape)}"
            )
        return cls(np.unpackbits(b, bitorder="little")[:n].astype(bool))

    def __len__(self) -> int:
        """How many ids are allowed."""
        return int(self.ids.shape[0] if self.mask is None else self.mask.sum())

    def __repr__(self) -> str:
        kind = f"{len(self)} ids" if self.mask is None else f"mask over {self.mask.shape[0]} ids"
        return f"IdFilter({kind})"

    def contains(self, ids: np.ndarray) -> np.ndarray:
        """uint8 [n]: 1 where the id (int64 [n], >= 0) is allowed."""
        if self.mask is not None:
            top = int(ids.max()) if ids.shape[0] else -1
            if top >= self.mask.shape[0]:
                raise ValueError(
                    f"allowed: a mask of length {self.mask.shape[0]} does not cover the stored "
                    f"id {top}; pass a mask of length >= {top + 1} (the largest id + 1) or an "
                    "array of allowed ids"
                )
            return self.mask[ids].view(np.uint8)
        pos = np.searchsorted(self.ids, ids)
        pos[pos == self.ids.shape[0]] = 0
        found = self.ids[pos] == ids if self.ids.shape[0] else np.zeros(ids.shape, bool)
        return found.view(np.uint8)

    def row_mask(self, index) -> np.ndarray:
        """uint8 [ntotal]: whether each stored row of ``index`` (a :class:`vq.index.Index`)
        is allowed, in storage order; kept in the filter until the index's ids change (one
        pass over the ids per index, not per search)."""
        ids, n = getattr(index, "ids", None), index.ntotal
        key = (id(index), n, None if ids is None else (ids.data_ptr(), ids._version, ids.shape))
        with self._lock:
            if self._cache and self._cache[0] == key:
                return self._cache[1]
        if index.has_sequential_ids():
            if self.mask is not None:
                self.contains(np.arange(n - 1, n) if n else np.zeros(0, np.int64))  # its length
                mask = np.ascontiguousarray(self.mask[:n]).view(np.uint8)
            else:
                mask = np.zeros(n, np.uint8)
                mask[self.ids[self.ids < n]] = 1
        else:
            mask = self.contains(index.stored_ids().cpu().numpy())
        with self._lock:
            self._cache = (key, mask)
        return mask


def _as_array(x: Any) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    elif isinstance(x, list | tuple | range | int | np.integer) and not isinstance(x, bool):
        x = np.asarray(x)
        if x.size == 0:
            x = x.astype(np.int64)
    if not isinstance(x, np.ndarray):
        raise TypeError(
            f"allowed: expected an id array, a boolean mask or a vq.IdFilter, got "
            f"{type(x).__name__}"
        )
    x = x.reshape(-1) if x.ndim == 0 else x
    if x.ndim != 1:
        raise ValueError(f"allowed: expected a flat array of ids or a mask, got shape {x.shape}")
    if x.dtype != np.bool_ and not np.issubdtype(x.dtype, np.integer):
        raise TypeError(
            f"allowed: expected integer ids or a boolean mask, got {x.dtype}; convert ids with "
            ".astype(np.int64), a 0/1 mask with .astype(bool)"
        )
    return x


def _sorted_ids(a: np.ndarray) -> np.ndarray:
    if a.dtype == np.uint64 and a.size and int(a.max()) >= 1 << 63:
        raise ValueError(f"allowed: ids must be below 2**63, got {int(a.max())}")
    ids = np.unique(a.astype(np.int64))
    if ids.size and ids[0] < 0:
        raise ValueError(f"allowed: ids must be >= 0, got {int(ids[0])}")
    return ids


#: the kernels' ``allowed`` where a search is not filtered (row bytes, and bit words)
NO_FILTER = np.zeros(0, dtype=np.uint8)
NO_BITS = np.zeros(0, dtype=np.uint64)
NO_BLOCKS = np.zeros(0, dtype=np.uint32)

_DERIVED: dict[int, tuple] = {}  # id(row mask) -> (weak reference to it, {name: (key, value)})
_DERIVED_LOCK = threading.Lock()
_DERIVED_KEPT = 8  # masks whose derived arrays are kept


def derived(mask: np.ndarray, name: str, key: Any, compute) -> Any:
    """``compute()``, kept for the row ``mask`` (a :meth:`IdFilter.row_mask`, which the filter
    holds until the index's ids change) under ``name`` while ``key`` stays equal: what a scan
    derives from a filter (bit words, allowed rows per list, per block) is computed once per
    filter and index, not per search. The last few masks' arrays are kept."""
    with _DERIVED_LOCK:
        entry = _DERIVED.get(id(mask))
        if entry is not None and entry[0]() is mask and name in entry[1]:
            held_key, value = entry[1][name]
            if held_key == key:
                return value
    value = compute()
    with _DERIVED_LOCK:
        entry = _DERIVED.get(id(mask))
        if entry is None or entry[0]() is not mask:
            for stale in [i for i, e in _DERIVED.items() if e[0]() is None]:
                del _DERIVED[stale]
            while len(_DERIVED) >= _DERIVED_KEPT:
                del _DERIVED[next(iter(_DERIVED))]
            entry = _DERIVED[id(mask)] = (weakref.ref(mask), {})
        entry[1][name] = (key, value)
    return value


def row_bits(mask: np.ndarray) -> np.ndarray:
    """The kernels' bit-word filter (uint64 [ceil(n / 64)], see :mod:`vq.kernels.common.bitmask`)
    of a row ``mask`` (uint8 [n], or empty: :data:`NO_BITS`), computed once per mask."""
    if mask.shape[0] == 0:
        return NO_BITS
    return derived(mask, "bits", None, lambda: pack_rows(mask))


def block_bits(mask: np.ndarray, offsets: torch.Tensor, list_blocks: np.ndarray) -> np.ndarray:
    """The IVF fast-scan kernel's filter (uint32 [nblocks]: the allowed rows of each block of
    the packed lists, see :func:`vq.kernels.fastscan.fastscan_ivf.block_bits`) of a row ``mask``
    (uint8 [n], or empty: no filter) over CSR lists (``offsets`` int64 [nlist + 1]) packed
    as ``list_blocks``; computed once per mask and layout."""
    if mask.shape[0] == 0:
        return NO_BLOCKS

    def compute():
        out = np.empty(int(list_blocks[-1]), np.uint32)
        fastscan_ivf.block_bits(row_bits(mask), offsets.cpu().numpy(), list_blocks, out)
        return out

    key = (offsets.data_ptr(), offsets._version, list_blocks.ctypes.data, list_blocks.shape)
    return derived(mask, "blocks", key, compute)


def kernel_mask(index, allowed: IdFilter | None) -> np.ndarray:
    """The kernels' ``allowed`` for a search of ``index``: uint8 [ntotal], or empty."""
    return NO_FILTER if allowed is None else allowed.row_mask(index)


def torch_mask(index, allowed: IdFilter | None) -> torch.Tensor | None:
    """The static searches' ``allowed`` for a search of ``index``: bool [ntotal] on its
    device, or None."""
    if allowed is None:
        return None
    return torch.from_numpy(allowed.row_mask(index).view(bool)).to(index.device)


def allowed_per_list(mask: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """int64 [nlist]: allowed rows (``mask`` uint8 [ntotal]) in each CSR inverted list."""
    csum = np.zeros(mask.shape[0] + 1, np.int64)
    np.cumsum(mask, out=csum[1:])
    return csum[offsets[1:]] - csum[offsets[:-1]]


def probe_further(coarse, lists, counts, sizes, k: int, max_codes, rank_all):
    """The probes of a filtered IVF search: each query's ``nprobe`` nearest lists, then the
    next nearest ones until k allowed vectors are among them, all lists probed, or
    ``max_codes`` codes would be passed (never fewer than ``nprobe`` lists).

    Args:
        coarse: float32 [nq, nprobe], lists: int64 [nq, nprobe]: the nearest lists
            (ascending); counts: int64 [nlist], allowed vectors per list; sizes: int64
            [nlist], vectors per list; k: results wanted; max_codes: int or None.
        rank_all: ``rank_all(rows)`` → the coarse scores and lists [len(rows), nlist] of
            those queries, every list ranked.

    Returns:
        coarse float32 [nq, P] and lists int64 [nq, P] (-1 past a query's last probe), and
        how many lists each query probes, int64 [nq].
    """
    nq, nprobe = lists.shape
    nlist = counts.shape[0]
    probed = np.full(nq, nprobe, np.int64)
    short = np.flatnonzero(counts[lists].sum(1) < k)
    if short.size == 0 or nprobe == nlist:
        return coarse, lists, probed
    c_all, l_all = rank_all(short)
    need = (np.cumsum(counts[l_all], 1) < k).sum(1) + 1  # lists to reach k allowed
    if max_codes is not None:
        need = np.minimum(need, (np.cumsum(sizes[l_all], 1) <= max_codes).sum(1))
    need = np.clip(need, nprobe, nlist)
    probed[short] = need
    width = int(need.max())
    out_c = np.zeros((nq, width), np.float32)
    out_l = np.full((nq, width), -1, np.int64)
    out_c[:, :nprobe], out_l[:, :nprobe] = coarse, lists
    cols = np.arange(width)
    out_c[short] = c_all[:, :width]
    out_l[short] = np.where(cols < need[:, None], l_all[:, :width], -1)
    return out_c, out_l, probed


def probes_for_filter(index, q, k, coarse, lists, allowed, max_codes, torch_ranking=False):
    """:func:`probe_further` for queries ``q`` of an IVF ``index`` searched under the filter
    ``allowed``, from its first ``nprobe`` probes (``coarse``, ``lists``): coarse scores and
    lists (numpy; -1 past a query's last probe), and the lists each query probes, so that k
    allowed vectors are among the probed rows wherever k are allowed (spilled lists: k
    distinct ones). The other lists are ranked by the numba probe, or by the torch
    searcher's if ``torch_ranking``."""
    if max_codes is not None:
        max_codes = check_positive(max_codes, "max_codes")
    mask, offsets = allowed.row_mask(index), index.offsets
    key = (offsets.data_ptr(), offsets._version, tuple(offsets.shape))
    counts = derived(mask, "per_list", key, lambda: allowed_per_list(mask, offsets.cpu().numpy()))

    def rank_all(rows):
        if not torch_ranking:
            c, lst = index.nearest_lists(q[torch.from_numpy(rows)], index.nlist)
            return c.numpy(), lst.numpy()
        picked = q[torch.from_numpy(rows).to(q.device)]
        c, lst = index.torch_searcher().probe(picked, index.nlist)
        return c.cpu().numpy(), lst.cpu().numpy()

    sizes = index.list_sizes().cpu().numpy()
    c, lst = coarse.cpu().numpy(), lists.cpu().numpy()
    # spilled lists count rows, and a vector is two of them (never both in one list): k
    # distinct vectors are among k * copies allowed rows, and no fewer rows make sure of it
    wanted = k * index.copies
    return probe_further(c, lst, counts, sizes, wanted, max_codes, rank_all)
