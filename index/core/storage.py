"""What the indexes share about their stored rows, below :class:`vq.index.Index`: the checks
of new ids, and buffers that grow and shrink in place.

Growth: a buffer that grows with ``add`` (codes, vectors, ids) is a view of its first ``ntotal``
rows over a larger tensor the index allocated itself (its *capacity*): an ``add`` writes the
new rows after the used ones, and only when the capacity runs out is a new tensor allocated,
``max(needed, 1.25 × ntotal)`` rows (amortised O(1) per added row; an add into an empty index
allocates exactly what it needs). Only the view is a buffer, so ``state_dict``, ``save`` and
``to_faiss`` see the logical rows alone and the file format does not change. The index only
writes in place into tensors it allocated (it records their address and size): a buffer
assigned or loaded from elsewhere — a memory-mapped file, a user's tensor — is copied on the
first write, never modified.

Shrinking: ``remove_ids`` works in place, with no copy of the buffers. Rows held in inverted
lists (:func:`remove_list_rows`) take each removed row's place with its list's last kept row
and move each later list down by copying as many of its rows as were removed before it (the
order within lists changes, as in faiss); rows without lists (:func:`remove_rows`) move down
together from the first removed row on.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from vq.kernels.common import rows as row_kernels

#: capacity growth when a buffer runs out of room
GROWTH = 1.25


class IdRange:
    """The ids ``start … start + n - 1`` (``add``'s sequential ids), made a slice at a time:
    ``ids[s:e]`` is an int64 tensor, so an add of n vectors holds no int64 [n] array of them."""

    def __init__(self, start: int, n: int, device: torch.device):
        self.start, self.n, self.device = start, n, device
        self.shape = (n,)

    def __getitem__(self, part: slice) -> torch.Tensor:
        s, e, _ = part.indices(self.n)
        return torch.arange(self.start + s, self.start + max(s, e), device=self.device)

    def to(self, device) -> IdRange:
        return IdRange(self.start, self.n, device)


def check_new_ids(index, ids: torch.Tensor | IdRange, what: str) -> None:
    """Refuse ids (non-negative, distinct) that ``index`` already stores."""
    if not index.ntotal or not ids.shape[0]:
        return
    if isinstance(ids, IdRange):  # a range: compare the stored ids with its ends
        if index.has_sequential_ids() and ids.start >= index.ntotal:
            return
        stored = index.stored_ids()
        inside = (stored >= ids.start) & (stored < ids.start + ids.n)
        if bool(inside.any()):
            first = int(stored[inside].min())
            raise ValueError(
                f"{what}: {int(inside.sum())} of them are already in the index (first: "
                f"{first}); remove_ids them first, or add with new ids (add_with_ids)"
            )
        return
    if index.has_sequential_ids():  # the stored ids are 0 … ntotal - 1: no search needed
        taken = ids < index.ntotal
    else:
        taken = torch.isin(ids, index.stored_ids())
    if bool(taken.any()):
        first = int(ids[torch.argmax(taken.to(torch.uint8))])
        raise ValueError(
            f"{what}: {int(taken.sum())} of them are already in the index (first: {first}); "
            "remove_ids them first, or add with new ids"
        )


def byte_rows(t: torch.Tensor) -> np.ndarray:
    """[rows, words]: a numpy view of the rows of a contiguous CPU tensor as the widest
    unsigned words that divide a row (uint64 for ids and 16-byte codes), for the row kernels."""
    flat = t.reshape(t.shape[0], math.prod(t.shape[1:])).view(torch.uint8).numpy()
    width = next(w for w in (8, 4, 2, 1) if flat.shape[1] % w == 0)
    return flat.view(f"u{width}")


def _owned(index, name: str) -> torch.Tensor | None:
    """The whole tensor the index allocated behind buffer ``name`` (its capacity), or None
    where the buffer is not a prefix view of one."""
    buf = getattr(index, name)
    record = index.__dict__.get("_capacity", {}).get(name)
    if record is None or buf.storage_offset() != 0 or not buf.is_contiguous():
        return None
    storage = buf.untyped_storage()
    ptr, nbytes, shape = record
    if storage.data_ptr() != ptr or storage.nbytes() != nbytes or shape[1:] != buf.shape[1:]:
        return None
    full = buf.new_empty(0)
    return full.set_(storage, 0, shape, torch.empty(shape, device="meta").stride())


def _install(index, name: str, full: torch.Tensor, n: int) -> None:
    storage = full.untyped_storage()
    record = (storage.data_ptr(), storage.nbytes(), tuple(full.shape))
    index.__dict__.setdefault("_capacity", {})[name] = record
    setattr(index, name, full[:n])


def reserve(index, name: str, total: int, *, rows: int | None = None) -> torch.Tensor:
    """Room for ``total`` rows in buffer ``name``: the tensor behind it (the buffer is its first
    ``rows`` rows, default the buffer's), reallocated — ``max(total, 1.25 × rows)`` rows, the
    used ones copied — where it has less room or is not the index's own."""
    buf = getattr(index, name)
    n = buf.shape[0] if rows is None else rows
    full = _owned(index, name)
    if full is not None and full.shape[0] >= total:
        return full
    grown = buf.new_empty((max(total, int(n * GROWTH)) if n else total, *buf.shape[1:]))
    grown[:n] = buf[:n]
    _install(index, name, grown, n)
    return grown


def append_rows(index, name: str, new: torch.Tensor) -> None:
    """Write ``new`` after the rows of buffer ``name`` (growing it as :func:`reserve` does)."""
    n, m = getattr(index, name).shape[0], new.shape[0]
    full = reserve(index, name, n + m)
    full[n : n + m] = new.to(full.dtype)
    _install(index, name, full, n + m)


def set_rows(index, name: str, n: int) -> None:
    """Buffer ``name`` becomes the first ``n`` rows of the tensor behind it (n within its
    capacity: a rollback, or the rows written since :func:`reserve`)."""
    full = _owned(index, name)
    _install(index, name, full, n)


def explicit_ids(index, total: int) -> None:
    """Store the ids explicitly (they were implicit, the row numbers), with room for
    ``total``."""
    n = index.n_rows
    if index.ids.shape[0] == n and (n or total == 0):
        reserve(index, "ids", total)
        return
    full = torch.empty(max(total, n), dtype=torch.int64, device=index.ids.device)
    torch.arange(n, out=full[:n])
    _install(index, "ids", full, n)


def marked_rows(index, ids: torch.Tensor) -> tuple[np.ndarray, int, int]:
    """Which stored rows hold one of ``ids``: uint8 [n_rows] (1: remove), the first such row
    (n_rows if none) and how many; a binary search per stored id, no sort of them."""
    n = index.n_rows
    drop = np.zeros(n, np.uint8)
    wanted = np.unique(ids.cpu().numpy())
    if index.has_sequential_ids():  # ids are the row numbers
        hit = wanted[(wanted >= 0) & (wanted < n)]
        drop[hit] = 1
        return drop, int(hit[0]) if hit.size else n, int(hit.size)
    stored = index.stored_ids().cpu().numpy()
    first = row_kernels.mark_ids(stored, wanted.astype(np.int64), drop)
    return drop, int(first), int(np.count_nonzero(drop[first:])) if first < n else 0


def remove_rows(index, names: tuple[str, ...], rows: np.ndarray) -> None:
    """Remove the stored rows ``rows`` (int64, ascending, distinct) from each buffer in
    ``names``: in place in a tensor the index owns on the CPU (the rows after the first removed
    one move down, :func:`vq.kernels.common.rows.remove_rows`, at memory speed), otherwise by a copy
    of the kept rows (which the index then owns)."""
    for name in names:
        full, buf = _owned(index, name), getattr(index, name)
        n = buf.shape[0]
        if full is not None and full.device.type == "cpu":
            words = byte_rows(full)
            kept = row_kernels.remove_rows(words.reshape(-1), words.shape[1], rows, n)
            _install(index, name, full, kept)
        else:
            keep = np.ones(n, dtype=bool)
            keep[rows] = False
            _install(
                index, name, buf[torch.from_numpy(keep).to(buf.device)].contiguous(), n - rows.size
            )


def remove_list_rows(index, names: tuple[str, ...], offsets: np.ndarray, rows: np.ndarray):
    """Remove the stored rows ``rows`` (int64, ascending, distinct) of CSR inverted lists
    (``offsets`` int64 [nlist + 1], on the CPU) from each buffer in ``names``, in place
    (:func:`vq.kernels.common.rows.remove_from_lists`: each removed row takes its list's last kept
    row, each later list moves down by copying as many rows as were removed before it; the
    order of rows within a list changes). A buffer the index does not own (loaded, memory
    mapped, assigned) is copied first, as it is. Returns the new offsets (int64 [nlist + 1])
    and how many rows of each buffer were copied."""
    new, moves = np.empty_like(offsets), 0
    for name in names:
        buf = getattr(index, name)
        n = buf.shape[0]
        full = _owned(index, name)
        if full is None:  # not the index's own: copy it (exactly its rows) before writing
            full = buf.contiguous().clone()
        words = byte_rows(full)
        moves = row_kernels.remove_from_lists(words.reshape(-1), words.shape[1], offsets, rows, new)
        _install(index, name, full, n - rows.shape[0])
    return new, moves


def move_lists(full: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
    """Move list l's rows ``src[l]:src[l + 1]`` of ``full`` to start at ``dst[l]`` (int64
    [nlist + 1] CSR offsets), in place (every list moves towards the end, or every one
    towards the start)."""
    src_np, dst_np = src.cpu().numpy(), dst.cpu().numpy()
    backward = bool((dst_np >= src_np).all())
    if full.device.type == "cpu":
        row_kernels.move_lists(byte_rows(full), src_np, dst_np, backward)
        return
    sizes = src.diff()
    lists = torch.repeat_interleave(torch.arange(sizes.shape[0], device=full.device), sizes)
    within = torch.arange(int(src[-1]), device=full.device) - src[:-1][lists]
    full[dst[:-1][lists] + within] = full[: int(src[-1])].clone()
