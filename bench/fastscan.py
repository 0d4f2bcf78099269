"""4-bit fast-scan, vq against faiss on the same index: faiss trains and fills each index, vq
imports it (``vq.index.from_faiss``), so both search the same codes with the same parameters and
return the same answers; the only difference left is the search code.

    python -m bench.fastscan [--data synthetic|nsynth|...] [--n 1000000] [--nq 1000] [--k 10]

Index types: PQ{2M}x4fs (flat), IVF{nlist},PQ{2M}x4fs (vectors encoded, faiss's default),
IVF{nlist},PQ{2M}x4fsr (residuals encoded) and IVF{nlist},PQ{2M}x4fs,RFlat (exact re-ranking
of k x k_factor candidates), with M = dim // 8 and nlist as bench.ann. IVF types sweep nprobe
(1..64), RFlat sweeps k_factor at nprobe 16 and 64. QPS are timed alternately (A B A B, each
sample at least --min-seconds, best of --rounds) with --threads threads for both systems.

Prints a table; writes bench/results/<name>.csv and a recall@k-QPS plot <name>.png with both
frontiers (--name, default "fastscan").
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from bench.ann import add_data_arguments, default_nlist, load_data
from bench.common import alternate, figure, report, set_threads


def index_types(nlist: int, M: int) -> list[str]:
    return [
        f"PQ{2 * M}x4fs",
        f"IVF{nlist},PQ{2 * M}x4fs",
        f"IVF{nlist},PQ{2 * M}x4fsr",
        f"IVF{nlist},PQ{2 * M}x4fs,RFlat",
    ]


def sweep(desc: str, nlist: int, nprobes: list[int], k_factors: list[int]) -> list[dict]:
    """The search parameters of each point of an index type's sweep."""
    if desc.endswith("RFlat"):
        probes = sorted({min(p, nlist) for p in (16, 64)})
        return [{"nprobe": p, "k_factor": f} for p in probes for f in k_factors]
    if "IVF" in desc:
        return [{"nprobe": p} for p in sorted({min(p, nlist) for p in nprobes})]
    return [{}]


def set_params(index, params: dict) -> None:
    import faiss

    if "nprobe" in params:
        faiss.extract_index_ivf(index).nprobe = params["nprobe"]
    if "k_factor" in params:
        index.k_factor = params["k_factor"]


def plot(rows: list[dict], name: str, title: str, k: int) -> None:
    """recall@k against QPS, a line per index type (and nprobe, for RFlat) and system."""
    series: dict[str, list[dict]] = {}
    for r in rows:
        nprobe = r["param"].split(",")[0] if r["index"].endswith("RFlat") else ""
        series.setdefault(f"{r['index']} {nprobe}".strip(), []).append(r)
    with figure(name, size=(8, 5)) as ax:
        for i, (line, pts) in enumerate(series.items()):
            for system, style in (("vq", "o-"), ("faiss", "s--")):
                mine = [r for r in pts if r["system"] == system]
                ax.plot(
                    [float(r[f"recall@{k}"]) for r in mine],
                    [float(r["QPS"]) for r in mine],
                    style,
                    color=f"C{i}",
                    label=f"{line} ({system})",
                    markersize=4,
                )
        ax.set_xlabel(f"recall@{k}")
        ax.set_ylabel("queries per second")
        ax.set_yscale("log")
        ax.set_title(title)
        ax.legend(fontsize=6, ncol=2)


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_data_arguments(p)
    p.add_argument("--M", type=int, default=None, help="bytes per vector (default dim // 8)")
    p.add_argument("--index", nargs="+", default=None, help="index types (default: all four)")
    p.add_argument("--nprobe", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    p.add_argument("--k-factor", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    p.add_argument("--k", type=int, default=10, help="neighbours per search")
    p.add_argument("--threads", type=int, default=2, help="threads for both systems")
    p.add_argument("--rounds", type=int, default=5, help="alternating timing rounds (best kept)")
    p.add_argument("--min-seconds", type=float, default=0.1, help="least time per timing sample")
    p.add_argument("--name", default="fastscan", help="results/<name>.csv and .png")
    args = p.parse_args(argv)

    import faiss

    import vq
    from vq.datasets import ground_truth, recall_at
    from vq.kernels.fastscan.fastscan_scans import best_isa

    set_threads(args.threads)
    label, x, q = load_data(args)
    n, dim = x.shape
    nlist = args.nlist or default_nlist(n)
    M = args.M or max(1, dim // 8)
    k = min(args.k, n)
    truth = ground_truth(x, q, k)[1]
    train = x[: min(n, args.ntrain)]

    rows = []
    for desc in args.index or index_types(nlist, M):
        theirs = faiss.index_factory(dim, desc)
        start = time.perf_counter()
        theirs.train(train)
        theirs.add(x)
        built = time.perf_counter() - start
        ours = vq.index.from_faiss(theirs)
        for params in sweep(desc, nlist, args.nprobe, args.k_factor):
            set_params(theirs, params)
            systems = {
                "vq": lambda ours=ours, params=params: ours.search(q, k, **params),
                "faiss": lambda theirs=theirs: theirs.search(q, k),
            }
            found = {name: np.asarray(fn()[1]) for name, fn in systems.items()}
            same = float(np.mean(found["vq"] == found["faiss"]))
            t = alternate(systems, rounds=args.rounds, min_seconds=args.min_seconds)
            param = ",".join(f"{key}={v}" for key, v in params.items()) or "-"
            for system in ("vq", "faiss"):
                rows.append(
                    {
                        "data": label,
                        "index": desc,
                        "system": system,
                        "param": param,
                        f"recall@{k}": recall_at(found[system], truth, k),
                        "QPS": q.shape[0] / t[system],
                        "vq / faiss": t["faiss"] / t["vq"],
                        "same ids": same,
                        "faiss build s": built,
                    }
                )
        ours = theirs = None
    title = (
        f"## Fast-scan on the same index: {label}, n={n}, d={dim}, {q.shape[0]} queries, k={k} "
        f"(faiss trains, vq imports; vq kernel {best_isa()}; vq / faiss = QPS ratio)"
    )
    report(args.name, title, args.threads, rows, list(rows[0]))
    plot(rows, args.name, f"{label}, n={n}, {args.threads} threads (faiss dashed)", k)
    return rows


if __name__ == "__main__":
    main()
