"""Files that are either the old version or the new one, never half written: write a temporary
file next to the target, fsync it, rename it over the target (atomic on POSIX and Windows), and
fsync the directory so that the rename survives a crash. Nothing is pickled: tensors go to
safetensors (metadata as strings), everything else to JSON.

The temporary file is ``.<name>.tmp-<pid>-<random>``: unique to one write, so that threads of one
process may write the same target at once (the last rename wins). A write killed before its
rename leaves that file behind; :func:`remove_stale_temporaries` deletes those whose process is
gone.

The file gets the permissions a plain ``open(path, "w")`` would give it: those of the file it
replaces, else 0o666 less the process's umask (some writers, safetensors' among them, create
files readable by their owner only).

A safetensors file written here is the same bytes for the same tensors and metadata, in any
process: safetensors writes the metadata in a hash map's order, a different one every time, so
:func:`write_safetensors` rewrites the header in a fixed order before the rename (the metadata
sorted by key, then the tensors in the order of their data), in place: the same entries, so the
same length.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import safetensors.torch
import torch

# the process's umask, read once at import (reading it means setting it, which is not
# thread-safe later)
_UMASK = os.umask(0o022)
os.umask(_UMASK)


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary path to write the new ``path`` to: when the block ends without an error the
    file is fsynced, renamed over ``path`` and the directory fsynced; on an error it is
    removed and ``path`` left as it was."""
    path = Path(path)
    tmp = _temporary(path)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, _permissions(path))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_directory(path.parent)


@contextmanager
def atomic_file(path: Path, mode: str = "wb") -> Iterator[IO]:
    """:func:`atomic_path` as an open file (``mode`` "wb" or "w")."""
    with atomic_path(path) as tmp, open(tmp, mode) as f:
        yield f


def write_safetensors(
    path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]
) -> None:
    """Write ``tensors`` (contiguous CPU tensors) and ``metadata`` to ``path`` atomically,
    the header in a fixed order (the same bytes for the same tensors and metadata)."""
    with atomic_path(path) as tmp:
        # looked up at call time (not imported by name), so that tests can simulate a failure
        safetensors.torch.save_file(tensors, str(tmp), metadata=metadata)
        _fix_header_order(tmp)


def _fix_header_order(path: Path) -> None:
    """Rewrite the JSON header of the safetensors file ``path`` in place in a fixed order:
    ``__metadata__`` first, its entries sorted by key, then the tensors by data offset, each
    as ``dtype``, ``shape``, ``data_offsets``; compact, as safetensors writes it, so the same
    length (padded with spaces, as safetensors pads it, should it ever be shorter). A header
    that would not fit is left as written (never seen: the entries are the same)."""
    with open(path, "rb+") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        ordered = {}
        if "__metadata__" in header:
            ordered["__metadata__"] = dict(sorted(header.pop("__metadata__").items()))
        for name, entry in sorted(header.items(), key=lambda e: tuple(e[1]["data_offsets"])):
            ordered[name] = {key: entry[key] for key in ("dtype", "shape", "data_offsets")}
        text = json.dumps(ordered, separators=(",", ":"), ensure_ascii=False).encode()
        if len(text) > n:
            return
        f.seek(8)
        f.write(text.ljust(n, b" "))


def write_json(path: Path, obj: Any, indent: int | None = 2) -> None:
    """Write ``obj`` as JSON (indented by ``indent``; None: compact) to ``path`` atomically."""
    with atomic_file(path, "w") as f:
        json.dump(obj, f, indent=indent)


def fsync_directory(path: Path) -> None:
    """Make a rename in ``path`` durable (best effort: not every platform can open directories)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def remove_stale_temporaries(path: Path) -> None:
    """Delete the temporary files that writes to ``path`` killed mid-write left behind (those of
    processes no longer running; POSIX only: elsewhere nothing is deleted)."""
    if os.name != "posix":
        return
    pattern = re.compile(rf"\.{re.escape(path.name)}\.tmp-(\d+)(-[0-9a-f]+)?")
    try:
        names = os.listdir(path.parent)
    except OSError:
        return
    for name in names:
        m = pattern.fullmatch(name)
        if m is None or int(m[1]) == os.getpid():
            continue
        try:
            os.kill(int(m[1]), 0)
        except ProcessLookupError:  # its writer is gone
            (path.parent / name).unlink(missing_ok=True)
        except (PermissionError, OverflowError):  # alive (another user's), or no such pid
            continue


def _permissions(path: Path) -> int:
    """The mode bits of the file ``path`` (if it exists), else 0o666 less the umask."""
    try:
        return path.stat().st_mode & 0o7777
    except OSError:
        return 0o666 & ~_UMASK


def _temporary(path: Path) -> Path:
    """A hidden sibling of ``path``, unique to this write."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
