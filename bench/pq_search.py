"""PQIndex search against faiss IndexPQ with the same codebooks and codes.

    python -m bench.pq_search [--n 1000000] [--dim 128] [--M 16] [--nq 1000] [--k 10]

Prints QPS of both, their ratio and the fraction of queries with identical top-k ids; writes
bench/results/pq_search.csv.
"""

from __future__ import annotations

import argparse

import numpy as np

from bench.common import alternate, report, set_threads


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", type=int, default=1_000_000, help="database vectors")
    p.add_argument("--dim", type=int, default=128, help="vector dimension")
    p.add_argument("--M", type=int, default=16, help="PQ sub-quantizers (8 bits each)")
    p.add_argument("--nq", type=int, default=1000, help="queries")
    p.add_argument("--k", type=int, default=10, help="neighbours per query")
    p.add_argument("--threads", type=int, default=2, help="threads for every system")
    p.add_argument("--rounds", type=int, default=3, help="alternating timing rounds (best kept)")
    args = p.parse_args(argv)

    import faiss

    import vq
    from vq import faiss_interop as fi
    from vq.datasets import clustered_vectors

    set_threads(args.threads)
    x = clustered_vectors(args.n, args.dim, n_clusters=1000, seed=0)
    q = clustered_vectors(args.nq, args.dim, n_clusters=1000, seed=1)
    ref = faiss.IndexPQ(args.dim, args.M, 8)
    ref.train(x[:100_000])
    ref.add(x)
    index = vq.PQIndex(args.dim, args.M)
    index.pq = fi.pq_from_faiss(ref.pq)
    index.add(x)
    D, I = index.search(q, args.k)
    Df, If = ref.search(q, args.k)
    t = alternate(
        {"vq": lambda: index.search(q, args.k), "faiss": lambda: ref.search(q, args.k)},
        rounds=args.rounds,
    )
    rows = [
        {
            "index": f"PQ{args.M}, n={args.n}",
            "vq QPS": args.nq / t["vq"],
            "faiss QPS": args.nq / t["faiss"],
            "vq / faiss": t["faiss"] / t["vq"],
            "identical top-k rows": float((I == If).all(axis=1).mean()),
            "max rel. distance diff": float(np.abs(D - Df).max() / np.abs(Df).max()),
        }
    ]
    cols = list(rows[0])
    title = f"## PQ search: {args.nq} queries, k={args.k} (same codebooks and codes)"
    report("pq_search", title, args.threads, rows, cols)
    return rows


if __name__ == "__main__":
    main()
