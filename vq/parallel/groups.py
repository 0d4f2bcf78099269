"""Which processes train together: the one rule that k-means, ``fit`` and layer training follow.

:func:`current_group` is the group of the calling thread: the one chosen by the innermost
:func:`use_group` block, else torch.distributed's default group when it is initialised with more
than one process, else None (this process alone). A group of one process counts as None, so
every caller has two cases only: None (no communication, single-process code) or a group of
several processes (collectives over it).

The choice is held in a ``threading.local``: per thread like a ``ContextVar``, but readable
inside ``torch.compile``, which traces the attribute read and guards on its value (it cannot
trace ``ContextVar.get``), so a compiled training step follows :func:`use_group` too: it
compiles once per choice in use (default, None, a sub-group) and reuses those graphs.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist


class _Current:
    def __repr__(self) -> str:
        return "vq.parallel.CURRENT"


#: default of every ``group`` argument: the group :func:`current_group` returns at the call
CURRENT: Any = _Current()
_UNSET: Any = object()  # no use_group block: the default group (if several processes)


#: ``.group``: this thread's choice (absent: none made). A plain ``threading.local`` read with
#: ``getattr``, which torch.compile follows (it reads a subclass's class attribute instead)
_SELECTION = threading.local()


def current_group() -> Any:
    """The process group training runs over, in this thread: the one set by :func:`use_group`,
    else the default group when torch.distributed is initialised with more than one process,
    else None (this process alone; a chosen group of one process is None too)."""
    group = getattr(_SELECTION, "group", _UNSET)
    if group is _UNSET:
        if not (dist.is_available() and dist.is_initialized()):
            return None
        group = dist.group.WORLD
    if group is None or dist.get_world_size(group) == 1:
        return None
    return group


def resolve(group: Any) -> Any:
    """``group`` itself, or :func:`current_group` for :data:`CURRENT`."""
    return current_group() if group is CURRENT else group


@contextmanager
def use_group(group: Any) -> Iterator[None]:
    """Choose what training inside the ``with`` block runs over, in this thread: the data of
    :func:`vq.kmeans` / ``fit`` (sharded over the group) and the statistics of a quantizer
    layer's training forward (all-reduced over the group).

    Args:
        group: a ``torch.distributed`` process group, or None to train on each process's data
            alone (for example when every process holds the same data, as under DDP, or to keep
            a layer's codebooks per process).
    """
    if group is not None and dist.get_rank(group) < 0:
        raise ValueError("use_group: this process is not a member of the given process group")
    previous = getattr(_SELECTION, "group", _UNSET)
    _SELECTION.group = group
    try:
        yield
    finally:  # back to the previous state, an absent attribute included: compiled code guards
        if previous is _UNSET:  # on the attribute's presence, and recompiles if it changes
            del _SELECTION.group
        else:
            _SELECTION.group = previous


def comm_device(group: Any, device: torch.device) -> torch.device:
    """Where the tensors of a collective must live: CPU for gloo, the current CUDA device for
    nccl, the data's device for other (e.g. mixed ``cpu:gloo,cuda:nccl``) backends."""
    backend = str(dist.get_backend(group))
    if backend == "gloo":
        return torch.device("cpu")
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return device
