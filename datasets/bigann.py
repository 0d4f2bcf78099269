"""big-ann-benchmarks binary files (https://big-ann-benchmarks.com): ``.fbin`` (float32
vectors), ``.u8bin`` (uint8), ``.i8bin`` (int8) and ``.ibin`` (int32, e.g. ground-truth ids).

A file is a header of two little-endian int32, ``n`` and ``dim``, then the ``n * dim`` values
row by row: after its first 8 bytes the file is one ``[n, dim]`` table, which is memory-mapped
and sliced by rows without reading the rest. The size must be exactly
``8 + n * dim * itemsize``: a shorter file is truncated, a longer one has a wrong header or is
not in this format. big-ann-benchmarks' ground-truth files hold the ids and then a second
``[n, dim]`` table of float32 distances; an ``.ibin`` of that size is read as its ids.

Readers copy the rows asked for (``rows`` as in :mod:`vq.datasets.vecs`: None, the first n, or
``slice(start, stop)``) into an ordinary writable array; writers write atomically (a temporary
file renamed into place once complete).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from vq.datasets.vecs import PathLike, _row_range
from vq.parallel.atomic import atomic_file

#: format name -> little-endian on-disk value dtype
BIN_DTYPES = {
    "fbin": np.dtype("<f4"),
    "u8bin": np.dtype("u1"),
    "i8bin": np.dtype("i1"),
    "ibin": np.dtype("<i4"),
}
_HEADER = 8
_WRITE_CHUNK_BYTES = 64 << 20


def bin_format(path: PathLike) -> str:
    """The format of a big-ann-benchmarks file from its suffix ("fbin", "u8bin", "i8bin",
    "ibin"); ValueError for any other suffix."""
    fmt = Path(path).suffix.lstrip(".").lower()
    if fmt not in BIN_DTYPES:
        raise ValueError(
            f"{os.fspath(path)}: cannot tell the format from the suffix {Path(path).suffix!r}; "
            "expected .fbin, .u8bin, .i8bin or .ibin"
        )
    return fmt


def map_bin(path: PathLike) -> np.ndarray:
    """The ``[n, dim]`` table of a big-ann-benchmarks file (format from the suffix), memory-
    mapped read-only (nothing is read but the header; a file of 0 vectors gives an empty
    array). Checks the header and the size.

    Raises:
        FileNotFoundError: no such file. ValueError: a header that is not two non-negative
            int32 (dim positive), or a size other than ``8 + n * dim * itemsize`` (``.ibin``:
            or that plus float32 distances of the same shape).
    """
    name, fmt = os.fspath(path), bin_format(path)
    dtype = BIN_DTYPES[fmt]
    what = f"a .{fmt} file (int32 n, int32 dim, then n * dim {dtype.name} values)"
    size = os.path.getsize(name)
    if size < _HEADER:
        raise ValueError(f"{name}: {size} bytes is too short for {what}")
    n, dim = (int(v) for v in np.fromfile(name, dtype="<i4", count=2))
    if n < 0 or dim <= 0:
        raise ValueError(f"{name}: the header says n={n}, dim={dim}; is this {what}?")
    table = n * dim * dtype.itemsize
    sizes = [_HEADER + table] + ([_HEADER + 2 * table] if fmt == "ibin" else [])
    if size not in sizes:
        state = "truncated" if size < sizes[0] else f"{size - sizes[0]} bytes too long"
        raise ValueError(
            f"{name}: {size} bytes, but the header says {n} x {dim} values, "
            f"{sizes[0]} bytes in all: the file is {state}, or it is not {what}"
        )
    if n == 0:
        return np.empty((0, dim), dtype=dtype)
    return np.memmap(name, dtype=dtype, mode="r", offset=_HEADER, shape=(n, dim))


def bin_shape(path: PathLike) -> tuple[int, int]:
    """``(n, dim)`` of a big-ann-benchmarks file, from its header (checked against its size)."""
    return map_bin(path).shape


def read_fbin(path: PathLike, rows: int | slice | None = None) -> np.ndarray:
    """Read an ``.fbin`` file. Returns float32 [n, dim], a writable in-memory copy."""
    return _read_bin(path, "fbin", rows)


def read_u8bin(path: PathLike, rows: int | slice | None = None) -> np.ndarray:
    """Read a ``.u8bin`` file. Returns uint8 [n, dim], a writable in-memory copy."""
    return _read_bin(path, "u8bin", rows)


def read_i8bin(path: PathLike, rows: int | slice | None = None) -> np.ndarray:
    """Read an ``.i8bin`` file. Returns int8 [n, dim], a writable in-memory copy."""
    return _read_bin(path, "i8bin", rows)


def read_ibin(path: PathLike, rows: int | slice | None = None) -> np.ndarray:
    """Read an ``.ibin`` file (a ground-truth file's ids). Returns int32 [n, dim], a writable
    in-memory copy."""
    return _read_bin(path, "ibin", rows)


def _read_bin(path: PathLike, fmt: str, rows: int | slice | None) -> np.ndarray:
    if bin_format(path) != fmt:
        raise ValueError(f"{os.fspath(path)}: read_{fmt} reads .{fmt} files")
    table = map_bin(path)
    start, stop = _row_range(rows, table.shape[0], os.fspath(path))
    return np.array(table[start:stop], dtype=table.dtype.newbyteorder("="))


def write_fbin(path: PathLike, x: np.ndarray) -> None:
    """Write float vectors [n, dim] as ``.fbin`` (converted to float32), atomically."""
    _write_bin(path, "fbin", x, np.floating)


def write_u8bin(path: PathLike, x: np.ndarray) -> None:
    """Write integer vectors [n, dim] with values in [0, 255] as ``.u8bin``, atomically."""
    _write_bin(path, "u8bin", x, np.integer)


def write_i8bin(path: PathLike, x: np.ndarray) -> None:
    """Write integer vectors [n, dim] with values in [-128, 127] as ``.i8bin``, atomically."""
    _write_bin(path, "i8bin", x, np.integer)


def write_ibin(path: PathLike, x: np.ndarray) -> None:
    """Write integer vectors [n, dim] (e.g. int64 ids from a search) with values in int32
    range as ``.ibin``, atomically."""
    _write_bin(path, "ibin", x, np.integer)


def _write_bin(path: PathLike, fmt: str, x: np.ndarray, kind: type) -> None:
    name = os.fspath(path)
    a = np.asarray(x)
    if a.ndim != 2 or a.shape[1] == 0:
        raise ValueError(f"{name}: expected a 2-D array [n, dim] with dim >= 1, got {a.shape}")
    if not np.issubdtype(a.dtype, kind):
        raise TypeError(
            f"write_{fmt}: expected {'floating-point' if kind is np.floating else 'integer'} "
            f"values, got {a.dtype}; cast them first if you mean to store them as "
            f"{BIN_DTYPES[fmt].name}"
        )
    dtype = BIN_DTYPES[fmt]
    if kind is np.integer and a.size:
        info, lo, hi = np.iinfo(dtype), int(a.min()), int(a.max())
        if lo < info.min or hi > info.max:
            raise ValueError(
                f"write_{fmt}: values must lie in [{info.min}, {info.max}] to fit {dtype.name}, "
                f"got values in [{lo}, {hi}]"
            )
    if max(a.shape) >= 2**31:
        raise ValueError(f"{name}: {a.shape} does not fit the int32 header of a .{fmt} file")
    directory = os.path.dirname(os.path.abspath(name))
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"cannot write {name}: no directory {directory}")
    step = max(1, _WRITE_CHUNK_BYTES // (a.shape[1] * dtype.itemsize))
    with atomic_file(Path(name), "wb") as f:
        f.write(np.array(a.shape, dtype="<i4").tobytes())
        for s in range(0, a.shape[0], step):
            f.write(np.ascontiguousarray(a[s : s + step], dtype=dtype).tobytes())
