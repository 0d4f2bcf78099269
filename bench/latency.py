"""One query at a time, as a service answers requests: vq against faiss
(``python -m bench.latency``).

    python -m bench.latency [--n 50000] [--dim 64] [--queries 1000] [--nprobe 8] [--k 10]
                            [--threads 2] [--kinds Flat IVF64,PQ16 IVF64,PQ32x4fs,RFlat]

faiss trains and fills each index on n seeded Gaussian vectors, vq imports it
(``vq.index.from_faiss``), so both search the same codes, with the same nprobe (set on both and
printed) and k_factor (faiss's default, 1). After a warm-up of 50 calls each, query i (row i of
a held-out set, numpy float32 [1, dim]) is searched alone and timed with ``perf_counter_ns``,
in alternating blocks of 100 calls per library (vq, faiss, vq, faiss, ...). Reports p50, p99
and mean per library, the vq / faiss ratio of p50 and p99, both libraries' recall@k against
exact neighbours on those queries and the fraction of neighbours they share, and the issue's
target: vq p50 <= 1.0 x faiss for the IVF kinds, <= 1.5 x for Flat.

Prints a table; writes bench/results/latency.csv.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from bench.ann import faiss_description
from bench.common import report, set_threads

KINDS = ("Flat", "IVF64,PQ16", "IVF64,PQ32x4fs,RFlat")
TARGETS = {"Flat": 1.5}  # vq p50 / faiss p50; 1.0 for every other kind
BLOCK, WARMUP = 100, 50


def time_calls(searches: dict, q: np.ndarray, k: int) -> tuple[dict, dict]:
    """Nanoseconds of each single-query call, and the ids each returned, per library; blocks of
    ``BLOCK`` calls alternate between the libraries."""
    times = {name: np.empty(len(q), np.int64) for name in searches}
    ids = {name: np.empty((len(q), k), np.int64) for name in searches}
    for search in searches.values():
        for i in range(min(WARMUP, len(q))):
            search(q[i : i + 1], k)
    for start in range(0, len(q), BLOCK):
        for name, search in searches.items():
            for i in range(start, min(start + BLOCK, len(q))):
                row = q[i : i + 1]
                t = time.perf_counter_ns()
                _, found = search(row, k)
                times[name][i] = time.perf_counter_ns() - t
                ids[name][i] = found[0]
    return times, ids


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", type=int, default=50_000, help="vectors (default 50,000)")
    p.add_argument("--dim", type=int, default=64, help="dimension (default 64)")
    p.add_argument("--queries", type=int, default=1000, help="single-query calls per library")
    p.add_argument("--nprobe", type=int, default=8, help="lists probed by both (default 8)")
    p.add_argument("--k", type=int, default=10, help="neighbours per search (default 10)")
    p.add_argument("--threads", type=int, default=2, help="threads for both systems")
    p.add_argument("--kinds", nargs="+", default=list(KINDS), help="index kinds")
    args = p.parse_args(argv)
    import faiss

    from vq.datasets import ground_truth, recall_at
    from vq.index import from_faiss

    set_threads(args.threads)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.n, args.dim), dtype=np.float32)
    q = rng.standard_normal((args.queries, args.dim), dtype=np.float32)  # held out
    k = min(args.k, args.n)
    truth = ground_truth(x, q, k)[1]
    rows = []
    for kind in args.kinds:
        theirs = faiss.index_factory(args.dim, faiss_description(kind))
        theirs.train(x)
        theirs.add(x)
        nprobe = "-"
        if "IVF" in kind:
            nprobe = faiss.extract_index_ivf(theirs).nprobe = args.nprobe
        ours = from_faiss(theirs)
        if "IVF" in kind:
            ours.nprobe = args.nprobe
            assert ours.nprobe == args.nprobe
        times, ids = time_calls({"vq": ours.search, "faiss": theirs.search}, q, k)
        us = {name: t / 1e3 for name, t in times.items()}
        p50 = {name: float(np.percentile(t, 50)) for name, t in us.items()}
        p99 = {name: float(np.percentile(t, 99)) for name, t in us.items()}
        shared = [
            len(np.intersect1d(a, b)) / k for a, b in zip(ids["vq"], ids["faiss"], strict=True)
        ]
        target = TARGETS.get(kind, 1.0)
        ratio = p50["vq"] / p50["faiss"]
        rows.append({
            "index": kind,
            "nprobe": nprobe,
            "vq p50 us": p50["vq"],
            "vq p99 us": p99["vq"],
            "vq mean us": float(us["vq"].mean()),
            "faiss p50 us": p50["faiss"],
            "faiss p99 us": p99["faiss"],
            "faiss mean us": float(us["faiss"].mean()),
            "p50 ratio": ratio,
            "p99 ratio": p99["vq"] / p99["faiss"],
            f"vq recall@{k}": recall_at(ids["vq"], truth, k),
            f"faiss recall@{k}": recall_at(ids["faiss"], truth, k),
            "same ids": float(np.mean(shared)),
            "target": f"p50 <= {target:g}x: {'met' if ratio <= target else 'not met'}",
        })  # fmt: skip
    title = (
        f"## One query at a time: n={args.n:,}, d={args.dim}, k={k}, nprobe {args.nprobe} (IVF "
        f"kinds, both libraries), {args.queries} single-query calls per library in alternating "
        f"blocks of {BLOCK}; faiss builds, vq imports (ratios: vq / faiss; same ids: the "
        f"fraction of the {k} neighbours both return)"
    )
    report("latency", title, args.threads, rows, list(rows[0]) if rows else ["index"])
    return rows


if __name__ == "__main__":
    main()
