"""How the IVF kinds store their rows: inverted lists held back to back (CSR: the rows of list
l are ``offsets[l]:offsets[l + 1]`` of every row buffer), grown in place.

``add`` routes every vector first (the only array of the whole call: its lists), makes room at
the end of each list by moving the lists after the first that grows towards the end of buffers
grown with spare capacity (:mod:`vq.index.core.storage`), then encodes a chunk at a time straight
into its slots; a spilled index (SOAR, :mod:`vq.index.ivf.spill`) writes two rows per vector, in
its list and in its SOAR list. ``merge_from`` inserts another index's rows the same way.

``remove_ids`` finds the rows to remove through an id → list map (:mod:`vq.index.ivf.idlists`,
built on the first removal and kept across removals) and reads only the lists that hold them,
each until its removed rows are found. It then removes them in place with few copies
(:func:`vq.index.core.storage.remove_list_rows`): within a list, each removed row takes the list's
last kept row (faiss's swap-with-last); each later list moves down by the R rows removed before
it by copying only its last min(R, size) rows into the free rows at its front. The search
kernels' contract stays CSR (list l is ``offsets[l]:offsets[l + 1]``, no room between lists),
and a removal costs the rows read in the touched lists plus the sum of min(R, size) over the
later lists, not a pass over every stored row. As with faiss's ``remove_ids``, the order of
the rows within a list changes (a list moved by fewer rows than it keeps is rotated): search
results equal those of an index built without the removed ids, up to the order among equal
distances (the kernels break ties by row).

A kind may hold per-vector rows in blocks rather than in row buffers (``block_rows``: IVFPQ
fast-scan's codes, 32 vectors a block, each list padded to whole blocks): its encoded rows go
to ``_write_blocks`` (into their slots; the lists grow by whole blocks, ``_grow_blocks``) and a
removal tells ``_move_blocks`` where each row came from. Its removals keep the order of the
rows left (the row buffers' later rows move down together, at memory speed), so the blocks of
the lists holding no removed row are copied whole and only the others gathered anew.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from vq import _cpu
from vq.index.core.mapped import file_range, read_lists, read_rows
from vq.index.core.storage import (
    IdRange,
    byte_rows,
    move_lists,
    remove_list_rows,
    remove_rows,
    reserve,
    set_rows,
)
from vq.index.ivf.idlists import IdLists
from vq.index.ivf.spill import SPILL_COPIES, nearest_and_spill, spill_lists
from vq.kernels.common import rows as row_kernels
from vq.kernels.common.threads import parallel_for

#: removals reading at least this many rows of their lists find them on the thread pool
PARALLEL_ROWS = 1 << 16


#: bytes of probed lists a search of a memory-mapped IVF index reads at a time
FILE_SCAN_BYTES = 64 << 20


class IVFStorage:
    """The storage half of :class:`vq.index.IVFIndex` (a mixin: it reads the index's
    ``offsets``, ``ids``, ``row_buffers``, ``_assign``, ``spill`` and the kind's
    ``_encode_rows``), and the reading of rows from a mapped index file for the kind's
    ``_scan_numba`` (:mod:`vq.index.core.mapped`)."""

    #: names of the per-vector rows the kind holds in blocks, not in ``row_buffers`` (what
    #: ``_encode_rows`` gives and ``_write_blocks`` stores; readable as attributes)
    block_rows: tuple[str, ...] = ()

    def data_buffers(self) -> tuple[str, ...]:
        return (*super().data_buffers(), "offsets")

    def kernels_ahead(self) -> None:
        """``Index.kernels_ahead``: the kernels ``_insert`` runs on the CPU (the moves of the
        buffers' rows, a row's slot in its list)."""
        super().kernels_ahead()
        if self.device.type != "cpu":
            return
        words = [byte_rows(self._buffers[name]).dtype for name in (*self.row_buffers, "ids")]
        words += [byte_rows(buf).dtype for buf in self.block_buffers().values()]
        row_kernels.insertion_ahead(words)

    def block_buffers(self) -> dict[str, torch.Tensor]:
        """The buffers holding ``block_rows`` (list l in blocks ``list_blocks[l]:list_blocks[l +
        1]``); none here."""
        return {}

    def _grow_blocks(self, old: torch.Tensor, new: torch.Tensor) -> Callable[[], None]:
        """Make room in the ``block_rows`` for lists growing from CSR offsets ``old`` to
        ``new`` (each list's rows staying at its start; an ``add``), and return what undoes it
        (the add failed: the blocks as they were)."""
        return lambda: None

    def _write_blocks(self, encoded: dict, lists, slots: np.ndarray, offsets) -> None:
        """Store ``encoded`` (the ``block_rows`` of new rows, in ``lists``) at stored rows
        ``slots`` (int64) of CSR ``offsets`` (those ``_grow_blocks`` made room for)."""

    def _move_blocks(self, old: torch.Tensor, new: torch.Tensor, rowmap: np.ndarray) -> None:
        """Lay the ``block_rows`` out for CSR offsets ``new`` after a removal, stored row r
        being the row ``rowmap[r]`` (int64 [n_rows]) of offsets ``old``."""

    def _encode_rows(self, x: torch.Tensor, lists: torch.Tensor) -> dict[str, torch.Tensor]:
        raise NotImplementedError  # x [b, dim] in lists [b] → the kind's _row_buffers, b rows

    def _assign_spilled(self, x: torch.Tensor) -> torch.Tensor:
        """int64 [n, 2]: each vector's list (``_assign``'s) and its SOAR spill list; for L2
        lists routed by a linear scan, on the CPU, both from one product per chunk of rows."""
        c = self.quantizer.codebook.float()
        if (
            self.metric == "l2"
            and not self.coarse_hnsw
            and x.dtype == torch.float32
            and _cpu.fast_path(x)
        ):
            return torch.stack(nearest_and_spill(x, c, self.soar_lambda), dim=1)
        first = self._assign(x)
        return torch.stack([first, spill_lists(x, c, first, self.soar_lambda)], dim=1)

    def add_rows(self, x: torch.Tensor, ids, prepare: Callable | None = None) -> None:
        """Route every vector (int64 [n] lists, the only array of the whole call), make room
        at the ends of the lists, then encode a chunk at a time into its rows (``prepare``:
        a wrapper's transform, applied a chunk at a time, twice)."""
        self._require_trained("add")
        n, step = x.shape[0], self.add_batch_size

        def chunk(s: int, e: int) -> torch.Tensor:
            part = x[s:e].to(self.device)
            return part if prepare is None else prepare(part)

        with torch.no_grad():
            if not self.spill:
                lists = torch.empty(n, dtype=torch.int64, device=self.device)
                for s in range(0, n, step):
                    lists[s : s + step] = self._assign(chunk(s, s + step))
                self._insert(lists, lambda s, e: self._encode_rows(chunk(s, e), lists[s:e]), ids)
                return
            # spilled: rows 2i and 2i + 1 hold vector i in its list and in its SOAR list
            rows = torch.empty((n, SPILL_COPIES), dtype=torch.int64, device=self.device)
            for s in range(0, n, step):
                rows[s : s + step] = self._assign_spilled(chunk(s, s + step))
            copies = (ids[0:n] if isinstance(ids, IdRange) else ids).repeat_interleave(SPILL_COPIES)

            def encode(s: int, e: int):  # row chunks start at even rows (add_batch_size is even)
                part = chunk(s // SPILL_COPIES, -(-e // SPILL_COPIES)).repeat_interleave(2, 0)
                return self._encode_rows(part[: e - s], rows.view(-1)[s:e])

            self._insert(rows.view(-1), encode, copies)

    def merge_rows(self, other, shift: int) -> None:
        ids = self._merged_ids(other, shift)
        sizes = other.list_sizes().to(self.device)
        lists = torch.repeat_interleave(torch.arange(self.nlist, device=self.device), sizes)
        buffers = {name: getattr(other, name) for name in (*self.row_buffers, *self.block_rows)}
        self._insert(lists, lambda s, e: {k: v[s:e] for k, v in buffers.items()}, ids)

    def _insert(self, lists: torch.Tensor, rows: Callable, ids: torch.Tensor) -> None:
        """Store new rows at the ends of their ``lists`` (int64 [n]): every buffer grown in
        place (:func:`vq.index.core.storage.reserve`), the lists after the first that grows moved
        towards the end (last first), then ``rows(s, e)`` (the ``row_buffers`` of new rows
        s..e) and ``ids`` written into their slots, ``add_batch_size`` at a time; on an error
        the lists move back (nothing half-added)."""
        n0, n = self.n_rows, lists.shape[0]
        if "_id_lists" in self.__dict__:  # (rows move to other lists: remove_ids builds it anew)
            self._id_lists.drop()
        old = self.offsets
        new = old.clone()
        new[1:] += torch.cumsum(torch.bincount(lists, minlength=self.nlist), 0)
        names = (*self.row_buffers, "ids")
        before = {name: self._buffers[name] for name in names}
        full = {name: reserve(self, name, n0 + n) for name in names}
        for name in names:
            move_lists(full[name], old, new)
        cursors = (new[:-1] + old.diff()).cpu().numpy()
        slots = np.empty(min(n, self.add_batch_size), np.int64)
        undo = self._grow_blocks(old, new) if self.block_rows else None
        try:
            for s in range(0, n, self.add_batch_size):
                e = min(n, s + self.add_batch_size)
                row_kernels.list_slots(lists[s:e].cpu().numpy(), cursors, slots[: e - s])
                at = torch.from_numpy(slots[: e - s]).to(self.device)
                encoded = {**rows(s, e), "ids": ids[s:e]}
                for name in names:
                    full[name][at] = encoded[name].to(full[name].device, full[name].dtype)
                if self.block_rows:
                    blocks = {name: encoded[name] for name in self.block_rows}
                    self._write_blocks(blocks, lists[s:e], slots[: e - s], new)
        except BaseException:
            for name in names:
                move_lists(full[name], new, old)
            self._buffers.update(before)
            if undo is not None:
                undo()
            raise
        for name in names:
            set_rows(self, name, n0 + n)
        self.offsets = new

    def remove_stored(self, ids: torch.Tensor) -> int:
        """Remove the rows holding ``ids``; returns how many rows. On the CPU: the lists that
        hold them found through the id → list map (:class:`vq.index.ivf.idlists.IdLists`, built
        on the first removal and kept across removals), only those lists read (each until its
        rows are found, on the thread pool where many lists are), then the rows removed in
        place by few copies (:func:`vq.index.core.storage.remove_list_rows`: swap-with-last within
        a list, the later lists moved down by as many rows as were removed before them)."""
        if self.ids.device.type != "cpu":
            return super().remove_stored(ids)
        wanted = np.sort(ids.cpu().numpy().astype(np.int64))  # (np.unique hashes: far slower)
        distinct = np.ones(wanted.shape, dtype=bool)
        np.not_equal(wanted[1:], wanted[:-1], out=distinct[1:])
        wanted = wanted[distinct]
        id_lists = self.__dict__.setdefault("_id_lists", IdLists())
        lists, starts, keys, pos = id_lists.current(self.ids, self.offsets).find(wanted)
        if not lists.size:
            return 0
        offsets, count = self.offsets.numpy(), int(starts[-1])
        found, per_list = np.empty(count, np.int64), np.empty(lists.shape[0], np.int64)
        scan = (self.ids.numpy(), offsets, lists, starts, keys, found, per_list)
        if int((offsets[lists + 1] - offsets[lists]).sum()) >= PARALLEL_ROWS:
            parallel_for(row_kernels.rows_of_ids, lists.shape[0], *scan)
        else:  # a few short lists: the pool's wake-up would cost more
            row_kernels.rows_of_ids(0, lists.shape[0], *scan)
        if int(per_list.sum()) != count:  # (the map is checked against the ids it was built for)
            raise RuntimeError("remove_ids: the id -> list map is out of date; please report this")
        if self.block_rows:  # rows in blocks: see _remove_in_order
            self._remove_in_order(np.sort(found), lists, per_list)
            id_lists.forget(pos, self.ids, self.offsets)
            return count
        new, _ = remove_list_rows(self, (*self.row_buffers, "ids"), offsets, found)
        self.offsets = torch.from_numpy(new)
        id_lists.forget(pos, self.ids, self.offsets)
        return count

    def _remove_in_order(self, rows: np.ndarray, lists: np.ndarray, per_list: np.ndarray):
        """``remove_stored`` of a kind holding rows in blocks: the stored ``rows`` (int64,
        ascending, distinct; ``per_list[i]`` of them in list ``lists[i]``) removed keeping the
        order of the rest (the row buffers' rows after the first removed one move down
        together, at memory speed), so that only the blocks of the lists holding removed rows
        are gathered anew and every other list's are copied whole (``_move_blocks``; swapping
        with the last row and rotating the later lists, as the plain layout does, would make
        most lists' blocks change)."""
        old = self.offsets
        gone = np.zeros(self.nlist, dtype=np.int64)
        gone[lists] = per_list
        new = old.numpy().copy()
        new[1:] -= np.cumsum(gone)
        remove_rows(self, (*self.row_buffers, "ids"), rows)
        self.offsets = torch.from_numpy(new)
        self._move_blocks(old, self.offsets, np.delete(np.arange(old.numpy()[-1]), rows))

    def _drop_rows(self, drop: np.ndarray, first: int, removed: int) -> None:
        self._remove_rows(np.flatnonzero(drop[first:]).astype(np.int64) + first)

    def _remove_rows(self, rows: np.ndarray) -> None:
        """Remove stored rows ``rows`` (int64, ascending, distinct) and shorten their lists."""
        lists = np.searchsorted(self.offsets.cpu().numpy(), rows, side="right") - 1
        gone = torch.from_numpy(np.bincount(lists, minlength=self.nlist)).to(self.device)
        offsets, old = self.offsets.clone(), self.offsets
        offsets[1:] -= torch.cumsum(gone, 0)
        remove_rows(self, (*self.row_buffers, "ids"), rows)
        self.offsets = offsets
        if self.block_rows:  # the rows kept, in order
            self._move_blocks(old, offsets, np.delete(np.arange(self.n_rows + rows.size), rows))

    def _row_lists(self, rows: torch.Tensor) -> torch.Tensor:  # the list of each stored row
        return torch.searchsorted(self.offsets, rows.to(self.device), right=True) - 1

    # -- reading rows from the index file (``load_index(path, mmap=True)``) ------------------
    def rows_mapped(self) -> bool:
        """Whether any row buffer (``row_buffers``: codes, vectors...) is (still) mapped from
        the index file this index was loaded from with ``load_index(path, mmap=True)``:
        searches then read the lists they probe with ``pread`` from the file, and copy those
        of the buffers held in memory (see :func:`vq.index.core.mapped.read_lists`), and never
        scan through the mapping; the ids of the results come from the file where ``ids`` is
        mapped (:meth:`_ids_of`), whether or not the rows are."""
        held = (*(self._buffers[name] for name in self.row_buffers), *self.block_buffers().values())
        return any(file_range(t) is not None for t in held)

    def _scan_from_file(self, q, coarse, lists, dist, rows, ranked, mask) -> bool:
        """``_scan_numba`` for an index whose row buffers are mapped from its file
        (``load_index(path, mmap=True)``, :meth:`rows_mapped`): the probed lists read with
        ``pread`` instead of through the mapping (see :mod:`vq.index.core.mapped`), a block of
        queries at a time (at most about :data:`FILE_SCAN_BYTES` read per block), then
        freed; False, having done nothing, for any other index."""
        if not self.rows_mapped():
            return False
        buffers = {name: self._buffers[name] for name in self.row_buffers}
        probes = lists.numpy()
        row_bytes = sum(t[0].numel() * t.element_size() for t in buffers.values())
        row_bytes += sum(t.shape[1] * t.element_size() / 32 for t in self.block_buffers().values())
        per_query = probes.shape[1] * row_bytes * self.n_rows / self.nlist + 1
        step = max(1, int(FILE_SCAN_BYTES // per_query))
        for s in range(0, q.shape[0], step):
            e = min(q.shape[0], s + step)
            local = self.read_probed_lists(probes[s:e])
            part = local.take(mask) if mask.shape[0] else mask
            self._scan_numba(
                q[s:e], coarse[s:e], lists[s:e], dist[s:e], rows[s:e], ranked, part, local
            )
            got = rows[s:e].numpy()
            got[...] = local.stored_rows(got)
        return True

    def read_probed_lists(self, lists: np.ndarray):
        """The rows of ``lists`` (int64, any shape; -1 ignored) of every row buffer (and the
        blocks of ``block_buffers``, by ``list_blocks``) read from the index file, a
        :class:`vq.index.core.mapped.LocalLists` (see :func:`vq.index.core.mapped.read_lists`);
        None where none is mapped from it."""
        buffers = {name: self._buffers[name] for name in self.row_buffers}
        blocks = self.block_buffers()
        held = (blocks, self.list_blocks.numpy()) if blocks else None
        return read_lists(buffers, self.offsets.numpy(), lists, held)

    def _ids_of(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(at, stored)`` with ``stored[at] == ids[rows]`` (-1 rows stay -1): the stored ids
        themselves, or, mapped from the index file, the ids of ``rows`` alone read with
        ``pread`` (``at`` indexes ``rows.reshape(-1)``)."""
        if file_range(self.ids) is None:
            return rows, self.ids.numpy()
        flat = rows.reshape(-1)
        stored = read_rows(self.ids, np.maximum(flat, 0)).numpy()
        at = np.where(rows >= 0, np.arange(flat.shape[0]).reshape(rows.shape), -1)
        return np.ascontiguousarray(at), stored
