"""The index file: one safetensors file whose header carries JSON metadata.

Nothing is pickled, so reading a file cannot run code. The metadata holds the format name and
version, the vq version, the index configuration (``{"class": name, **index.config()}`` as
JSON), a SHA-256 checksum of the tensors and (from format version 2) one of the configuration.
Writing goes through :mod:`vq.parallel.atomic`: a temporary file beside the target, flushed to
disk, renamed over it, the directory flushed, so a crash mid-save leaves the previous file.

Format versions: 1 (vq 0.1.0: tensors checksummed), 2 (the configuration checksummed too) and
3 (fast-scan codes stored as faiss's blocks, ``packed_codes``, instead of one byte per code).
All are read (a fast-scan index of a version 1 or 2 file packs its plain codes as it loads);
files of a newer version are refused with the version they need. A file is written as the
oldest version that holds it: 3 where it holds fast-scan blocks, else 2, so a vq that reads
only up to 2 still loads every other index a newer one saves.

This module knows the file, not the indexes (it imports none): ``Index.save`` writes through
:func:`write_index_file`; :func:`vq.index.load_index` (in :mod:`vq.index.io`, the top of the
package) opens the file once as an :class:`IndexFile` (one descriptor for the header, the
tensors and the mapping: one version of the file, whatever a concurrent save renames over the
path), reads or maps its tensors, then builds the index and checks it against the file.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import stat
import struct
from pathlib import Path

import numpy as np
import torch

from vq._version import __version__
from vq.index.core.mapped import MappedFile, read_chunks, register
from vq.parallel.atomic import remove_stale_temporaries, write_safetensors

FORMAT = "vq.index"
FORMAT_VERSION = 3
#: the version of files holding no tensor that needs 3 (no fast-scan blocks)
_PLAIN_VERSION = 2
#: tensors (by the last part of their name) that only format 3 holds
_VERSION_3_TENSORS = ("packed_codes", "code_rows")
#: the oldest format version this vq reads
MIN_FORMAT_VERSION = 1
#: tensors smaller than this are read at a mapped load, not mapped (offsets, codebooks...)
SMALL_BYTES = 1 << 20
#: safetensors headers larger than this are refused before being read
_MAX_HEADER_BYTES = 1 << 24


def tensors_checksum(tensors: dict[str, torch.Tensor]) -> str:
    """``"sha256:<hex>"`` over the names, dtypes, shapes and bytes of CPU ``tensors`` (those
    mapped from a file read with ``pread``, a piece at a time)."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name]
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        for chunk in read_chunks(t):  # (a mapped tensor read with pread: nothing mapped in)
            h.update(memoryview(chunk.view(torch.uint8).numpy()))
    return "sha256:" + h.hexdigest()


def config_checksum(config: str) -> str:
    """``"sha256:<hex>"`` of the configuration as stored (a JSON string)."""
    return "sha256:" + hashlib.sha256(f"{FORMAT}|config|{config}".encode()).hexdigest()


def save_target(path) -> Path:
    """``path`` as a Path a save may write, after deleting what saves to it killed mid-write
    left behind; ValueError for a directory, FileNotFoundError for a missing parent."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path} is a directory; save the index to a file inside it")
    if not path.parent.is_dir():
        raise FileNotFoundError(f"cannot save to {path}: no directory {path.parent}")
    remove_stale_temporaries(path)
    return path


def written_version(tensors: dict[str, torch.Tensor]) -> int:
    """The format version a file of ``tensors`` is written as: the oldest that holds them."""
    for name in tensors:
        if name.rsplit(".", 1)[-1] in _VERSION_3_TENSORS:
            return FORMAT_VERSION
    return _PLAIN_VERSION


def write_index_file(path: Path, tensors: dict[str, torch.Tensor], config: dict) -> None:
    """Write contiguous CPU ``tensors`` and the JSON-serialisable ``config`` (``{"class":
    name, **index.config()}``) to ``path`` atomically, with the metadata and checksums."""
    config_json = json.dumps(config)
    metadata = {
        "format": FORMAT,
        "format_version": str(written_version(tensors)),
        "vq_version": __version__,
        "config": config_json,
        "checksum": tensors_checksum(tensors),
        "config_checksum": config_checksum(config_json),
    }
    write_safetensors(path, tensors, metadata)


class IndexFile:
    """An index file opened once for a load: one descriptor, from which the header, the
    tensors and the mapping are all read, so that a load sees one version of the file even
    while a save renames another over its path (the descriptor keeps the file it opened).

    Opening reads the header alone: the format tag and version checked (``meta``, the
    metadata, its ``format_version`` an int) and every tensor's byte range inside the file
    (``size``, the file's bytes when opened). Use as a context manager (or :meth:`close`);
    tensors read or mapped stay valid after it closes (a mapping holds a descriptor of its
    own, see :class:`vq.index.core.mapped.MappedFile`).

    Raises:
        FileNotFoundError: no such file, or not a regular file (a directory, a FIFO...).
        ValueError: not a vq index file, a version this vq does not read, or a header that
            does not fit the file (truncated or corrupted).
    """

    def __init__(self, path):
        self.path = path = Path(path)
        flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
        try:  # (non-blocking: opening a FIFO does not wait for a writer; no effect on files)
            self.fd = os.open(path, flags | getattr(os, "O_BINARY", 0))
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError) as err:
            raise FileNotFoundError(f"no index file at {path}") from err
        try:
            self.stat = os.fstat(self.fd)
            if not stat.S_ISREG(self.stat.st_mode):
                raise FileNotFoundError(f"no index file at {path} (not a regular file)")
            self.size = self.stat.st_size
            self.base, self._header = self._read_header()
            self.meta = _metadata(path, self._header, self.size - self.base)
        except BaseException:
            os.close(self.fd)
            raise

    def __enter__(self) -> IndexFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def _read_header(self) -> tuple[int, dict]:
        """(the file offset of the tensor data, the header JSON)."""
        path, size = self.path, self.size
        head = _pread_all(self.fd, 8, 0)
        if len(head) < 8:
            raise ValueError(f"{path}: not a vq index file (only {size} bytes)")
        (n,) = struct.unpack("<Q", head)
        if n > min(_MAX_HEADER_BYTES, size - 8):
            raise ValueError(
                f"{path}: not a vq index file (no safetensors header: it claims {n} header "
                f"bytes in a {size}-byte file)"
            )
        raw = _pread_all(self.fd, n, 8)
        if len(raw) < n:
            raise ValueError(f"{path}: truncated vq index file (its header)")
        try:
            return 8 + n, json.loads(raw)
        except (ValueError, RecursionError) as err:  # not UTF-8, not JSON, nested too deep
            raise ValueError(f"{path}: not a vq index file (unreadable header: {err})") from err

    def read_tensors(self) -> dict[str, torch.Tensor]:
        """The tensors, each read straight from the file into memory of its own (``pread`` at
        its byte range: no mapping of the file, no second copy, so a load peaks at about the
        file's size), then checked against their checksum.

        Raises:
            ValueError: a tensor whose dtype, shape and byte range disagree (see
                :meth:`layout`), a file shorter than its header says, or a checksum
                mismatch (corrupted, or modified).
        """
        tensors = {
            name: _read_tensor(self.path, self.fd, kind, shape, self.base + start, name)
            for name, kind, shape, start, _ in self.layout()
        }
        if tensors_checksum(tensors) != self.meta.get("checksum"):
            raise ValueError(
                f"{self.path}: checksum mismatch: the file is corrupted or was modified"
            )
        return tensors

    def layout(self) -> list[tuple]:
        """For each tensor its name, (numpy, torch) dtypes, shape and byte range in the data,
        ordered by offset. Checked as safetensors checks them: a known dtype, a shape of
        non-negative ints whose size is the range's, ranges that tile the data exactly (no
        overlap, no gap, nothing after the last).

        Raises:
            ValueError: a check fails (corrupted file).
        """
        path, size = self.path, self.size - self.base
        named = [(k, v) for k, v in self._header.items() if k != "__metadata__"]
        entries, at = [], 0
        for name, entry in sorted(named, key=lambda e: tuple(e[1]["data_offsets"])):
            kind, shape = _DTYPES.get(entry.get("dtype")), entry.get("shape")
            start, end = entry["data_offsets"]
            bad = f"{path}: corrupted vq index file (tensor {name!r}: "
            if (
                kind is None
                or not isinstance(shape, list)
                or not all(type(d) is int and d >= 0 for d in shape)
            ):
                raise ValueError(bad + "invalid shape, data type, or offset)")
            nbytes = int(np.prod(shape, dtype=object)) * np.dtype(kind[0]).itemsize
            if nbytes >= 1 << 63:
                raise ValueError(bad + f"overflow computing its size from shape {shape})")
            if nbytes != end - start:
                raise ValueError(bad + "invalid shape, data type, or offset for its byte range)")
            if start != at:
                raise ValueError(bad + "its bytes overlap another tensor's or leave a gap)")
            entries.append((name, kind, shape, start, end))
            at = end
        if at != size:
            raise ValueError(
                f"{path}: corrupted vq index file ({size - at} bytes after the tensors)"
            )
        return entries

    def map_tensors(self, verify: bool) -> dict[str, torch.Tensor]:
        """The tensors memory-mapped, not read: each a view of the file's bytes (copy-on-write,
        ``numpy.memmap`` mode "c": writing to one copies the pages it touches and never
        changes the file), so only the pages a search reads become resident. Tensors under
        :data:`SMALL_BYTES` (offsets, codebooks, centroids) are read instead. ``verify``:
        compute the checksum now (reads every byte once, with ``pread``: no page mapped in);
        otherwise the data are not read here (ranges and shapes are checked from the header
        alone). The mapping is advised
        random access (``MADV_RANDOM``, where the platform has it): a page fault reads that
        page from disk and no read-ahead around it, so what is not read is not loaded. Pages
        already in the page cache are still mapped around a fault (whole large folios: see
        :mod:`vq.index.core.mapped`), which is why IVF searches read the probed lists with
        ``pread`` instead: each mapped tensor is registered there with its byte offset and
        the :class:`vq.index.core.mapped.MappedFile` (a descriptor of this file, its size and
        modification time when opened) that guards the reads.

        Raises:
            ValueError: a tensor whose dtype, shape and byte range disagree (see
                :meth:`layout`), or (``verify``) a checksum mismatch.
        """
        entries, base = self.layout(), self.base
        pages = mmap.mmap(self.fd, self.size, access=mmap.ACCESS_COPY)  # (numpy.memmap "c")
        source = MappedFile(self.path, os.dup(self.fd), self.stat)
        data = np.frombuffer(pages, dtype=np.uint8)  # (holds the mapping while a view lives)
        tensors = {}
        for name, kind, shape, start, end in entries:
            if end - start < SMALL_BYTES:  # read, not mapped: a search never faults on the map
                tensors[name] = _read_tensor(self.path, self.fd, kind, shape, base + start, name)
                continue
            array = data[base + start : base + end].view(kind[0]).reshape(shape)
            tensors[name] = torch.from_numpy(array).view(kind[1])
            register(source, tensors[name], base + start)
        if verify and tensors_checksum(tensors) != self.meta.get("checksum"):
            raise ValueError(
                f"{self.path}: checksum mismatch: the file is corrupted or was modified"
            )
        if hasattr(mmap, "MADV_RANDOM"):  # a fault reads its page alone: no read-ahead
            pages.madvise(mmap.MADV_RANDOM)
        return tensors


def _metadata(path: Path, header, data_bytes: int) -> dict:
    """The vq metadata of a parsed safetensors ``header`` (``format_version`` as an int),
    every tensor's byte range checked against the ``data_bytes`` after the header."""
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(f"{path}: a safetensors file, but not a vq index (no '{FORMAT}' tag)")
    meta["format_version"] = _format_version(meta, path)
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2):
            raise ValueError(f"{path}: corrupted vq index file (tensor {name!r} has no offsets)")
        start, end = offsets
        if not (type(start) is int and type(end) is int and 0 <= start <= end <= data_bytes):
            raise ValueError(f"{path}: truncated or corrupted (tensor {name!r} lies past the end)")
    return meta


def _pread_all(fd: int, n: int, offset: int) -> bytes:
    """Up to ``n`` bytes of ``fd`` from ``offset`` (fewer only at the end of the file)."""
    parts, done = [], 0
    while done < n:
        got = os.pread(fd, min(n - done, _READ_BYTES), offset + done)
        if not got:
            break
        parts.append(got)
        done += len(got)
    return b"".join(parts)


def _format_version(meta: dict, path: Path) -> int:
    try:
        version = int(meta["format_version"])
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{path}: the vq index metadata has no valid format_version") from err
    if version > FORMAT_VERSION:
        raise ValueError(
            f"{path}: written by vq {meta.get('vq_version', '?')} in index format version "
            f"{version}; this vq reads versions {MIN_FORMAT_VERSION} to {FORMAT_VERSION}: "
            "upgrade vq to read it"
        )
    if version < MIN_FORMAT_VERSION:
        raise ValueError(
            f"{path}: index format version {version} is older than any this vq reads (versions "
            f"{MIN_FORMAT_VERSION} to {FORMAT_VERSION}); load it with the vq that wrote it "
            f"({meta.get('vq_version', '?')}) and rebuild the index"
        )
    return version


#: safetensors dtype names → the numpy dtype read and the torch dtype it is viewed as
_DTYPES = {
    "F64": (np.float64, torch.float64),
    "F32": (np.float32, torch.float32),
    "F16": (np.float16, torch.float16),
    "BF16": (np.uint16, torch.bfloat16),
    "I64": (np.int64, torch.int64),
    "I32": (np.int32, torch.int32),
    "I16": (np.int16, torch.int16),
    "I8": (np.int8, torch.int8),
    "U8": (np.uint8, torch.uint8),
    "BOOL": (np.bool_, torch.bool),
}
#: bytes per read call (Linux reads at most about 2 GiB in one)
_READ_BYTES = 1 << 26


def _read_tensor(path: Path, fd: int, kind: tuple, shape: list, offset: int, name: str):
    """A tensor of ``kind`` ((numpy, torch) dtypes) and ``shape`` in memory of its own (numpy's:
    huge pages for large ones), read from the file's bytes at ``offset``."""
    if 0 in shape:
        return torch.empty(shape, dtype=kind[1])
    array = np.empty(shape, dtype=kind[0])
    buf = memoryview(array.reshape(-1).view(np.uint8))
    done = 0
    while done < len(buf):
        got = os.preadv(fd, [buf[done : done + _READ_BYTES]], offset + done)
        if got <= 0:
            raise ValueError(f"{path}: truncated vq index file (tensor {name!r})")
        done += got
    return torch.from_numpy(array).view(kind[1])


def read_config(path: Path, meta: dict) -> dict:
    """The configuration in ``meta`` (ValueError where it is not a JSON object). Its checksum
    is :func:`check_config_checksum`'s."""
    try:
        config = json.loads(meta["config"])
    except (KeyError, TypeError, ValueError, RecursionError) as err:
        raise ValueError(f"{path}: the vq index metadata has no valid config") from err
    if not isinstance(config, dict):
        raise ValueError(f"{path}: the vq index metadata has no valid config")
    return config


def check_config_checksum(path: Path, meta: dict) -> None:
    """ValueError where a version-2 file's configuration does not match its checksum."""
    if meta["format_version"] >= 2 and meta.get("config_checksum") != config_checksum(
        meta["config"]
    ):
        raise ValueError(
            f"{path}: checksum mismatch in the configuration: the file is corrupted or was modified"
        )
