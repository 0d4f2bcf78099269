"""Keeping a quantizer layer's codebook training state identical across processes.

A quantizer layer communicates only while it updates its state: in training mode with gradients
enabled (see :meth:`vq.Quantizer.updates_state`). Eval and ``torch.no_grad()`` forwards never
call a collective, so a process that validates while another trains cannot hang them both.
The processes are those of :func:`~vq.parallel.groups.current_group` — the rule ``fit`` and
:func:`vq.kmeans` follow — so ``use_group(None)`` keeps a layer's statistics per process and
``use_group(pg)`` syncs them over a sub-group. Every call below except :func:`active` is a
collective: all processes of that group must reach it together, which they do because they run
the same training step; check :func:`active` first.

Collectives run on the tensors' device (CPU with gloo, CUDA with nccl). The helpers use the
in-place ``torch.distributed`` calls, which ``torch.compile`` rewrites to traceable functional
collectives; the group lookup is traced and guarded, so a compiled step recompiles when the
group in use changes.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from vq.parallel.groups import current_group


def active() -> bool:
    """Whether layer training syncs: :func:`current_group` is a group of several processes."""
    return current_group() is not None


def _group() -> Any:
    group = current_group()
    if group is None:
        raise RuntimeError("vq.parallel.sync: no process group in use; check sync.active() first")
    return group


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """The elementwise sum of ``t`` over the group's processes (a new tensor)."""
    out = t.contiguous().clone()
    dist.all_reduce(out, group=_group())
    return out


def all_gather(t: torch.Tensor) -> torch.Tensor:
    """Every process's ``t`` (same shape everywhere), stacked: Tensor[world_size, *t.shape]."""
    group = _group()
    flat = t.contiguous().reshape(-1)
    out = flat.new_empty(dist.get_world_size(group) * flat.numel())
    dist.all_gather_into_tensor(out, flat, group=group)
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
    """Overwrite ``t`` with the values of the group's process of rank ``src`` (in place;
    returns ``t``)."""
    dist.broadcast(t, group_src=src, group=_group())
    return t


def rank() -> int:
    """This process's rank in the group."""
    return dist.get_rank(_group())


def world_size() -> int:
    """Processes in the group."""
    return dist.get_world_size(_group())
