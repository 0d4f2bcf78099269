"""ann-benchmarks HDF5 files (https://github.com/erikbern/ann-benchmarks): the database, the
queries and their true nearest neighbours in one file. Needs h5py.

A file holds the 2-D datasets ``train`` (the database), ``test`` (the queries), ``neighbors``
(ids of each query's true nearest neighbours, closest first) and ``distances``, and an attribute
``distance`` naming the measure its neighbours are by. :func:`ann_metric` turns that name into
vq's metric: ``euclidean`` → ``"l2"``, ``angular`` → ``"cosine"``, ``dot`` / ``ip`` → ``"ip"``;
``jaccard`` and ``hamming`` (sets and bit strings) have no vq index and are refused, so that
such a file is never searched with a metric its neighbours are not by.

:func:`read_ann_hdf5` reads a whole file into memory; :func:`ann_dataset_info` and
:func:`read_ann_rows` read one dataset's shape, or some of its rows, without reading the rest
(what :func:`vq.datasets.open_vectors` uses).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

import numpy as np

#: ann-benchmarks' (and big-ann-benchmarks') distance names -> vq's metric
ANN_METRICS = {
    "euclidean": "l2",
    "l2": "l2",
    "angular": "cosine",
    "cosine": "cosine",
    "dot": "ip",
    "ip": "ip",
}
#: distance names of ann-benchmarks data sets that no vq index searches
_REFUSED = {
    "jaccard": "sets compared by Jaccard distance",
    "hamming": "bit strings compared by Hamming distance",
}


def ann_metric(distance: str | None, name: str = "the file") -> str | None:
    """vq's metric ("l2", "ip" or "cosine") for an ann-benchmarks ``distance`` attribute;
    None for None (a file that does not say).

    Raises:
        ValueError: ``jaccard`` or ``hamming`` (no vq index searches sets or bit strings), or
            a name this function does not know; ``name`` is the file the message names.
    """
    if distance is None:
        return None
    key = str(distance).strip().lower()
    if key in ANN_METRICS:
        return ANN_METRICS[key]
    if key in _REFUSED:
        raise ValueError(
            f"{name}: distance={distance!r}: its vectors are {_REFUSED[key]}, which no vq "
            "index searches; use a euclidean, angular or dot-product data set"
        )
    raise ValueError(
        f"{name}: unknown distance attribute {distance!r}; expected one of "
        f"{', '.join(sorted(ANN_METRICS))}"
    )


class AnnDataset(NamedTuple):
    """An ann-benchmarks dataset (https://github.com/erikbern/ann-benchmarks)."""

    train: np.ndarray  # float32 [n, d]: the database
    test: np.ndarray  # float32 [nq, d]: the queries
    neighbors: np.ndarray  # int64 [nq, k]: ids of the true nearest neighbours, closest first
    distances: np.ndarray  # float32 [nq, k]: their distances (as the file stores them)
    distance: str | None  # the file's "distance" attribute ("euclidean", "angular", ...)

    @property
    def metric(self) -> str | None:
        """vq's metric for :attr:`distance` (see :func:`ann_metric`): "l2", "ip", "cosine",
        or None when the file does not say."""
        return ann_metric(self.distance)


_ANN_DATASETS = ("train", "test", "neighbors", "distances")
_CHUNK_BYTES = 64 << 20  # output bytes converted at a time


def _h5py():
    try:
        import h5py
    except ImportError as err:
        raise ImportError(
            "reading .hdf5 files needs h5py: pip install h5py (or vq[bench])"
        ) from err
    return h5py


@contextmanager
def _open(path: str | os.PathLike) -> Iterator[Any]:
    """The HDF5 file at ``path``, open for reading; ValueError for a file that is not HDF5."""
    h5py, name = _h5py(), os.fspath(path)
    if not os.path.isfile(name):
        raise FileNotFoundError(f"{name}: no such file")
    try:
        f = h5py.File(name, "r")
    except OSError as err:
        raise ValueError(f"{name}: not a readable HDF5 file ({err})") from err
    with f:
        yield f


def _distance(f: Any) -> str | None:
    distance = f.attrs.get("distance")
    if isinstance(distance, bytes):
        distance = distance.decode()
    return None if distance is None else str(distance)


def _dataset(f: Any, key: str, name: str) -> Any:
    import h5py

    if key not in f or not isinstance(f[key], h5py.Dataset):
        raise ValueError(
            f"{name}: no dataset {key!r} (the file has: {', '.join(sorted(f)) or 'none'}); "
            f"an ann-benchmarks file holds {', '.join(_ANN_DATASETS)}"
        )
    data = f[key]
    if data.ndim != 2:
        raise ValueError(
            f"{name}: dataset {key!r} has shape {data.shape}, expected 2-D; sparse (jaccard) "
            "ann-benchmarks files are not supported"
        )
    return data


class AnnDatasetInfo(NamedTuple):
    """One dataset of an ann-benchmarks file, as :func:`ann_dataset_info` finds it."""

    shape: tuple[int, int]  # [rows, columns]
    dtype: np.dtype  # as stored
    metric: str | None  # the file's distance attribute as vq's metric (see ann_metric)


def ann_dataset_info(path: str | os.PathLike, key: str) -> AnnDatasetInfo:
    """The shape and dtype of dataset ``key`` ("train", "test", "neighbors", "distances") of
    an ann-benchmarks file and the file's metric, reading no data.

    Raises:
        FileNotFoundError: no file. ValueError: not HDF5, no such 2-D dataset, or a refused
            or unknown distance (:func:`ann_metric`).
    """
    name = os.fspath(path)
    with _open(path) as f:
        metric = ann_metric(_distance(f), name)
        data = _dataset(f, key, name)
        return AnnDatasetInfo(tuple(int(s) for s in data.shape), np.dtype(data.dtype), metric)


def read_ann_rows(
    path: str | os.PathLike, key: str, start: int, stop: int, dtype: Any = np.float32
) -> np.ndarray:
    """Rows ``start <= i < stop`` of dataset ``key`` of an ann-benchmarks file as a ``dtype``
    array [stop - start, columns]: only those rows are read, and converted a block of about
    64 MiB at a time."""
    name = os.fspath(path)
    with _open(path) as f:
        data = _dataset(f, key, name)
        if not 0 <= start <= stop <= data.shape[0]:
            raise ValueError(f"{name}: rows {start}:{stop} of {key!r}, which has {data.shape[0]}")
        out = np.empty((stop - start, data.shape[1]), dtype=dtype)
        step = max(1, _CHUNK_BYTES // max(1, out.itemsize * data.shape[1]))
        for lo in range(start, stop, step):
            hi = min(stop, lo + step)
            out[lo - start : hi - start] = data[lo:hi]
        return out


def read_ann_hdf5(path: str | os.PathLike) -> AnnDataset:
    """Read an ann-benchmarks ``.hdf5`` file (datasets ``train``, ``test``, ``neighbors``,
    ``distances``; attribute ``distance``) fully into memory. Needs h5py.

    Returns:
        :class:`AnnDataset`: float32 ``train`` [n, d] and ``test`` [nq, d], int64 ``neighbors``
        [nq, k], float32 ``distances`` [nq, k], and ``distance`` (None when the file has no such
        attribute; :attr:`AnnDataset.metric` gives vq's metric). Note that ann-benchmarks'
        "euclidean" distances are plain, not squared, L2.

    Raises:
        ValueError: a missing or non-2-D dataset, shapes that do not match, or a ``jaccard``,
            ``hamming`` or unknown ``distance`` (see :func:`ann_metric`).
    """
    name = os.fspath(path)
    with _open(path) as f:
        distance = _distance(f)
        ann_metric(distance, name)
        found = {key: _dataset(f, key, name) for key in _ANN_DATASETS}  # all checked first
        arrays = {key: data[...] for key, data in found.items()}
    train, test = arrays["train"], arrays["test"]
    neighbors, distances = arrays["neighbors"], arrays["distances"]
    if train.shape[1] != test.shape[1]:
        raise ValueError(f"{name}: train has dim {train.shape[1]} but test has dim {test.shape[1]}")
    if neighbors.shape != distances.shape or neighbors.shape[0] != test.shape[0]:
        raise ValueError(
            f"{name}: expected neighbors and distances of shape [{test.shape[0]}, k] "
            f"(one row per test vector), got {neighbors.shape} and {distances.shape}"
        )
    return AnnDataset(
        train=train.astype(np.float32, copy=False),
        test=test.astype(np.float32, copy=False),
        neighbors=neighbors.astype(np.int64, copy=False),
        distances=distances.astype(np.float32, copy=False),
        distance=distance,
    )
