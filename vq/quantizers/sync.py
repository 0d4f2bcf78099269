"""Keeping codebook training state identical across processes (torch.distributed).

A quantizer layer communicates only while it updates its state: in training mode with gradients
enabled (see :meth:`vq.Quantizer.updates_state`). Eval and ``torch.no_grad()`` forwards never
call a collective, so a process that validates while another trains cannot hang them both.
Every call below is a collective: all processes of the default group must reach it together,
which they do because they run the same training step.

Collectives run on the tensors' device (CPU with gloo, CUDA with nccl). The helpers use the
in-place ``torch.distributed`` calls, which ``torch.compile`` rewrites to traceable functional
collectives.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def active() -> bool:
    """Whether a process group of more than one process is initialised."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """The elementwise sum of ``t`` over all processes (a new tensor)."""
    out = t.contiguous().clone()
    dist.all_reduce(out)
    return out


def all_gather(t: torch.Tensor) -> torch.Tensor:
    """Every process's ``t`` (same shape everywhere), stacked: Tensor[world_size, *t.shape]."""
    flat = t.contiguous().reshape(-1)
    out = flat.new_empty(dist.get_world_size() * flat.numel())
    dist.all_gather_into_tensor(out, flat)
    return out.reshape(-1, *t.shape)


def gather_rows(x: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """All processes' rows, for k-means initialisation (eager only: row counts may differ).

    Args:
        x: float Tensor[G, n, d], this process's vectors in G groups; weight: float Tensor[n].

    Returns:
        ``(x, weight)`` of every process in rank order, Tensor[G, W·n_max, d] and [W·n_max]; rows
        that pad a shorter process get weight 0.
    """
    n = torch.tensor([x.shape[1]], device=x.device)
    n_max = int(all_gather(n).max())
    pad = n_max - x.shape[1]
    x = torch.nn.functional.pad(x, (0, 0, 0, pad))
    weight = torch.nn.functional.pad(weight, (0, pad))
    xs, ws = all_gather(x), all_gather(weight)  # [W, G, n_max, d], [W, n_max]
    return xs.transpose(0, 1).reshape(x.shape[0], -1, x.shape[2]), ws.reshape(-1)


def broadcast_(t: torch.Tensor, src: int = 0) -> torch.Tensor:
    """Overwrite ``t`` with process ``src``'s values (in place; returns ``t``)."""
    dist.broadcast(t, src)
    return t


def rank() -> int:
    return dist.get_rank()
