"""One query at a time, as a service answers requests: vq against faiss
(``python -m bench.latency``).

faiss builds each index, vq imports it (both search the same codes with the same nprobe); after
a warm-up, single-query searches are timed one by one with ``perf_counter_ns``, alternating
blocks of 100 calls of each library, and p50/p99 are reported with their ratio.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from bench.common import machine_header, markdown_table, set_threads, write_csv

KINDS = ("Flat", "IVF64,PQ16", "IVF64,PQ32x4fs,RFlat")
TARGETS = {"Flat": 1.5, "IVF64,PQ16": 1.0, "IVF64,PQ32x4fs,RFlat": 1.0}  # vq p50 / faiss p50


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=50_000, help="vectors (default 50,000)")
    p.add_argument("--dim", type=int, default=64, help="dimension (default 64)")
    p.add_argument("--queries", type=int, default=1000, help="single-query calls per library")
    p.add_argument("--nprobe", type=int, default=8, help="lists probed by both (default 8)")
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--kinds", nargs="*", default=list(KINDS))
    args = p.parse_args(argv)
    import faiss

    from vq.index import from_faiss

    set_threads(args.threads)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.n, args.dim), dtype=np.float32)
    q = rng.standard_normal((args.queries, args.dim), dtype=np.float32)
    rows = []
    for kind in args.kinds:
        theirs = faiss.index_factory(args.dim, kind)
        theirs.train(x)
        theirs.add(x)
        if "IVF" in kind:
            faiss.extract_index_ivf(theirs).nprobe = args.nprobe
        ours = from_faiss(theirs)
        if hasattr(ours, "nprobe"):
            ours.nprobe = args.nprobe
        for i in range(min(50, args.queries)):  # warm-up
            ours.search(q[i : i + 1], args.k)
            theirs.search(q[i : i + 1], args.k)
        times: dict[str, list[int]] = {"vq": [], "faiss": []}
        agree = []
        for start in range(0, args.queries, 100):
            block = range(start, min(start + 100, args.queries))
            for name, search in (("vq", ours.search), ("faiss", theirs.search)):
                for i in block:
                    t = time.perf_counter_ns()
                    search(q[i : i + 1], args.k)
                    times[name].append(time.perf_counter_ns() - t)
            for i in block[:5]:
                mine, ref = (
                    ours.search(q[i : i + 1], args.k)[1],
                    theirs.search(q[i : i + 1], args.k)[1],
                )
                agree.append(len(np.intersect1d(mine, ref)) / args.k)
        p_vq = np.percentile(times["vq"], [50, 99]) / 1e3
        p_faiss = np.percentile(times["faiss"], [50, 99]) / 1e3
        ratio, target = p_vq[0] / p_faiss[0], TARGETS.get(kind, 1.0)
        rows.append({
            "index": kind,
            "vq p50 us": p_vq[0],
            "vq p99 us": p_vq[1],
            "faiss p50 us": p_faiss[0],
            "faiss p99 us": p_faiss[1],
            "p50 ratio": ratio,
            "p99 ratio": p_vq[1] / p_faiss[1],
            "same ids": float(np.mean(agree)),
            "target": f"<= {target}: {'met' if ratio <= target else 'not met'}",
        })  # fmt: skip
    columns = list(rows[0]) if rows else []
    print(
        f"One query at a time: {args.n:,} x {args.dim}, k={args.k}, nprobe {args.nprobe}, "
        f"{args.queries} calls per library, alternating blocks of 100"
    )
    print(machine_header(args.threads) + "\n")
    print(markdown_table(rows, columns))
    write_csv("latency", rows, columns)
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
