"""Fixed batch sizes for static-shape runtimes: pad a variable batch up to the next bucket."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

#: the buckets ``pad_batch`` uses unless told otherwise
DEFAULT_SIZES = (1, 8, 64, 256)


def pad_batch(x: Any, sizes: Sequence[int] = DEFAULT_SIZES) -> tuple[Any, int]:
    """Pad the rows of ``x`` with zeros up to the smallest size in ``sizes`` that holds them.

    A model compiled or exported for a few fixed batch sizes then serves any batch: run it on
    ``padded`` and keep the first ``n_valid`` rows of every output. Rows are independent in
    every vq export module, so the padding never changes the valid rows' results.

    Args:
        x: numpy array or torch tensor ``[n, ...]`` (any dtype: vectors or codes).
        sizes: the allowed batch sizes (positive integers, any order).

    Returns:
        ``(padded, n_valid)``: ``padded`` is ``[size, ...]``, of ``x``'s kind, dtype and device,
        ``x`` itself when n is already one of the sizes; ``n_valid`` is n.

    Raises:
        ValueError: n exceeds the largest size (split the batch into chunks of that size), or
            ``sizes`` is empty or holds a non-positive entry.
        TypeError: ``x`` is neither a numpy array nor a torch tensor.
    """
    if not isinstance(x, np.ndarray | torch.Tensor):
        raise TypeError(
            f"pad_batch: expected a numpy array or torch tensor, got {type(x).__name__}"
        )
    if x.ndim == 0:
        raise ValueError("pad_batch: expected a batch [n, ...], got a scalar")
    buckets = sorted(_check_sizes(sizes))
    n = int(x.shape[0])
    size = next((s for s in buckets if s >= n), None)
    if size is None:
        raise ValueError(
            f"pad_batch: a batch of {n} rows exceeds the largest size {buckets[-1]}; split it "
            f"into chunks of {buckets[-1]} rows or add a larger size"
        )
    if size == n:
        return x, n
    shape = (size - n, *x.shape[1:])
    if isinstance(x, np.ndarray):
        return np.concatenate([x, np.zeros(shape, dtype=x.dtype)]), n
    return torch.cat([x, x.new_zeros(shape)]), n


def _check_sizes(sizes: Sequence[int]) -> list[int]:
    try:
        out = [int(s) for s in sizes]
    except (TypeError, ValueError) as err:
        raise TypeError(f"pad_batch: sizes must be a sequence of integers, got {sizes!r}") from err
    if not out or min(out) <= 0 or any(s != t for s, t in zip(out, sizes, strict=True)):
        raise ValueError(f"pad_batch: sizes must be positive integers, got {tuple(sizes)!r}")
    return out
