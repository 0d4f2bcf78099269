"""RaBitQ,RFlat: vq's RaBitQIndex + exact re-ranking against faiss's "RR<d>,RaBitQ,RFlat", each
trained on its own (its own random rotation), at the same query bits (qb) and k_factor; and
IVF<nlist>,RaBitQ(,RFlat) against faiss's "RR<d>,IVF<nlist>,RaBitQ" over an nprobe sweep, vq's
index converted from faiss's trained one (the same rotation and coarse centroids, vq encoding
the vectors itself: equal recall, so the QPS ratio compares the scans).

    python -m bench.rabitq [--n 50000] [--dim 128] [--nq 1000] [--k 10] [--threads 2]
                           [--k-factors 5,10,20] [--qbs 4] [--nlist 256] [--nprobes 4,16,64]

Prints recall@k and QPS of both and their QPS ratio, timed alternately (A B A B, each sample
at least 0.1 s, best of ``--rounds``); also the bare 1-bit scans ("RaBitQ" alone). The data are
clustered synthetic vectors. Writes bench/results/rabitq.csv. (faiss's float-query scan, qb 0,
runs at some 25 QPS here: ``--qbs 0,4`` takes minutes.)
"""

from __future__ import annotations

import argparse

import numpy as np

from bench.common import alternate, report, set_threads


def recall(found: np.ndarray, truth: np.ndarray) -> float:
    k = truth.shape[1]
    return float(np.mean([len(set(a) & set(b)) for a, b in zip(found, truth, strict=True)]) / k)


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", type=int, default=50_000, help="database vectors")
    p.add_argument("--dim", type=int, default=128, help="vector dimension")
    p.add_argument("--nq", type=int, default=1000, help="queries")
    p.add_argument("--k", type=int, default=10, help="neighbours per query")
    p.add_argument("--k-factors", default="5,10,20", help="re-ranking candidates per result")
    p.add_argument("--qbs", default="4", help="query bits (0: float queries)")
    p.add_argument("--nlist", type=int, default=256, help="inverted lists of the IVF rows")
    p.add_argument("--nprobes", default="4,16,64", help="nprobe sweep of the IVF rows")
    p.add_argument("--threads", type=int, default=2, help="threads for every system")
    p.add_argument("--rounds", type=int, default=3, help="alternating timing rounds (best kept)")
    args = p.parse_args(argv)

    import faiss

    import vq
    from vq.datasets import clustered_vectors

    set_threads(args.threads)
    d, k = args.dim, args.k
    x = clustered_vectors(args.n, d, n_clusters=200, seed=0).astype(np.float32)
    q = clustered_vectors(args.nq, d, n_clusters=200, seed=1).astype(np.float32)
    truth = faiss.knn(q, x, k)[1]

    ours = vq.index_factory(d, "RaBitQ,RFlat")
    ours.train(x)
    ours.add(x)
    theirs = faiss.index_factory(d, f"RR{d},RaBitQ,RFlat")
    theirs.train(x)
    theirs.add(x)
    their_base = faiss.downcast_index(theirs.base_index)  # IndexPreTransform
    their_rabitq = faiss.downcast_index(their_base.index)

    rows = []
    for qb in (int(v) for v in args.qbs.split(",")):
        their_rabitq.qb = qb
        ours.index.qb = qb
        for kf in [0, *(int(v) for v in args.k_factors.split(","))]:
            if kf == 0:  # the bare scans
                name = "RaBitQ"

                def run_ours():
                    return ours.index.search(q, k)[1]

                def run_theirs():
                    return their_base.search(q, k)[1]
            else:
                name = f"RaBitQ,RFlat k_factor={kf}"
                theirs.k_factor = kf

                def run_ours(kf=kf):
                    return ours.search(q, k, k_factor=kf)[1]

                def run_theirs():
                    return theirs.search(q, k)[1]

            r_ours, r_theirs = recall(run_ours(), truth), recall(run_theirs(), truth)
            t = alternate({"vq": run_ours, "faiss": run_theirs}, rounds=args.rounds)
            rows.append(
                {
                    "index": name,
                    "qb": qb,
                    "vq recall": r_ours,
                    "faiss recall": r_theirs,
                    "vq QPS": args.nq / t["vq"],
                    "faiss QPS": args.nq / t["faiss"],
                    "vq / faiss": t["faiss"] / t["vq"],
                }
            )
    rows += ivf_rows(args, x, q, truth)
    cols = list(rows[0])
    title = (
        f"## RaBitQ: n={args.n}, d={d}, {args.nq} queries, recall@{k} "
        "(flat: each trained on its own rotation; IVF: faiss's rotation and centroids)"
    )
    report("rabitq", title, args.threads, rows, cols)
    return rows


def ivf_rows(args, x: np.ndarray, q: np.ndarray, truth: np.ndarray) -> list[dict]:
    """The IVF rows: vq's IVFRaBitQ (converted from faiss's trained index, then filled by vq)
    against faiss's "RR<d>,IVF<nlist>,RaBitQ", bare and re-ranked, over the nprobe sweep."""
    import faiss

    import vq

    d, k = args.dim, args.k
    theirs = faiss.index_factory(d, f"RR{d},IVF{args.nlist},RaBitQ")
    theirs.train(x)
    ours = vq.Refine(vq.index.from_faiss(theirs))  # the same rotation and coarse centroids
    ours.add(x)
    refined = faiss.IndexRefineFlat(theirs)
    refined.add(x)
    their_ivf = faiss.downcast_index(faiss.extract_index_ivf(theirs))
    kf = max(int(v) for v in args.k_factors.split(","))
    rows = []
    for qb in (int(v) for v in args.qbs.split(",")):
        their_ivf.qb = ours.index.qb = qb
        for nprobe in (int(v) for v in args.nprobes.split(",")):
            their_ivf.nprobe = ours.index.nprobe = nprobe
            refined.k_factor = ours.k_factor = kf
            pairs = {
                f"IVF{args.nlist},RaBitQ nprobe={nprobe}": (
                    lambda: ours.index.search(q, k)[1],
                    lambda: theirs.search(q, k)[1],
                ),
                f"IVF{args.nlist},RaBitQ,RFlat nprobe={nprobe} k_factor={kf}": (
                    lambda: ours.search(q, k)[1],
                    lambda: refined.search(q, k)[1],
                ),
            }
            for name, (run_ours, run_theirs) in pairs.items():
                r_ours, r_theirs = recall(run_ours(), truth), recall(run_theirs(), truth)
                t = alternate({"vq": run_ours, "faiss": run_theirs}, rounds=args.rounds)
                rows.append(
                    {
                        "index": name,
                        "qb": qb,
                        "vq recall": r_ours,
                        "faiss recall": r_theirs,
                        "vq QPS": args.nq / t["vq"],
                        "faiss QPS": args.nq / t["faiss"],
                        "vq / faiss": t["faiss"] / t["vq"],
                    }
                )
    return rows


if __name__ == "__main__":
    main()
