"""When the numba kernels serve a tensor, and how their outputs are allocated."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numba
import numpy as np
import torch
from numba import prange

from vq._checks import is_eager
from vq.kernels.cache import kernel

_NUMPY_DTYPES = {
    torch.float32: np.float32,
    torch.int64: np.int64,
    torch.int32: np.int32,
    torch.int16: np.int16,
    torch.uint8: np.uint8,
}


_disabled = False
_numba_started = False


def fast_path(x: torch.Tensor) -> bool:
    """Whether the numba kernels may serve ``x``: eager mode, CPU, no autograd, not disabled."""
    ok = x.device.type == "cpu" and is_eager() and not x.requires_grad and not _disabled
    if ok and not _numba_started:
        _start_numba_threads()
    return ok


def numpy_path() -> bool:
    """Whether the numba kernels may serve numpy arrays (the lean path of small searches):
    not inside :func:`torch_only`."""
    return not _disabled


def start_numba_threads() -> None:
    """Start numba's thread pool, keeping torch's thread count (see
    :func:`_start_numba_threads`), before a parallel kernel's first call on numpy arrays."""
    if not _numba_started:
        _start_numba_threads()


def _start_numba_threads() -> None:
    """Start numba's thread pool once, keeping torch's thread count: numba's OpenMP layer
    shares libgomp with torch and, when its pool starts, resets the count to numba's — which
    would silently undo ``torch.set_num_threads`` (and make compiled graphs recompile)."""
    global _numba_started
    threads = torch.get_num_threads()
    _touch(np.empty(2, np.int64))
    torch.set_num_threads(threads)
    _numba_started = True


@kernel(parallel=True)
def _touch(a):
    for i in prange(a.shape[0]):
        a[i] = i


#: below this much work (estimated single-threaded nanoseconds) the kernels run on the
#: calling thread alone: waking the thread pool costs tens of µs per parallel kernel, more
#: than such a call gains from a second thread
SERIAL_WORK = 200_000


@contextmanager
def serial_if_small(work: float) -> Iterator[None]:
    """Run the numba kernels inside (and torch operations that follow OpenMP's thread count)
    on the calling thread alone when ``work`` is below :data:`SERIAL_WORK` (a single query
    took ~1 ms with the pool, ~0.1 ms without). numba's thread count is per thread, so
    concurrent callers are unaffected."""
    if work >= SERIAL_WORK:
        yield
        return
    threads = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        yield
    finally:
        numba.set_num_threads(threads)


@contextmanager
def torch_only() -> Iterator[None]:
    """Run everything inside on the device-agnostic torch path (the one CUDA tensors and
    exported graphs take), bypassing the numba kernels: for tests and comparisons."""
    global _disabled
    previous, _disabled = _disabled, True
    try:
        yield
    finally:
        _disabled = previous


def empty(shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """An uninitialised CPU tensor backed by numpy memory: numpy asks for huge pages on large
    arrays, which makes first-touch writes several times faster than ``torch.empty``."""
    return torch.from_numpy(np.empty(shape, dtype=_NUMPY_DTYPES[dtype]))
