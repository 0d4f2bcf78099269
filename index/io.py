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
        h.update(memoryview(t.contiguous().view(torch.uint8).reshape(-1).numpy()))
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
    except (KeyError, ValueError) as err:
        raise ValueError(f"{path}: the vq index metadata has no valid format_version") from err
    if version > FORMAT_VERSION:
        raise ValueError(
            f"{path}: written by vq {meta.get('vq_version', '?')} in index format version "
            f"{version}; this vq ({FORMAT_VERSION}) is older: upgrade vq to read it"
        )
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        start, end = entry.get("data_offsets", (0, -1))
        if not 0 <= start <= end <= size - 8 - n:
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
    except (KeyError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: the vq index metadata has no valid config") from err
    index = from_config(config)
    try:
        index.load_state_dict(tensors, strict=True)
    except RuntimeError as err:
        raise ValueError(
            f"{path}: the tensors do not match a {config.get('class')}: {err}"
        ) from err
    return index.to(device).eval()
