"""Rows split over processes: the one data interface that single-process and distributed training
share (the idea of faiss's contrib ``DatasetAssign``).

When training runs over a group of several processes (see :mod:`vq.parallel.groups`), the
vectors a process gives to :func:`vq.kmeans`, :func:`vq.lbg` or a quantizer's ``fit`` are its
*shard*: the global training set is the concatenation of every process's rows in rank order.
Everything random is defined on global row numbers, drawn from a generator seeded identically on
every process, so a seed gives the same training as one process holding the concatenated data,
however the rows are split. Without a process group (or inside ``use_group(None)``) a
:class:`Shards` is just the local tensor and every method is its single-process counterpart, at
no cost.

Collectives run on the backend's device: CPU tensors for gloo, the current CUDA device for nccl.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from vq.parallel.collectives import all_gather_ints, all_sum, broadcast, gather_rows
from vq.parallel.groups import CURRENT, resolve


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
    def of(cls, x: torch.Tensor, group: Any = CURRENT) -> Shards:
        """``x`` as this process's shard over ``group`` (default: the group
        :func:`~vq.parallel.groups.current_group` picks).

        Collective when a group is in use: the processes exchange their row counts and check
        that their rows have the same trailing shape.

        Raises:
            ValueError: on every process, when the processes' rows differ in shape.
        """
        group = resolve(group)
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
