"""Per-code sums of assigned vectors, the EMA statistic ``Σ_{x→k} w·x``.

On the CPU, in eager mode, a numba kernel accumulates them in one pass (torch's ``index_add_``
dispatches once per row, and its multi-threaded ``scatter_add_`` is slower than one thread);
everywhere else — CUDA, and graphs being compiled or exported — it is ``scatter_add_``.
"""

from __future__ import annotations

import numpy as np
import torch

from vq import _cpu
from vq.kernels.jit.cache import kernel


@kernel(fastmath=True, nogil=True)
def _cluster_sums(x, codes, weight, sums):
    """``sums[codes[i]] += weight[i] * x[i]`` for every row i (weight empty: 1).

    Serial and row-major: one pass over x (n · d multiply-adds), and no thread hand-off
    between torch's and numba's pools in the middle of a training step (which costs more than
    the work when other processes hold the cores).

    Args:
        x: float32 [n, d]; codes: int64 [n] in [0, len(sums)); weight: float32 [n] or [0];
        sums: float32 [k, d], accumulated into.
    """
    n, d = x.shape
    weighted = weight.shape[0] == n
    for i in range(n):  # rows indexed in place: a row view costs two atomic reference counts
        c = codes[i]
        if weighted:
            w = weight[i]
            for j in range(d):
                sums[c, j] += w * x[i, j]
        else:
            for j in range(d):
                sums[c, j] += x[i, j]


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
