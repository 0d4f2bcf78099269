"""Rows split over processes: the one data interface that single-process and distributed training
share (the idea of faiss's contrib ``DatasetAssign``).

When ``torch.distributed`` is initialised with more than one process, the vectors a process gives
to :func:`vq.kmeans`, :func:`vq.lbg` or a quantizer's ``fit`` are its *shard*: the global
training set is the concatenation of every process's rows in rank order. Everything random is
defined on global row numbers, drawn from a generator seeded identically on every process, so a
seed gives the same training as one process holding the concatenated data, however the rows are
split. Without a process group (or inside ``use_group(None)``) a :class:`Shards` is just the local
tensor and every method is its single-process counterpart, at no cost.

Collectives run on the backend's device: CPU tensors for gloo, the current CUDA device for nccl.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import torch
import torch.distributed as dist

_DEFAULT: Any = object()
#: the group that training shards its data over, when set by :func:`use_group`
_GROUP: ContextVar[Any] = ContextVar("vq_distributed_group", default=_DEFAULT)


def current_group() -> Any:
    """The process group training shards over: the one set by :func:`use_group`, else the default
    group when torch.distributed is initialised with more than one process, else None (this
    process alone)."""
    group = _GROUP.get()
    if group is _DEFAULT:
        if not (dist.is_available() and dist.is_initialized()):
            return None
        group = dist.group.WORLD
    if group is None or dist.get_world_size(group) == 1:
        return None
    return group


@contextmanager
def use_group(group: Any) -> Iterator[None]:
    """Choose what training inside the ``with`` block shards its data over.

    Args:
        group: a ``torch.distributed`` process group, or None to train on each process's data
            alone (for example when every process holds the same data, as under DDP).
    """
    if group is not None and dist.get_rank(group) < 0:
        raise ValueError("use_group: this process is not a member of the given process group")
    token = _GROUP.set(group)
    try:
        yield
    finally:
        _GROUP.reset(token)


def comm_device(group: Any, device: torch.device) -> torch.device:
    """Where the tensors of a collective must live: CPU for gloo, the current CUDA device for
    nccl, the data's device for other (e.g. mixed ``cpu:gloo,cuda:nccl``) backends."""
    backend = str(dist.get_backend(group))
    if backend == "gloo":
        return torch.device("cpu")
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return device


class Shards:
    """This process's rows of a global ``[n, ...]`` tensor split over a process group.

    Build it with :meth:`of` (collective: every process of the group must call it) or
    :meth:`whole` (no group: this process holds every row).

    Attributes:
        local: Tensor[n_local, ...], this process's rows: global rows ``offset … offset + n_local``.
        counts: rows held by each process, in rank order.
        rank: this process's position in ``counts``.
        group: the process group, or None when this process holds every row.
    """

    def __init__(self, local: torch.Tensor, counts: tuple[int, ...], rank: int, group: Any):
        self.local, self.counts, self.rank, self.group = local, counts, rank, group

    @classmethod
    def whole(cls, x: torch.Tensor) -> Shards:
        """Every row held here (no communication, single-process semantics)."""
        return cls(x, (int(x.shape[0]),), 0, None)

    @classmethod
    def of(cls, x: torch.Tensor, group: Any = _DEFAULT) -> Shards:
        """``x`` as this process's shard over ``group`` (default: :func:`current_group`).

        Collective when a group is in use: the processes exchange their row counts and check
        that their rows have the same trailing shape.

        Raises:
            ValueError: on every process, when the processes' rows differ in shape.
        """
        group = current_group() if group is _DEFAULT else group
        if group is None:
            return cls.whole(x)
        shape = [int(v) for v in x.shape[1:]]
        if len(shape) > 7:
            raise ValueError(f"expected rows of at most 7 dimensions, got shape {tuple(x.shape)}")
        table = all_gather_ints(
            group, [int(x.shape[0]), len(shape), *shape, *[0] * (7 - len(shape))]
        )
        for r, row in enumerate(table):
            if row[1:] != table[0][1:]:
                raise ValueError(
                    f"the processes hold rows of different shapes (rank 0: {_describe(table[0])}; "
                    f"rank {r}: {_describe(row)}); every process must pass vectors of the same "
                    "dimension"
                )
        return cls(x, tuple(row[0] for row in table), dist.get_rank(group), group)

    # -- layout ---------------------------------------------------------------------------
    @property
    def distributed(self) -> bool:
        return self.group is not None

    @property
    def n(self) -> int:
        """Global number of rows."""
        return sum(self.counts)

    @property
    def offset(self) -> int:
        """Global row number of this process's first row."""
        return sum(self.counts[: self.rank])

    @property
    def is_root(self) -> bool:
        """True on the process of rank 0 (the one that writes files)."""
        return self.rank == 0

    def with_local(self, local: torch.Tensor) -> Shards:
        """The same split with other rows per process (e.g. residuals or a column slice of
        ``local``); ``local`` must have this process's row count."""
        if local.shape[0] != self.local.shape[0]:
            raise ValueError(
                f"with_local: expected {self.local.shape[0]} rows (this process's), "
                f"got {local.shape[0]}"
            )
        return Shards(local, self.counts, self.rank, self.group)

    def float(self) -> Shards:
        return self.with_local(self.local.float())

    # -- random subsets, defined on global row numbers ------------------------------------
    def _draw(self, count: int, gen: torch.Generator) -> torch.Tensor | None:
        """Sorted global row numbers of ``count`` distinct random rows (None: every row). The
        draw depends only on the global row count and the generator, so every process draws the
        same rows and a seed gives one sample however the rows are split."""
        if count >= self.n:
            return None
        return torch.randperm(self.n, generator=gen)[:count].sort().values

    def _mine(self, rows: torch.Tensor) -> torch.Tensor:
        """This process's local row numbers among sorted global ``rows``."""
        lo, hi = self.offset, self.offset + self.local.shape[0]
        start, stop = torch.searchsorted(rows, torch.tensor([lo, hi])).tolist()
        return rows[start:stop] - lo

    def subsample(self, count: int, gen: torch.Generator) -> Shards:
        """A random subset of ``count`` global rows (all rows when count >= n), still split:
        each process keeps the drawn rows it holds, in order."""
        rows = self._draw(count, gen)
        if rows is None:
            return self
        if not self.distributed:
            return Shards.whole(self.local[rows.to(self.local.device)])
        mine = self._mine(rows).to(self.local.device)
        return Shards(self.local[mine], self._counts_of(rows), self.rank, self.group)

    def sample(self, count: int, gen: torch.Generator) -> torch.Tensor:
        """``count`` distinct random rows (all rows when count >= n) in global order, the same
        tensor on every process (gathered when distributed)."""
        rows = self._draw(count, gen)
        if not self.distributed:
            return self.local if rows is None else self.local[rows.to(self.local.device)]
        part = self.local if rows is None else self.local[self._mine(rows).to(self.local.device)]
        return self.gather_rows(part, self._counts_of(rows))

    def _counts_of(self, rows: torch.Tensor | None) -> tuple[int, ...]:
        """Rows each process holds among sorted global ``rows`` (None: every row)."""
        if rows is None:
            return self.counts
        bounds = torch.tensor([sum(self.counts[:r]) for r in range(len(self.counts) + 1)])
        edges = torch.searchsorted(rows, bounds).tolist()
        return tuple(edges[r + 1] - edges[r] for r in range(len(self.counts)))

    def gather(self) -> torch.Tensor:
        """Every row, in global order, on every process."""
        if not self.distributed:
            return self.local
        return self.gather_rows(self.local, self.counts)

    def gather_rows(self, part: torch.Tensor, counts: tuple[int, ...]) -> torch.Tensor:
        """Concatenate in rank order the ``part`` of every process (``counts[r]`` rows on rank
        r), on every process."""
        return gather_rows(self.group, part, counts)

    def all_sum(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The element-wise sums over processes of ``tensors`` (identical on every process); the
        inputs themselves when not distributed."""
        return all_sum(self.group, *tensors)

    def broadcast(self, t: torch.Tensor, src: int = 0) -> torch.Tensor:
        """``t`` as the process of rank ``src`` holds it, on every process."""
        return broadcast(self.group, t, src)

    def mean(self) -> torch.Tensor:
        """float32 [1, ...]: the mean of every row."""
        if not self.distributed:
            return self.local.float().mean(dim=0, keepdim=True)
        (total,) = self.all_sum(self.local.float().sum(dim=0, keepdim=True))
        return total / self.n

    def __repr__(self) -> str:
        return (
            f"Shards(local={tuple(self.local.shape)}, counts={self.counts}, rank={self.rank}, "
            f"distributed={self.distributed})"
        )


def _describe(row: list[int]) -> str:
    return f"{row[0]} rows of shape {tuple(row[2 : 2 + row[1]])}"


# -- collectives (no-ops for group None) ----------------------------------------------------
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
