"""Benchmark vector files: TEXMEX ``.fvecs``/``.ivecs``/``.bvecs``, read and written. (The
ann-benchmarks HDF5 reader is :mod:`vq.datasets.ann_hdf5`; exact ground truth is
:mod:`vq.datasets.exact_knn`.)

The TEXMEX formats (SIFT1M, GIST1M, SIFT1B; http://corpus-texmex.irisa.fr/) store one record per
vector: a little-endian int32 dimension ``d`` followed by ``d`` values, float32 (``.fvecs``),
int32 (``.ivecs``, used for ground-truth ids) or uint8 (``.bvecs``). Every record of a file has the
same ``d``, so a file is an ``[n, 1 + d]`` table that can be memory-mapped and sliced by rows
without reading the rest.

Reading memory-maps the file and copies only the requested rows into an ordinary, writable numpy
array. The file size must be a whole number of records; the dimension headers of the first and
last rows of the file and of every row read must equal ``d`` (a header in an unread row is not
looked at, so that reading a slice of a 100 GB file stays cheap). Writing goes to a temporary file
in the destination directory which replaces the destination only once complete, so a crash never
leaves a half-written file behind.

``rows`` (the row selection of the readers) is one of:

- ``None``: every row;
- an int ``n``: the first ``n`` rows (``0 <= n <= n_rows``);
- ``slice(start, stop)``: rows ``start <= i < stop``; either end may be None (the start or the end
  of the file) or negative (counted from the end, as in Python); the step must be None or 1. Unlike
  Python slicing, an end beyond the file is an error, not clipped.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vq.parallel.atomic import atomic_file

PathLike = str | os.PathLike

# format name -> little-endian on-disk value dtype
_VALUE_DTYPES = {"fvecs": np.dtype("<f4"), "ivecs": np.dtype("<i4"), "bvecs": np.dtype("u1")}
_WRITE_CHUNK_BYTES = 64 << 20  # records are assembled in pieces of about this size


# -- reading -------------------------------------------------------------------------------------


def read_fvecs(path: PathLike, rows: int | slice | None = None) -> np.ndarray:
    """Read an ``.fvecs`` file (int32 dim + dim float32 per vector).

    Args:
        path: file path (str or Path).
        rows: which vectors: None (all), an int n (the first n) or ``slice(start, stop)``; see
            the module docstring.

    Returns:
        float32 [n, d], a writable in-memory copy (not tied to the file).
    """
    return _read_vecs(path, "fvecs", rows)


def read_ivecs(path: PathLike, rows: int | slice | None = None) -> np.ndarray:
    """Read an ``.ivecs`` file (int32 dim + dim int32 per vector), e.g. ground-truth ids.

    Returns:
        int32 [n, d], a writable in-memory copy. ``rows`` as in :func:`read_fvecs`.
    """
    return _read_vecs(path, "ivecs", rows)


def read_bvecs(path: PathLike, rows: int | slice | None = None) -> np.ndarray:
    """Read a ``.bvecs`` file (int32 dim + dim uint8 per vector), e.g. SIFT1B.

    Returns:
        uint8 [n, d], a writable in-memory copy. ``rows`` as in :func:`read_fvecs`.
    """
    return _read_vecs(path, "bvecs", rows)


def vecs_shape(path: PathLike) -> tuple[int, int]:
    """``(n, d)`` of a ``.fvecs``/``.ivecs``/``.bvecs`` file (format from the suffix), reading only
    its first and last headers: what a reader of row chunks of a huge file needs first."""
    fmt = Path(path).suffix.lstrip(".").lower()
    if fmt not in _VALUE_DTYPES:
        raise ValueError(
            f"{os.fspath(path)}: cannot tell the format from the suffix {Path(path).suffix!r}; "
            "expected .fvecs, .ivecs or .bvecs"
        )
    table, _ = _map_records(path, fmt)
    return table.shape[0], table.dtype["v"].shape[0]


def _read_vecs(path: PathLike, fmt: str, rows: int | slice | None) -> np.ndarray:
    table, d = _map_records(path, fmt)
    start, stop = _row_range(rows, table.shape[0], os.fspath(path))
    records = table[start:stop]
    bad = np.flatnonzero(records["d"] != d)
    if bad.size:
        row = start + int(bad[0])
        raise ValueError(
            f"{os.fspath(path)}: row {row} has dimension header {int(records['d'][bad[0]])}, "
            f"row 0 has {d}; every record of a .{fmt} file must have the same dim"
        )
    out = np.array(records["v"], dtype=_VALUE_DTYPES[fmt].newbyteorder("="))
    del records, table  # drop the map
    return out


def _map_records(path: PathLike, fmt: str) -> tuple[np.memmap, int]:
    """Memory-map a vecs file as a record array with fields ``d`` (int32) and ``v`` (values [d]);
    checks the size and the first and last headers. Returns the map and d."""
    name = os.fspath(path)
    size = os.path.getsize(name)
    what = f"a .{fmt} file (int32 dim + dim {_VALUE_DTYPES[fmt].name} values per vector)"
    if size == 0:
        raise ValueError(f"{name}: empty file; expected {what}")
    if size < 4:
        raise ValueError(f"{name}: {size} bytes is too short for {what}")
    d = int(np.fromfile(name, dtype="<i4", count=1)[0])
    if d <= 0:
        raise ValueError(
            f"{name}: the first dimension header is {d}, expected a positive dim; is this {what}?"
        )
    record = 4 + d * _VALUE_DTYPES[fmt].itemsize
    if size % record:
        raise ValueError(
            f"{name}: size {size} bytes is not a multiple of the record size {record} "
            f"(int32 dim {d} + {d} values); the file is truncated, its rows differ in dim, "
            f"or it is not {what}"
        )
    dtype = np.dtype([("d", "<i4"), ("v", _VALUE_DTYPES[fmt], (d,))])
    table = np.memmap(name, dtype=dtype, mode="r", shape=(size // record,))
    last = int(table["d"][-1])
    if last != d:
        raise ValueError(
            f"{name}: the last row has dimension header {last}, row 0 has {d}; "
            f"every record of a .{fmt} file must have the same dim"
        )
    return table, d


def _row_range(rows: int | slice | None, n: int, name: str) -> tuple[int, int]:
    """``(start, stop)`` of a row selection, checked against the n rows of the file."""
    if rows is None:
        return 0, n
    if isinstance(rows, int | np.integer) and not isinstance(rows, bool | np.bool_):
        if not 0 <= rows <= n:
            raise ValueError(f"{name}: rows={rows} asks for the first {rows} of {n} rows")
        return 0, int(rows)
    if isinstance(rows, slice):
        if rows.step not in (None, 1):
            raise ValueError(f"{name}: rows must be a contiguous slice (step 1), got {rows}")
        ends = []
        for end, default in ((rows.start, 0), (rows.stop, n)):
            if end is None:
                ends.append(default)
                continue
            if not isinstance(end, int | np.integer) or isinstance(end, bool | np.bool_):
                raise TypeError(f"{name}: slice ends must be ints or None, got {rows}")
            ends.append(int(end) + n if end < 0 else int(end))
        start, stop = ends
        if not 0 <= start <= stop <= n:
            raise ValueError(
                f"{name}: rows={rows} is out of range for a file of {n} rows "
                f"(need 0 <= start <= stop <= {n}, got start {start}, stop {stop})"
            )
        return start, stop
    raise TypeError(
        f"{name}: rows must be None, an int (first n rows) or slice(start, stop), "
        f"got {type(rows).__name__}"
    )


# -- writing -------------------------------------------------------------------------------------


def write_fvecs(path: PathLike, x: Any) -> None:
    """Write float vectors [n, d] (numpy or torch) as ``.fvecs``, atomically.

    float64/float16/bfloat16 are converted to float32; integer or bool input raises TypeError
    (cast it yourself, so that ids are not silently written as floats).
    """
    a = _as_numpy(x)
    if not np.issubdtype(a.dtype, np.floating):
        raise TypeError(
            f"write_fvecs: expected floating-point vectors, got {a.dtype}; "
            "cast with x.astype(np.float32) if you mean to store them as float32"
        )
    _write_vecs(path, "fvecs", a)


def write_ivecs(path: PathLike, x: Any) -> None:
    """Write integer vectors [n, d] (numpy or torch, any integer dtype with values in int32
    range, e.g. int64 ids from a search) as ``.ivecs``, atomically."""
    _write_vecs(path, "ivecs", _as_integers(x, "write_ivecs", np.int32))


def write_bvecs(path: PathLike, x: Any) -> None:
    """Write byte vectors [n, d] (numpy or torch, any integer dtype with values in [0, 255]) as
    ``.bvecs``, atomically."""
    _write_vecs(path, "bvecs", _as_integers(x, "write_bvecs", np.uint8))


def _as_numpy(x: Any) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        t = x.detach().cpu()
        return (t.float() if t.dtype == torch.bfloat16 else t).numpy()
    if isinstance(x, np.ndarray):
        return x
    raise TypeError(f"expected a numpy array or torch tensor, got {type(x).__name__}")


def _as_integers(x: Any, what: str, dtype: type) -> np.ndarray:
    a = _as_numpy(x)
    if not np.issubdtype(a.dtype, np.integer):
        raise TypeError(
            f"{what}: expected integer vectors, got {a.dtype}; "
            f"cast with x.astype(np.{np.dtype(dtype).name}) if you mean to store them so"
        )
    info = np.iinfo(dtype)
    if a.size and not np.can_cast(a.dtype, dtype):
        lo, hi = int(a.min()), int(a.max())
        if lo < info.min or hi > info.max:
            raise ValueError(
                f"{what}: values must lie in [{info.min}, {info.max}] to fit {np.dtype(dtype)}, "
                f"got values in [{lo}, {hi}]"
            )
    return a


def _write_vecs(path: PathLike, fmt: str, a: np.ndarray) -> None:
    name = os.fspath(path)
    if a.ndim != 2:
        raise ValueError(f"{name}: expected a 2-D array [n, d], got shape {a.shape}")
    n, d = a.shape
    if n == 0 or d == 0:
        raise ValueError(
            f"{name}: expected at least one vector of dim >= 1, got shape {a.shape} "
            f"(a .{fmt} file cannot hold an empty set)"
        )
    dtype = np.dtype([("d", "<i4"), ("v", _VALUE_DTYPES[fmt], (d,))])
    step = max(1, _WRITE_CHUNK_BYTES // dtype.itemsize)
    directory = os.path.dirname(os.path.abspath(name))
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"cannot write {name}: no directory {directory}")
    with atomic_file(Path(name), "wb") as f:  # the old file or the new one, never half of one
        for s in range(0, n, step):
            chunk = a[s : s + step]
            records = np.empty(chunk.shape[0], dtype=dtype)
            records["d"] = d
            records["v"] = chunk  # casts (float64 -> float32, int64 -> int32, ...)
            f.write(records.tobytes())
