"""Joining the process group that torchrun starts."""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist


def default_backend() -> str:
    """gloo for CPU tensors, plus nccl for CUDA tensors when a GPU is visible."""
    return "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"


def init_process_group(backend: str | None = None, timeout_s: float = 1800.0) -> bool:
    """Join the process group described by torchrun's environment (``RANK``, ``WORLD_SIZE``,
    ``MASTER_ADDR``, ``MASTER_PORT``); returns whether this process is part of a group of
    several. A no-op when a group is already initialised, or when started without torchrun (or
    with one process): training and search then run in this process alone.

    The processes meet in a key-value store prefixed by the restart count: after ``torchrun
    --max-restarts`` restarts a group, its store can still hold the addresses the dead attempt's
    processes published, and gloo would try to connect to them (the restarted group then fails
    with "Connection refused" or hangs).

    Args:
        backend: torch.distributed backend; default :func:`default_backend` (with a GPU, each
            process also takes the GPU ``LOCAL_RANK`` as its CUDA device).
        timeout_s: how long a collective waits for the other processes.
    """
    if dist.is_initialized():
        return dist.get_world_size() > 1
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or "RANK" not in os.environ:
        return False
    backend = backend or default_backend()
    if "nccl" in backend and torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    timeout = timedelta(seconds=timeout_s)
    dist.init_process_group(
        backend=backend,
        store=_store(rank, world, timeout),
        rank=rank,
        world_size=world,
        timeout=timeout,
    )
    return True


def _store(rank: int, world: int, timeout: timedelta) -> dist.Store:
    """The rendezvous store of this attempt: torchrun's agent hosts it (workers are clients);
    under a plain ``env://`` launch, rank 0 does."""
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == str(True)
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world,
        is_master=not agent and rank == 0,
        timeout=timeout,
        multi_tenant=not agent,
    )
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"vq.distributed/attempt_{attempt}/", store)
