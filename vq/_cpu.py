"""When the numba kernels serve a tensor, and how their outputs are allocated."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch

from vq._checks import is_eager
from vq.kernels.common import threads

_NUMPY_DTYPES = {
    torch.float32: np.float32,
    torch.int64: np.int64,
    torch.int32: np.int32,
    torch.int16: np.int16,
    torch.uint8: np.uint8,
}


class _Local(threading.local):
    disabled = False  # inside torch_only() on this thread


_local = _Local()


def fast_path(x: torch.Tensor) -> bool:
    """Whether the numba kernels may serve ``x``: eager mode, CPU, no autograd, not disabled."""
    return x.device.type == "cpu" and is_eager() and not x.requires_grad and not _local.disabled


def numpy_path() -> bool:
    """Whether the numba kernels may serve numpy arrays (the lean path of small searches):
    not inside :func:`torch_only`."""
    return not _local.disabled


#: below this much work (estimated single-threaded nanoseconds) the kernels run on the
#: calling thread alone: waking the thread pool (once per parallel kernel) costs more than
#: such a call gains from a second thread (docs/perf/threads.md)
SERIAL_WORK = 200_000


@contextmanager
def serial_if_small(work: float) -> Iterator[None]:
    """Run the numba kernels inside on the calling thread alone when ``work`` is below
    :data:`SERIAL_WORK`; other threads are unaffected."""
    if work >= SERIAL_WORK:
        yield
        return
    with threads.serial():
        yield


@contextmanager
def torch_only() -> Iterator[None]:
    """Run everything inside, on the calling thread, on the device-agnostic torch path (the
    one CUDA tensors and exported graphs take), bypassing the numba kernels: for tests and
    comparisons, and for the searches whose kernels are still compiling
    (:mod:`vq.kernels.jit.background`)."""
    previous, _local.disabled = _local.disabled, True
    try:
        yield
    finally:
        _local.disabled = previous


def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy dtype of a torch dtype the kernels use (float32, int64, int32, int16, uint8)."""
    return np.dtype(_NUMPY_DTYPES[dtype])


def empty(shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """An uninitialised CPU tensor backed by numpy memory: numpy asks for huge pages on large
    arrays, so that first-touch writes fault once per huge page rather than once per 4 KiB
    page, as into ``torch.empty``'s memory."""
    return torch.from_numpy(np.empty(shape, dtype=_NUMPY_DTYPES[dtype]))
