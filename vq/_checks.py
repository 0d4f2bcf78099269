"""Input checks and numpy/torch conversion shared by every public entry point.

Errors say what was expected and what came (``expected vectors of dim 128, got 96``). The checks
that read tensor values (NaN/Inf, code ranges) run only in eager mode, so that the same functions
can be traced, compiled and exported with static shapes.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def is_eager() -> bool:
    """False while torch.compile, TorchScript tracing or ONNX export is recording a graph."""
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return False
    in_export = getattr(torch.onnx, "is_in_onnx_export", None)
    return not (in_export is not None and in_export())


def as_tensor(x: Any, name: str) -> torch.Tensor:
    """A torch view of ``x`` (numpy arrays are shared, not copied, where the dtype allows)."""
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, np.ndarray):
        if x.dtype.byteorder == ">":
            x = x.astype(x.dtype.newbyteorder("="))
        try:
            with warnings.catch_warnings():  # read-only arrays (memmaps): we never write to them
                warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
                return torch.from_numpy(x)
        except TypeError as err:  # object arrays, unsupported dtypes
            raise TypeError(f"{name}: unsupported numpy dtype {x.dtype}") from err
    raise TypeError(f"{name}: expected a numpy array or torch tensor, got {type(x).__name__}")


def as_vectors(
    x: Any,
    dim: int | None,
    name: str = "x",
    *,
    matrix: bool = True,
    keep_half: bool = False,
) -> torch.Tensor:
    """Validate a batch of vectors and return it as a floating-point tensor.

    Args:
        x: numpy array or torch tensor, ``[n, dim]`` (or ``[..., dim]`` when ``matrix`` is False).
        dim: expected size of the last axis, or None to accept any.
        name: how the argument is called in error messages.
        matrix: require exactly two axes.
        keep_half: keep float16/bfloat16 as they are (callers that accumulate in float32 per
            chunk); otherwise every floating dtype becomes float32.

    Returns:
        A tensor on ``x``'s device, detached from autograd (numpy input shares memory when no
        conversion is needed).
    """
    t = as_tensor(x, name)
    if t.dtype == torch.bool or not (t.is_floating_point()):
        raise TypeError(
            f"{name}: expected floating-point vectors (float32, float16, bfloat16 or float64), "
            f"got {str(t.dtype).replace('torch.', '')}; convert with .astype(np.float32) "
            "or .float()"
        )
    if matrix and t.dim() != 2:
        raise ValueError(f"{name}: expected a 2-D array [n, dim], got shape {tuple(t.shape)}")
    if t.dim() == 0:
        raise ValueError(f"{name}: expected vectors [..., dim], got a scalar")
    if dim is not None and t.shape[-1] != dim:
        raise ValueError(f"{name}: expected vectors of dim {dim}, got {t.shape[-1]}")
    t = t.detach()
    if not (keep_half and t.dtype in _FLOAT_DTYPES):
        t = t.float()
    if is_eager():
        check_finite(t, name)
    return t


def check_finite(t: torch.Tensor, name: str) -> None:
    """Raise ValueError naming the count of NaN/Inf values and the first row holding one."""
    if t.numel() == 0 or bool(torch.isfinite(t.sum())):
        return  # one fast pass: a NaN/Inf anywhere makes the sum non-finite
    bad = ~torch.isfinite(t)  # (a finite sum may also overflow: then this finds nothing)
    if bool(bad.any()):
        rows = bad.reshape(-1, t.shape[-1]).any(dim=1)
        first = int(torch.argmax(rows.to(torch.uint8)))
        raise ValueError(
            f"{name}: {int(bad.sum())} NaN/Inf values, first in row {first}; "
            "remove or replace them before quantizing"
        )


def check_training_size(n: int, k: int, what: str) -> None:
    if k <= 0:
        raise ValueError(f"{what}: k must be a positive number of centroids, got {k}")
    if n == 0:
        raise ValueError(f"{what}: got an empty training set (0 vectors)")
    if n < k:
        raise ValueError(
            f"{what}: needs at least k={k} training vectors, got {n}; "
            "give more vectors or ask for fewer centroids"
        )


def like_input(result: torch.Tensor, original: Any) -> Any:
    """Return ``result`` as numpy when the user passed numpy, else as a tensor on their device."""
    if isinstance(original, np.ndarray):
        return result.detach().cpu().numpy()
    if isinstance(original, torch.Tensor) and result.device != original.device:
        return result.to(original.device)
    return result


def code_dtype(codebook_size: int) -> torch.dtype:
    """Smallest integer dtype holding codes in [0, codebook_size): uint8, int16, int32 or int64."""
    if codebook_size <= 1 << 8:
        return torch.uint8
    if codebook_size <= 1 << 15:
        return torch.int16
    if codebook_size <= 1 << 31:
        return torch.int32
    return torch.int64


def as_codes(codes: Any, n_tables: int | None, codebook_size: int, name: str = "codes"):
    """Validate integer codes ``[..., n_tables]`` (``[...]`` when n_tables is None); the integer
    dtype is kept (uint8 codes are not widened)."""
    t = as_tensor(codes, name)
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise TypeError(f"{name}: expected integer codes, got {str(t.dtype).replace('torch.', '')}")
    if n_tables is not None and (t.dim() == 0 or t.shape[-1] != n_tables):
        got = "a scalar" if t.dim() == 0 else f"shape {tuple(t.shape)}"
        raise ValueError(f"{name}: expected codes [..., {n_tables}], got {got}")
    if is_eager() and t.numel() > 0:
        lo, hi = int(t.min()), int(t.max())
        if lo < 0 or hi >= codebook_size:
            raise ValueError(
                f"{name}: codes must lie in [0, {codebook_size}), got values in [{lo}, {hi}]"
            )
    return t
