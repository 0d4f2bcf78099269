"""Filtered search, vq against faiss on the same index: faiss trains and fills each index, vq
imports it (``vq.index.from_faiss``), so both search the same codes; faiss searches with an
``IDSelectorBitmap`` (its fastest selector) and with an ``IDSelectorBatch``, vq with the same ids
as a ``vq.IdFilter``.

    python -m bench.filtered [--data synthetic|...] [--n 1000000] [--nq 1000] [--k 10]

Index types: IVF{nlist},PQ{dim/8} and IVF{nlist},PQ{dim/4}x4fs at --nprobe; selectivity 1%,
10% and 50% of the ids (a random subset). QPS timed alternately (A B A B, each sample at least
--min-seconds, best of --rounds) with --threads threads for both systems. Also counts the
queries for which faiss returns fewer than k results and vq returns k (vq probes further lists;
printed at 1% selectivity, and the ``faiss_short_vq_k`` column).

Prints a table; writes bench/results/<name>.csv (--name, default "filtered").
"""

from __future__ import annotations

import argparse

import numpy as np

from bench.ann import add_data_arguments, default_nlist, load_data
from bench.common import alternate, report, set_threads


def main(argv: list[str] | None = None) -> None:
    import faiss

    import vq

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_data_arguments(p)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--nprobe", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--min-seconds", type=float, default=0.1)
    p.add_argument("--selectivity", default="0.01,0.1,0.5")
    p.add_argument("--name", default="filtered")
    args = p.parse_args(argv)
    set_threads(args.threads)
    label, x, q = load_data(args)
    n, dim = x.shape
    nlist = args.nlist or default_nlist(n)
    rng = np.random.default_rng(args.seed)
    rows = []
    for desc in (f"IVF{nlist},PQ{dim // 8}", f"IVF{nlist},PQ{dim // 4}x4fs"):
        source = faiss.index_factory(dim, desc)
        source.train(x[: args.ntrain])
        source.add(x)
        faiss.extract_index_ivf(source).nprobe = args.nprobe
        index = vq.index.from_faiss(source)
        index.nprobe = args.nprobe
        for fraction in (float(f) for f in args.selectivity.split(",")):
            allowed = np.sort(rng.choice(n, max(1, int(n * fraction)), replace=False))
            mask = np.zeros(n, bool)
            mask[allowed] = True
            bitmap = np.packbits(mask, bitorder="little")
            f = vq.IdFilter(allowed)
            sels = {
                "bitmap": faiss.IDSelectorBitmap(bitmap),
                "batch": faiss.IDSelectorBatch(allowed),
            }
            params = {
                s: faiss.SearchParametersIVF(sel=sel, nprobe=args.nprobe) for s, sel in sels.items()
            }
            times = alternate(
                {
                    "vq": lambda i=index, f=f: i.search(q, args.k, allowed=f),
                    "faiss-bitmap": lambda s=source, p=params: s.search(
                        q, args.k, params=p["bitmap"]
                    ),
                    "faiss-batch": lambda s=source, p=params: s.search(
                        q, args.k, params=p["batch"]
                    ),
                },
                args.rounds,
                args.min_seconds,
            )
            _, I = index.search(q, args.k, allowed=f)
            _, If = source.search(q, args.k, params=params["bitmap"])
            short = (If < 0).any(axis=1)
            full = ~short
            rows.append(
                {
                    "index": desc,
                    "selectivity": fraction,
                    "vq_qps": round(len(q) / times["vq"]),
                    "faiss_bitmap_qps": round(len(q) / times["faiss-bitmap"]),
                    "faiss_batch_qps": round(len(q) / times["faiss-batch"]),
                    "vs_bitmap": round(times["faiss-bitmap"] / times["vq"], 2),
                    "vs_batch": round(times["faiss-batch"] / times["vq"], 2),
                    "same_ids_where_faiss_full": round(float((I[full] == If[full]).mean()), 4),
                    "faiss_short_queries": int(short.sum()),
                    "vq_short_queries": int((I < 0).any(axis=1).sum()),
                    "faiss_short_vq_k": int((short & (I >= 0).all(axis=1)).sum()),
                }
            )
            print(rows[-1], flush=True)
            if fraction == 0.01:
                for nprobe in sorted({1, args.nprobe}):
                    counts = _short_counts(source, index, q, args.k, f, sels["bitmap"], nprobe)
                    print(f"{desc} at 1% selectivity, nprobe={nprobe}: {counts}", flush=True)
    cols = list(rows[0])
    title = f"Filtered search, {label} n={n} d={dim} nq={len(q)} k={args.k} nprobe={args.nprobe}"
    report(args.name, title, args.threads, rows, cols)


def _short_counts(source, index, q, k, allowed, sel, nprobe) -> str:
    """How many queries faiss answers with fewer than k results, and for how many of those
    vq returns k (it probes further lists)."""
    import faiss

    _, If = source.search(q, k, params=faiss.SearchParametersIVF(sel=sel, nprobe=nprobe))
    _, I = index.search(q, k, allowed=allowed, nprobe=nprobe)
    short = (If < 0).any(axis=1)
    full = (I >= 0).all(axis=1)
    return (
        f"faiss returned fewer than k={k} results for {int(short.sum())} of {len(q)} queries; "
        f"vq returned k for {int((short & full).sum())} of those"
    )


if __name__ == "__main__":
    main()
