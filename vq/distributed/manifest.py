"""The directory a :class:`~vq.distributed.ShardedIndex` saves: one index file per shard
(``shard-00000.index``, …, written by ``index.save``) and ``manifest.json``, which lists them
with their vector counts and checksums, so that a load refuses a directory mixing the files of
different builds.

``manifest.json`` holds ``format`` ("vq.sharded-index"), ``format_version``, ``vq_version``,
``num_shards``, ``ntotal``, ``dim``, ``metric``, ``index`` (the class and configuration of the
shards) and ``shards``: one ``{"file", "ntotal", "checksum"}`` per shard, in shard order. It is
written atomically (temporary file, fsync, rename).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from safetensors import safe_open

from vq._version import __version__
from vq.parallel.atomic import write_json

MANIFEST = "manifest.json"
FORMAT = "vq.sharded-index"
FORMAT_VERSION = 1
#: a checksum travels between processes as this many int64 values (one per byte)
CHECKSUM_BYTES = 80


def shard_file(shard: int) -> str:
    return f"shard-{shard:05d}.index"


def shard_checksum(file: Path) -> str:
    """The checksum an index file records in its metadata ("" when it has none)."""
    with safe_open(str(file), framework="pt") as f:
        return (f.metadata() or {}).get("checksum", "")


def encode_checksum(text: str) -> list[int]:
    """``text`` as CHECKSUM_BYTES integers (its bytes, zero-padded), to travel in a tensor."""
    raw = text.encode()[:CHECKSUM_BYTES]
    return list(raw) + [0] * (CHECKSUM_BYTES - len(raw))


def decode_checksum(values: list[int]) -> str:
    return bytes(v for v in values if v).decode()


def write_manifest(
    directory: Path, table: list[list[int]], first: Any, dim: int, metric: str
) -> None:
    """Write ``directory/manifest.json``.

    Args:
        table: one row per shard, ``[shard, ntotal, *encode_checksum(checksum)]``, in any order.
        first: one of the shards (its class and configuration are recorded), or None.
        dim, metric: those of every shard.
    """
    table = sorted(table)
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "vq_version": __version__,
        "num_shards": len(table),
        "ntotal": sum(row[1] for row in table),
        "dim": dim,
        "metric": metric,
        "index": None if first is None else {"class": type(first).__name__, **first.config()},
        "shards": [
            {"file": shard_file(row[0]), "ntotal": row[1], "checksum": decode_checksum(row[2:])}
            for row in table
        ],
    }
    write_json(directory / MANIFEST, manifest)


def read_manifest(path: Path) -> dict:
    """The manifest of the sharded index at ``path``, checked for its format and shard list.

    Raises:
        FileNotFoundError: no manifest; ValueError: unreadable, of another format or version,
            or a shard list that does not match ``num_shards``.
    """
    file = path / MANIFEST
    if not file.is_file():
        raise FileNotFoundError(f"no sharded index at {path} (no {MANIFEST})")
    try:
        manifest = json.loads(file.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{file}: unreadable manifest ({err})") from err
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ValueError(f"{file}: not a vq sharded-index manifest (no '{FORMAT}' format tag)")
    if int(manifest.get("format_version", 0)) > FORMAT_VERSION:
        raise ValueError(
            f"{file}: written by vq {manifest.get('vq_version')} in a newer format; upgrade vq"
        )
    shards = manifest.get("shards")
    if not isinstance(shards, list) or len(shards) != manifest.get("num_shards") or not shards:
        raise ValueError(f"{file}: corrupted manifest (its shard list does not match num_shards)")
    for i, entry in enumerate(shards):
        if not (isinstance(entry, dict) and entry.get("file") == shard_file(i)):
            raise ValueError(f"{file}: corrupted manifest (entry {i} is not {shard_file(i)})")
    return manifest


def check_shard(file: Path, shard: Any, entry: dict, manifest: dict) -> None:
    """Raise ValueError when the loaded ``shard`` (from ``file``) is not the one ``entry`` of
    ``manifest`` lists: another checksum, vector count or dimension."""
    checksum = shard_checksum(file)
    if entry.get("checksum") and checksum != entry["checksum"]:
        raise ValueError(
            f"{file}: not the shard the manifest lists (checksum differs): the directory mixes "
            "files of different builds"
        )
    if shard.ntotal != entry.get("ntotal") or shard.dim != manifest.get("dim"):
        raise ValueError(
            f"{file}: holds {shard.ntotal} vectors of dim {shard.dim}, the manifest says "
            f"{entry.get('ntotal')} of dim {manifest.get('dim')}"
        )
