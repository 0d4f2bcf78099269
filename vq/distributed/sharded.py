"""Sharded indexes: every process holds the vectors it added, with global ids; a search returns
the global top-k, as one index holding all the vectors would.

A search is one collective: every process searches its own shard for the same queries, the
(distances, ids) of all shards are all-gathered and merged into the top k. Saved, a sharded index
is a directory: one index file per shard (``shard-00000.index``, … written by ``index.save``)
plus ``manifest.json`` (number of shards, vectors per shard, each file's checksum; see
:mod:`vq.distributed.manifest`). It loads onto any number of processes: shard i goes to the
process of rank ``i % world_size``, so shards built by 16 workers can be served by 4 — or by one
process, without torch.distributed at all.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import torch

from vq._checks import as_vectors, check_positive, like_input
from vq.distributed.manifest import (
    CHECKSUM_BYTES,
    MANIFEST,
    check_shard,
    encode_checksum,
    read_manifest,
    shard_checksum,
    shard_file,
    write_manifest,
)
from vq.index import load_index
from vq.parallel.collectives import agree, all_gather_ints, all_sum, broadcast_json, gather_rows
from vq.parallel.groups import CURRENT, resolve, use_group


class ShardedIndex:
    """One process's part of an index split over the processes of a group.

    Every method below is collective (all processes of the group call it, in the same order)
    except the read-only properties. Build it around a fresh index on every process:

    >>> index = ShardedIndex(vq.index_factory(128, "IVF1024,PQ16"))
    >>> index.train(x_local)   # trains on all processes' vectors: the same parameters everywhere
    >>> index.add(x_local)     # global ids: process 0's vectors first, then process 1's, …
    >>> D, I = index.search(q, k=10)   # the same queries on every process -> global top-10
    >>> index.save("shards/")  # one file per shard + manifest.json

    Args:
        index: this process's index (a :class:`vq.index.Index`; the same kind and settings on
            every process), empty or already filled with globally unique ids.
        group: the process group (default: torch.distributed's default group when initialised,
            see :func:`vq.distributed.current_group`; None: this process holds every shard).

    Attributes:
        shards: this process's indexes (one, unless loaded onto fewer processes than shards).
        shard_ids: their shard numbers.
        num_shards: shards in all.
    """

    def __init__(self, index: Any, group: Any = CURRENT):
        group = resolve(group)
        rank = 0 if group is None else torch.distributed.get_rank(group)
        world = 1 if group is None else torch.distributed.get_world_size(group)
        self._init([index], [rank], world, group)

    def _init(self, shards: list, shard_ids: list[int], num_shards: int, group: Any) -> None:
        self.group = group
        self.rank = 0 if group is None else torch.distributed.get_rank(group)
        self.world_size = 1 if group is None else torch.distributed.get_world_size(group)
        self.shards, self.shard_ids, self.num_shards = shards, shard_ids, num_shards
        self.dim, self.metric = _agreed_dim_and_metric(shards, group)
        (total,) = all_sum(group, torch.tensor(self.local_ntotal))
        self._ntotal = int(total)

    # -- properties -----------------------------------------------------------------------
    @property
    def ntotal(self) -> int:
        """Vectors in all shards."""
        return self._ntotal

    @property
    def local_ntotal(self) -> int:
        """Vectors in this process's shards."""
        return sum(s.ntotal for s in self.shards)

    @property
    def index(self) -> Any:
        """This process's index (when it holds exactly one shard)."""
        if len(self.shards) != 1:
            raise ValueError(
                f"this process holds {len(self.shards)} shards ({self.shard_ids}); use .shards"
            )
        return self.shards[0]

    @property
    def is_trained(self) -> bool:
        return all(s.is_trained for s in self.shards)

    # -- building -------------------------------------------------------------------------
    def train(self, x: Any) -> ShardedIndex:
        """Train on the vectors of all processes (``x``: this process's float [n, dim]); every
        shard gets the same parameters, those one process would learn from all of them.

        Each process's ``x`` must hold at least as many vectors as the index has lists (or PQ
        centroids): the indexes check their training sets before training together."""
        self._require_one_shard("train")
        with use_group(self.group):
            self.index.train(x)
        return self

    def add(self, x: Any) -> None:
        """Add this process's vectors [n, dim] with global sequential ids: ``ntotal`` onwards,
        process 0's vectors first, then process 1's, … (the ids one index would give them all,
        added in rank order)."""
        self._require_one_shard("add")
        t = self._agreed(lambda: as_vectors(x, self.dim, "x"), "add")
        counts = [row[0] for row in all_gather_ints(self.group, [t.shape[0]])]
        start = self._ntotal + sum(counts[: self.rank])
        self.index.add_with_ids(t, torch.arange(start, start + t.shape[0]))
        self._ntotal += sum(counts)

    def add_with_ids(self, x: Any, ids: Any) -> None:
        """Add this process's vectors [n, dim] with caller-chosen int64 ids [n], unique over all
        processes."""
        self._require_one_shard("add_with_ids")
        before = self.index.ntotal
        self._agreed(lambda: self.index.add_with_ids(x, ids), "add_with_ids")
        (added,) = all_sum(self.group, torch.tensor(self.index.ntotal - before))
        self._ntotal += int(added)

    def remove_ids(self, ids: Any) -> int:
        """Remove the vectors with these ids from every shard; returns how many were removed."""
        removed = self._agreed(lambda: sum(s.remove_ids(ids) for s in self.shards), "remove_ids")
        (total,) = all_sum(self.group, torch.tensor(removed))
        self._ntotal -= int(total)
        return int(total)

    # -- search ---------------------------------------------------------------------------
    def search(self, queries: Any, k: int = 10, **params) -> tuple[Any, Any]:
        """The global ``k`` nearest neighbours of ``queries`` (float [nq, dim], the same on
        every process); ``params`` are the per-call options of the index (``nprobe``, …,
        and ``allowed=``: filtered search over the global ids, each shard keeping its own).

        Returns:
            ``(D, I)`` as :meth:`vq.index.Index.search` returns them (float32 [nq, k] distances,
            int64 [nq, k] global ids, -1 and +inf (-inf for "ip") where fewer than k exist), the
            same on every process: those of one index holding every shard's vectors (ties in
            distance go to the smaller id).

        Raises:
            ValueError: on every process, when the processes pass different queries (or bad
                ones on any process).
        """

        def local_search():
            check_positive(k, "k")
            q = as_vectors(queries, self.dim, "queries")
            return q, [s.search(q, int(k), **params) for s in self.shards]

        q, parts = self._agreed(local_search, "search")
        self._check_same_queries(q)
        k = int(k)
        if not parts:  # more processes than shards: nothing here
            fill = float("inf") if self.metric == "l2" else float("-inf")
            parts = [(torch.full((q.shape[0], k), fill), torch.full((q.shape[0], k), -1))]
        d = torch.stack([p[0].to(q.device) for p in parts])
        i = torch.stack([p[1].to(q.device) for p in parts])
        if self.group is not None:  # every process's best k, in rank order: [world, nq, k]
            counts = (1,) * self.world_size
            d, i = merge_topk(d, i, k, self.metric)
            d = gather_rows(self.group, d[None], counts)
            i = gather_rows(self.group, i[None], counts)
        d, i = merge_topk(d, i, k, self.metric)
        return like_input(d, queries), like_input(i, queries)

    def range_search(self, queries: Any, radius: float, **params) -> tuple[Any, Any, Any]:
        """Every vector of every shard within ``radius`` of each query (float [nq, dim], the
        same on every process), as :meth:`vq.index.Index.range_search` returns them: ``(lims,
        D, I)``, the same on every process, a query's hits in rank order then shard order;
        ``params`` as :meth:`search`'s (``allowed=`` global ids too)."""

        def local_search():
            q = as_vectors(queries, self.dim, "queries")
            return q, [s.range_search(q, radius, **params) for s in self.shards]

        q, parts = self._agreed(local_search, "range_search")
        self._check_same_queries(q)
        nq = q.shape[0]
        rows, dist = [torch.zeros(0, dtype=torch.int64)], [torch.zeros(0)]
        ids = [torch.zeros(0, dtype=torch.int64)]
        for lims, d, i in parts:
            counts = torch.as_tensor(lims).cpu().diff()
            rows.append(torch.repeat_interleave(torch.arange(nq), counts))
            dist.append(torch.as_tensor(d).cpu())
            ids.append(torch.as_tensor(i).cpu())
        rows, dist, ids = torch.cat(rows), torch.cat(dist), torch.cat(ids)
        if self.group is not None:  # every process's hits, in rank order
            counts = tuple(row[0] for row in all_gather_ints(self.group, [rows.shape[0]]))
            rows, dist, ids = (gather_rows(self.group, t, counts) for t in (rows, dist, ids))
        order = torch.argsort(rows, stable=True)
        lims = torch.zeros(nq + 1, dtype=torch.int64)
        lims[1:] = torch.cumsum(torch.bincount(rows, minlength=nq), 0)
        return tuple(like_input(t, queries) for t in (lims, dist[order], ids[order]))

    def _check_same_queries(self, q: torch.Tensor) -> None:
        if self.group is None:
            return
        digest = hashlib.sha256(q.detach().cpu().contiguous().numpy().tobytes()).digest()
        mine = [q.shape[0], *(int.from_bytes(digest[j : j + 7], "little") for j in range(0, 28, 7))]
        table = all_gather_ints(self.group, mine)
        if any(row != table[0] for row in table):
            sizes = ", ".join(f"rank {r}: {row[0]}" for r, row in enumerate(table))
            raise ValueError(
                "search needs the same queries on every process (each searches its shard for all "
                f"of them); the processes passed different ones ({sizes} queries)"
            )

    def _agreed(self, fn, what: str):
        """``fn()``, with its errors raised on every process (see
        :func:`vq.parallel.collectives.agree`)."""
        result, error = None, None
        try:
            result = fn()
        except (ValueError, TypeError, RuntimeError) as err:
            error = err
        agree(self.group, error, what)
        return result

    # -- persistence ----------------------------------------------------------------------
    def warm_up(self, k: int = 10) -> int:
        """Not collective: compile (or load) the kernels of this process's shards' searches
        (:meth:`vq.index.Index.warm_up`); returns how many it compiled. One process per machine
        suffices where they share the kernel cache."""
        return sum(shard.warm_up(k) for shard in self.shards)

    def save(self, directory: str | os.PathLike) -> None:
        """Write every shard to ``directory/shard-<i>.index`` (on the file system of the
        process that holds it) and, from rank 0, ``directory/manifest.json``."""
        path = Path(directory)
        error = None
        rows = []
        try:
            path.mkdir(parents=True, exist_ok=True)
            for i, shard in zip(self.shard_ids, self.shards, strict=True):
                shard.save(path / shard_file(i))
                checksum = shard_checksum(path / shard_file(i))
                rows.append([i, shard.ntotal, *encode_checksum(checksum)])
        except (OSError, ValueError) as err:
            error = err
        agree(self.group, error, "save its shards")
        mine = torch.tensor(rows, dtype=torch.int64).reshape(-1, 2 + CHECKSUM_BYTES)
        counts = tuple(row[0] for row in all_gather_ints(self.group, [mine.shape[0]]))
        table = gather_rows(self.group, mine, counts).tolist()
        if self.rank == 0:
            first = self.shards[0] if self.shards else None
            write_manifest(path, table, first, self.dim, self.metric)
        if self.group is not None:
            torch.distributed.barrier(group=self.group)

    @classmethod
    def load(
        cls, directory: str | os.PathLike, group: Any = CURRENT, device: str | torch.device = "cpu"
    ) -> ShardedIndex:
        """Load a directory written by :meth:`save` (collective): this process takes the shards
        i with ``i % world_size == rank``; without a group, one process takes them all.

        Raises:
            FileNotFoundError, ValueError: on every process, when the manifest or a shard file is
                missing, corrupted, or does not match the manifest.
        """
        group = resolve(group)
        rank = 0 if group is None else torch.distributed.get_rank(group)
        world = 1 if group is None else torch.distributed.get_world_size(group)
        path = Path(directory)
        manifest, error = None, None
        if rank == 0:
            try:
                manifest = read_manifest(path)
            except (OSError, ValueError) as err:
                error = err
        agree(group, error, f"read {path / MANIFEST}")
        manifest = broadcast_json(group, manifest)
        shards, ids, error = [], [], None
        try:
            for i, entry in enumerate(manifest["shards"]):
                if i % world != rank:
                    continue
                shard = load_index(path / entry["file"], device=device)
                check_shard(path / entry["file"], shard, entry, manifest)
                shards.append(shard)
                ids.append(i)
        except (OSError, ValueError) as err:
            error = err
        agree(group, error, "load its shards")
        self = cls.__new__(cls)
        self._init(shards, ids, manifest["num_shards"], group)
        return self

    # -- helpers --------------------------------------------------------------------------
    def _require_one_shard(self, what: str) -> None:
        if self.num_shards != self.world_size:
            raise ValueError(
                f"{what} needs one shard per process; this index has {self.num_shards} shards on "
                f"{self.world_size} processes (load it with as many processes as shards)"
            )

    def __repr__(self) -> str:
        return (
            f"ShardedIndex(rank {self.rank} of {self.world_size}, shards {self.shard_ids} of "
            f"{self.num_shards}, ntotal={self.ntotal}, local_ntotal={self.local_ntotal})"
        )


def merge_topk(
    dist_: torch.Tensor, ids: torch.Tensor, k: int, metric: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """The best ``k`` of several top-k lists: ``dist_`` float32 [S, nq, k'] and ``ids`` int64
    [S, nq, k'] → [nq, k] (ascending distances for "l2", descending for "ip"; ties go to the
    smaller id; missing results, id -1, last)."""
    s, nq, kk = dist_.shape
    d = dist_.permute(1, 0, 2).reshape(nq, s * kk)
    i = ids.permute(1, 0, 2).reshape(nq, s * kk)
    by_id = torch.argsort(torch.where(i < 0, torch.iinfo(torch.int64).max, i), dim=1, stable=True)
    d, i = d.gather(1, by_id), i.gather(1, by_id)
    order = torch.argsort(d, dim=1, descending=metric == "ip", stable=True)[:, :k]
    d, i = d.gather(1, order), i.gather(1, order)
    if d.shape[1] < k:
        fill = float("inf") if metric == "l2" else float("-inf")
        pad = k - d.shape[1]
        d = torch.cat([d, d.new_full((nq, pad), fill)], dim=1)
        i = torch.cat([i, i.new_full((nq, pad), -1)], dim=1)
    return d, i


# -- agreement ---------------------------------------------------------------------------------
def _agreed_dim_and_metric(shards: list, group: Any) -> tuple[int, str]:
    """(dim, metric) of the shards, checked to agree over all processes."""
    dims = {(s.dim, s.metric) for s in shards}
    if len(dims) > 1:
        raise ValueError(f"this process's shards differ in dim or metric: {sorted(dims)}")
    dim, metric = next(iter(dims)) if dims else (0, "")
    metric_code = {"": -1, "l2": 0, "ip": 1}[metric]
    table = [row for row in all_gather_ints(group, [dim, metric_code]) if row[1] >= 0]
    if any(row != table[0] for row in table):
        raise ValueError(
            "the processes' indexes differ in dim or metric ("
            + "; ".join(f"dim {d}, metric {['l2', 'ip'][m]}" for d, m in table)
            + "); build every shard with the same index description"
        )
    if not table:
        raise ValueError("no process holds a shard")
    return table[0][0], ["l2", "ip"][table[0][1]]
