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
from vq.apps.common import (
    INPUT_ERRORS,
    InputError,
    report_error,
    report_search,
    set_threads,
    timed,
)
from vq.datasets import read_bvecs, read_fvecs, vecs_shape
from vq.distributed.launch import init_process_group
from vq.distributed.sharded import ShardedIndex
from vq.parallel import Shards, checkpoints

COMMANDS = ("build", "search")


def read_rows(path: Path, rank: int, world: int, what: str = "train") -> tuple[np.ndarray, int]:
    """This process's share of the rows of a vector file (all rows when world is 1) and the
    global row number of its first row. .fvecs/.bvecs/.npy are memory-mapped; .hdf5 (the
    ``what`` dataset of an ann-benchmarks file) is sliced by h5py."""
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    suffix = path.suffix.lower()
    if suffix in (".fvecs", ".bvecs"):
        n = vecs_shape(path)[0]
    elif suffix == ".npy":
        table = np.load(path, mmap_mode="r")
        n = table.shape[0]
    elif suffix in (".hdf5", ".h5"):
        import h5py

        with h5py.File(path, "r") as f:
            if what not in f:
                raise InputError(f"{path}: no dataset {what!r}")
            n = f[what].shape[0]
    else:
        raise InputError(
            f"{path}: unknown vector file type {suffix!r}; use .fvecs, .bvecs, .npy or .hdf5"
        )
    lo, hi = rank * n // world, (rank + 1) * n // world
    if suffix == ".fvecs":
        x = read_fvecs(path, rows=slice(lo, hi))
    elif suffix == ".bvecs":
        x = read_bvecs(path, rows=slice(lo, hi)).astype(np.float32)
    elif suffix == ".npy":
        x = np.asarray(table[lo:hi], dtype=np.float32)
    else:
        with h5py.File(path, "r") as f:
            x = np.asarray(f[what][lo:hi], dtype=np.float32)
    if x.ndim != 2:
        raise InputError(f"{path}: expected a 2-D array of vectors, got shape {x.shape}")
    return np.ascontiguousarray(x), lo


def build(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="python -m vq.distributed build",
        description="Train an index on the union of the processes' rows, add them, save shards.",
    )
    p.add_argument("--data", type=Path, required=True, help=".fvecs, .bvecs, .npy or .hdf5")
    p.add_argument("--index", required=True, help='faiss-style description, e.g. "IVF4096,PQ32"')
    p.add_argument("-o", "--output", type=Path, required=True, help="directory for the shards")
    p.add_argument("--metric", choices=["l2", "ip"], default="l2", help="distance (default l2)")
    p.add_argument(
        "--train-size", type=int, default=None, help="train on a random sample of this many vectors"
    )
    p.add_argument("--nprobe", type=int, default=None, help="IVF lists searched (stored)")
    p.add_argument("--seed", type=int, default=0, help="seed of the training sample")
    p.add_argument(
        "--checkpoint-every", type=int, default=1, help="k-means iterations between checkpoints"
    )
    p.add_argument("--checkpoint-dir", type=Path, default=None, help="default: OUTPUT/checkpoints")
    p.add_argument(
        "--keep-checkpoints", action="store_true", help="keep them after a successful build"
    )
    p.add_argument("--threads", type=int, default=None, help="CPU threads per process")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument(
        "--no-warm-up",
        action="store_true",
        help="skip compiling the search kernels (the first process that searches then does)",
    )
    args = p.parse_args(argv)
    world, rank = _start(args.threads)
    x, first = read_rows(args.data, rank, world, "train")
    index = vq.index_factory(x.shape[1], args.index, metric=args.metric)
    if args.nprobe is not None:
        if not hasattr(index, "nprobe") or args.nprobe <= 0:
            raise InputError(f"--nprobe must be positive and apply to the index ({args.index})")
        index.nprobe = args.nprobe
    for inner in index.modules():
        if isinstance(inner, vq.index.Index):
            inner.verbose = not args.quiet and rank == 0
    train = torch.from_numpy(x)
    if args.train_size is not None:
        if args.train_size <= 0:
            raise InputError(f"--train-size must be positive, got {args.train_size}")
        gen = torch.Generator().manual_seed(args.seed)
        train = Shards.of(train).subsample(args.train_size, gen).local
    sharded = ShardedIndex(index)
    ckpt = args.checkpoint_dir or args.output / "checkpoints"
    with checkpoints(ckpt, every=args.checkpoint_every):
        _, t_train = timed(lambda: sharded.train(train))
    _, t_add = timed(lambda: sharded.add(x))
    sharded.save(args.output)
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


def search(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="python -m vq.distributed search",
        description="Search a sharded index (global top-k); rank 0 prints QPS and recall.",
    )
    p.add_argument("index", type=Path, help="directory written by build / ShardedIndex.save")
    p.add_argument("--queries", type=Path, required=True, help=".fvecs, .bvecs, .npy or .hdf5")
    p.add_argument("-k", type=int, default=10, help="neighbours per query (default 10)")
    p.add_argument("--nprobe", type=int, default=None, help="IVF lists searched")
    p.add_argument("--gt", type=Path, default=None, help="exact neighbours (.ivecs) for recall")
    p.add_argument("--out", type=Path, default=None, help="write the ids found as .ivecs")
    p.add_argument("--threads", type=int, default=None, help="CPU threads per process")
    args = p.parse_args(argv)
    if args.k <= 0:
        raise InputError(f"-k must be positive, got {args.k}")
    _, rank = _start(args.threads)
    sharded = ShardedIndex.load(args.index)
    q, _ = read_rows(args.queries, 0, 1, "test")
    params = {} if args.nprobe is None else {"nprobe": args.nprobe}
    (_, ids), seconds = timed(lambda: sharded.search(q, args.k, **params))
    if rank != 0:
        return 0
    line = (
        f"{len(q)} queries, k={args.k}, {sharded.num_shards} shard(s) on {sharded.world_size} "
        f"process(es): {seconds:.3f} s, {len(q) / seconds:.0f} QPS"
    )
    report_search(line, ids, args.k, args.gt, args.out)
    return 0


def _start(threads: int | None) -> tuple[int, int]:
    """Join torchrun's process group (if any); returns (world size, rank)."""
    set_threads(threads)
    if init_process_group():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print(__doc__, file=sys.stdout if argv and argv[0] in ("-h", "--help") else sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    try:
        status = build(argv[1:]) if argv[0] == "build" else search(argv[1:])
    except INPUT_ERRORS as err:
        return report_error(err)  # (torchrun stops the other processes)
    if dist.is_initialized():
        dist.barrier()  # nobody tears the group down while another process still uses it
        dist.destroy_process_group()
    return status


if __name__ == "__main__":
    sys.exit(main())
