"""Tensors mapped from an index file (``load_index(path, mmap=True)``), and reading their rows
from the file instead of through the mapping.

Touching a mapped page makes it resident in the process, and from a warm page cache the
kernel maps more than the page: it maps whole large folios of the page cache around each fault
(tens to hundreds of KiB on current kernels, whatever ``MADV_RANDOM`` says; measured here:
reading one byte per MiB of a cached 64 MiB file made 36–64 MiB resident). An inverted list
of IVF1024 over 1M vectors is 16 KiB of codes, so a search that probed 16 lists per query
would show most of the file in its RSS. A search of a mapped IVF index therefore reads the
probed lists' rows with ``pread`` into memory of its own (the bytes copied, a syscall per run
of adjacent lists; nothing mapped), scans them there and frees them
(:func:`read_lists`); ids of the results are read the same way (:func:`read_rows`). The
mapping itself stays for everything else (``reconstruct``, filtered and range search, export,
``to_faiss``), which touches its pages.

:func:`vq.index.fileformat.map_tensors` registers each tensor it maps (:func:`register`);
:func:`file_range` finds it again only while it is unmodified (the same tensor object, its
version counter unchanged), so a buffer replaced or written in place is never read from the
file. The file is read through a descriptor opened with the mapping, which stays valid if
the path is replaced (``index.save`` renames a new file over it).
"""

from __future__ import annotations

import os
import weakref
from typing import NamedTuple

import numpy as np
import torch

#: the mapped tensors by id: (a weak reference to the tensor, its file, the byte offset of its
#: first element, its version counter when mapped)
_REGISTRY: dict[int, tuple] = {}


class MappedFile:
    """An open descriptor of a mapped index file (closed when the last tensor mapped from it
    is freed) and its path, for messages."""

    def __init__(self, path, fd: int):
        self.path, self.fd = path, fd
        self._closer = weakref.finalize(self, os.close, fd)


class FileRange(NamedTuple):
    file: MappedFile
    offset: int  # byte offset of the tensor's first element in the file


def register(file: MappedFile, tensor: torch.Tensor, offset: int) -> None:
    """Record that ``tensor`` (C-contiguous, as mapped) holds the file's bytes from
    ``offset`` (until it is freed)."""
    key = id(tensor)

    def forget(ref, key=key):
        if _REGISTRY.get(key, (None,))[0] is ref:
            del _REGISTRY[key]

    _REGISTRY[key] = (weakref.ref(tensor, forget), file, offset, tensor._version)


def file_range(t: torch.Tensor) -> FileRange | None:
    """Where ``t``'s bytes are in its file, if ``t`` is a tensor :func:`register` recorded and
    nothing has written to it since; else None."""
    entry = _REGISTRY.get(id(t))
    if entry is None or entry[0]() is not t or entry[3] != t._version:
        return None
    return FileRange(entry[1], entry[2])


def _pread(source: FileRange, out: np.ndarray, spans: list) -> None:
    """Fill ``out`` (uint8, contiguous) with the file's byte ranges ``spans`` ((offset from
    ``source.offset``, length) pairs) back to back."""
    view, fd, base, at = memoryview(out), source.file.fd, source.offset, 0
    for offset, length in spans:
        got = os.preadv(fd, [view[at : at + length]], base + offset)
        while got < length:  # (a short read: go on from where it stopped)
            more = os.preadv(fd, [view[at + got : at + length]], base + offset + got)
            if more <= 0:
                raise OSError(
                    f"{source.file.path}: the index file is shorter than when it was mapped "
                    "(truncated or rewritten in place while in use); load it again"
                )
            got += more
        at += length


def _row_bytes(t: torch.Tensor) -> int:
    return int(np.prod(t.shape[1:], dtype=np.int64)) * t.element_size()


def _empty_rows(t: torch.Tensor, n: int) -> tuple[torch.Tensor, np.ndarray]:
    """A new tensor of ``n`` rows like ``t``'s, and its bytes (uint8, flat)."""
    raw = np.empty(n * _row_bytes(t), dtype=np.uint8)
    return torch.from_numpy(raw).view(t.dtype).view(n, *t.shape[1:]), raw


class LocalLists:
    """Rows of some inverted lists read into memory, read as an index's would be: each row
    buffer an attribute (``local.codes``: those rows, list by list) and ``offsets`` (int64
    [nlist + 1], CSR over them: empty for the lists not read); ``stored`` (int64 [nlist + 1])
    the index's own offsets, ``runs`` (int64 [r, 2]) the stored rows read, as (first, count)
    ranges in order; ``lists`` (int64, ascending) the lists read."""

    def __init__(self, buffers: dict, offsets: np.ndarray, stored: np.ndarray, runs: np.ndarray,
                 lists: np.ndarray):  # fmt: skip
        self.buffers, self.stored, self.runs, self.lists = buffers, stored, runs, lists
        self.offsets = torch.from_numpy(offsets)

    def __getattr__(self, name: str) -> torch.Tensor:
        try:
            return self.__dict__["buffers"][name]
        except KeyError:
            raise AttributeError(name) from None

    def stored_rows(self, rows: np.ndarray) -> np.ndarray:
        """The stored rows of local ``rows`` (int64, any shape; -1 stays -1)."""
        local = self.offsets.numpy()
        lists = np.searchsorted(local, rows, side="right") - 1
        return np.where(rows >= 0, rows - local[lists] + self.stored[lists], -1)

    def take(self, per_row: np.ndarray) -> np.ndarray:
        """``per_row`` [n_rows] (a value for every stored row) at the rows read, in order."""
        return np.concatenate([per_row[s : s + n] for s, n in self.runs] or [per_row[:0]])


def read_lists(
    buffers: dict[str, torch.Tensor], offsets: np.ndarray, lists: np.ndarray
) -> LocalLists | None:
    """The rows of ``lists`` (int64, any shape; -1 ignored) of each mapped tensor in
    ``buffers`` (name → [n_rows, ...] row buffer, CSR lists ``offsets`` int64 [nlist + 1]),
    read from the file by ``pread``, adjacent lists in one read; None where a buffer is not
    (or no longer) a mapped file's (see :func:`file_range`)."""
    sources = {name: file_range(t) for name, t in buffers.items()}
    if any(s is None for s in sources.values()):
        return None
    nlist = offsets.shape[0] - 1
    wanted = np.unique(lists[(lists >= 0) & (lists < nlist)])
    sizes = np.zeros(nlist, dtype=np.int64)
    sizes[wanted] = offsets[wanted + 1] - offsets[wanted]
    local = np.zeros(nlist + 1, dtype=np.int64)
    np.cumsum(sizes, out=local[1:])
    # runs of adjacent lists: one contiguous range of stored rows each
    first = np.diff(wanted, prepend=-2) != 1
    last = np.append(first[1:], True)
    starts = offsets[wanted[first]]
    runs = np.stack([starts, offsets[wanted[last] + 1] - starts], axis=1)
    out = {}
    for name, t in buffers.items():
        width = _row_bytes(t)
        out[name], raw = _empty_rows(t, int(local[-1]))
        _pread(sources[name], raw, (runs * width).tolist())
    return LocalLists(out, local, offsets, runs, wanted)


def read_rows(t: torch.Tensor, rows: np.ndarray) -> torch.Tensor | None:
    """``t[rows]`` (``rows`` int64, any shape, each in range) read from the file, a ``pread``
    per distinct row; None where ``t`` is not (or no longer) a mapped file's."""
    source = file_range(t)
    if source is None:
        return None
    distinct, back = np.unique(rows, return_inverse=True)
    width = _row_bytes(t)
    values, raw = _empty_rows(t, distinct.shape[0])
    _pread(source, raw, [(r * width, width) for r in distinct.tolist()])
    return values[torch.from_numpy(back.reshape(rows.shape))]
