"""ann-benchmarks HDF5 files (https://github.com/erikbern/ann-benchmarks): the database, the
queries and their true nearest neighbours in one file, read fully into memory. Needs h5py.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import numpy as np


class AnnDataset(NamedTuple):
    """An ann-benchmarks dataset (https://github.com/erikbern/ann-benchmarks)."""

    train: np.ndarray  # float32 [n, d]: the database
    test: np.ndarray  # float32 [nq, d]: the queries
    neighbors: np.ndarray  # int64 [nq, k]: ids of the true nearest neighbours, closest first
    distances: np.ndarray  # float32 [nq, k]: their distances (as the file stores them)
    distance: str | None  # the file's "distance" attribute ("euclidean", "angular", ...)


_ANN_DATASETS = ("train", "test", "neighbors", "distances")


def read_ann_hdf5(path: str | os.PathLike) -> AnnDataset:
    """Read an ann-benchmarks ``.hdf5`` file (datasets ``train``, ``test``, ``neighbors``,
    ``distances``; attribute ``distance``) fully into memory. Needs h5py.

    Returns:
        :class:`AnnDataset`: float32 ``train`` [n, d] and ``test`` [nq, d], int64 ``neighbors``
        [nq, k], float32 ``distances`` [nq, k], and ``distance`` (None when the file has no such
        attribute). Note that ann-benchmarks' "euclidean" distances are plain, not squared, L2.
    """
    try:
        import h5py
    except ImportError as err:
        raise ImportError("read_ann_hdf5 needs h5py: pip install h5py (or vq[bench])") from err
    name = os.fspath(path)
    with h5py.File(name, "r") as f:
        for key in _ANN_DATASETS:
            if key not in f or not isinstance(f[key], h5py.Dataset):
                raise ValueError(
                    f"{name}: no dataset {key!r} (the file has: {', '.join(sorted(f)) or 'none'}); "
                    f"an ann-benchmarks file holds {', '.join(_ANN_DATASETS)}"
                )
        arrays = {key: f[key][...] for key in _ANN_DATASETS}
        distance = f.attrs.get("distance")
    if isinstance(distance, bytes):
        distance = distance.decode()
    for key, a in arrays.items():
        if a.ndim != 2:
            raise ValueError(
                f"{name}: dataset {key!r} has shape {a.shape}, expected 2-D; sparse (jaccard) "
                "ann-benchmarks files are not supported"
            )
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
        distance=None if distance is None else str(distance),
    )
