"""Input checks and numpy/torch conversion shared by every public entry point.

Errors say what was expected and what came (``expected vectors of dim 128, got 96``). The checks
that read tensor values (NaN/Inf, code ranges) run only in eager mode, so that the same functions
can be traced, compiled and exported with static shapes.

The dtype policy, in one place:

- vectors: float32 is used as it is; float64 is converted to float32 (values beyond float32's
  range are refused, not turned into infinities); float16/bfloat16 are converted to float32, or
  kept by callers that accumulate them in float32 a chunk at a time (``keep_half``); integer,
  bool and complex input is a ``TypeError`` (convert explicitly: integer vectors are often codes
  or ids passed by mistake).
- the indexes also refuse vectors of norm beyond :data:`MAX_NORM` (1e18), whose squared
  distances would overflow float32 (``check_vectors(..., max_norm=MAX_NORM)``).
- codes and ids: any integer dtype; floating-point codes/ids are a ``TypeError``.
- numpy arrays and torch tensors on any device are accepted, contiguous or not (numpy input is
  shared, not copied, where the dtype allows); Python lists are a ``TypeError`` (wrap them with
  ``np.asarray``), as are sparse and meta tensors.
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
    onnx = sys.modules.get("torch.onnx")  # not imported: no export (importing it costs 50 ms)
    in_export = getattr(onnx, "is_in_onnx_export", None)
    return not (in_export is not None and in_export())


def _dtype_name(dtype: torch.dtype) -> str:
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
            f"got {_dtype_name(t.dtype)}; convert with .astype(np.float32) or .float()"
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
#: that no distance overflows to +inf or NaN (finite float32 vectors near 1e19 did, and
#: searches returned ids in no order, or none)
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
        with np.errstate(all="ignore"):  # numpy: a few µs less per call than torch
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


def is_integer(value: Any) -> bool:
    """Whether ``value`` is an integer: a Python or numpy integer, not a bool."""
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def check_flag(value: Any, name: str) -> bool:
    """``value`` as a Python bool if it is one (or a numpy bool): for the on/off options of a
    constructor (``spill``, ``sketch``, ``by_residual``, ``fast_scan``), where a string such
    as ``"no"`` would otherwise switch the option on; anything else is a TypeError."""
    if not isinstance(value, bool | np.bool_):
        raise TypeError(f"{name} must be True or False, got {value!r} ({type(value).__name__})")
    return bool(value)


def check_int(value: Any, name: str, minimum: int | None = None, maximum: int | None = None) -> int:
    """``value`` as a Python int: integers (Python or numpy, not bool) at least ``minimum``
    and at most ``maximum`` (constructor arguments: a wrong type is a TypeError, a wrong value
    a ValueError naming the accepted range)."""
    if not is_integer(value):
        raise TypeError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")
    if minimum is not None and value < minimum:
        what = "positive" if minimum == 1 else f">= {minimum}"
        raise ValueError(f"{name} must be {what}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be at most {maximum}, got {value}")
    return int(value)


#: seeds are integers in [0, 2**63) (what torch and numpy generators take, and JSON keeps)
SEED_MAX = (1 << 63) - 1


def check_seed(value: Any, name: str = "seed") -> int:
    """A random seed: an integer in [0, 2**63) (None is refused: a saved index must rebuild
    and retrain the same way, so its seed is a number)."""
    if value is None:
        raise TypeError(f"{name} must be an integer in [0, 2**63), got None; pick a number")
    return check_int(value, name, 0, SEED_MAX)


def check_real(value: Any, name: str, minimum: float = 0.0) -> float:
    """``value`` as a Python float: a finite real number (int or float, numpy's too, not
    bool) at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise TypeError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
    v = float(value)
    if not (minimum <= v < float("inf")):
        raise ValueError(f"{name} must be a finite number >= {minimum:g}, got {value!r}")
    return v


def check_positive(value: Any, name: str, what: str = "a positive integer") -> int:
    """``value`` as a Python int if it is an integer >= 1 (Python or numpy, not bool): for the
    options of a call (``k``, ``nprobe``, ``k_factor``, a batch size), where any bad value, of
    whatever type, is one ValueError: ``"{name} must be {what}, got {value!r}"``."""
    if not is_integer(value) or value < 1:
        raise ValueError(f"{name} must be {what}, got {value!r}")
    return int(value)


def check_training_size(n: int, k: int, what: str) -> None:
    if not is_integer(k):
        raise TypeError(f"{what}: k must be an integer number of centroids, got {k!r}")
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


def _integer_tensor(x: Any, name: str, what: str) -> torch.Tensor:
    t = as_tensor(x, name)
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise TypeError(f"{name}: expected {what}, got {_dtype_name(t.dtype)}")
    return t


def as_codes(codes: Any, n_tables: int | None, codebook_size: int, name: str = "codes"):
    """Validate integer codes ``[..., n_tables]`` (``[...]`` when n_tables is None); the integer
    dtype is kept (uint8 codes are not widened)."""
    t = _integer_tensor(codes, name, "integer codes")
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


def as_ids(
    ids: Any, n: int | None = None, name: str = "ids", *, unique: bool = True, stored: bool = True
):
    """Validate vector ids: int64 [n] (any shape when ``n`` is None, flattened) below 2**63;
    ``stored`` refuses negative ids (-1 marks a missing result), ``unique`` repeated ones.
    Python ints, lists and ranges are accepted.

    Returns:
        int64 Tensor[n] on the ids' device.
    """
    if isinstance(ids, int | np.integer | list | tuple | range) and not isinstance(ids, bool):
        try:
            ids = np.asarray(ids)
        except (ValueError, OverflowError) as err:
            raise TypeError(f"{name}: expected a flat list of integer ids ({err})") from err
        if ids.dtype == object:
            raise TypeError(f"{name}: expected integer ids, got Python objects")
        if ids.size == 0:
            ids = ids.astype(np.int64)  # np.asarray([]) is float64
    t = _integer_tensor(ids, name, "integers")
    if n is not None and tuple(t.shape) != (n,):
        raise ValueError(f"{name}: expected shape ({n},) to match x, got {tuple(t.shape)}")
    t = t.reshape(-1)
    if t.dtype == torch.uint64 and t.numel():  # torch has no max() for uint64
        top = int(t.cpu().numpy().max())
        if top >= 1 << 63:
            raise ValueError(f"{name}: ids must be below 2**63, got {top}")
    t = t.to(torch.int64)
    if t.numel() and is_eager():
        lo = int(t.min())
        if stored and lo < 0:
            raise ValueError(f"{name}: ids must be >= 0 (-1 marks a missing result), got {lo}")
        if unique and t.numel() > 1:
            s = torch.sort(t).values
            same = s[1:] == s[:-1]
            if bool(same.any()):
                first = int(s[1:][same][0])
                raise ValueError(
                    f"{name}: id {first} appears more than once; every stored vector needs its "
                    "own id"
                )
    return t
