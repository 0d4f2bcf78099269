"""``python -m vq.distributed`` (the torchrun program): build and search sharded indexes, one
shard per process.

    torchrun --standalone --nproc_per_node=4 -m vq.distributed build \\
        --data X.fvecs --index "IVF4096,PQ32" -o shards/
    torchrun --standalone --nproc_per_node=4 -m vq.distributed search shards/ \\
        --queries Q.fvecs -k 10 --nprobe 16 --gt GT.ivecs

``build``: process r of W reads rows ``[r·n/W, (r+1)·n/W)`` of the data file (memory-mapped:
only its rows are read), all processes train the index together on the union (checkpointed, so a
``torchrun --max-restarts`` restart resumes the training), each adds its rows with their row
numbers as ids, and the shards plus ``manifest.json`` are written to the output directory;
then one process per machine (local rank 0) compiles its shards' search kernels
(``--no-warm-up``: not), so that the first search finds them in the kernel cache.
``search``: every process loads its shards, searches them for all queries, and rank 0 reports
the merged global top-k (QPS, recall with ``--gt``, ids with ``--out``). Without torchrun both
run in one process (``search`` then loads every shard). Bad input ends with a one-line
``error: …`` and exit status 2.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

import vq
from vq.apps import arguments, distributed_arguments
from vq.apps.common import (
    INPUT_ERRORS,
    InputError,
    check_k,
    check_writable,
    metric_for,
    open_input,
    read_truth,
    report_error,
    report_search,
    set_threads,
    timed,
    writing,
)
from vq.distributed.launch import init_process_group
from vq.distributed.sharded import ShardedIndex
from vq.parallel import Shards, checkpoints

COMMANDS = ("build", "search")


def read_rows(path: Path, rank: int, world: int, what: str = "train") -> tuple[np.ndarray, int]:
    """This process's share of the rows of a vector file (all rows when world is 1) and the
    global row number of its first row: rows ``[rank·n/world, (rank+1)·n/world)``, read with
    :func:`vq.datasets.open_vectors` (only those rows; ``what``: an HDF5 file's dataset)."""
    x, first, _ = _read_share(open_input(path, what), rank, world)
    return x, first


def _read_share(source, rank: int, world: int) -> tuple[np.ndarray, int, int]:
    n = source.shape[0]
    lo, hi = rank * n // world, (rank + 1) * n // world
    return source.read(slice(lo, hi)), lo, n


def build(args: argparse.Namespace) -> int:
    """``build``: train on the union of the processes' rows, add them, save the shards."""
    source = open_input(args.data, "train")
    index = vq.index_factory(source.shape[1], args.index, metric=metric_for(args.metric, source))
    if args.nprobe is not None:
        if not hasattr(index, "nprobe"):
            raise InputError(f"--nprobe does not apply to {type(index).__name__}")
        index.nprobe = args.nprobe
    args.output.mkdir(parents=True, exist_ok=True)
    check_writable(args.output / "manifest.json", "-o")
    world, rank = _start(args.threads)
    x, first, _ = _read_share(source, rank, world)
    for inner in index.modules():
        if isinstance(inner, vq.index.Index):
            inner.verbose = not args.quiet and rank == 0
    train = torch.from_numpy(x)
    if args.train_size is not None:
        gen = torch.Generator().manual_seed(args.seed)
        train = Shards.of(train).subsample(args.train_size, gen).local
    sharded = ShardedIndex(index)
    ckpt = args.checkpoint_dir or args.output / "checkpoints"
    with checkpoints(ckpt, every=args.checkpoint_every):
        _, t_train = timed(lambda: sharded.train(train))
    _, t_add = timed(lambda: sharded.add(x))
    writing(args.output, lambda: sharded.save(args.output))
    if rank == 0:
        if not args.keep_checkpoints:
            shutil.rmtree(ckpt, ignore_errors=True)
        print(
            f"{args.index}: {sharded.ntotal} vectors of dim {x.shape[1]} in {world} shard(s), "
            f"trained in {t_train:.1f} s, added in {t_add:.1f} s; saved {args.output}/"
        )
    # the search kernels, once per machine (its processes share the kernel cache)
    if not args.no_warm_up and os.environ.get("LOCAL_RANK", str(rank)) == "0":
        compiled, seconds = timed(sharded.warm_up)
        if compiled:
            print(f"search kernels: {compiled} compiled in {seconds:.1f} s, kept for later runs")
    return 0


def search(args: argparse.Namespace) -> int:
    """``search``: every process searches its shards; rank 0 reports the global top-k."""
    if args.out is not None:
        check_writable(args.out, "--out")
    _, rank = _start(args.threads)
    sharded = ShardedIndex.load(args.index)
    queries = open_input(args.queries, "test")
    if queries.shape[1] != sharded.dim:
        raise InputError(
            f"queries: expected vectors of dim {sharded.dim}, got "
            f"{queries.shape[1]} in {args.queries}"
        )
    truth = None if args.gt is None else read_truth(args.gt, queries.shape[0], sharded)
    check_k(args.k, sharded.ntotal, queries.shape[0])
    q = queries.read()
    params = {} if args.nprobe is None else {"nprobe": args.nprobe}
    (_, ids), seconds = timed(lambda: sharded.search(q, args.k, **params))
    if rank != 0:
        return 0
    line = (
        f"{len(q)} queries, k={args.k}, {sharded.num_shards} shard(s) on {sharded.world_size} "
        f"process(es): {seconds:.3f} s, {len(q) / seconds:.0f} QPS"
    )
    report_search(line, ids, args.k, truth, args.out)
    return 0


def _start(threads: int | None) -> tuple[int, int]:
    """Join torchrun's process group (if any); returns (world size, rank)."""
    set_threads(threads)
    if init_process_group():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def main(argv: list[str] | None = None) -> int:
    """``python -m vq.distributed build|search ARGS``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    # build or search; --help: the program's help, exit 0; anything else: usage error, exit 2
    command = distributed_arguments.distributed().parse_args(argv[:1]).command
    try:
        args = arguments.parse(f"distributed {command}", argv[1:])
        status = build(args) if command == "build" else search(args)
    except INPUT_ERRORS as err:
        return report_error(err)  # (torchrun stops the other processes)
    if dist.is_initialized():
        dist.barrier()  # nobody tears the group down while another process still uses it
        dist.destroy_process_group()
    return status


if __name__ == "__main__":
    sys.exit(main())
