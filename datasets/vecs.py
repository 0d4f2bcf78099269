"""Benchmark vector files: TEXMEX ``.fvecs``/``.ivecs``/``.bvecs``, ann-benchmarks HDF5, and
exact ground truth.

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
import uuid
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from vq._checks import as_tensor, as_vectors

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
    directory, base = os.path.split(os.path.abspath(name))
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"cannot write {name}: no directory {directory}")
    tmp = os.path.join(directory, f".{base}.{uuid.uuid4().hex[:12]}.tmp")
    # os.open rather than tempfile: the new file gets the usual umask permissions, not 0600
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            for s in range(0, n, step):
                chunk = a[s : s + step]
                records = np.empty(chunk.shape[0], dtype=dtype)
                records["d"] = d
                records["v"] = chunk  # casts (float64 -> float32, int64 -> int32, ...)
                f.write(records.tobytes())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, name)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


# -- ann-benchmarks HDF5 -------------------------------------------------------------------------


class AnnDataset(NamedTuple):
    """An ann-benchmarks dataset (https://github.com/erikbern/ann-benchmarks)."""

    train: np.ndarray  # float32 [n, d]: the database
    test: np.ndarray  # float32 [nq, d]: the queries
    neighbors: np.ndarray  # int64 [nq, k]: ids of the true nearest neighbours, closest first
    distances: np.ndarray  # float32 [nq, k]: their distances (as the file stores them)
    distance: str | None  # the file's "distance" attribute ("euclidean", "angular", ...)


_ANN_DATASETS = ("train", "test", "neighbors", "distances")


def read_ann_hdf5(path: PathLike) -> AnnDataset:
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


# -- exact ground truth --------------------------------------------------------------------------


class GroundTruth(NamedTuple):
    """Result of :func:`ground_truth`; unpacks as ``D, I = ground_truth(...)``."""

    distances: np.ndarray  # float32 [nq, k]
    ids: np.ndarray  # int64 [nq, k]


def ground_truth(
    xb: Any,
    xq: Any,
    k: int,
    metric: str = "l2",
    batch_size: int = 1024,
    db_batch_size: int = 16384,
) -> GroundTruth:
    """Exact k nearest neighbours of each query by brute force (faiss ``IndexFlatL2`` /
    ``IndexFlatIP`` results).

    The database is read once, ``db_batch_size`` rows at a time (so ``xb`` may be a memmap larger
    than memory), and scored against ``batch_size`` queries at a time by one matrix product: the
    score block holds ``batch_size × db_batch_size`` float32 (64 MiB by default). Runs on the
    device of ``xq`` or ``xb`` when either is a CUDA tensor, else on CPU.

    Args:
        xb: database, float or uint8 [n, d], numpy (a memmap is fine) or torch.
        xq: queries, float or uint8 [nq, d], numpy or torch.
        k: neighbours per query (k > n is allowed: the missing ones are padded).
        metric: "l2" (squared Euclidean, ascending) or "ip" (inner product, descending).
        batch_size: queries per score block.
        db_batch_size: database rows per score block.

    Returns:
        :class:`GroundTruth` ``(distances, ids)``: numpy float32 [nq, k] and int64 [nq, k]; equal
        distances are ordered by lower id; columns past n hold id -1 and distance +inf (-inf for
        "ip"), as faiss does.
    """
    if metric not in ("l2", "ip"):
        raise ValueError(f'metric must be "l2" or "ip", got {metric!r}')
    for arg, value in (("k", k), ("batch_size", batch_size), ("db_batch_size", db_batch_size)):
        if not isinstance(value, int | np.integer) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{arg} must be a positive integer, got {value!r}")
    xb_t = _as_search_vectors(xb, None, "xb")
    xq_t = _as_search_vectors(xq, xb_t.shape[1], "xq")
    device = next((t.device for t in (xq_t, xb_t) if t.device.type != "cpu"), torch.device("cpu"))
    xq_t = xq_t.to(device).float()
    n, nq, k = xb_t.shape[0], xq_t.shape[0], int(k)
    q_norms = (xq_t * xq_t).sum(dim=1) if metric == "l2" else None

    # running best keys (smaller is better: squared L2, or minus the inner product) and ids
    keys = torch.empty(nq, 0, device=device)
    ids = torch.empty(nq, 0, dtype=torch.int64, device=device)
    with torch.no_grad():
        for b0 in range(0, n, db_batch_size):
            block = xb_t[b0 : b0 + db_batch_size].to(device).float()
            b_norms = (block * block).sum(dim=1) if metric == "l2" else None
            new_keys, new_ids = [], []
            for q0 in range(0, nq, batch_size):
                q = xq_t[q0 : q0 + batch_size]
                if metric == "l2":
                    scores = torch.addmm(b_norms, q, block.T, alpha=-2.0)
                    scores.add_(q_norms[q0 : q0 + batch_size, None]).clamp_min_(0.0)
                else:
                    scores = torch.mm(q, block.T).neg_()
                top_keys, top_rows = _smallest(scores, min(k, block.shape[0]))
                merged_keys = torch.cat([keys[q0 : q0 + batch_size], top_keys], dim=1)
                merged_ids = torch.cat([ids[q0 : q0 + batch_size], top_rows + b0], dim=1)
                # stable: among equal keys the earlier (lower) ids stay first
                order = torch.sort(merged_keys, dim=1, stable=True).indices[:, :k]
                new_keys.append(torch.gather(merged_keys, 1, order))
                new_ids.append(torch.gather(merged_ids, 1, order))
            if nq:
                keys, ids = torch.cat(new_keys), torch.cat(new_ids)

    pad = k - keys.shape[1]
    if pad:
        keys = torch.cat([keys, torch.full((nq, pad), float("inf"), device=device)], dim=1)
        ids = torch.cat([ids, torch.full((nq, pad), -1, dtype=torch.int64, device=device)], dim=1)
    distances = keys if metric == "l2" else keys.neg()
    return GroundTruth(distances.float().cpu().numpy(), ids.cpu().numpy())


def _as_search_vectors(x: Any, dim: int | None, name: str) -> torch.Tensor:
    """Checked [n, dim] vectors in their own dtype: float16/bfloat16/uint8 (.bvecs data) are
    converted to float32 a block at a time, so a huge memmapped database is never copied whole."""
    t = as_tensor(x, name)
    if t.dtype != torch.uint8:
        return as_vectors(t, dim, name, keep_half=True)
    if t.dim() != 2:
        raise ValueError(f"{name}: expected a 2-D array [n, dim], got shape {tuple(t.shape)}")
    if dim is not None and t.shape[1] != dim:
        raise ValueError(f"{name}: expected vectors of dim {dim}, got {t.shape[1]}")
    return t


def _smallest(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k smallest entries of each row of ``scores`` [m, n] and their columns, in ascending
    column order (not value order); among equal values at the cut the lowest columns are kept."""
    if k == scores.shape[1]:
        cols = torch.arange(k, device=scores.device).expand(scores.shape[0], k)
        return scores, cols
    vals, cols = torch.topk(scores, k + 1, dim=1, largest=False, sorted=True)
    # topk may keep any of several values equal to the k-th: where the (k+1)-th equals the k-th
    # it had a choice, so redo those rows with a stable sort (rare outside duplicated data)
    tied = vals[:, k] == vals[:, k - 1]
    cols = cols[:, :k]
    if bool(tied.any()):
        rows = torch.nonzero(tied).flatten()
        cols[rows] = torch.sort(scores[rows], dim=1, stable=True).indices[:, :k]
    cols = torch.sort(cols, dim=1).values
    return torch.gather(scores, 1, cols), cols


def recall_at(found: np.ndarray, truth: np.ndarray, r: int) -> float:
    """r-recall@r: the mean fraction of the true r nearest (``truth[:, :r]``) among the first
    r found (``found[:, :r]``), as ann-benchmarks reports it.

    Args:
        found: int [nq, >= r] ids returned by a search (-1 for missing results).
        truth: int [nq, >= r] exact neighbour ids, e.g. from :func:`ground_truth`.
        r: how many neighbours count.
    """
    found, truth = np.asarray(found), np.asarray(truth)
    for name, a in (("found", found), ("truth", truth)):
        if a.dtype.kind not in "iu":
            raise TypeError(f"{name}: expected integer ids, got {a.dtype}")
    if isinstance(r, bool) or not isinstance(r, int | np.integer):
        raise TypeError(f"r must be an integer, got {r!r}")
    if found.ndim != 2 or truth.ndim != 2 or found.shape[0] != truth.shape[0]:
        raise ValueError(
            f"expected found and truth of shape [nq, k] with the same nq, got {found.shape} "
            f"and {truth.shape}"
        )
    if not 0 < r <= min(found.shape[1], truth.shape[1]):
        raise ValueError(
            f"r must lie in [1, {min(found.shape[1], truth.shape[1])}] (the columns given), got {r}"
        )
    f, t = found[:, :r], truth[:, :r]
    hits = ((f[:, :, None] == t[:, None, :]) & (f[:, :, None] >= 0)).any(axis=2).sum(axis=1)
    return float(hits.mean() / r)
