"""IVFPQ's precomputed table (faiss's ``precompute_table``: the per-list term ``||r||² +
2⟨c, r⟩`` of L2 search by residual, float32 [nlist, M, ksub]), filled a list at a time.

faiss builds the whole table before the first search: nlist × M × ksub floats (16 MiB for
IVF1024,PQ16, 1 GiB for IVF65536,PQ16), whatever the lists searches probe. Here the table is
allocated without touching its pages (an anonymous mapping: a page becomes resident when it is
first written) and a search fills the rows of the lists it probes, once each
(:func:`vq.kernels.pq.list_tables.list_table_rows`, whose values do not depend on which rows are
filled together, so results are those of a whole table). A few queries probing 16 lists of
1,024 fill 1/64th of it; a memory-mapped index (``load_index(path, mmap=True)``) then adds
that much anonymous memory, not the whole table. ``IVFPQ.precompute_table()`` fills it whole.

Filling is thread-safe: searches (which run concurrently under the index's read lock) fill
under this table's own lock and never write a row that is already filled, which is the only
kind another search may be reading.
"""

from __future__ import annotations

import mmap
import threading

import numpy as np
import torch

from vq.index.ivf.ivf_lean import near_lists
from vq.kernels.common.threads import parallel_for
from vq.kernels.pq.list_tables import list_table_rows

#: tables at least this large are anonymous mappings (pages resident once written); smaller
#: ones come from the allocator
MAPPED_BYTES = 1 << 20
#: fills of at least this many lists run on the thread pool
PARALLEL_LISTS = 64


def empty_table(nlist: int, M: int, ksub: int, device: torch.device) -> torch.Tensor:
    """float32 [nlist, M, ksub], not initialised; on the CPU from :data:`MAPPED_BYTES` on an
    anonymous mapping, so none of its pages is resident before it is written (a large
    ``torch.empty`` may reuse memory the allocator already holds)."""
    nbytes = nlist * M * ksub * 4
    if device.type != "cpu" or nbytes < MAPPED_BYTES:
        return torch.empty(nlist, M, ksub, device=device)
    pages = mmap.mmap(-1, nbytes)  # kept alive by the tensor (torch.frombuffer holds it)
    return torch.frombuffer(pages, dtype=torch.float32).view(nlist, M, ksub)


class ListTables:
    """Which rows of an IVFPQ's precomputed table hold their values (``filled``: bool
    [nlist]; ``missing``: how many do not), for the codebooks whose ``key`` it was allocated
    for. Copies and pickles (``copy.deepcopy`` of an index) start empty."""

    def __init__(self):
        self.key: tuple | None = None
        self.filled = np.zeros(0, dtype=bool)
        self.missing = 0
        self.lock = threading.Lock()

    def __reduce__(self):
        return ListTables, ()

    def reset(self, key: tuple, nlist: int) -> None:
        """A new, empty table for the codebooks ``key`` names."""
        self.key, self.filled, self.missing = key, np.zeros(nlist, dtype=bool), nlist

    def fill(self, lists: np.ndarray | None, table: np.ndarray, inputs: tuple) -> None:
        """Fill the rows of ``lists`` (int64, any shape; out-of-range entries such as -1
        padding ignored; None: every list) of ``table`` (float32 [nlist, M * ksub]) that are
        not filled yet; ``inputs`` = (centroids [nlist, M * dsub], codebooks_t [M, dsub,
        ksub], norms [M, ksub]), float32 (see ``list_table_rows``)."""
        if not self.missing:
            return
        if lists is not None:
            lists = np.asarray(lists, dtype=np.int64).reshape(-1)
            lists = lists[(lists >= 0) & (lists < self.filled.shape[0])]
            lists = lists[~self.filled[lists]]  # (a gather: cheap once most rows are filled)
            if not lists.size:
                return
        with self.lock:
            todo = np.flatnonzero(~self.filled) if lists is None else np.unique(lists)
            todo = todo[~self.filled[todo]]  # another search may have filled some meanwhile
            if todo.size >= PARALLEL_LISTS:
                parallel_for(list_table_rows, todo.size, todo, *inputs, table)
            elif todo.size:  # a few lists: the pool's wake-up would cost more
                list_table_rows(0, todo.size, todo, *inputs, table)
            self.filled[todo] = True
            self.missing -= int(todo.size)

    def fill_near(self, q, panels, c_norms, nprobe, table, inputs) -> None:
        """Fill the rows of every list that a lean search of ``q`` (float32 [nq, d]) may probe
        (:func:`vq.index.ivf.ivf_lean.near_lists`; L2, ``panels`` the centroids in column panels,
        ``c_norms`` [nlist] their squared norms)."""
        if self.missing:
            self.fill(near_lists(q, panels, c_norms, False, nprobe), table, inputs)


def filled_table(index, state: ListTables, lists: np.ndarray | None) -> torch.Tensor:
    """The ``precomputed_table`` buffer of the IVFPQ ``index`` with the rows of ``lists``
    (int64, any shape, -1 ignored; None: all) filled; ``state`` says which rows are, and is
    started anew (with a new, untouched table) when the coarse centroids or the codebooks have
    changed or moved. Off the CPU the table is filled whole, on the CPU, then copied."""
    c, cb, pq, nlist = index.quantizer.codebook, index.pq.codebooks, index.pq, index.nlist
    key = (c.data_ptr(), c._version, cb.data_ptr(), cb._version, c.device, nlist)
    with state.lock:
        if state.key != key or index.precomputed_table.shape[0] != nlist:
            index.precomputed_table = empty_table(nlist, pq.M, pq.ksub, c.device)
            state.reset(key, nlist)
    table = index.precomputed_table
    if not state.missing:
        return table
    if c.device.type == "cpu":
        state.fill(lists, table.view(nlist, -1).numpy(), index._table_inputs())
        return table
    whole = np.empty((nlist, pq.M * pq.ksub), np.float32)
    state.fill(None, whole, index._table_inputs())
    table.copy_(torch.from_numpy(whole).view(table.shape))
    return table
