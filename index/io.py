"""Saving and loading indexes: one safetensors file whose header carries JSON metadata.

Nothing is pickled, so loading a file cannot run code. The metadata holds the format name and
version, the vq version, the index configuration (class and constructor arguments) and a
SHA-256 checksum of the tensors; every one of them is checked before an index is built.
Saving writes a temporary file beside the target and renames it over the target, so a crash
mid-save leaves the previous file intact.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path

import torch

FORMAT = "vq.index"
FORMAT_VERSION = 1
#: safetensors headers larger than this are refused before being read
_MAX_HEADER_BYTES = 1 << 24


def _checksum(tensors: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name]
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(memoryview(t.contiguous().reshape(-1).view(torch.uint8).numpy()))
    return "sha256:" + h.hexdigest()


def save_index(index, path) -> None:
    """Write ``index`` (any :class:`vq.index.Index`) to ``path`` atomically."""
    from safetensors.torch import save_file

    import vq

    path = Path(path)
    tensors = {k: v.detach().cpu().contiguous() for k, v in index.state_dict().items()}
    metadata = {
        "format": FORMAT,
        "format_version": str(FORMAT_VERSION),
        "vq_version": vq.__version__,
        "config": json.dumps({"class": type(index).__name__, **index.config()}),
        "checksum": _checksum(tensors),
    }
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        save_file(tensors, str(tmp), metadata=metadata)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


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
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
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
            f"{version}; this vq ({FORMAT_VERSION}) is older: upgrade vq to read it"
        )
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
        ValueError: not a vq index, written by a newer format version, truncated, or its
            checksum does not match (the file was modified or corrupted).
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from vq.index.factory import from_config

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
    except (KeyError, TypeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: the vq index metadata has no valid config") from err
    if not isinstance(config, dict):
        raise ValueError(f"{path}: the vq index metadata has no valid config")
    _check_shapes(config, tensors, path)
    index = from_config(config)
    try:
        index.load_state_dict(tensors, strict=True)
    except RuntimeError as err:
        raise ValueError(
            f"{path}: the tensors do not match a {config.get('class')}: {err}"
        ) from err
    _check_consistent(index, path)
    return index.to(device).eval()


#: buffers whose length grows with the stored vectors (any size is allowed on load)
_GROWING = ("ids", "codes", "vectors")


def _check_shapes(config: dict, tensors: dict[str, torch.Tensor], path: Path) -> None:
    """Build the configured index on the meta device (no memory) and compare its fixed-size
    tensors with the file's, so that a forged config (a huge nlist or dim) cannot make the
    real construction allocate more than the file holds."""
    from vq.index.factory import from_config

    with torch.device("meta"):
        expected = from_config(config).state_dict()
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
