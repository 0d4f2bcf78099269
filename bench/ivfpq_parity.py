"""IVFPQ recall parity with faiss at equal parameters (``python -m bench.ivfpq_parity``): each
library trains its own index from the same seed, on the same data, and both are searched with
the same nprobe; the mission's bar is a recall@k within 0.005 of faiss's, averaged over seeds.

    python -m bench.ivfpq_parity [--data clustered nsynth ...] [--n 50000] [--nq 1000]
                                 [--dim 64] [--seeds 0 1 2] [--nprobe 4 16] [--k 10]
                                 [--kinds IVF256,PQ16 IVF64,PQ16] [--pq-init k-means++]
                                 [--coarse-init auto] [--threads 2] [--name ivfpq_parity]

For each data set, kind and seed: vq's ``IVFPQ(dim, nlist, M, seed=seed)`` and faiss's
``index_factory(dim, "IVF<nlist>,PQ<M>np")`` with the coarse and PQ k-means seeded alike
(``cp.seed``, ``pq.cp.seed``), both trained on the first ``--ntrain`` database vectors and
filled with all of them, each with its library's defaults otherwise (faiss: 10 coarse and 25 PQ
iterations from random rows, at most 256 points per centroid; vq: as :class:`vq.index.IVFPQ`
documents, its PQ k-means started by k-means++, or with ``--pq-init random`` from random rows
as faiss's, and its coarse k-means by its ``coarse_init``: "auto", k-means++ seeds up to 2,048
lists, or ``--coarse-init random``, faiss's start). Then, per nprobe, the k-recall@k of both
against exact neighbours (``ground_truth``), one row per seed and a "mean" row per (data, kind,
nprobe) with the mean difference vq - faiss and whether it is within the bar.

Data: "clustered" (``vq.datasets.clustered_vectors``: 256 Gaussian blobs, spread 0.5, data
seed 0, queries held out from the same draw), "nsynth" (embeddings of the synthetic NSynth
notes: train split = database, test split = queries; see ``bench.ann``), "text" (the real
sentence embeddings of ``bench.ann --data text``; the first run embeds them, which takes long)
or a file ``bench.ann`` reads. Prints a table; writes bench/results/ivfpq_parity.csv
(``--name`` changes the name).
"""

from __future__ import annotations

import argparse
import re

import numpy as np

from bench.common import report, set_threads

KINDS = ("IVF256,PQ16", "IVF64,PQ16")
BAR = 0.005  # |mean recall difference| the mission allows


def load(name: str, args) -> tuple[str, np.ndarray, np.ndarray]:
    """(label, database float32 [n, d], queries float32 [nq, d]) of a ``--data`` entry."""
    if name == "clustered":
        from vq.datasets import clustered_vectors

        both = clustered_vectors(args.n + args.nq, args.dim, seed=0)
        return "clustered", both[: args.n], both[args.n :]
    from bench.ann import load_data

    ns = argparse.Namespace(**{**vars(args), "data": name, "seed": 0, "queries": None})
    return load_data(ns)


def build_pair(
    kind: str, dim: int, seed: int, train: np.ndarray, x: np.ndarray, init: str, coarse: str
):
    """(vq index, faiss index) of ``kind`` ("IVF<nlist>,PQ<M>"), trained from ``seed``, vq's
    PQ k-means started by ``init`` and its coarse k-means by ``coarse`` (``coarse_init``)."""
    import faiss

    from vq.index import IVFPQ

    nlist, M = map(int, re.fullmatch(r"IVF(\d+),PQ(\d+)", kind).groups())
    ours = IVFPQ(dim, nlist, M, seed=seed, init=init, coarse_init=coarse)
    theirs = faiss.index_factory(dim, f"IVF{nlist},PQ{M}np")
    ivf = faiss.downcast_index(theirs)  # (a view: theirs owns the index)
    ivf.cp.seed = seed
    ivf.pq.cp.seed = seed
    for index in (ours, theirs):
        index.train(train)
        index.add(x)
    return ours, theirs


def recalls(ours, theirs, q: np.ndarray, truth: np.ndarray, k: int, nprobe: int):
    """(vq, faiss) k-recall@k at ``nprobe``."""
    import faiss

    from vq.datasets import recall_at

    faiss.extract_index_ivf(theirs).nprobe = nprobe
    found_vq = ours.search(q, k, nprobe=nprobe)[1]
    found_faiss = theirs.search(q, k)[1]
    return recall_at(found_vq, truth, k), recall_at(found_faiss, truth, k)


def mean_row(rows: list[dict], k: int) -> dict:
    """The "mean" row of one (data, kind, nprobe)'s per-seed rows."""
    ours = float(np.mean([r[f"vq recall@{k}"] for r in rows]))
    theirs = float(np.mean([r[f"faiss recall@{k}"] for r in rows]))
    diff = ours - theirs
    return {
        **{c: rows[0][c] for c in ("data", "index", "nprobe")},
        "seed": "mean",
        f"vq recall@{k}": ours,
        f"faiss recall@{k}": theirs,
        "vq - faiss": diff,
        "bar": f"within {BAR}: {'met' if abs(diff) <= BAR else 'not met'}",
    }


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", nargs="+", default=["clustered", "nsynth"], help="data sets")
    p.add_argument("--n", type=int, default=50_000, help="database vectors (at most)")
    p.add_argument("--nq", type=int, default=1000, help="queries (at most)")
    p.add_argument("--dim", type=int, default=64, help="dimension of the clustered data")
    p.add_argument("--ntrain", type=int, default=100_000, help="training vectors (at most n)")
    p.add_argument("--instruments", type=int, default=330, help="synthetic NSynth instruments")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="training seeds")
    p.add_argument("--nprobe", type=int, nargs="+", default=[4, 16], help="lists probed")
    p.add_argument("--k", type=int, default=10, help="neighbours (k-recall@k)")
    p.add_argument("--kinds", nargs="+", default=list(KINDS), help="IVF<nlist>,PQ<M> kinds")
    p.add_argument(
        "--pq-init",
        default="k-means++",
        choices=["k-means++", "random"],
        help="how vq's PQ k-means starts (vq's default k-means++; faiss: random)",
    )
    p.add_argument(
        "--coarse-init",
        default="auto",
        choices=["auto", "k-means++", "random"],
        help="how vq's coarse k-means starts (vq's default auto: k-means++; faiss: random)",
    )
    p.add_argument("--threads", type=int, default=2, help="threads for both libraries")
    p.add_argument("--name", default="ivfpq_parity", help="results/<name>.csv")
    args = p.parse_args(argv)
    from vq.datasets import ground_truth

    set_threads(args.threads)
    rows = []
    for name in args.data:
        label, x, q = load(name, args)
        k = min(args.k, x.shape[0])
        truth = ground_truth(x, q, k)[1]
        train = x[: min(len(x), args.ntrain)]
        for kind in args.kinds:
            per_seed = {npb: [] for npb in args.nprobe}
            for seed in args.seeds:
                ours, theirs = build_pair(
                    kind, x.shape[1], seed, train, x, args.pq_init, args.coarse_init
                )
                for nprobe in args.nprobe:
                    r_vq, r_faiss = recalls(ours, theirs, q, truth, k, nprobe)
                    row = {"data": label, "index": kind, "nprobe": nprobe, "seed": seed}
                    row.update({f"vq recall@{k}": r_vq, f"faiss recall@{k}": r_faiss})
                    per_seed[nprobe].append({**row, "vq - faiss": r_vq - r_faiss, "bar": ""})
            for nprobe in args.nprobe:
                rows += [*per_seed[nprobe], mean_row(per_seed[nprobe], k)]
    title = (
        f"## IVFPQ recall@{k} parity: each library trains its own index from the same seed "
        f"(seeds {', '.join(map(str, args.seeds))}; vq's PQ init {args.pq_init}, coarse init "
        f"{args.coarse_init}), same data, "
        f"same nprobe; bar: the mean difference within {BAR}"
    )
    report(args.name, title, args.threads, rows, list(rows[0]) if rows else ["data"])
    return rows


if __name__ == "__main__":
    main()
