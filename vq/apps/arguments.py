"""The command lines of vq's programs: every option, its help text and the checks that need no
data, built from the standard library alone.

``vq --help`` and ``vq <command> --help`` are answered from here without importing torch, numba
or the indexes; each program's work (:mod:`vq.apps.build_search`, :mod:`vq.apps.export`,
:mod:`vq.apps.nsynth`, :mod:`vq.apps.validate`, :mod:`vq.apps.warmup`,
:mod:`vq.apps.torchrun`) is imported once its arguments have parsed. Help texts are plain
words: they are what a user reads in a terminal.

    args = parse("build", ["--data", "x.npy", "--index", "Flat", "-o", "x.vq"])

The torchrun program's command lines are in :mod:`vq.apps.distributed_arguments`; :data:`PROGRAMS`
holds them too, as "distributed build" and "distributed search".

Usage errors print one line, ``error: <program>: <what is wrong>``, and exit with status 2
(:class:`~vq.apps.parser.Parser`); checks of values that parse but cannot be right
(``--threads 0``) raise :class:`~vq.apps.errors.InputError` (one line, status 2, through
:func:`~vq.apps.errors.run_command`).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path

from vq.apps.distributed_arguments import (
    check_distributed_build,
    check_distributed_search,
    distributed_build,
    distributed_search,
)
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

#: the index kinds ``vq warmup`` compiles by default (at the dimension given)
COMMON = (
    "Flat",
    "PQ16",
    "IVF64,Flat",
    "IVF64,PQ16",
    "OPQ16,IVF64,PQ16",
    "PQ32x4fs",
    "IVF64,PQ32x4fs",
    "IVF64,PQ32x4fsr,RFlat",
    "SQ8",
    "IVF64,SQ8",
    "HNSW32",
    "HNSW32,SQ8",
)
_KERNEL_CACHE = "$NUMBA_CACHE_DIR/vq, else $XDG_CACHE_HOME/vq, else ~/.cache/vq"

# -- vq build / vq search ------------------------------------------------------------------------


def build(prog: str = "vq build") -> Parser:
    p = Parser(
        prog=prog,
        description="Train an index on a file of vectors, add them, and save the index.\n\n"
        'The index is described as in faiss: "Flat", "IVF1024,PQ16", "HNSW32",\n'
        '"OPQ16,IVF1024,PQ16", "IVF1024,PQ32x4fs,RFlat", ...\n\n'
        f"The vectors: {VECTOR_FILES}; of an .hdf5 file, its train set.\n\n"
        "After saving, the search kernels are compiled once for this machine, so that the\n"
        "first `vq search` does not wait for a compiler (--no-warm-up skips this).",
    )
    p.add_argument("--data", type=Path, required=True, help=f"the vectors: {VECTOR_FILES}")
    p.add_argument("--index", required=True, help='faiss-style description, e.g. "IVF1024,PQ16"')
    p.add_argument("-o", "--output", type=Path, required=True, help="where to save the index")
    p.add_argument("--metric", choices=METRICS, default=None, help=METRIC_HELP)
    p.add_argument(
        "--train-size",
        type=int,
        default=None,
        help="train on a random sample of this many vectors (default: all)",
    )
    p.add_argument("--nprobe", type=int, default=None, help="IVF lists searched (stored)")
    p.add_argument("--k-factor", type=int, default=None, help="re-ranking factor (stored)")
    p.add_argument("--seed", type=int, default=0, help="seed of the training sample")
    add_threads(p, 2)
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument(
        "--no-warm-up",
        action="store_true",
        help="skip compiling the search kernels (the first process that searches then does)",
    )
    return p


def check_build(args: argparse.Namespace) -> None:
    for flag in ("threads", "train_size", "nprobe", "k_factor"):
        require_positive(getattr(args, flag), "--" + flag.replace("_", "-"))


def search(prog: str = "vq search") -> Parser:
    p = Parser(
        prog=prog,
        description="Search a saved index; prints the queries per second, and the recall\n"
        "against exact neighbours with --gt.\n\n"
        f"Queries: {VECTOR_FILES};\nof an .hdf5 file, its test set.\n"
        f"Ground truth: {NEIGHBOR_FILES}.",
    )
    p.add_argument("index", type=Path, help="an index saved by vq build (or index.save)")
    p.add_argument("--queries", type=Path, required=True, help=f"the queries: {VECTOR_FILES}")
    p.add_argument(
        "-k",
        type=int,
        default=10,
        help="neighbours per query (default 10; at most the vectors in the index)",
    )
    p.add_argument("--nprobe", type=int, default=None, help="IVF lists searched (default: saved)")
    p.add_argument("--k-factor", type=int, default=None, help="re-ranking candidates per result")
    p.add_argument(
        "--gt",
        type=Path,
        default=None,
        help="exact neighbours, to report recall (.ivecs, .ibin, .npy or .hdf5)",
    )
    p.add_argument(
        "--radius",
        type=float,
        default=None,
        help="range search: every vector within this squared L2 distance (above this inner "
        "product); --out then writes lims, D and I as .npz",
    )
    p.add_argument("--mmap", action="store_true", help="map the index file instead of reading it")
    p.add_argument(
        "--out", type=Path, default=None, help="write the ids found (.ivecs, .ibin or .npy)"
    )
    add_threads(p, 2)
    return p


def check_search(args: argparse.Namespace) -> None:
    if args.k <= 0:
        raise InputError(f"-k must be positive, got {args.k}")
    for flag in ("threads", "nprobe", "k_factor"):
        require_positive(getattr(args, flag), "--" + flag.replace("_", "-"))
    if args.radius is not None and args.gt is not None:
        raise InputError("--gt measures top-k recall; it does not apply to --radius")
    if args.out is not None:
        wanted = (".npz",) if args.radius is not None else ID_FILES
        if args.out.suffix.lower() not in wanted:
            raise InputError(
                f"--out {args.out}: write {'range results as' if args.radius else 'ids as'} "
                f"{', '.join(wanted)} (the suffix says which)"
            )


# -- vq export -----------------------------------------------------------------------------------


def export(prog: str = "vq export") -> Parser:
    p = Parser(
        prog=prog,
        description="Export a saved index's search to ONNX with static shapes, or audit ONNX\n"
        "models.\n\n"
        f"  {prog} my.index -o search.onnx --batch-size 64 -k 10 --nprobe 16\n"
        f"  {prog} faiss.index -o search.onnx    (a file written by faiss.write_index)\n"
        f"  {prog} --audit search.onnx           (exit status 1 unless all shapes are static)\n\n"
        "--check QUERIES runs the model in ONNX Runtime and compares its answers with the\n"
        "index's own search.",
    )
    p.add_argument(
        "index", type=Path, nargs="+", help="a saved index (or ONNX models with --audit)"
    )
    p.add_argument("-o", "--output", type=Path, help="the .onnx file to write")
    p.add_argument("--audit", action="store_true", help="audit ONNX models instead of exporting")
    p.add_argument("--batch-size", type=int, default=1, help="queries per call (default 1)")
    p.add_argument("-k", type=int, default=None, help="neighbours per query (default: saved k)")
    p.add_argument("--nprobe", type=int, default=None, help="IVF lists probed (default: saved)")
    p.add_argument("--k-factor", type=int, default=None, help="re-ranking factor (default: saved)")
    p.add_argument(
        "--capacity", type=int, default=None, help="slots per padded list (default: longest list)"
    )
    p.add_argument(
        "--code-dtype",
        choices=["uint8", "int16", "int32", "int64"],
        default=None,
        help="dtype of the code tables in the graph (int32 for TensorRT; default: as stored)",
    )
    p.add_argument("--dynamic-batch", action="store_true", help="symbolic batch axis")
    p.add_argument(
        "--filtered",
        action="store_true",
        help="a second input 'allowed' (bool [largest id + 1]): the ids a search may return",
    )
    p.add_argument("--opset", type=int, default=None, help="ONNX opset (default 20)")
    p.add_argument(
        "--check",
        type=Path,
        default=None,
        metavar="QUERIES",
        help=f"compare ONNX Runtime with the index's search on these queries ({VECTOR_FILES})",
    )
    return p


def check_export(args: argparse.Namespace, p: argparse.ArgumentParser) -> None:
    if not args.audit and (len(args.index) != 1 or args.output is None):
        p.error("give one index file and -o OUTPUT.onnx (or --audit MODEL.onnx ...)")


# -- vq nsynth / vq validate ---------------------------------------------------------------------


def nsynth(prog: str = "vq nsynth") -> Parser:
    p = Parser(
        prog=prog,
        description="The main job: vq against faiss on NSynth audio embeddings.\n\n"
        "Builds (once) a set of synthetic notes in the NSynth layout, or reads a real NSynth\n"
        "download (--nsynth-root), embeds every note with torchaudio (log-mel statistics),\n"
        "then builds vq's and faiss's Flat, PQ, IVF-PQ and OPQ+IVF-PQ indexes with the same\n"
        "parameters and prints recall@1/10/100, QPS, training time and bytes per vector side\n"
        "by side. The database is the train split, the queries the test split. A second\n"
        "table checks the quantizers against faiss on the same embeddings.\n\n"
        "Exit status 1 if vq's recall@10 falls more than 0.01 below faiss's for an index, or\n"
        "a check fails. Needs faiss and torchaudio.",
    )
    p.add_argument(
        "--nsynth-root", type=Path, help="a real NSynth download (with train/ and test/)"
    )
    p.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="where the synthetic set and the embedding cache live (default ~/.cache/vq)",
    )
    p.add_argument(
        "--instruments",
        type=int,
        default=330,
        help="synthetic instruments in the train split (test gets a tenth; default 330)",
    )
    p.add_argument("--max-notes", type=int, default=None, help="use at most this many train notes")
    p.add_argument("--method", choices=["logmel", "mfcc"], default="logmel", help="embedding")
    p.add_argument("--nprobe", type=int, default=8, help="IVF lists probed (default 8)")
    add_threads(p, 2, "threads for vq and faiss alike")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic set")
    p.add_argument("--skip-validation", action="store_true", help="only the index table")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    return p


def check_nsynth(args: argparse.Namespace, p: argparse.ArgumentParser) -> None:
    if args.instruments < 11:
        p.error(f"--instruments must be at least 11 (one per family), got {args.instruments}")
    if args.max_notes is not None and args.max_notes < 1:
        p.error(f"--max-notes must be positive, got {args.max_notes}")
    require_positive(args.threads, "--threads")
    require_positive(args.nprobe, "--nprobe")


def validate(prog: str = "vq validate") -> Parser:
    p = Parser(
        prog=prog,
        description="Check vq against faiss on generated vectors (blobs, and anisotropic\n"
        "vectors for OPQ and IVF-PQ):\n\n"
        "1. the same codebooks give the same codes: faiss-trained codebooks copied into vq\n"
        "   (and vq's into faiss) give identical codes, ties aside, and equal decodes;\n"
        "2. trained independently, the same quality: k-means objective and PQ/OPQ\n"
        "   reconstruction error within 1% of faiss, RVQ within 2%, IVF-PQ recall@10 within\n"
        "   0.01;\n"
        "3. speed side by side on the same data and threads, as a ratio (indicative: the\n"
        "   careful measurements are the benchmarks, `vq bench`).\n\n"
        "Prints one table; exit status 1 if a check fails. Needs faiss. `vq nsynth` runs the\n"
        "same checks on audio embeddings.",
    )
    p.add_argument("--n", type=int, default=50_000, help="vectors per data set (default 50000)")
    p.add_argument("--dim", type=int, default=64, help="dimension, a multiple of 8 (default 64)")
    add_threads(p, 2, "threads for vq and faiss alike")
    return p


def check_validate(args: argparse.Namespace, p: argparse.ArgumentParser) -> None:
    if args.dim % 8 or args.dim <= 0:
        p.error(f"--dim must be a positive multiple of 8, got {args.dim}")
    if args.n < 20_000:
        p.error(f"--n must be at least 20000 (PQ and RVQ training sizes), got {args.n}")
    require_positive(args.threads, "--threads")


# -- vq warmup -----------------------------------------------------------------------------------


def warmup(prog: str = "vq warmup") -> Parser:
    p = Parser(
        prog=prog,
        description="Compile the search kernels of the common index kinds ahead of time, once\n"
        "per machine. They are kept in the kernel cache\n"
        f"({_KERNEL_CACHE})\n"
        "and loaded by every later process. Kernels are specialised by the shape of the\n"
        "codes: warm up at the dimension you use. --saved FILE compiles the kernels of a\n"
        "saved index's searches instead.",
    )
    p.add_argument(
        "--index",
        action="append",
        default=None,
        metavar="DESCRIPTION",
        help=f"an index description (repeatable; default: {', '.join(COMMON)})",
    )
    p.add_argument(
        "--saved",
        action="append",
        default=None,
        type=Path,
        metavar="FILE",
        help="a saved index: compile the kernels of its searches (repeatable; with no --index, "
        "only these)",
    )
    p.add_argument("--dim", type=int, default=128, help="vector dimension (default 128)")
    p.add_argument(
        "--metric", choices=[*METRICS, "both"], default="l2", help="default l2; both: l2 and ip"
    )
    p.add_argument("--no-layer", action="store_true", help="skip the quantizer-layer step")
    p.add_argument(
        "--jobs",
        type=int,
        default=max(1, min(4, os.cpu_count() or 1)),
        help="kinds compiled at a time, a process each (default: the cores, at most 4)",
    )
    return p


def check_warmup(args: argparse.Namespace) -> None:
    require_positive(args.dim, "--dim")
    require_positive(args.jobs, "--jobs")


#: each program's parser and its checks: (parser builder, checks needing the parser or None,
#: checks raising InputError or None)
PROGRAMS: dict[str, tuple[Callable[[str], Parser], Callable | None, Callable | None]] = {
    "build": (build, None, check_build),
    "search": (search, None, check_search),
    "export": (export, check_export, None),
    "nsynth": (nsynth, check_nsynth, None),
    "validate": (validate, check_validate, None),
    "warmup": (warmup, None, check_warmup),
    "distributed build": (distributed_build, None, check_distributed_build),
    "distributed search": (distributed_search, None, check_distributed_search),
}


def parse(name: str, argv: list[str], prog: str | None = None) -> argparse.Namespace:
    """Parse the command line ``argv`` of program ``name`` ("build", "search", "export",
    "nsynth", "validate", "warmup", "distributed build", "distributed search") and check what
    needs no data: usage errors exit with status 2 (one line), bad values raise
    :class:`~vq.apps.errors.InputError`."""
    builder, usage_checks, value_checks = PROGRAMS[name]
    p = builder(prog) if prog is not None else builder()
    args = p.parse_args(argv)
    if usage_checks is not None:
        usage_checks(args, p)
    if value_checks is not None:
        value_checks(args)
    return args
