"""Changing what an index stores, the part of :class:`vq.index.Index` that grows, shrinks and
reads back its rows: ``add`` (encoded a chunk at a time straight into room reserved for the
whole call), ``remove_ids`` (rows moved down in place), ``reconstruct`` / ``reconstruct_n``
(stored vectors decoded, found through an id → row map built on first use) and ``merge_from``
(another index's stored rows, trained alike, copied as they are). Buffers grow and shrink in
place: see :mod:`vq.index.core.storage`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from vq._checks import as_ids
from vq.index.core.storage import (
    IdRange,
    append_rows,
    check_new_ids,
    explicit_ids,
    marked_rows,
    remove_rows,
    reserve,
)

#: configuration keys that are search options, not part of what an index stores
_OPTIONS = frozenset({"k", "nprobe", "k_factor"})


class Updates:
    """The mixin of :class:`vq.index.Index` holding its writes to the stored rows (the kinds
    override ``decode_rows``, and the IVF kinds ``add_rows``, ``_drop_rows`` and ``merge_rows``)."""

    row_buffers: tuple[str, ...]

    # -- reading stored vectors back ------------------------------------------------------------
    def reconstruct(self, ids: Any) -> Any:
        """The stored vectors of ``ids``, decoded (faiss ``reconstruct`` and
        ``reconstruct_batch``): float32 [n, dim] for n ids, [dim] for one int; numpy unless
        ``ids`` is a tensor (then on the index's device).

        Flat kinds give the stored vectors, PQ kinds their codes decoded (plus the list's
        centroid, IVF by residual), :class:`vq.Refine` its exact vectors, :class:`vq.PreTransform`
        the wrapped index's reconstruction rotated back (``x̂ R``, as faiss's
        ``reverse_transform``). Ids are found through an id → row map — the stored ids'
        argsort, 8 bytes per vector, what faiss builds with ``make_direct_map`` — built on the
        first call and kept until the index is written to; indexes whose ids are the row
        numbers need none.

        Raises:
            ValueError: an id that is not stored (the message names it).
        """
        one = isinstance(ids, int | np.integer) and not isinstance(ids, bool)
        i = as_ids([int(ids)] if one else ids, None, "ids", unique=False, stored=False)
        with self.lock.read(), torch.no_grad():
            x = self.decode_rows(self._rows_of(i, "reconstruct"))
        x = x[0] if one else x
        return x if isinstance(ids, torch.Tensor) else x.cpu().numpy()

    def reconstruct_n(self, i0: int, n: int) -> Any:
        """``reconstruct(range(i0, i0 + n))`` (faiss ``reconstruct_n``): float32 [n, dim]
        numpy; a ValueError for an id in the range that is not stored."""
        return self.reconstruct(np.arange(int(i0), int(i0) + int(n), dtype=np.int64))

    def _rows_of(self, ids: torch.Tensor, what: str) -> torch.Tensor:
        """int64 [len(ids)]: the stored row of each id (ValueError naming one not stored)."""
        n, wanted = self.n_rows, ids.cpu().numpy()
        if self.has_sequential_ids():
            rows = wanted
            found = (wanted >= 0) & (wanted < n)
        else:
            stored = self.stored_ids()
            s = stored.cpu().numpy()
            order = self.derived("id_order", (stored,), lambda: np.argsort(s, kind="stable"))
            pos = np.searchsorted(s, wanted, sorter=order).clip(0, max(n - 1, 0))
            rows = order[pos] if n else pos
            found = (s[rows] == wanted) if n else np.zeros(wanted.shape, bool)
        if not found.all():
            missing = wanted[~found]
            raise ValueError(
                f"{what}: id {int(missing[0])} is not in the index ({missing.size} of the "
                f"{wanted.size} ids are not); stored_ids() lists the ids it holds"
            )
        return torch.from_numpy(np.ascontiguousarray(rows, dtype=np.int64))

    def decode_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """float32 [len(rows), dim]: the stored rows decoded (each kind that can)."""
        raise ValueError(f"{type(self).__name__} cannot reconstruct its stored vectors")

    # -- merging ------------------------------------------------------------------------------
    def merge_from(self, other) -> None:
        """Copy every vector ``other`` stores into this index, codes and vectors as stored (no
        re-encoding; faiss ``merge_from``, except that ``other`` is left as it is, not
        emptied; the graph kinds, HNSW and HNSWSQ, insert ``other``'s stored vectors or codes
        into this graph as an ``add`` would, where faiss's HNSW has no ``merge_from``).
        ``other`` must be trained alike: the same kind and configuration (search options
        aside) and equal trained tensors (centroids, codebooks, rotation). Ids are
        kept: ``other``'s stored ids, which must not be stored here already; where both
        indexes keep sequential ids (a Flat or PQ index filled by ``add``), ``other``'s rows
        are numbered after this index's, as faiss's flat ``merge_from`` does.

        Raises:
            ValueError: indexes not trained alike (the message names the first difference),
                or ids of ``other`` already stored here.
        """
        problem = merge_problem(self, other)
        if problem is not None:
            raise ValueError(f"merge_from: {problem}")
        with other.lock.read(), self._writing(), torch.no_grad():
            self.merge_rows(other, 0)

    @property
    def n_rows(self) -> int:
        """Rows stored (``ntotal``; twice that in a spilled IVF index, which stores copies)."""
        return self.ntotal

    def data_buffers(self) -> tuple[str, ...]:
        """This module's own buffers that hold stored data rather than trained parameters
        (``growing_buffers``, and the IVF list offsets)."""
        return self.growing_buffers()

    def _merged_ids(self, other, shift: int) -> torch.Tensor:
        """The ids ``other``'s rows take here (``shift`` added: a wrapper's row numbers)."""
        n0, m = self.ntotal, other.ntotal
        if not shift and self.has_sequential_ids() and other.has_sequential_ids():
            return torch.arange(n0, n0 + m, device=self.device)
        ids = other.stored_ids().to(self.device) + shift
        check_new_ids(self, ids, "merge_from: other's ids")
        return ids

    def merge_rows(self, other, shift: int) -> None:
        ids = self._merged_ids(other, shift)
        before = {name: self._buffers[name] for name in (*self.row_buffers, "ids")}
        try:
            self._append_ids(ids)
            for name in self.row_buffers:
                append_rows(self, name, getattr(other, name).to(self.device))
        except BaseException:
            self._buffers.update(before)
            raise

    # -- adding and removing ----------------------------------------------------------------------
    def _append_ids(self, ids: torch.Tensor) -> None:
        """Record the ids of rows about to be appended (call before the storage grows)."""
        n0 = self.ntotal
        if isinstance(ids, IdRange):
            if self.ids.shape[0] == 0 and ids.start == n0:
                return
            ids = ids[:]
        if self.ids.shape[0] == 0 and torch.equal(
            ids, torch.arange(n0, n0 + ids.shape[0], device=ids.device)
        ):
            return
        explicit_ids(self, n0 + ids.shape[0])
        append_rows(self, "ids", ids.to(self.ids.device))

    def renumber(self, mapping: torch.Tensor) -> None:  # id i → mapping[i] (see Refine)
        self.ids = mapping[self.stored_ids()]

    # -- adding and removing (in place: see vq.index.core.storage) ---------------------------------
    def add_rows(self, x: torch.Tensor, ids, prepare: Callable | None = None) -> None:
        """Encode ``add_batch_size`` rows at a time (``prepare``d first: a wrapper's
        transform, a chunk at a time) straight into room reserved for all of them; on an
        error, the index as it was (nothing half-added)."""
        self._require_trained("add")
        n0, n, step = self.ntotal, x.shape[0], self.add_batch_size
        before = {name: self._buffers[name] for name in (*self.row_buffers, "ids")}
        for name in self.row_buffers:
            reserve(self, name, n0 + n)
        desc = f"{type(self).__name__}.add"
        bar = tqdm(total=n, desc=desc, disable=not self.verbose, leave=False, unit="vec")
        with torch.no_grad(), bar:
            try:
                for s in range(0, n, step):
                    chunk = x[s : s + step].to(self.device)
                    encoded = self.encode_batch(chunk if prepare is None else prepare(chunk))
                    self._store(encoded, ids[s : s + step])
                    bar.update(min(step, n - s))
            except BaseException:
                self._buffers.update(before)
                raise

    def _store(self, encoded: dict[str, torch.Tensor], ids: torch.Tensor) -> None:
        """Append a chunk of encoded rows (``row_buffers``) and their ids."""
        self._append_ids(ids)
        for name in self.row_buffers:
            append_rows(self, name, encoded[name])

    def remove_stored(self, ids: torch.Tensor) -> int:
        drop, first, removed = marked_rows(self, ids)
        if removed:
            self._drop_rows(drop, first, removed)
        return removed

    def _drop_rows(self, drop: np.ndarray, first: int, removed: int) -> None:
        """Remove the ``removed`` rows ``drop`` marks (uint8 [n_rows], the first at ``first``)."""
        explicit_ids(self, self.n_rows)
        rows = np.flatnonzero(drop[first:]) + first
        remove_rows(self, (*self.row_buffers, "ids"), rows.astype(np.int64, copy=False))


def _settings(config: dict, prefix: str = "") -> dict:
    """The configuration flattened (``index.nlist``), search options left out."""
    out = {}
    for k, v in config.items():
        if isinstance(v, dict):
            out.update(_settings(v, f"{prefix}{k}."))
        elif k not in _OPTIONS:
            out[prefix + k] = v
    return out


def _trained_state(index) -> dict[str, torch.Tensor]:
    """The index's state_dict without the stored data of any index in its tree."""
    data = set()
    for prefix, m in index.named_modules():
        if isinstance(m, Updates):
            data.update(f"{prefix}.{b}" if prefix else b for b in m.data_buffers())
    return {k: v for k, v in index.state_dict().items() if k not in data}


def merge_problem(index, other) -> str | None:
    """Why ``other``'s stored rows cannot be merged into ``index`` as they are, or None."""
    if other is index:
        return "an index cannot merge itself; merge a copy (vq.load_index of its file)"
    if type(other) is not type(index):
        return f"other is a {type(other).__name__}, this index a {type(index).__name__}"
    mine, theirs = _settings(index.config()), _settings(other.config())
    for key in sorted(set(mine) | set(theirs)):
        if mine.get(key) != theirs.get(key):
            return (
                f"the configurations differ ({key}: {theirs.get(key)!r} in other, "
                f"{mine.get(key)!r} here); merge only indexes built and trained alike"
            )
    if not (index.is_trained and other.is_trained):
        return "both indexes must be trained (train one, copy it, add to each)"
    a, b = _trained_state(index), _trained_state(other)
    for name, t in a.items():
        if not torch.equal(t.cpu(), b[name].cpu()):
            return (
                f"the trained tensor {name!r} differs: merge only indexes trained alike (train "
                "one, save it, load it for each part), or add other's vectors with add()"
            )
    return None
