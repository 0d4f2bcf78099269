"""The plumbing every command line shares: one-line errors with exit status 2, vector and
ground-truth files, thread counts, recall lines.

    status = run_command(build, argv)           # bad input: "error: …" on stderr, returns 2
    x = read_vectors(path, "train")             # .fvecs / .bvecs / .hdf5 -> float32 [n, d]
    truth = read_neighbors(gt_path, len(q))     # .ivecs / .hdf5 -> int64 [nq, k], rows checked
    line += "; " + recall_summary(ids, truth, k)   # "recall@1 0.9, recall@10 0.95"
    set_threads(args.threads)                   # torch and vq (and faiss with faiss=True)
    _, seconds = timed(lambda: index.train(x))  # a call and its wall time
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vq.datasets import read_ann_hdf5, read_bvecs, read_fvecs, read_ivecs, recall_at, write_ivecs
from vq.kernels.threads import set_num_threads


class InputError(Exception):
    """Bad input from the command line: reported in one line, exit status 2."""


#: the errors a command reports as bad input (one line, exit status 2) rather than a traceback
INPUT_ERRORS = (InputError, ValueError, TypeError, FileNotFoundError, RuntimeError)


def report_error(err: BaseException) -> int:
    """Print the first line of ``err`` as ``error: …`` on stderr; returns the exit status, 2."""
    print(f"error: {err}".splitlines()[0], file=sys.stderr)
    return 2


def run_command(command: Callable[[list[str]], int], argv: list[str]) -> int:
    """``command(argv)``'s exit status, or 2 after :func:`report_error` when it raises one of
    :data:`INPUT_ERRORS` (argparse's own exits pass through)."""
    try:
        return command(argv)
    except INPUT_ERRORS as err:
        return report_error(err)


def read_vectors(path: Path, what: str = "train") -> np.ndarray:
    """float32 [n, d] from .fvecs / .bvecs, or the ``what`` set ("train"/"test") of an
    ann-benchmarks .hdf5 file."""
    suffix = path.suffix.lower()
    if suffix == ".fvecs":
        return read_fvecs(path)
    if suffix == ".bvecs":
        return read_bvecs(path).astype(np.float32)
    if suffix in (".hdf5", ".h5"):
        return getattr(read_ann_hdf5(path), what)
    raise InputError(f"{path}: unknown vector file type {suffix!r}; use .fvecs, .bvecs or .hdf5")


def read_neighbors(path: Path, queries: int | None = None) -> np.ndarray:
    """int64 [nq, k] exact neighbours from .ivecs or the ``neighbors`` of an .hdf5 file; with
    ``queries``, refuses a file whose row count is not that number of queries."""
    suffix = path.suffix.lower()
    if suffix == ".ivecs":
        truth = read_ivecs(path).astype(np.int64)
    elif suffix in (".hdf5", ".h5"):
        truth = read_ann_hdf5(path).neighbors
    else:
        raise InputError(f"{path}: unknown ground-truth file type {suffix!r}; use .ivecs or .hdf5")
    if queries is not None and truth.shape[0] != queries:
        raise InputError(f"{path}: {truth.shape[0]} rows of neighbours for {queries} queries")
    return truth


def recall_summary(ids: np.ndarray, truth: np.ndarray, k: int) -> str:
    """``"recall@1 …, recall@10 …, recall@100 …"`` for the ranks up to ``k`` and the depth of
    ``truth`` (int [nq, >= r]; see :func:`vq.datasets.recall_at`), four decimals each."""
    ranks = [r for r in (1, 10, 100) if r <= min(k, truth.shape[1])]
    return ", ".join(f"recall@{r} {recall_at(ids, truth, r):.4f}" for r in ranks)


def report_search(line: str, ids: np.ndarray, k: int, gt: Path | None, out: Path | None) -> None:
    """Print a search's summary ``line``, with the recall against the ground truth ``gt`` if
    given, and write the ``ids`` found to ``out`` (.ivecs) if given."""
    if gt is not None:
        line += "; " + recall_summary(ids, read_neighbors(gt, ids.shape[0]), k)
    print(line)
    if out is not None:
        write_ivecs(out, ids)


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
