"""The ``vq`` console command.

    vq build --data X.fvecs --index "OPQ16,IVF1024,PQ16" -o index.vq   train and fill an index
    vq search index.vq --queries Q.fvecs -k 10 [--gt GT.ivecs]         search; recall with --gt
    vq export index.vq -o search.onnx --batch-size 64                  static-shape ONNX search
    vq export --audit model.onnx             op counts, dynamic shapes, data-dependent ops
    vq nsynth [options]      the main job: vq against faiss on NSynth embeddings
    vq validate [options]    quantizer and index checks against faiss on generated vectors
    vq bench [name ...]      the benchmarks (from a source checkout: bench/ is not installed)
    vq warmup [--index DESCRIPTION ...] [--dim D]   compile the kernels ahead of time
    vq warmup --saved index.vq               compile the kernels of a saved index's searches

Vector files: .fvecs, .bvecs (converted to float32), .ivecs (ground truth), and ann-benchmarks
.hdf5 (train vectors for build, test vectors and neighbors for search). Every subcommand takes
``--help``. Bad input ends with a one-line ``error: …`` and exit status 2.
"""

from __future__ import annotations

import argparse
import functools
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

import vq
from vq.apps import export as export_cli
from vq.apps import nsynth, validate
from vq.apps.common import (
    InputError,
    read_vectors,
    report_search,
    run_command,
    set_threads,
    timed,
)
from vq.apps.warmup import COMMON, Warmed
from vq.apps.warmup import warmup as warm_up
from vq.kernels import cache

COMMANDS = ("build", "search", "export", "nsynth", "validate", "bench", "warmup")


def _compile_notice(what: str):
    """A context printing one line on stderr before the first kernel compilation inside (the
    kernels are then kept for every later process)."""
    where = cache.folder()
    kept = f"kept in {where}" if where is not None else "in memory: the cache is not writable"
    return cache.announce(f"vq: compiling {what}, once per machine ({kept})")


def build(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="vq build", description="Train an index on a vector file, add the vectors, save it."
    )
    p.add_argument("--data", type=Path, required=True, help=".fvecs, .bvecs or .hdf5 (train)")
    p.add_argument("--index", required=True, help='faiss-style description, e.g. "IVF1024,PQ16"')
    p.add_argument("-o", "--output", type=Path, required=True, help="where to save the index")
    p.add_argument("--metric", choices=["l2", "ip"], default="l2", help="distance (default l2)")
    p.add_argument(
        "--train-size",
        type=int,
        default=None,
        help="train on a random sample of this many vectors (default: all)",
    )
    p.add_argument("--nprobe", type=int, default=None, help="IVF lists searched (stored)")
    p.add_argument("--k-factor", type=int, default=None, help="re-ranking factor (stored)")
    p.add_argument("--seed", type=int, default=0, help="seed of the training sample")
    p.add_argument("--threads", type=int, default=2, help="CPU threads (default 2)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument(
        "--no-warm-up",
        action="store_true",
        help="skip compiling the search kernels (the first process that searches then does)",
    )
    args = p.parse_args(argv)
    set_threads(args.threads)
    x = read_vectors(args.data, "train")
    index = vq.index_factory(x.shape[1], args.index, metric=args.metric)
    if args.nprobe is not None:  # checked before the (long) training
        _set(index, "nprobe", args.nprobe)
    if args.k_factor is not None:
        _set(index, "k_factor", args.k_factor)
    index.verbose = not args.quiet
    for inner in index.modules():
        if isinstance(inner, vq.index.Index):
            inner.verbose = not args.quiet
    train = x
    if args.train_size is not None:
        if args.train_size <= 0:
            raise InputError(f"--train-size must be positive, got {args.train_size}")
        if args.train_size < len(x):
            rng = np.random.default_rng(args.seed)
            train = x[np.sort(rng.choice(len(x), args.train_size, replace=False))]
    with _compile_notice(f"the kernels of {args.index} (dim {x.shape[1]})"):
        _, t_train = timed(lambda: index.train(train))
        _, t_add = timed(lambda: index.add(x))
    index.save(args.output)
    print(
        f"{args.index}: {index.ntotal} vectors of dim {x.shape[1]}, trained on {len(train)} in "
        f"{t_train:.1f} s, added in {t_add:.1f} s; saved {args.output} "
        f"({args.output.stat().st_size / 2**20:.1f} MiB)"
    )
    if not args.no_warm_up:  # so that the first `vq search` (a service…) compiles nothing
        with _compile_notice(f"the search kernels of {args.index}"):
            compiled, seconds = timed(index.warm_up)
        if compiled:
            print(f"search kernels: {compiled} compiled in {seconds:.1f} s, kept for later runs")
    return 0


def _set(index, name: str, value: int) -> None:
    if not hasattr(index, name):
        raise InputError(f"--{name.replace('_', '-')} does not apply to {type(index).__name__}")
    if value <= 0:
        raise InputError(f"--{name.replace('_', '-')} must be positive, got {value}")
    setattr(index, name, value)


def search(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="vq search", description="Search a saved index; prints QPS, and recall with --gt."
    )
    p.add_argument("index", type=Path, help="an index saved by vq build / index.save")
    p.add_argument("--queries", type=Path, required=True, help=".fvecs, .bvecs or .hdf5 (test)")
    p.add_argument("-k", type=int, default=10, help="neighbours per query (default 10)")
    p.add_argument("--nprobe", type=int, default=None, help="IVF lists searched (default: saved)")
    p.add_argument("--k-factor", type=int, default=None, help="re-ranking candidates per result")
    p.add_argument(
        "--gt",
        type=Path,
        default=None,
        help="exact neighbours (.ivecs, or .hdf5 neighbors) to report recall",
    )
    p.add_argument(
        "--radius",
        type=float,
        default=None,
        help="range search: every vector within this squared L2 distance (above this inner "
        "product); --out then writes lims, D and I as .npz",
    )
    p.add_argument("--mmap", action="store_true", help="map the index file instead of reading it")
    p.add_argument("--out", type=Path, default=None, help="write the ids found as .ivecs")
    p.add_argument("--threads", type=int, default=2, help="CPU threads (default 2)")
    args = p.parse_args(argv)
    set_threads(args.threads)
    if args.k <= 0:
        raise InputError(f"-k must be positive, got {args.k}")
    if args.radius is not None and args.gt is not None:
        raise InputError("--gt measures top-k recall; it does not apply to --radius")
    index = vq.load_index(args.index, mmap=args.mmap)
    q = read_vectors(args.queries, "test")
    if args.radius is not None:
        return _range_search(index, q, args)
    if args.nprobe is not None:
        _set(index, "nprobe", args.nprobe)
    if args.k_factor is not None:
        _set(index, "k_factor", args.k_factor)
    kind = f"{type(index).__name__} of dim {index.dim}"
    with _compile_notice(f"search kernels for this {kind}"):
        (_, ids), seconds = timed(lambda: index.search(q, args.k))
    line = f"{len(q)} queries, k={args.k}: {seconds:.3f} s, {len(q) / seconds:.0f} QPS"
    report_search(line, ids, args.k, args.gt, args.out)
    return 0


def _range_search(index, q, args) -> int:
    params = {} if args.nprobe is None else {"nprobe": args.nprobe}
    try:
        (lims, dist, ids), seconds = timed(lambda: index.range_search(q, args.radius, **params))
    except (ValueError, TypeError, NotImplementedError) as err:
        raise InputError(str(err)) from err
    print(
        f"{len(q)} queries, radius {args.radius:g}: {seconds:.3f} s, {len(q) / seconds:.0f} QPS, "
        f"{int(lims[-1])} results ({lims[-1] / max(1, len(q)):.1f} per query)"
    )
    if args.out is not None:
        np.savez(args.out, lims=lims, D=dist, I=ids)
    return 0


def warmup(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="vq warmup",
        description="Compile the kernels of the common index kinds ahead of time, once per "
        f"machine (kept in {cache.folder() or 'memory only: the cache is not writable'}).",
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
    p.add_argument("--metric", choices=["l2", "ip", "both"], default="l2", help="default l2")
    p.add_argument("--no-layer", action="store_true", help="skip the quantizer-layer step")
    p.add_argument(
        "--jobs",
        type=int,
        default=max(1, min(4, os.cpu_count() or 1)),
        help="kinds compiled at a time, a process each (default: the cores, at most 4)",
    )
    args = p.parse_args(argv)
    if args.dim <= 0:
        raise InputError(f"--dim must be positive, got {args.dim}")
    if args.jobs <= 0:
        raise InputError(f"--jobs must be positive, got {args.jobs}")
    metrics = ("l2", "ip") if args.metric == "both" else (args.metric,)

    def report(item: Warmed) -> None:
        state = f"{item.compiled} kernels compiled" if item.compiled else "all cached"
        print(f"{item.description:28s} {item.seconds:6.1f} s  ({state})", flush=True)

    start = time.perf_counter()
    indexes = [(path, vq.load_index(path)) for path in args.saved or ()]  # all read first
    done = []
    for path, index in indexes:
        compiled, seconds = timed(index.warm_up)
        done.append(Warmed(f"{path} ({type(index).__name__})", seconds, compiled))
        report(done[-1])
    what = [f"{len(done)} saved indexes"] if done else []
    if args.index or not args.saved:
        kinds = args.index or COMMON
        n = len(done)
        done += warm_up(kinds, args.dim, metrics, not args.no_layer, report, args.jobs)
        what.append(f"{len(done) - n} kinds at dim {args.dim}")
    compiled = sum(item.compiled for item in done)
    print(
        f"warm-up of {' and '.join(what)}: {time.perf_counter() - start:.1f} s, "
        f"{compiled} kernels compiled; kept in {cache.folder() or 'memory only'}"
    )
    return 0


def bench(argv: list[str]) -> int:
    """``python -m bench`` in a process of its own, with this interpreter: the library never
    imports the benchmarks (bench/ is a folder of the source checkout, not installed)."""
    root = _bench_root()
    if root is None:
        raise InputError(
            "the benchmarks live in the source checkout's bench/ folder: run `vq bench` (or "
            "`python -m bench`) from the repository root"
        )
    paths = [str(root), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    return subprocess.run([sys.executable, "-m", "bench", *argv], env=env, check=False).returncode


def _bench_root() -> Path | None:
    """The folder holding bench/: the current directory, or the source checkout this package
    sits in (None for an installed package run elsewhere)."""
    for root in (Path.cwd(), Path(__file__).resolve().parents[2]):
        if (root / "bench" / "__main__.py").is_file():
            return root
    return None


#: what each command runs, given the rest of the command line
RUNNERS: dict[str, Callable[[list[str]], int]] = {
    "build": build,
    "search": search,
    "export": functools.partial(export_cli.main, prog="vq export"),
    "nsynth": functools.partial(nsynth.main, prog="vq nsynth"),
    "validate": validate.main,
    "bench": bench,
    "warmup": warmup,
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="vq", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("command", choices=COMMANDS, help="what to run")
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        parser.parse_args([command])  # prints the usage error and exits 2
    return run_command(RUNNERS[command], rest)


if __name__ == "__main__":
    sys.exit(main())
