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

The probed lists' row buffers that a mapped load read into memory (tensors under 1 MiB) are
copied alongside, so a search reads nothing through the mapping whichever buffers are mapped.

:meth:`vq.index.core.fileformat.IndexFile.map_tensors` registers each tensor it maps
(:func:`register`); :func:`file_range` finds it again only while it is unmodified (the same
tensor object, its version counter unchanged), so a buffer replaced or written in place is
never read from the file. The file is read through a descriptor opened with the mapping, which
stays valid if the path is replaced (``index.save`` renames a new file over it).

A read through the mapping of a file cut short past it faults (SIGBUS: the process dies),
and ``pread`` raises OSError instead. So every call on a mapped index first checks the file
(:class:`FileGuard`, entered through the index's lock, :class:`GuardedLock`: one ``fstat``, its
size and modification time against those when the load opened it) and raises OSError where it
was cut short or written to in place; a ``pread`` that comes up short raises the same.
:func:`read_chunks` reads a mapped tensor's values with ``pread`` for the checks of a load.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import NamedTuple

import numpy as np
import torch

from vq.index.core.locking import ReadWriteLock

#: the mapped tensors by id: (a weak reference to the tensor, its file, the byte offset of its
#: first element, its version counter when mapped)
_REGISTRY: dict[int, tuple] = {}


class MappedFile:
    """An open descriptor of a mapped index file (closed when the last tensor mapped from it
    is freed), its path (for messages) and its size and modification time when it was opened
    (``opened``: its ``os.stat_result``), which :meth:`check` compares with the file's now."""

    def __init__(self, path, fd: int, opened: os.stat_result):
        self.path, self.fd = path, fd
        self.size, self.mtime_ns = opened.st_size, opened.st_mtime_ns
        self._closer = weakref.finalize(self, os.close, fd)

    def check(self) -> None:
        """OSError where the file is no longer as it was mapped: shorter (a read through the
        mapping past its end would fault: SIGBUS), or written to in place (the mapping would
        show other bytes than those checked at load). One ``fstat`` of the descriptor."""
        now = os.fstat(self.fd)
        if now.st_size < self.size:
            raise OSError(_SHORTER.format(path=self.path))
        if now.st_size != self.size or now.st_mtime_ns != self.mtime_ns:
            raise OSError(
                f"{self.path}: the index file was written to in place since it was mapped "
                "(index.save renames a new file over it instead); load it again"
            )


_SHORTER = (
    "{path}: the index file is shorter than when it was mapped (truncated or rewritten in "
    "place while in use); load it again"
)


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
                raise OSError(_SHORTER.format(path=source.file.path))
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

    def __init__(
        self,
        buffers: dict,
        offsets: np.ndarray,
        stored: np.ndarray,
        runs: np.ndarray,
        lists: np.ndarray,
    ):
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
    buffers: dict[str, torch.Tensor],
    offsets: np.ndarray,
    lists: np.ndarray,
    blocks: tuple[dict[str, torch.Tensor], np.ndarray] | None = None,
) -> LocalLists | None:
    """The rows of ``lists`` (int64, any shape; -1 ignored) of each row buffer in ``buffers``
    (name → [n_rows, ...], CSR lists ``offsets`` int64 [nlist + 1]): read from the file by
    ``pread`` for those mapped from it (adjacent lists in one read), copied for those held in
    memory (a mapped load reads tensors under 1 MiB); None where none is (or still is) a mapped
    file's (see :func:`file_range`). ``blocks``: buffers holding the lists in blocks (name →
    [blocks, ...], list l in blocks ``starts[l]:starts[l + 1]``) and ``starts``, read alike;
    the result then holds them and ``list_blocks`` (int64 [nlist + 1], over the blocks read)."""
    held, starts = blocks if blocks is not None else ({}, None)
    sources = {name: file_range(t) for name, t in {**buffers, **held}.items()}
    if all(s is None for s in sources.values()):
        return None
    nlist = offsets.shape[0] - 1
    wanted = np.unique(lists[(lists >= 0) & (lists < nlist)])
    local, runs = _local_runs(offsets, wanted)
    out = {}
    for name, t in buffers.items():
        _read_runs(name, t, sources[name], int(local[-1]), runs, out)
    if held:
        local_blocks, block_runs = _local_runs(starts, wanted)
        for name, t in held.items():
            _read_runs(name, t, sources[name], int(local_blocks[-1]), block_runs, out)
        out["list_blocks"] = torch.from_numpy(local_blocks)
    return LocalLists(out, local, offsets, runs, wanted)


def _local_runs(offsets: np.ndarray, wanted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CSR offsets over the lists ``wanted`` (ascending; the others empty) of CSR ``offsets``,
    and their runs of adjacent lists: one contiguous (first, count) range of rows each."""
    nlist = offsets.shape[0] - 1
    sizes = np.zeros(nlist, dtype=np.int64)
    sizes[wanted] = offsets[wanted + 1] - offsets[wanted]
    local = np.zeros(nlist + 1, dtype=np.int64)
    np.cumsum(sizes, out=local[1:])
    first = np.diff(wanted, prepend=-2) != 1
    last = np.append(first[1:], True)
    starts = offsets[wanted[first]]
    return local, np.stack([starts, offsets[wanted[last] + 1] - starts], axis=1)


def _read_runs(name: str, t: torch.Tensor, source, n: int, runs: np.ndarray, out: dict) -> None:
    """``out[name]``: the rows ``runs`` of ``t`` (``n`` in all), by ``pread`` where ``source``
    (its file range) is not None, else copied."""
    width = _row_bytes(t)
    out[name], raw = _empty_rows(t, n)
    if source is not None:
        _pread(source, raw, (runs * width).tolist())
    else:
        _copy_rows(t, raw, runs)


def _copy_rows(t: torch.Tensor, out: np.ndarray, runs: np.ndarray) -> None:
    """Fill ``out`` (uint8, contiguous) with the bytes of the rows ``runs`` ((first, count)
    pairs) of ``t`` (a row buffer in memory), back to back."""
    width = _row_bytes(t)
    rows = t.contiguous().view(torch.uint8).numpy().reshape(t.shape[0], width)
    dst, at = out.reshape(-1, width), 0
    for first, count in runs.tolist():
        dst[at : at + count] = rows[first : first + count]
        at += count


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


#: bytes a :func:`read_chunks` piece holds at most (a mapped tensor's pieces share one buffer of
#: that size: memory the allocator may keep after the load, so it stays small)
CHUNK_BYTES = 1 << 20


def read_chunks(t: torch.Tensor) -> Iterator[torch.Tensor]:
    """The values of ``t`` (flattened, in its dtype) a piece of at most :data:`CHUNK_BYTES`
    (a power of two) at a time: views of ``t``, or where ``t`` is mapped from a file, read from
    it with ``pread`` into one buffer of its own that each piece overwrites (use a piece before
    taking the next), nothing of the file mapped in: a pass over a mapped tensor costs its
    bytes read, not its pages resident, and a file cut short raises OSError rather than fault.
    For the checks of a load that must see every value (ids, 16-bit float codes, checksums)."""
    flat, size = t.reshape(-1), t.element_size()
    step = max(1, CHUNK_BYTES // size)
    source = file_range(t)
    if source is None:
        for s in range(0, flat.shape[0], step):
            yield flat[s : s + step]
        return
    raw = np.empty(min(step, flat.shape[0]) * size, np.uint8)
    for s in range(0, flat.shape[0], step):
        piece = raw[: (min(flat.shape[0], s + step) - s) * size]
        _pread(source, piece, [(s * size, piece.shape[0])])
        yield torch.from_numpy(piece).view(t.dtype)


class FileGuard:
    """What keeps the calls on an index mapped from its file from faulting: the files its
    buffers are mapped from, and the modules holding those buffers (``modules``: every module
    of the index's tree; those holding a mapped buffer when the guard is made are kept, by
    weak reference, with the buffers' names), and :meth:`check`, which every call that may
    read a buffer runs first (see :class:`GuardedLock`)."""

    def __init__(self, modules: Iterable[torch.nn.Module]):
        self._held, files = [], {}
        for m in modules:
            for name, t in m.named_buffers(recurse=False):
                found = None if t is None else file_range(t)
                if found is not None:
                    self._held.append((weakref.ref(m), name))
                    files[id(found.file)] = found.file
        self._files = list(files.values())

    def holds(self) -> bool:
        """Whether any buffer was mapped when the guard was made."""
        return bool(self._held)

    def check(self) -> None:
        """OSError (:meth:`MappedFile.check`) where a file is shorter than when it was mapped,
        or was written to in place, while a buffer is still mapped from it; nothing once the
        buffers mapped from it were all replaced (``add``, ``remove_ids``... copy them into
        memory). One ``fstat`` per file (an index has one), about a microsecond."""
        for file in self._files:
            try:
                file.check()
            except OSError:
                if self._maps(file):
                    raise
                self._files = [f for f in self._files if f is not file]  # (no longer read)

    def _maps(self, file: MappedFile) -> bool:
        """Whether a buffer held is still mapped from ``file``."""
        for ref, name in self._held:
            module = ref()
            found = None if module is None else file_range(getattr(module, name, None))
            if found is not None and found.file is file:
                return True
        return False


class GuardedLock(ReadWriteLock):
    """The readers-writer lock (:class:`vq.index.core.locking.ReadWriteLock`) of an index whose
    buffers are mapped from its file (and of each index it wraps): every reader and writer
    that enters it — a search (the lean path too), ``range_search``, ``reconstruct``,
    ``save``, ``add``, ``remove_ids``, ``merge_from`` — first runs ``guard.check()``, so that a
    call that would read through the mapping of a file cut short raises OSError instead of
    faulting (SIGBUS). A file cut short *while* a call reads through the mapping still
    faults: nothing in a process can catch that fault; ``index.save`` never does it (it
    renames a new file over the path). Copies of the index get a plain lock."""

    def __init__(self, guard: FileGuard):
        super().__init__()
        self.guard = guard

    def acquire_read(self) -> tuple[int, bool]:
        self.guard.check()
        return super().acquire_read()

    def try_read(self) -> bool:
        self.guard.check()
        return super().try_read()

    @contextmanager
    def write(self) -> Iterator[None]:
        self.guard.check()
        with super().write():
            yield

    def __reduce__(self):  # copies (deepcopy) hold their buffers in memory
        return (ReadWriteLock, ())
