"""The command lines of ``python -m vq.distributed`` (:mod:`vq.apps.torchrun`): its top level
and its two commands, ``build`` and ``search``, with the checks that need no data.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from vq.apps.errors import InputError
from vq.apps.parser import (
    ID_FILES,
    METRIC_HELP,
    METRICS,
    NEIGHBOR_FILES,
    VECTOR_FILES,
    Parser,
    add_threads,
    require_positive,
)

DISTRIBUTED = "python -m vq.distributed"


def distributed(prog: str = DISTRIBUTED) -> Parser:
    """The torchrun program's top level (its commands: :func:`distributed_build`,
    :func:`distributed_search`)."""
    p = Parser(
        prog=prog,
        usage=f"{prog} {{build,search}} ...",
        description="Build and search a sharded index, one shard per process, under torchrun:\n\n"
        "  torchrun --standalone --nproc_per_node=4 -m vq.distributed build \\\n"
        '      --data X.fvecs --index "IVF4096,PQ32" -o shards/\n'
        "  torchrun --standalone --nproc_per_node=4 -m vq.distributed search shards/ \\\n"
        "      --queries Q.fvecs -k 10 --nprobe 16 --gt GT.ivecs\n\n"
        "- build: process r of W reads its own share of the rows of the data file, all the\n"
        "processes train the index together (with checkpoints, so that a group restarted by\n"
        "torchrun --max-restarts resumes the training), each adds its rows with their row\n"
        "numbers as ids, and the shards and a manifest are written to the output directory.\n"
        "- search: every process searches its shards for all the queries; rank 0 reports the\n"
        "merged top-k.\n\n"
        "Without torchrun both run in one process. "
        f"`{prog} build --help` and `{prog} search --help` list the options.",
    )
    p.add_argument("command", choices=("build", "search"), help="what to run")
    return p


def distributed_build(prog: str = f"{DISTRIBUTED} build") -> Parser:
    p = Parser(
        prog=prog,
        description="Train an index on the union of the processes' rows, add them, save one\n"
        f"shard per process and a manifest.\n\nData: {VECTOR_FILES};\n"
        "of an .hdf5 file, its train set.",
    )
    p.add_argument("--data", type=Path, required=True, help=f"the vectors: {VECTOR_FILES}")
    p.add_argument("--index", required=True, help='faiss-style description, e.g. "IVF4096,PQ32"')
    p.add_argument("-o", "--output", type=Path, required=True, help="directory for the shards")
    p.add_argument("--metric", choices=METRICS, default=None, help=METRIC_HELP)
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
    add_threads(p, None, "CPU threads per process")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument(
        "--no-warm-up",
        action="store_true",
        help="skip compiling the search kernels (the first process that searches then does)",
    )
    return p


def check_distributed_build(args: argparse.Namespace) -> None:
    for flag in ("threads", "train_size", "nprobe", "checkpoint_every"):
        require_positive(getattr(args, flag), "--" + flag.replace("_", "-"))


def distributed_search(prog: str = f"{DISTRIBUTED} search") -> Parser:
    p = Parser(
        prog=prog,
        description="Search a sharded index for the global top-k; rank 0 prints the queries\n"
        f"per second and the recall.\n\nQueries: {VECTOR_FILES};\n"
        f"of an .hdf5 file, its test set.\nGround truth: {NEIGHBOR_FILES}.",
    )
    p.add_argument("index", type=Path, help="a directory written by build (ShardedIndex.save)")
    p.add_argument("--queries", type=Path, required=True, help=f"the queries: {VECTOR_FILES}")
    p.add_argument("-k", type=int, default=10, help="neighbours per query (default 10)")
    p.add_argument("--nprobe", type=int, default=None, help="IVF lists searched")
    p.add_argument(
        "--gt", type=Path, default=None, help="exact neighbours (.ivecs, .ibin, .npy or .hdf5)"
    )
    p.add_argument(
        "--out", type=Path, default=None, help="write the ids found (.ivecs, .ibin or .npy)"
    )
    add_threads(p, None, "CPU threads per process")
    return p


def check_distributed_search(args: argparse.Namespace) -> None:
    if args.k <= 0:
        raise InputError(f"-k must be positive, got {args.k}")
    require_positive(args.threads, "--threads")
    require_positive(args.nprobe, "--nprobe")
    if args.out is not None and args.out.suffix.lower() not in ID_FILES:
        raise InputError(f"--out {args.out}: write ids as {', '.join(ID_FILES)}")
