"""How the IVF kinds store their rows: inverted lists held back to back (CSR: the rows of list
l are ``offsets[l]:offsets[l + 1]`` of every row buffer), grown in place.

``add`` routes every vector first (the only array of the whole call: its lists), makes room at
the end of each list by moving the lists after the first that grows towards the end of buffers
grown with spare capacity (:mod:`vq.index.storage`), then encodes a chunk at a time straight
into its slots; a spilled index (SOAR, :mod:`vq.index.spill`) writes two rows per vector, in
its list and in its SOAR list. ``merge_from`` inserts another index's rows the same way.

``remove_ids`` finds the rows to remove through an id → list map (:mod:`vq.index.idlists`,
built on the first removal and kept across removals) and reads only the lists that hold them;
it then moves the rows after the first removed one down in place and shortens the lists. The
search kernels read list l as ``offsets[l]:offsets[l + 1]``, with no room between lists, so the
lists after the first touched one move (one memory-speed pass over them, and O(n) still); room
left at the end of each list would make that proportional to the touched lists too.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from vq.index.idlists import IdLists
from vq.index.spill import SPILL_COPIES, soar_assign
from vq.index.storage import IdRange, move_lists, remove_rows, reserve, set_rows
from vq.kernels import rows as row_kernels


class IVFStorage:
    """The storage half of :class:`vq.index.IVFIndex` (a mixin: it reads the index's
    ``offsets``, ``ids``, ``_row_buffers``, ``_assign``, ``spill`` and the kind's
    ``_encode_rows``)."""

    def data_buffers(self) -> tuple[str, ...]:
        return (*super().data_buffers(), "offsets")

    def _encode_rows(self, x: torch.Tensor, lists: torch.Tensor) -> dict[str, torch.Tensor]:
        raise NotImplementedError  # x [b, dim] in lists [b] → the kind's _row_buffers, b rows

    def _add(self, x: torch.Tensor, ids, prepare: Callable | None = None) -> None:
        """Route every vector (int64 [n] lists, the only array of the whole call), make room
        at the ends of the lists, then encode a chunk at a time into its rows (``prepare``:
        a wrapper's transform, applied a chunk at a time, twice)."""
        self._require_trained("add")
        n, step = x.shape[0], self.add_batch_size
        lists = torch.empty(n, dtype=torch.int64, device=self.device)

        def chunk(s: int, e: int) -> torch.Tensor:
            part = x[s:e].to(self.device)
            return part if prepare is None else prepare(part)

        with torch.no_grad():
            for s in range(0, n, step):
                lists[s : s + step] = self._assign(chunk(s, s + step))
            if not self.spill:
                self._insert(lists, lambda s, e: self._encode_rows(chunk(s, e), lists[s:e]), ids)
                return
            # spilled: rows 2i and 2i + 1 hold vector i in its list and in its SOAR list
            rows = torch.empty((n, SPILL_COPIES), dtype=torch.int64, device=self.device)
            c = self.quantizer.codebook.float()
            for s in range(0, n, step):
                first = lists[s : s + step]
                rows[s : s + step, 0] = first
                rows[s : s + step, 1] = soar_assign(chunk(s, s + step), c, first, self.soar_lambda)
            copies = (ids[0:n] if isinstance(ids, IdRange) else ids).repeat_interleave(SPILL_COPIES)

            def encode(s: int, e: int):  # row chunks start at even rows (add_batch_size is even)
                part = chunk(s // SPILL_COPIES, -(-e // SPILL_COPIES)).repeat_interleave(2, 0)
                return self._encode_rows(part[: e - s], rows.view(-1)[s:e])

            self._insert(rows.view(-1), encode, copies)

    def _merge(self, other, shift: int) -> None:
        ids = self._merged_ids(other, shift)
        sizes = other.list_sizes().to(self.device)
        lists = torch.repeat_interleave(torch.arange(self.nlist, device=self.device), sizes)
        buffers = {name: other._buffers[name] for name in self._row_buffers}
        self._insert(lists, lambda s, e: {k: v[s:e] for k, v in buffers.items()}, ids)

    def _insert(self, lists: torch.Tensor, rows: Callable, ids: torch.Tensor) -> None:
        """Store new rows at the ends of their ``lists`` (int64 [n]): every buffer grown in
        place (:func:`vq.index.storage.reserve`), the lists after the first that grows moved
        towards the end (last first), then ``rows(s, e)`` (the ``_row_buffers`` of new rows
        s..e) and ``ids`` written into their slots, ``add_batch_size`` at a time; on an error
        the lists move back (nothing half-added)."""
        n0, n = self.n_rows, lists.shape[0]
        if "_id_lists" in self.__dict__:  # (rows move to other lists: remove_ids builds it anew)
            self._id_lists.drop()
        old = self.offsets
        new = old.clone()
        new[1:] += torch.cumsum(torch.bincount(lists, minlength=self.nlist), 0)
        names = (*self._row_buffers, "ids")
        before = {name: self._buffers[name] for name in names}
        full = {name: reserve(self, name, n0 + n) for name in names}
        for name in names:
            move_lists(full[name], old, new)
        cursors = (new[:-1] + old.diff()).cpu().numpy()
        slots = np.empty(min(n, self.add_batch_size), np.int64)
        try:
            for s in range(0, n, self.add_batch_size):
                e = min(n, s + self.add_batch_size)
                row_kernels.list_slots(lists[s:e].cpu().numpy(), cursors, slots[: e - s])
                at = torch.from_numpy(slots[: e - s]).to(self.device)
                for name, t in {**rows(s, e), "ids": ids[s:e]}.items():
                    full[name][at] = t.to(full[name].device, full[name].dtype)
        except BaseException:
            for name in names:
                move_lists(full[name], new, old)
            self._buffers.update(before)
            raise
        for name in names:
            set_rows(self, name, n0 + n)
        self.offsets = new

    def _remove(self, ids: torch.Tensor) -> int:
        """Remove the rows holding ``ids``; returns how many rows. On the CPU: the lists that
        hold them found through the id → list map (:class:`vq.index.idlists.IdLists`, built
        on the first removal and kept across removals), only those lists' rows read, then the
        rows after the first removed one moved down (CSR: the lists after it shift)."""
        if self.ids.device.type != "cpu":
            return super()._remove(ids)
        wanted = np.unique(ids.cpu().numpy()).astype(np.int64, copy=False)
        id_lists = self.__dict__.setdefault("_id_lists", IdLists())
        lists, pos = id_lists.current(self.ids, self.offsets).find(wanted)
        if not lists.size:
            return 0
        offsets = self.offsets.numpy()
        scanned = int((offsets[lists + 1] - offsets[lists]).sum())
        found = np.empty(scanned, np.int64)
        count = row_kernels.rows_in_lists(self.ids.numpy(), offsets, lists, wanted, found)
        self._remove_rows(found[:count])
        id_lists.forget(pos, self.ids, self.offsets)
        return count

    def _drop_rows(self, drop: np.ndarray, first: int, removed: int) -> None:
        self._remove_rows(np.flatnonzero(drop[first:]).astype(np.int64) + first)

    def _remove_rows(self, rows: np.ndarray) -> None:
        """Remove stored rows ``rows`` (int64, ascending, distinct) and shorten their lists."""
        lists = np.searchsorted(self.offsets.cpu().numpy(), rows, side="right") - 1
        gone = torch.from_numpy(np.bincount(lists, minlength=self.nlist)).to(self.device)
        offsets = self.offsets.clone()
        offsets[1:] -= torch.cumsum(gone, 0)
        remove_rows(self, (*self._row_buffers, "ids"), rows)
        self.offsets = offsets

    def _row_lists(self, rows: torch.Tensor) -> torch.Tensor:  # the list of each stored row
        return torch.searchsorted(self.offsets, rows.to(self.device), right=True) - 1
