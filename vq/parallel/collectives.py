"""Collectives over an explicit process group, for eager code (k-means, ``fit``, checkpoints,
sharded indexes): every function is a no-op returning its input when ``group`` is None, and
moves tensors to the backend's device and back (:func:`~vq.parallel.groups.comm_device`), so
callers pass data wherever it lives. Nothing travels pickled: integers and JSON go as tensors.

A layer's training step uses :mod:`vq.parallel.sync` instead (traceable by ``torch.compile``).
"""

from __future__ import annotations

import json
from typing import Any

import torch
import torch.distributed as dist

from vq.parallel.groups import comm_device


def all_sum(group: Any, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Element-wise sums over the processes of ``group`` of ``tensors``, the same on every
    process: one all_reduce per dtype (the tensors of a dtype travel as one buffer)."""
    if group is None:
        return tensors
    out: list[torch.Tensor | None] = [None] * len(tensors)
    for dtype in dict.fromkeys(t.dtype for t in tensors):
        picks = [i for i, t in enumerate(tensors) if t.dtype == dtype]
        dev = comm_device(group, tensors[picks[0]].device)
        flat = torch.cat([tensors[i].reshape(-1).to(dev) for i in picks])
        dist.all_reduce(flat, group=group)
        for i, part in zip(picks, flat.split([tensors[i].numel() for i in picks]), strict=True):
            out[i] = part.reshape(tensors[i].shape).to(tensors[i].device)
    return tuple(out)  # type: ignore[arg-type]


def gather_rows(group: Any, part: torch.Tensor, counts: tuple[int, ...]) -> torch.Tensor:
    """The ``part`` of every process (``counts[r]`` rows on the process of rank r) concatenated
    in rank order, on every process; float16/bfloat16 rows travel (and come back) as float32."""
    if group is None:
        return part
    device = part.device
    if part.dtype in (torch.float16, torch.bfloat16):
        part = part.float()
    dev = comm_device(group, device)
    padded = part.new_zeros((max(counts), *part.shape[1:]), device=dev)
    padded[: part.shape[0]] = part.to(dev)
    out = [torch.empty_like(padded) for _ in counts]
    dist.all_gather(out, padded, group=group)
    return torch.cat([t[:c] for t, c in zip(out, counts, strict=True)]).to(device)


def broadcast(group: Any, t: torch.Tensor, src: int = 0) -> torch.Tensor:
    """``t`` as the process of rank ``src`` (within ``group``) holds it, on every process."""
    if group is None:
        return t
    dev = comm_device(group, t.device)
    buf = t.to(dev).contiguous() if dev != t.device else t.contiguous().clone()
    dist.broadcast(buf, group_src=src, group=group)
    return buf.to(t.device)


def all_gather_ints(group: Any, values: list[int]) -> list[list[int]]:
    """Every process's list of ``values`` (the same length everywhere), in rank order."""
    mine = torch.tensor(values, dtype=torch.int64)
    if group is None:
        return [values]
    counts = (1,) * dist.get_world_size(group)
    return gather_rows(group, mine[None], counts).tolist()


def broadcast_json(group: Any, obj: Any) -> Any:
    """Rank 0's JSON-serialisable ``obj`` on every process (it travels as UTF-8 bytes: nothing is
    pickled); other processes may pass None."""
    if group is None:
        return obj
    root = dist.get_rank(group) == 0
    blob = torch.tensor(list(json.dumps(obj).encode()) if root else [], dtype=torch.uint8)
    size = broadcast(group, torch.tensor([blob.numel()], dtype=torch.int64))
    if not root:
        blob = torch.zeros(int(size), dtype=torch.uint8)
    return json.loads(broadcast(group, blob).numpy().tobytes().decode())


def agree(group: Any, error: BaseException | None, what: str) -> None:
    """Raise on every process when any failed (so that none waits forever in a collective): the
    failing process raises its own ``error``, the others a ValueError naming the failing ranks.

    Args:
        group: the process group (None: raise ``error`` if any).
        error: what this process's step raised, or None.
        what: the step, for the others' message ("could not <what>").
    """
    failed = [row[0] for row in all_gather_ints(group, [int(error is not None)])]
    if error is not None:
        raise error
    bad = [r for r, f in enumerate(failed) if f]
    if bad:
        raise ValueError(f"process(es) of rank {bad} could not {what} (see their errors)")
