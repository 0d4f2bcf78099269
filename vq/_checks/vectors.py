"""Checks of vectors (shape, floating dtype, finite values, norms), their conversion to the
floating dtype the library computes in, and back to the caller's kind of array.

The checks that read tensor values run only in eager mode (:func:`is_eager`), so that the same
functions can be traced, compiled and exported with static shapes.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_FLOAT32_MAX = float(torch.finfo(torch.float32).max)


def is_eager() -> bool:
    """False while torch.compile, TorchScript tracing or ONNX export is recording a graph."""
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return False
    # torch.onnx not imported yet: no export runs (importing it here would slow every check)
    onnx = sys.modules.get("torch.onnx")
    in_export = getattr(onnx, "is_in_onnx_export", None)
    return not (in_export is not None and in_export())


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` → ``"float32"``."""
    return str(dtype).replace("torch.", "")


def as_tensor(x: Any, name: str) -> torch.Tensor:
    """A torch view of ``x`` (numpy arrays are shared, not copied, where the dtype allows)."""
    if isinstance(x, torch.Tensor):
        if x.layout != torch.strided:
            raise TypeError(
                f"{name}: expected a dense tensor, got layout {x.layout}; call .to_dense()"
            )
        if x.is_meta:
            raise TypeError(f"{name}: a tensor on the meta device holds no data")
        return x
    if isinstance(x, np.ndarray):
        if x.dtype.byteorder == ">":
            x = x.astype(x.dtype.newbyteorder("="))
        if any(stride < 0 for stride in x.strides):  # x[::-1]: torch cannot view it
            x = np.ascontiguousarray(x)
        try:
            if x.flags.writeable:
                return torch.from_numpy(x)
            with warnings.catch_warnings():  # read-only arrays (memmaps): we never write to them
                warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
                return torch.from_numpy(x)
        except TypeError as err:  # object arrays, unsupported dtypes
            raise TypeError(f"{name}: unsupported numpy dtype {x.dtype}") from err
    hint = "; wrap it with np.asarray(...)" if isinstance(x, list | tuple) else ""
    raise TypeError(f"{name}: expected a numpy array or torch tensor, got {type(x).__name__}{hint}")


def check_vectors(
    x: Any,
    dim: int | None,
    name: str = "x",
    *,
    matrix: bool = True,
    max_norm: float | None = None,
) -> torch.Tensor:
    """Validate a batch of vectors without converting it: shape, floating dtype, finite values.

    Args:
        x: numpy array or torch tensor, ``[n, dim]`` (or ``[..., dim]`` when ``matrix`` is False).
        dim: expected size of the last axis, or None to accept any (but 0).
        name: how the argument is called in error messages.
        matrix: require exactly two axes.
        max_norm: refuse vectors whose norm is beyond it (the indexes pass :data:`MAX_NORM`:
            see :func:`check_norms`); with it the values are checked in one pass, a dot
            product of all of them, where every vector is within the bound.

    Returns:
        ``x`` as a tensor in its own floating dtype, on its own device, detached from autograd.
        float64 values are known to fit float32: convert with ``.float()`` (a chunk at a time,
        for big batches).
    """
    t = as_tensor(x, name)
    if t.dtype == torch.bool or not t.is_floating_point():
        raise TypeError(
            f"{name}: expected floating-point vectors (float32, float16, bfloat16 or float64), "
            f"got {dtype_name(t.dtype)}; convert with .astype(np.float32) or .float()"
        )
    if matrix and t.dim() != 2:
        raise ValueError(f"{name}: expected a 2-D array [n, dim], got shape {tuple(t.shape)}")
    if t.dim() == 0:
        raise ValueError(f"{name}: expected vectors [..., dim], got a scalar")
    if dim is not None and t.shape[-1] != dim:
        raise ValueError(f"{name}: expected vectors of dim {dim}, got {t.shape[-1]}")
    if t.shape[-1] == 0:
        raise ValueError(f"{name}: expected vectors of dim >= 1, got shape {tuple(t.shape)}")
    t = t.detach()
    if is_eager() and not (max_norm is not None and norms_within(t, max_norm)):
        check_finite(t, name)
        if t.dtype == torch.float64:
            _check_float32_range(t, name)
        if max_norm is not None:
            check_norms(t, name, max_norm)
    return t


#: the largest norm of a vector an index stores or searches (``Index.add``, ``train``,
#: ``search``, ``range_search``): the squared distances between such vectors (at most
#: 4 · MAX_NORM²) and the sums the scans build from them (IVF-PQ's ``‖x - c‖² + ‖r‖² + 2⟨c, r⟩
#: - 2⟨x, r⟩``, at most 16 · MAX_NORM²) stay far below float32's largest value (3.4e38), so
#: that no distance overflows to +inf or NaN
MAX_NORM = 1e18


def norms_within(t: torch.Tensor, max_norm: float) -> bool:
    """Whether every vector (row of the last axis) of the float tensor ``t`` is finite and of
    norm at most ``max_norm``, by one pass: the sum of all squared values (a BLAS dot product
    for contiguous float32 / float64 CPU arrays) is at most ``max_norm²``. False also where
    that sum overflows, is NaN or exceeds the bound while each row is within it (a big
    batch): :func:`check_norms` then looks row by row."""
    if t.numel() == 0:
        return True
    if t.device.type == "cpu" and t.dtype in (torch.float32, torch.float64) and t.is_contiguous():
        a = t.numpy()
        total = float(np.vdot(a, a))  # (BLAS: no floating-point warning on an overflow)
    else:
        wide = torch.float64 if t.dtype == torch.float64 else torch.float32
        total = float(torch.linalg.vector_norm(t, dtype=wide)) ** 2
    return total <= max_norm * max_norm


def check_norms(t: torch.Tensor, name: str, max_norm: float = MAX_NORM) -> None:
    """ValueError naming how many vectors (rows of the last axis) of the finite float tensor
    ``t`` have a norm beyond ``max_norm``, and the first of them; norms computed in float64,
    a chunk of rows at a time."""
    rows = t.reshape(-1, t.shape[-1])
    bad, first, norm = 0, -1, 0.0
    for s in range(0, rows.shape[0], 1 << 16):
        norms = torch.linalg.vector_norm(rows[s : s + (1 << 16)], dim=1, dtype=torch.float64)
        over = norms > max_norm
        count = int(over.sum())
        if count and first < 0:
            at = int(torch.argmax(over.to(torch.uint8)))
            first, norm = s + at, float(norms[at])
        bad += count
    if bad:
        raise ValueError(
            f"{name}: {bad} vector{'s' if bad > 1 else ''} of norm beyond {max_norm:g} (first: "
            f"row {first}, norm "
            f"{norm:.3g}), whose squared distances overflow float32; rescale the vectors "
            "(dividing all of them by one number keeps every ranking)"
        )


def _check_float32_range(t: torch.Tensor, name: str) -> None:
    """float64 vectors become float32: refuse values that would turn into infinities."""
    if not t.numel():
        return
    lo, hi = torch.aminmax(t)
    if max(-float(lo), float(hi)) <= _FLOAT32_MAX:
        return
    bad = t.abs() > _FLOAT32_MAX
    rows = bad.reshape(-1, t.shape[-1]).any(dim=1)
    raise ValueError(
        f"{name}: {int(bad.sum())} float64 values beyond float32's range "
        f"(±{_FLOAT32_MAX:.4g}), first in row {int(torch.argmax(rows.to(torch.uint8)))}; "
        "rescale the vectors"
    )


def in_chunks(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, rows: int):
    """``fn(x)`` computed ``rows`` rows of ``x`` at a time into one output (row i of the output
    comes from row i of ``x``), so that fn's temporary memory stays that of one chunk. One call
    when ``x`` has at most ``rows`` rows, or while a graph is being recorded (static shapes)."""
    if not is_eager() or x.shape[0] <= rows:
        return fn(x)
    first = fn(x[:rows])
    out = first.new_empty((x.shape[0], *first.shape[1:]))
    out[:rows] = first
    for s in range(rows, x.shape[0], rows):
        out[s : s + rows] = fn(x[s : s + rows])
    return out


def as_vectors(
    x: Any,
    dim: int | None,
    name: str = "x",
    *,
    matrix: bool = True,
    keep_half: bool = False,
    max_norm: float | None = None,
) -> torch.Tensor:
    """Validate a batch of vectors and return it as a floating-point tensor.

    Args:
        x: numpy array or torch tensor, ``[n, dim]`` (or ``[..., dim]`` when ``matrix`` is False).
        dim: expected size of the last axis, or None to accept any.
        name: how the argument is called in error messages.
        matrix: require exactly two axes.
        keep_half: keep float16/bfloat16 as they are (callers that accumulate in float32 per
            chunk); otherwise every floating dtype becomes float32.
        max_norm: as :func:`check_vectors`'s.

    Returns:
        A tensor on ``x``'s device, detached from autograd (numpy input shares memory when no
        conversion is needed).
    """
    t = check_vectors(x, dim, name, matrix=matrix, max_norm=max_norm)
    if keep_half and t.dtype in _FLOAT_DTYPES:
        return t
    return t.float()


def check_finite(t: torch.Tensor, name: str) -> None:
    """Raise ValueError naming the count of NaN/Inf values and the first row holding one."""
    if t.numel() == 0:
        return
    # one fast pass: a NaN/Inf anywhere makes the sum non-finite (half precision is summed in
    # float32, which seldom overflows; a finite sum that does overflow finds nothing below)
    wide = torch.float64 if t.dtype == torch.float64 else torch.float32
    if t.device.type == "cpu" and t.dtype in (torch.float32, torch.float64):
        with np.errstate(all="ignore"):
            if np.isfinite(t.numpy().sum()):
                return
    elif bool(torch.isfinite(t.sum(dtype=wide))):
        return
    bad = ~torch.isfinite(t)
    if bool(bad.any()):
        rows = bad.reshape(-1, t.shape[-1]).any(dim=1)
        first = int(torch.argmax(rows.to(torch.uint8)))
        raise ValueError(
            f"{name}: {int(bad.sum())} NaN/Inf values, first in row {first}; "
            "remove or replace them before quantizing"
        )


def like_input(result: torch.Tensor, original: Any) -> Any:
    """Return ``result`` as numpy when the user passed numpy, else as a tensor on their device."""
    if isinstance(original, np.ndarray):
        return result.detach().cpu().numpy()
    if isinstance(original, torch.Tensor) and result.device != original.device:
        return result.to(original.device)
    return result
