"""One reader for every vector file vq's programs take (``vq build``, ``vq search``, ``vq
export --check``, ``python -m vq.distributed``), by suffix:

- vectors: TEXMEX ``.fvecs`` / ``.bvecs``, numpy ``.npy`` (any real dtype, [n, dim]),
  big-ann-benchmarks ``.fbin`` / ``.u8bin`` / ``.i8bin``, and ann-benchmarks ``.hdf5`` / ``.h5``
  (the ``train`` or ``test`` dataset);
- neighbour ids (ground truth): ``.ivecs``, ``.ibin``, integer ``.npy``, and the ``neighbors``
  of an ann-benchmarks file.

::

    vectors = open_vectors(path, "train")     # checks the file, reads only headers
    n, dim = vectors.shape
    x = vectors.read(slice(lo, hi))           # float32 [hi - lo, dim]
    x = read_vectors(path)                    # the whole file
    truth = read_neighbors(gt_path)           # int64 [nq, k]

Every format but HDF5 is memory-mapped: a read touches only the rows it returns, and converts
them to the result's dtype a block of rows at a time (about 64 MiB of output per block), so
reading uint8 vectors as float32 never holds a second full-size copy. An ann-benchmarks file's
``distance`` attribute becomes :attr:`VectorFile.metric` (``angular`` → ``"cosine"``, see
:func:`vq.datasets.ann_metric`); the other formats do not say (None).

Errors: FileNotFoundError for a missing file; ValueError for a directory, an unknown suffix, a
file whose size or headers do not fit its format, a dtype that is not real numbers (or not
integers, for ids), or an array that is not 2-D; OSError as the system reports it otherwise
(permissions).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vq.datasets.ann_hdf5 import ann_dataset_info, read_ann_rows
from vq.datasets.bigann import BIN_DTYPES, map_bin
from vq.datasets.vecs import PathLike, _map_records, _row_range

#: suffix -> format of the files :func:`open_vectors` reads
VECTOR_FORMATS = {
    ".fvecs": "fvecs",
    ".bvecs": "bvecs",
    ".npy": "npy",
    ".fbin": "fbin",
    ".u8bin": "u8bin",
    ".i8bin": "i8bin",
    ".hdf5": "hdf5",
    ".h5": "hdf5",
}
#: suffix -> format of the files :func:`open_neighbors` reads
NEIGHBOR_FORMATS = {
    ".ivecs": "ivecs",
    ".ibin": "ibin",
    ".npy": "npy",
    ".hdf5": "hdf5",
    ".h5": "hdf5",
}
_CHUNK_BYTES = 64 << 20  # output bytes converted at a time


@dataclass(frozen=True)
class VectorFile:
    """A checked vector (or id) file: what it holds, read on demand with :meth:`read`.

    Attributes:
        path: the file.
        format: "fvecs", "bvecs", "ivecs", "npy", "fbin", "u8bin", "i8bin", "ibin" or "hdf5".
        shape: ``(n, dim)`` (for ids: ``(queries, k)``).
        dtype: the values' dtype as stored.
        metric: the metric the file's neighbours are by ("l2", "ip", "cosine"), where the file
            says (ann-benchmarks' ``distance`` attribute); else None.
        dataset: the HDF5 dataset read ("train", "test", "neighbors"); None for other formats.
    """

    path: Path
    format: str
    shape: tuple[int, int]
    dtype: np.dtype
    metric: str | None = None
    dataset: str | None = None

    def read(self, rows: int | slice | None = None, dtype: Any = np.float32) -> np.ndarray:
        """The rows asked for as a C-contiguous, writable ``dtype`` array [m, dim].

        Args:
            rows: None (all), an int n (the first n) or ``slice(start, stop)`` (see
                :mod:`vq.datasets.vecs`).
            dtype: of the result (float32 for vectors, int64 for ids).
        """
        name = os.fspath(self.path)
        start, stop = _row_range(rows, self.shape[0], name)
        if self.format == "hdf5":
            return read_ann_rows(self.path, self.dataset, start, stop, dtype)
        out = np.empty((stop - start, self.shape[1]), dtype=dtype)
        table, headers = self._map()
        step = max(1, _CHUNK_BYTES // max(1, out.itemsize * self.shape[1]))
        for lo in range(start, stop, step):
            hi = min(stop, lo + step)
            if headers is not None:
                _check_headers(headers[lo:hi], self.shape[1], lo, name, self.format)
            out[lo - start : hi - start] = table[lo:hi]
        return out

    def _map(self) -> tuple[Any, Any]:
        """The file's values as an [n, dim] array-like (memory-mapped) and, for the TEXMEX
        formats, the per-row dimension headers [n]."""
        if self.format in ("fvecs", "bvecs", "ivecs"):
            records, _ = _map_records(self.path, self.format)
            return records["v"], records["d"]
        if self.format == "npy":
            return np.load(self.path, mmap_mode="r", allow_pickle=False), None
        return map_bin(self.path), None


def open_vectors(path: PathLike, what: str = "train") -> VectorFile:
    """Check a vector file and say what it holds, reading only its headers.

    Args:
        path: a ``.fvecs``, ``.bvecs``, ``.npy``, ``.fbin``, ``.u8bin``, ``.i8bin`` or
            ann-benchmarks ``.hdf5`` / ``.h5`` file.
        what: the dataset of an HDF5 file ("train": the database, "test": the queries).

    Returns:
        :class:`VectorFile` (``read()`` gives float32 [n, dim]).
    """
    return _open(path, VECTOR_FORMATS, what, "vector", "fiu")


def open_neighbors(path: PathLike) -> VectorFile:
    """Check a file of neighbour ids (ground truth) — ``.ivecs``, ``.ibin``, integer ``.npy``
    or the ``neighbors`` of an ann-benchmarks ``.hdf5`` — reading only its headers."""
    return _open(path, NEIGHBOR_FORMATS, "neighbors", "ground-truth", "iu")


def read_vectors(path: PathLike, rows: int | slice | None = None, what: str = "train"):
    """float32 [n, dim]: the rows asked for of a vector file (see :func:`open_vectors`)."""
    return open_vectors(path, what).read(rows)


def read_neighbors(path: PathLike, rows: int | slice | None = None) -> np.ndarray:
    """int64 [nq, k]: the neighbour ids of a ground-truth file (see :func:`open_neighbors`)."""
    return open_neighbors(path).read(rows, np.int64)


def _open(path: PathLike, formats: dict[str, str], what: str, kind: str, kinds: str) -> VectorFile:
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path} is a directory; give a {kind} file ({', '.join(formats)})")
    fmt = formats.get(path.suffix.lower())
    if fmt is None:
        raise ValueError(
            f"{path}: unknown {kind} file type {path.suffix!r}; use " + ", ".join(formats)
        )
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    metric, dataset = None, None
    if fmt == "hdf5":
        info = ann_dataset_info(path, what)
        shape, dtype, metric, dataset = info.shape, info.dtype, info.metric, what
    elif fmt == "npy":
        shape, dtype = _npy_header(path)
    elif fmt in BIN_DTYPES:
        shape, dtype = map_bin(path).shape, BIN_DTYPES[fmt]
    else:
        records, d = _map_records(path, fmt)
        shape, dtype = (records.shape[0], d), records.dtype["v"].base
    if np.dtype(dtype).kind not in kinds:
        wanted = "integer ids" if kinds == "iu" else "real numbers (float, int or uint)"
        raise ValueError(f"{path}: holds {np.dtype(dtype)} values; expected {wanted}")
    return VectorFile(path, fmt, (int(shape[0]), int(shape[1])), np.dtype(dtype), metric, dataset)


def _npy_header(path: Path) -> tuple[tuple[int, int], np.dtype]:
    """Shape and dtype of an ``.npy`` file, from its header alone."""
    try:
        table = np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError as err:  # object arrays, a bad header
        raise ValueError(f"{path}: not a readable .npy array ({err})") from err
    if not isinstance(table, np.ndarray) or table.ndim != 2:
        shape = getattr(table, "shape", None)
        raise ValueError(f"{path}: expected a 2-D array [n, dim], got shape {shape}")
    if table.shape[1] == 0:
        raise ValueError(f"{path}: holds vectors of dim 0")
    return table.shape, table.dtype


def _check_headers(headers: np.ndarray, dim: int, first: int, name: str, fmt: str) -> None:
    bad = np.flatnonzero(headers != dim)
    if bad.size:
        raise ValueError(
            f"{name}: row {first + int(bad[0])} has dimension header {int(headers[bad[0]])}, "
            f"row 0 has {dim}; every record of a .{fmt} file must have the same dim"
        )
