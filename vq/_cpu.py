"""When the numba kernels serve a tensor, and how their outputs are allocated."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch

from vq._checks import is_eager

_NUMPY_DTYPES = {
    torch.float32: np.float32,
    torch.int64: np.int64,
    torch.int32: np.int32,
    torch.int16: np.int16,
    torch.uint8: np.uint8,
}


_disabled = False


def fast_path(x: torch.Tensor) -> bool:
    """Whether the numba kernels may serve ``x``: eager mode, CPU, no autograd, not disabled."""
    return x.device.type == "cpu" and is_eager() and not x.requires_grad and not _disabled


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
