"""Run the benchmark suite at its default sizes: ``python -m bench`` (``vq bench``, ``make
bench``), or some of its benchmarks by name: ``python -m bench kmeans latency``.

ann and fastscan run at n=200,000 synthetic vectors here, to keep the whole run short;
``python -m bench.ann`` and ``python -m bench.fastscan`` alone default to 1M (``--data nsynth``
for the NSynth embeddings). coldstart starts some seventy fresh processes (each paying
``import torch``) and compiles every kind once in an empty kernel cache
(``python -m bench.coldstart --no-cold`` skips those compiles). The recall frontiers against
faiss, hnswlib and ScaNN run on their own: ``python -m bench.frontier`` (real sentence
embeddings; the first run embeds them). How long each part takes: docs/perf/bench-durations.md.

The arguments are parsed before any benchmark module is imported (they import torch and
faiss), so that ``--help`` and ``--list`` answer at once.
"""

from __future__ import annotations

import argparse
import importlib
import sys

#: the suite, in the order it runs: name -> (the arguments it runs with, what it measures)
SUITE = {
    "kmeans": ([], "k-means against faiss.Kmeans at equal k and iterations"),
    "encode": ([], "PQ, OPQ and RVQ encode/decode throughput against faiss"),
    "pq_search": ([], "PQ search against faiss IndexPQ with the same codes"),
    "ann": (["--n", "200000"], "recall against QPS of each index kind, vq and faiss"),
    "fastscan": (["--n", "200000"], "4-bit fast-scan search on the same index as faiss"),
    "memory": ([], "peak memory and bytes per vector of adding vectors"),
    "coldstart": ([], "time to the first answer in a new process, warm and cold cache"),
    "freshstart": ([], "the first build and searches on a machine that compiled nothing"),
    "latency": ([], "one query at a time, as a service answers requests"),
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="vq bench",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run the benchmarks against faiss at their default sizes (about 20\n"
        "minutes on two cores for the whole suite) and print their tables.\n\n"
        "benchmarks of the suite:\n"
        + "\n".join(f"  {name:<11}{what}" for name, (_, what) in SUITE.items())
        + "\n\nEach is also a program of its own with more options: python -m bench.NAME "
        "--help\n(from the repository root), as are the ones outside the suite (frontier,\n"
        "hnsw, ivf_search, filtered, range, spill, sketch, updates, mmap, export, ...).",
    )
    p.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help="the benchmarks to run, in the suite's order (default: all of them)",
    )
    p.add_argument("--list", action="store_true", help="list the suite's benchmarks and exit")
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    unknown = [name for name in args.names if name not in SUITE]
    if unknown:
        p.error(
            f"no benchmark {', '.join(unknown)} in the suite (it has {', '.join(SUITE)}); run "
            "others as python -m bench.NAME"
        )
    if args.list:
        for name, (_, what) in SUITE.items():
            print(f"{name:<11}{what}")
        return 0
    for name, (argv_of, _) in SUITE.items():
        if args.names and name not in args.names:
            continue
        importlib.import_module(f"bench.{name}").main(argv_of)
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
