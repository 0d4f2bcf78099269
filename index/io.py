"""Saving and loading indexes: one safetensors file whose header carries JSON metadata.

Nothing is pickled, so loading a file cannot run code. The metadata holds the format name and
version, the vq version, the index configuration (class and constructor arguments), a SHA-256
checksum of the tensors and (from format version 2) one of the configuration; every one of them
is checked before an index is built, and sizes are checked before anything is allocated.
Saving writes a temporary file beside the target, flushes it to disk and renames it over the
target, so a crash mid-save leaves the previous file intact.

Format versions: 1 (vq 0.1.0: tensors checksummed) and 2 (the configuration checksummed too).
Both are read; files of a newer version are refused with the version they need.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import struct
from contextlib import nullcontext
from pathlib import Path

import torch

FORMAT = "vq.index"
FORMAT_VERSION = 2
#: the oldest format version this vq reads
MIN_FORMAT_VERSION = 1
#: safetensors headers larger than this are refused before being read
_MAX_HEADER_BYTES = 1 << 24
#: wrappers (PreTransform, Refine) nest at most this deep in a configuration
_MAX_NESTING = 8


def _checksum(tensors: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name]
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(memoryview(t.contiguous().reshape(-1).view(torch.uint8).numpy()))
    return "sha256:" + h.hexdigest()


def _config_checksum(config: str) -> str:
    return "sha256:" + hashlib.sha256(f"{FORMAT}|config|{config}".encode()).hexdigest()


def save_index(index, path) -> None:
    """Write ``index`` (any :class:`vq.index.Index`) to ``path`` atomically: a temporary file
    beside it, flushed to disk, then renamed over it. Searches may run meanwhile; ``add`` and
    ``remove_ids`` wait for the save."""
    from safetensors.torch import save_file

    import vq

    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path} is a directory; save the index to a file inside it")
    if not path.parent.is_dir():
        raise FileNotFoundError(f"cannot save to {path}: no directory {path.parent}")
    _remove_stale_temporary_files(path)
    lock = index._lock.read() if hasattr(index, "_lock") else nullcontext()
    with lock:
        tensors = {k: v.detach().cpu().contiguous() for k, v in index.state_dict().items()}
        config = json.dumps({"class": type(index).__name__, **index.config()})
        metadata = {
            "format": FORMAT,
            "format_version": str(FORMAT_VERSION),
            "vq_version": vq.__version__,
            "config": config,
            "checksum": _checksum(tensors),
            "config_checksum": _config_checksum(config),
        }
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
        try:
            save_file(tensors, str(tmp), metadata=metadata)
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
    _fsync_directory(path.parent)


def _fsync_directory(directory: Path) -> None:
    """Make the rename itself durable (POSIX); a no-op where directories cannot be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _remove_stale_temporary_files(path: Path) -> None:
    """Delete the temporary files that saves to ``path`` killed mid-write left behind (those of
    processes no longer running; POSIX only)."""
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


def _read_metadata(path: Path) -> dict:
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(f"{path}: not a vq index file (only {size} bytes)")
        (n,) = struct.unpack("<Q", head)
        if n > min(_MAX_HEADER_BYTES, size - 8):
            raise ValueError(
                f"{path}: not a vq index file (no safetensors header: it claims {n} header "
                f"bytes in a {size}-byte file)"
            )
        try:
            header = json.loads(f.read(n))
        except (ValueError, RecursionError) as err:  # not UTF-8, not JSON, nested too deep
            raise ValueError(f"{path}: not a vq index file (unreadable header: {err})") from err
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(f"{path}: a safetensors file, but not a vq index (no '{FORMAT}' tag)")
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
    meta["format_version"] = version
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2):
            raise ValueError(f"{path}: corrupted vq index file (tensor {name!r} has no offsets)")
        start, end = offsets
        if not (type(start) is int and type(end) is int and 0 <= start <= end <= size - 8 - n):
            raise ValueError(f"{path}: truncated or corrupted (tensor {name!r} lies past the end)")
    return meta


def load_index(path, device: str | torch.device = "cpu"):
    """Read an index written by ``index.save(path)``.

    Args:
        path: the file.
        device: where to put its buffers (search then runs there).

    Raises:
        FileNotFoundError: no such file.
        ValueError: not a vq index, written in a format version this vq does not read (the
            message names the versions), truncated, inconsistent, or its checksums do not
            match (the file was modified or corrupted). Nothing else: no file makes this
            function execute code, crash, or allocate more than the file holds.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no index file at {path}")
    meta = _read_metadata(path)
    try:
        tensors = load_file(str(path))
    except SafetensorError as err:
        raise ValueError(f"{path}: corrupted vq index file ({err})") from err
    if _checksum(tensors) != meta.get("checksum"):
        raise ValueError(f"{path}: checksum mismatch: the file is corrupted or was modified")
    try:
        config = json.loads(meta["config"])
    except (KeyError, TypeError, ValueError, RecursionError) as err:
        raise ValueError(f"{path}: the vq index metadata has no valid config") from err
    if not isinstance(config, dict):
        raise ValueError(f"{path}: the vq index metadata has no valid config")
    _check_nesting(config, path)
    _check_shapes(config, tensors, path)
    if meta["format_version"] >= 2 and meta.get("config_checksum") != _config_checksum(
        meta["config"]
    ):
        raise ValueError(
            f"{path}: checksum mismatch in the configuration: the file is corrupted or was modified"
        )
    _check_finite(tensors, path)
    index = _build(config, path)
    try:
        index.load_state_dict(tensors, strict=True)
    except RuntimeError as err:
        raise ValueError(
            f"{path}: the tensors do not match a {config.get('class')}: {err}"
        ) from err
    _check_consistent(index, path)
    return index.to(device).eval()


def _build(config: dict, path: Path):
    """``from_config(config)``, every failure a ValueError naming the file."""
    from vq.index.factory import from_config

    try:
        return from_config(config)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from err
    except (TypeError, KeyError, AttributeError, RuntimeError, OverflowError) as err:
        raise ValueError(f"{path}: invalid index configuration {config!r}: {err}") from err


def _check_nesting(config: dict, path: Path) -> None:
    depth, inner = 0, config
    while isinstance(inner, dict) and "index" in inner:
        depth, inner = depth + 1, inner["index"]
        if depth > _MAX_NESTING:
            raise ValueError(
                f"{path}: the configuration nests more than {_MAX_NESTING} indexes; "
                "not a file vq wrote"
            )


def _check_finite(tensors: dict[str, torch.Tensor], path: Path) -> None:
    for name, t in tensors.items():
        if t.is_floating_point() and t.numel() and not bool(torch.isfinite(t).all()):
            raise ValueError(
                f"{path}: corrupted vq index file (tensor {name!r} holds "
                f"{int((~torch.isfinite(t)).sum())} NaN/Inf values)"
            )


#: buffers whose length grows with the stored vectors (any size is allowed on load)
_GROWING = ("ids", "codes", "vectors")


def _check_shapes(config: dict, tensors: dict[str, torch.Tensor], path: Path) -> None:
    """Build the configured index on the meta device (no memory) and compare its fixed-size
    tensors with the file's, so that a forged config (a huge nlist or dim) cannot make the
    real construction allocate more than the file holds."""
    with torch.device("meta"):
        index = _build(config, path)
    built = {"class": type(index).__name__, **index.config()}
    odd = _settings_not_taken(config, built)
    if odd:
        raise ValueError(
            f"{path}: the configuration holds settings a {config.get('class')} does not take: "
            f"{', '.join(odd)}"
        )
    expected = index.state_dict()
    for name, t in expected.items():
        if name.rsplit(".", 1)[-1] in _GROWING:
            continue
        found = tensors.get(name)
        if found is None or found.shape != t.shape:
            got = "missing" if found is None else f"of shape {tuple(found.shape)}"
            raise ValueError(
                f"{path}: the tensors do not match a {config.get('class')}: {name!r} is {got}, "
                f"its configuration needs {tuple(t.shape)}"
            )


def _settings_not_taken(saved: dict, built: dict, where: str = "") -> list[str]:
    """Entries of a saved configuration that the index built from it does not hold as they are
    (unknown names, or values the constructor changed): a file vq wrote has none."""
    odd = []
    for key, value in saved.items():
        mine = built.get(key, _MISSING)
        if isinstance(value, dict) and isinstance(mine, dict):
            odd += _settings_not_taken(value, mine, f"{where}{key}.")
        elif mine is _MISSING:
            odd.append(f"{where}{key} (unknown)")
        elif type(value) is not type(mine) or value != mine:
            odd.append(f"{where}{key}={value!r}")
    return odd


_MISSING = object()


def _check_consistent(index, path: Path) -> None:
    """Refuse stored data whose sizes or codes disagree (the numba scans do not check bounds, so
    a file with a recomputed checksum could otherwise make a search read out of bounds)."""
    from vq.index.base import Index
    from vq.index.ivf import IVFIndex
    from vq.index.refine import Refine

    for m in index.modules():
        if not isinstance(m, Index):
            continue
        n, bufs, why = m.ntotal, m._buffers, None
        ids, vectors, codes = bufs.get("ids"), bufs.get("vectors"), bufs.get("codes")
        if ids is not None and ids.shape[0] not in (0, n):
            why = f"{ids.shape[0]} ids for {n} vectors"
        elif vectors is not None and tuple(vectors.shape) != (n, m.dim):
            why = f"vectors of shape {tuple(vectors.shape)}, expected ({n}, {m.dim})"
        elif codes is not None and tuple(codes.shape) != (n, m.pq.M):
            why = f"codes of shape {tuple(codes.shape)}, expected ({n}, {m.pq.M})"
        elif codes is not None and n and not 0 <= int(codes.min()) <= int(codes.max()) < m.pq.ksub:
            why = f"codes outside [0, {m.pq.ksub})"
        elif isinstance(m, IVFIndex):
            o = m.offsets
            if o.shape != (m.nlist + 1,) or o[0] != 0 or o[-1] != n or bool((o.diff() < 0).any()):
                why = "inverted-list offsets that do not match the stored vectors"
        elif isinstance(m, Refine):
            inner = m.index.stored_ids()
            if m.index.ntotal != n or (n and not 0 <= int(inner.min()) <= int(inner.max()) < n):
                why = "a wrapped index whose rows do not match the stored vectors"
        if why is not None:
            raise ValueError(f"{path}: corrupted vq index file ({type(m).__name__} has {why})")
