"""The plumbing vq's command lines share once their arguments have parsed: input files checked
before any work, outputs checked before any work, thread counts, recall lines.

    source = open_input(args.data, "train")     # any vector file; refuses an empty one
    metric = metric_for(args.metric, source)    # --metric, else what the file says, else l2
    check_writable(args.output, "-o")           # before hours of training, not after
    x = source.read()                           # float32 [n, d]
    truth = read_truth(gt_path, len(q), index)  # int64 [nq, k], rows and metric checked
    check_k(args.k, index.ntotal, len(q))       # before allocating the results
    line += "; " + recall_summary(ids, truth, k)   # "recall@1 0.9, recall@10 0.95"
    set_threads(args.threads)                   # torch and vq (and faiss with faiss=True)
    _, seconds = timed(lambda: index.train(x))  # a call and its wall time

Errors are :class:`~vq.apps.errors.InputError` (one line, exit status 2).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError

from vq.apps.errors import INPUT_ERRORS, InputError, report_error, run_command
from vq.datasets import (
    VectorFile,
    open_neighbors,
    open_vectors,
    recall_at,
    write_ibin,
    write_ivecs,
)
from vq.kernels.common.threads import set_num_threads
from vq.parallel.atomic import atomic_file

__all__ = [
    "INPUT_ERRORS",
    "InputError",
    "check_k",
    "check_writable",
    "faiss_available",
    "metric_for",
    "open_input",
    "read_truth",
    "read_vectors",
    "recall_summary",
    "report_error",
    "report_search",
    "run_command",
    "set_threads",
    "timed",
    "write_ids",
    "writing",
]

#: bytes of one search result per query and neighbour: an int64 id and a float32 distance
_RESULT_BYTES = 12


def open_input(path: Path, what: str = "train") -> VectorFile:
    """The vector file at ``path`` checked (``what``: the dataset of an HDF5 file, "train" or
    "test"), reading only its headers; refuses a file of no vectors."""
    source = open_vectors(path, what)
    if source.shape[0] == 0:
        raise InputError(f"{path} holds no vectors")
    return source


def read_vectors(path: Path, what: str = "train") -> np.ndarray:
    """float32 [n, d]: every vector of the file at ``path`` (see :func:`open_input`)."""
    return open_input(path, what).read()


def metric_for(flag: str | None, source: VectorFile) -> str:
    """The metric to build with: ``--metric`` if given, else the one the file says its
    neighbours are by (an ann-benchmarks file's ``distance``), else "l2". Refuses a
    ``--metric`` that contradicts the file."""
    if flag is None:
        return source.metric or "l2"
    if source.metric is not None and source.metric != flag:
        raise InputError(
            f"{source.path}: the file's neighbours are by {source.metric} distance, but "
            f"--metric {flag} was given; drop --metric to build a {source.metric} index"
        )
    return flag


def read_truth(path: Path, queries: int, index: Any) -> np.ndarray:
    """int64 [queries, k]: the exact neighbours in ``path`` (.ivecs, .ibin, .npy, .hdf5),
    checked to hold one row per query and, where the file says its metric, to be by the
    ``index``'s."""
    truth = open_neighbors(path)
    if truth.shape[0] != queries:
        raise InputError(f"{path}: {truth.shape[0]} rows of neighbours for {queries} queries")
    metric = getattr(index, "metric", None)
    if truth.metric is not None and metric is not None and truth.metric != metric:
        raise InputError(
            f"{path}: its neighbours are by {truth.metric} distance, but the index searches "
            f"by {metric}: the recall would not mean anything; build the index with "
            f"--metric {truth.metric}"
        )
    return truth.read(dtype=np.int64)


def check_k(k: int, ntotal: int, queries: int) -> None:
    """Refuse ``-k`` larger than the vectors in the index, or whose results would not fit in
    this machine's memory, before anything is allocated."""
    if ntotal == 0:
        raise InputError("the index holds no vectors: add some (vq build) before searching")
    if k > ntotal:
        raise InputError(
            f"-k {k} is more than the {ntotal} vectors in the index; ask for at most {ntotal}"
        )
    need, total = k * queries * _RESULT_BYTES, _memory_bytes()
    if total is not None and need > total // 2:
        raise InputError(
            f"-k {k} for {queries} queries needs {need / 2**30:.1f} GiB of results, more than "
            f"half of this machine's {total / 2**30:.1f} GiB; search fewer queries at a time "
            "or ask for fewer neighbours"
        )


def _memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not POSIX
        return None


def check_writable(path: Path, flag: str) -> None:
    """Refuse, before any work, an output ``path`` that cannot be written: a directory, a
    missing directory, or a place where no file can be created (a read-only file system,
    /proc, no permission). A file is created next to ``path`` and deleted to find out."""
    if path.is_dir():
        raise InputError(f"{flag} {path} is a directory; give the path of a file inside it")
    parent = path.absolute().parent
    if not parent.is_dir():
        raise InputError(f"{flag} {path}: no directory {parent}; create it first")
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".probe", dir=parent)
    except OSError as err:
        raise InputError(
            f"{flag} {path}: cannot create a file in {parent} ({err.strerror or err}); "
            "write it somewhere else"
        ) from err
    os.close(fd)
    os.unlink(probe)


def writing(path: Path, write: Callable[[], Any]) -> Any:
    """``write()``'s result; a failure to write (the system's, or safetensors') becomes an
    :class:`InputError` naming ``path``."""
    try:
        return write()
    except (OSError, SafetensorError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise InputError(f"cannot write {path}: {reason}") from err


def write_ids(path: Path, ids: np.ndarray) -> None:
    """Write search results' ids [nq, k] as .ivecs, .ibin or .npy (by the suffix)."""
    suffix = path.suffix.lower()
    if suffix == ".npy":

        def write():
            with atomic_file(path) as f:
                np.save(f, np.asarray(ids, dtype=np.int64), allow_pickle=False)

    elif suffix == ".ibin":

        def write():
            write_ibin(path, ids)

    else:

        def write():
            write_ivecs(path, ids)

    writing(path, write)


def recall_summary(ids: np.ndarray, truth: np.ndarray, k: int) -> str:
    """``"recall@1 …, recall@10 …, recall@100 …"`` for the ranks up to ``k`` and the depth of
    ``truth`` (int [nq, >= r]; see :func:`vq.datasets.recall_at`), four decimals each."""
    ranks = [r for r in (1, 10, 100) if r <= min(k, truth.shape[1])]
    return ", ".join(f"recall@{r} {recall_at(ids, truth, r):.4f}" for r in ranks)


def report_search(
    line: str, ids: np.ndarray, k: int, truth: np.ndarray | None, out: Path | None
) -> None:
    """Print a search's summary ``line``, with the recall against ``truth`` (int [nq, >= 1])
    if given, and write the ``ids`` found to ``out`` (see :func:`write_ids`) if given."""
    if truth is not None:
        line += "; " + recall_summary(ids, truth, k)
    print(line)
    if out is not None:
        write_ids(out, ids)


def set_threads(threads: int | None, faiss: bool = False) -> None:
    """The same thread count for torch and vq's kernels (and faiss's OpenMP with ``faiss``);
    None leaves the defaults. Refuses a count below 1 (:class:`InputError`)."""
    if threads is None:
        return
    if threads <= 0:
        raise InputError(f"--threads must be positive, got {threads}")
    torch.set_num_threads(threads)
    set_num_threads(threads)
    if faiss:
        import faiss as faiss_module  # optional: only the jobs that compare with faiss need it

        faiss_module.omp_set_num_threads(threads)


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    """``fn()``'s result and the seconds it took (wall clock)."""
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def faiss_available() -> bool:
    """Whether faiss imports; if not, says so on stderr (the jobs then exit with status 2)."""
    try:
        import faiss  # noqa: F401
    except ImportError:
        print(
            "error: faiss is not installed; pip install 'vq[faiss]' (make demo does)",
            file=sys.stderr,
        )
        return False
    return True
