"""Range search, vq against faiss on the same index: faiss fills each index, vq imports it
(``vq.index.from_faiss``), so both search the same data; the radius is the median over the
queries of the distance to their ``--hits``-th nearest neighbour (half the queries get more
results, half fewer).

    python -m bench.range [--data synthetic|...] [--n 1000000] [--nq 1000] [--hits 100]

Index types (--indexes): Flat and SQ8 (on --flat-n vectors: a range search compares every query
with every vector), IVF{nlist},PQ{dim/8} and IVF{nlist},SQ8 at --nprobe, PQ{dim/8}. QPS timed
alternately (A B A B, each sample at least --min-seconds, best of --rounds) with --threads
threads for both systems; "same results": the fraction of queries whose result ids are identical
sets (hits within 1e-4 of the radius are rounding's to differ on).

Prints a table; writes bench/results/range.csv.
"""

from __future__ import annotations

import argparse

import numpy as np

from bench.ann import add_data_arguments, default_nlist, load_data
from bench.common import alternate, report, set_threads


def same_results(a: tuple, b: tuple, radius: float) -> float:
    """Fraction of queries whose hits (lims, D, I) agree but for hits at the radius."""
    (la, da, ia), (lb, db, ib) = a, b
    same = 0
    for j in range(len(la) - 1):
        x, dx = ia[la[j] : la[j + 1]], da[la[j] : la[j + 1]]
        y, dy = ib[lb[j] : lb[j + 1]], db[lb[j] : lb[j + 1]]
        edge = set(x[np.abs(dx - radius) < 1e-4 * abs(radius)]) | set(
            y[np.abs(dy - radius) < 1e-4 * abs(radius)]
        )
        same += (set(x.tolist()) ^ set(y.tolist())) <= edge
    return same / (len(la) - 1)


def main(argv: list[str] | None = None) -> list[dict]:
    import faiss

    import vq

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_data_arguments(p)
    p.add_argument("--hits", type=int, default=100, help="median results per query")
    p.add_argument("--flat-n", type=int, default=100_000, help="vectors of the Flat index")
    p.add_argument("--nprobe", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--min-seconds", type=float, default=0.2)
    p.add_argument(
        "--indexes",
        default="Flat,IVF{nlist},PQ{m},PQ{m},SQ8,IVF{nlist},SQ8",
        help="index types, comma-separated ({nlist}: --nlist or ~4 sqrt(n); {m}: dim / 8)",
    )
    args = p.parse_args(argv)
    set_threads(args.threads)
    label, x, q = load_data(args)
    n, dim = x.shape
    nlist = args.nlist or default_nlist(n)
    rows = []
    for desc in _index_types(args.indexes.format(nlist=nlist, m=dim // 8)):
        data = x if desc.startswith(("IVF", "PQ")) else x[: args.flat_n]  # exhaustive: fewer
        source = faiss.index_factory(dim, desc)
        source.train(data[: args.ntrain])
        source.add(data)
        if desc.startswith("IVF"):
            source.nprobe = args.nprobe
        index = vq.index.from_faiss(source)
        D, _ = source.search(q, args.hits)
        radius = float(np.median(D[:, -1]))
        times = alternate(
            {
                "vq": lambda i=index, r=radius: i.range_search(q, r),
                "faiss": lambda s=source, r=radius: s.range_search(q, r),
            },
            args.rounds,
            args.min_seconds,
        )
        ours, theirs = index.range_search(q, radius), source.range_search(q, radius)
        rows.append(
            {
                "index": desc,
                "n": data.shape[0],
                "radius": round(radius, 4),
                "results/query": round(float(ours[0][-1]) / len(q), 1),
                "vq QPS": round(len(q) / times["vq"]),
                "faiss QPS": round(len(q) / times["faiss"]),
                "vq / faiss": round(times["faiss"] / times["vq"], 2),
                "same results": round(same_results(ours, theirs, radius), 4),
            }
        )
        print(rows[-1], flush=True)
    title = f"Range search, {label} d={dim} nq={len(q)} nprobe={args.nprobe}"
    report("range", title, args.threads, rows, list(rows[0]))
    return rows


def _index_types(spec: str) -> list[str]:
    """The index types of a spec: "Flat,IVF1024,PQ16,SQ8" → Flat, IVF1024,PQ16 and SQ8."""
    parts, out = spec.split(","), []
    while parts:
        part = parts.pop(0)
        out.append(f"{part},{parts.pop(0)}" if part.startswith("IVF") and parts else part)
    return out


if __name__ == "__main__":
    main()
