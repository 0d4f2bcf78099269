"""Checks of integer inputs: codes (any integer dtype, kept) and vector ids (int64, below 2**63,
non-negative and unique where stored), and the smallest dtype that holds a codebook's codes."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from vq._checks.vectors import as_tensor, dtype_name, is_eager


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
        raise TypeError(f"{name}: expected {what}, got {dtype_name(t.dtype)}")
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
