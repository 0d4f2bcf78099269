"""Per-code sums of assigned vectors, the EMA statistic ``Σ_{x→k} w·x``.

On the CPU, in eager mode, a numba kernel accumulates them in one pass (torch's ``index_add_``
loops over rows serially, and ``scatter_add_`` reads an index per element); everywhere else —
CUDA, and graphs being compiled or exported — it is ``scatter_add_``.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit, prange

from vq import _cpu

_COLUMNS = 32  # columns per parallel task: no two tasks write the same element


@njit(parallel=True, fastmath=True, nogil=True, cache=True)
def _cluster_sums(x, codes, weight, sums):
    """``sums[codes[i]] += weight[i] * x[i]`` for every row i (weight empty: 1).

    Args:
        x: float32 [n, d]; codes: int64 [n] in [0, len(sums)); weight: float32 [n] or [0];
        sums: float32 [k, d], accumulated into.
    """
    n, d = x.shape
    weighted = weight.shape[0] == n
    for block in prange((d + _COLUMNS - 1) // _COLUMNS):
        lo = block * _COLUMNS
        hi = min(d, lo + _COLUMNS)
        for i in range(n):
            row, out = x[i], sums[codes[i]]
            w = weight[i] if weighted else np.float32(1.0)
            for j in range(lo, hi):
                out[j] += w * row[j]


def cluster_sums(
    x: torch.Tensor, codes: torch.Tensor, size: int, weight: torch.Tensor | None = None
) -> torch.Tensor:
    """Sums of the rows of ``x`` per code.

    Args:
        x: float32 Tensor[n, d]; codes: integer Tensor[n] in [0, size);
        weight: optional float Tensor[n] multiplying each row.

    Returns:
        float32 Tensor[size, d].
    """
    d = x.shape[1]
    if _cpu.fast_path(x) and x.dtype == torch.float32:
        sums = torch.zeros(size, d)
        w = np.empty(0, np.float32) if weight is None else weight.float().contiguous().numpy()
        _cluster_sums(x.contiguous().numpy(), codes.long().contiguous().numpy(), w, sums.numpy())
        return sums
    rows = x if weight is None else x * weight[:, None]
    index = codes.long().reshape(-1, 1).expand(-1, d)
    return torch.zeros(size, d, device=x.device, dtype=x.dtype).scatter_add_(0, index, rows)
