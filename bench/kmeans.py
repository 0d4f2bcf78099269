"""k-means: vq.kmeans / vq.lbg against faiss.Kmeans (and scikit-learn) at equal k and iterations.

    python -m bench.kmeans [--n 200000] [--dim 128] [--k 1024] [--niter 20] [--threads 2]

Prints a markdown table (time ratio to faiss, objective ratio to faiss) and writes
bench/results/kmeans.csv and kmeans.png.
"""

from __future__ import annotations

import argparse

import numpy as np

from bench.common import alternate, figure, report, set_threads


def inertia(x: np.ndarray, centroids: np.ndarray) -> float:
    import torch

    from vq.distances import nearest

    c = torch.from_numpy(np.ascontiguousarray(centroids, dtype=np.float32))
    return float(nearest(torch.from_numpy(x), c).distances.double().sum())


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", type=int, default=200_000, help="training vectors")
    p.add_argument("--dim", type=int, default=128, help="vector dimension")
    p.add_argument("--k", type=int, default=1024, help="centroids")
    p.add_argument("--niter", type=int, default=20, help="Lloyd iterations, all systems")
    p.add_argument("--threads", type=int, default=2, help="threads for every system")
    p.add_argument("--rounds", type=int, default=3, help="alternating timing rounds (best kept)")
    p.add_argument("--sklearn", action="store_true", help="also time scikit-learn KMeans")
    args = p.parse_args(argv)

    import faiss

    import vq
    from vq.datasets import clustered_vectors

    set_threads(args.threads)
    x = clustered_vectors(args.n, args.dim, n_clusters=2 * args.k, seed=0)
    k, niter = args.k, args.niter
    results: dict[str, np.ndarray] = {}

    def run_faiss():
        km = faiss.Kmeans(args.dim, k, niter=niter, seed=1234, max_points_per_centroid=256)
        km.train(x)
        results["faiss.Kmeans"] = km.centroids

    def run_vq(init):
        def fn():
            r = vq.kmeans(x, k, niter=niter, init=init, seed=1234)
            results[f"vq.kmeans ({init})"] = r.centroids

        return fn

    def run_lbg():
        results["vq.lbg"] = vq.lbg(x, k, niter=max(1, niter // 2), seed=1234).centroids

    systems = {
        "faiss.Kmeans": run_faiss,
        "vq.kmeans (random)": run_vq("random"),
        "vq.kmeans (k-means++)": run_vq("k-means++"),
        "vq.lbg": run_lbg,
    }
    if args.sklearn:
        from sklearn.cluster import KMeans

        def run_sklearn():
            km = KMeans(k, init="random", n_init=1, max_iter=niter, tol=0.0, random_state=0)
            results["sklearn KMeans"] = km.fit(x).cluster_centers_

        systems["sklearn KMeans"] = run_sklearn
    times = alternate(systems, rounds=args.rounds, min_seconds=0.1)
    base_t = times["faiss.Kmeans"]
    base_obj = inertia(x, results["faiss.Kmeans"])
    rows = []
    for name in systems:
        obj = inertia(x, results[name])
        rows.append(
            {
                "system": name,
                "seconds": times[name],
                "time / faiss": times[name] / base_t,
                "objective": obj,
                "objective / faiss": obj / base_obj,
            }
        )
    cols = ["system", "seconds", "time / faiss", "objective", "objective / faiss"]
    title = (
        f"## k-means: n={args.n}, d={args.dim}, k={k}, {niter} iterations\n"
        "(lbg: niter/2 Lloyd iterations after each of log2(k) splits)"
    )
    report("kmeans", title, args.threads, rows, cols)
    with figure("kmeans") as ax:
        for r in rows:
            ax.scatter(r["seconds"], r["objective / faiss"], label=r["system"])
        ax.set_xlabel("seconds (lower is better)")
        ax.set_ylabel("objective / faiss (lower is better)")
        ax.set_title("k-means")
        ax.legend()
    return rows


if __name__ == "__main__":
    main()
