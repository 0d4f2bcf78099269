"""The id → inverted list map through which ``remove_ids`` on an IVF index finds the rows to
remove without reading every stored id.

faiss's ``IndexIVF.remove_ids`` tests every stored id against the selector (it keeps no map
unless ``make_direct_map`` was called). Here the first ``remove_ids`` builds, from the stored
ids and list offsets, the ids sorted and the list of each (12 bytes per stored row: int64 +
int32); a removal then looks its ids up (a binary search each), reads only the lists that hold
them (each only until its removed rows are found), and marks their entries gone. The map holds
lists, not rows, so it stays valid across removals: they move kept rows within their lists and
move lists down, but never move a row to another list. It is dropped at any other change of
the ids or lists (``add``, ``merge_from``, a load, a buffer replaced): the next removal builds
it again.
"""

from __future__ import annotations

import weakref

import numpy as np
import torch

from vq.kernels.common import rows as row_kernels


def _state(ids: torch.Tensor, offsets: torch.Tensor) -> tuple:
    """What identifies the stored ids and lists (the tensors by weak reference: the map must
    not keep a replaced buffer alive)."""
    return (
        weakref.ref(ids),
        ids._version,
        ids.data_ptr(),
        tuple(ids.shape),
        weakref.ref(offsets),
        offsets._version,
        offsets.data_ptr(),
    )


def _same(a: tuple | None, b: tuple) -> bool:
    if a is None:
        return False
    alive = a[0]() is b[0]() is not None and a[4]() is b[4]() is not None
    return alive and a[1:4] == b[1:4] and a[5:] == b[5:]


class IdLists:
    """The sorted stored ids (``keys``, int64 [n]) and the list of each (``lists``, int32 [n],
    -1 once removed), for the ids and offsets of ``state``. Copies and pickles start empty."""

    def __init__(self):
        self.state: tuple | None = None
        self.keys = np.zeros(0, dtype=np.int64)
        self.lists = np.zeros(0, dtype=np.int32)
        self.nlist = 0

    def __reduce__(self):
        return IdLists, ()

    def current(self, ids: torch.Tensor, offsets: torch.Tensor) -> IdLists:
        """This map, rebuilt first if the stored ``ids`` (int64 [n_rows], CPU) or ``offsets``
        (int64 [nlist + 1]) are not those it was built or last updated for (O(n log n))."""
        state = _state(ids, offsets)
        if not _same(self.state, state):
            stored = ids.numpy()
            order = np.argsort(stored)
            self.keys = stored[order]
            sizes = np.diff(offsets.numpy())
            self.nlist = sizes.shape[0]
            self.lists = np.repeat(np.arange(sizes.shape[0], dtype=np.int32), sizes)[order]
            self.state = state
        return self

    def find(self, wanted: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """For ``wanted`` (int64, ascending, distinct; ids not stored are ignored), grouped by
        the list holding them: ``(lists, starts, ids, pos)`` — the lists (int64 [t],
        ascending, distinct), where each one's ids start (int64 [t + 1]), the ids of the rows
        to remove (int64 [starts[-1]], ascending within each list; a spilled id twice where its
        two rows share a list) and the map entries that say so (int64, for :meth:`forget`).
        O(m log n + nlist)."""
        counts = np.empty(self.nlist, dtype=np.int64)
        pos = np.empty(2 * wanted.shape[0], dtype=np.int64)  # (spilled: two rows an id)
        found = row_kernels.ids_by_list(self.keys, self.lists, wanted, pos, counts)
        if found > pos.shape[0]:
            pos = np.empty(found, dtype=np.int64)
            row_kernels.ids_by_list(self.keys, self.lists, wanted, pos, counts)
        pos = pos[:found]
        lists = np.flatnonzero(counts)
        starts = np.zeros(lists.shape[0] + 1, dtype=np.int64)
        np.cumsum(counts[lists], out=starts[1:])
        return lists, starts, self.keys[pos], pos

    def forget(self, pos: np.ndarray, ids: torch.Tensor, offsets: torch.Tensor) -> None:
        """Mark the entries ``pos`` removed and take the stored ``ids`` and ``offsets`` as
        they are after the removal."""
        self.lists[pos] = -1
        self.state = _state(ids, offsets)

    def drop(self) -> None:
        """Free the map (the stored ids or lists changed otherwise than by a removal)."""
        self.__init__()
