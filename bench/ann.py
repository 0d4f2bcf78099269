"""Recall against QPS, vq against faiss: each library trains and fills its own index of each type
on the same data, then both are searched with the same parameters and thread count.

    python -m bench.ann [--data synthetic|nsynth|BASE.fvecs|FILE.hdf5] [--n 1000000] [--nq 1000]

Index types: Flat, PQ{M}, IVF{nlist},Flat, IVF{nlist},PQ{M}, OPQ{M},IVF{nlist},PQ{M} and
IVF{nlist},PQ{M},RFlat, and the 4-bit fast-scan PQ{2M}x4fs, IVF{nlist},PQ{2M}x4fs(,RFlat)
(the same bytes per vector), with M = dim // 8 and nlist ~ 4 sqrt(n) (a power of two in [8, 1024])
unless given. IVF types sweep nprobe; RFlat sweeps k_factor at a fixed nprobe. Every point is
a k=100 search (--k): r-recall@r for r = 1, 10, 100 against exact neighbours, and QPS timed
alternately (A B A B, best of --rounds). faiss gets "np" PQ parts (no polysemous training).

Data: "synthetic" (anisotropic Gaussian vectors, whose neighbours an index can find), "text"
(real sentence embeddings: all-MiniLM-L6-v2 over local text, see vq.datasets.text), "words"
(the same model over single words and two-word phrases of that text, vq.datasets.words), "nsynth"
(embeddings of the synthetic NSynth notes: train split = database, test split = queries), a
.fvecs database (with --queries Q.fvecs) or an ann-benchmarks .hdf5 (angular sets are
normalised, so L2 ranks as cosine). Prints a table; writes bench/results/ann.csv and ann.png
(--name changes the file names).
"""

from __future__ import annotations

import argparse
import math
import re
import time
from pathlib import Path

import numpy as np

from bench.common import alternate, figure, report, set_threads

K = 100  # neighbours per search; recall@1, @10 and @100 come from the same search


def default_nlist(n: int) -> int:
    """~4 sqrt(n), rounded to a power of two in [8, 1024]."""
    return int(min(1024, max(8, 2 ** round(math.log2(4 * math.sqrt(max(n, 1)))))))


def index_types(nlist: int, M: int) -> list[str]:
    """The vq index_factory descriptions benchmarked, in table order."""
    return [
        "Flat",
        f"PQ{M}",
        f"IVF{nlist},Flat",
        f"IVF{nlist},PQ{M}",
        f"OPQ{M},IVF{nlist},PQ{M}",
        f"IVF{nlist},PQ{M},RFlat",
        f"PQ{2 * M}x4fs",
        f"IVF{nlist},PQ{2 * M}x4fs",
        f"IVF{nlist},PQ{2 * M}x4fs,RFlat",
    ]


def faiss_description(desc: str) -> str:
    """faiss's equivalent of a vq description: PQ parts get "np" (no polysemous training)."""
    return re.sub(r"(?<![A-Za-z])PQ(\d+)(?=,|$)", r"PQ\1np", desc)


def sweep(desc: str, nlist: int, nprobes: list[int], k_factors: list[int], refine_nprobe: int):
    """(label, vq search kwargs) for each point of an index type's sweep."""
    if desc.endswith("RFlat"):
        nprobe = min(refine_nprobe, nlist)
        return [
            (f"nprobe={nprobe},k_factor={f}", {"nprobe": nprobe, "k_factor": f}) for f in k_factors
        ]
    if "IVF" in desc:
        capped = sorted({min(p, nlist) for p in nprobes})
        return [(f"nprobe={p}", {"nprobe": p}) for p in capped]
    return [("-", {})]


def add_data_arguments(p: argparse.ArgumentParser) -> None:
    """The options :func:`load_data` reads, and the training size and IVF lists."""
    kinds = "synthetic, text, words, nsynth, X.fvecs, X.hdf5 or X.safetensors"
    p.add_argument("--data", default="synthetic", help=kinds)
    p.add_argument("--queries", default=None, help="query .fvecs (with a .fvecs --data)")
    p.add_argument("--n", type=int, default=1_000_000, help="database vectors (at most)")
    p.add_argument("--nq", type=int, default=1000, help="queries (at most)")
    p.add_argument("--dim", type=int, default=128, help="vector dimension (synthetic data)")
    p.add_argument("--instruments", type=int, default=330, help="synthetic NSynth instruments")
    p.add_argument("--seed", type=int, default=0, help="data seed")
    p.add_argument("--ntrain", type=int, default=100_000, help="training vectors (at most n)")
    p.add_argument("--nlist", type=int, default=None, help="IVF lists (default ~4 sqrt(n))")


def load_data(args) -> tuple[str, np.ndarray, np.ndarray]:
    """(label, database float32 [n, d], queries float32 [nq, d])."""
    from vq.datasets import anisotropic_vectors, read_ann_hdf5, read_fvecs

    if args.data == "synthetic":
        both = anisotropic_vectors(args.n + args.nq, args.dim, decay=0.95, seed=args.seed)
        return "synthetic", both[: args.n], both[args.n :]
    if args.data == "text":  # real sentence embeddings (all-MiniLM-L6-v2 over local text)
        from vq.datasets.text import sentence_embeddings

        x, q = sentence_embeddings(args.n, args.nq, seed=args.seed, verbose=True)
        return "text (all-MiniLM-L6-v2)", x, q
    if args.data == "words":  # short texts: single words and two-word phrases, the same model
        from vq.datasets.words import word_embeddings

        x, q = word_embeddings(args.n, args.nq, seed=args.seed, verbose=True)
        return "words (all-MiniLM-L6-v2)", x, q
    if args.data == "nsynth":
        from vq.apps.nsynth import default_data_dir, synthetic_dataset
        from vq.datasets import embed_nsynth

        data_dir = default_data_dir()
        train, test = synthetic_dataset(data_dir, args.instruments, args.seed, verbose=False)
        cache = data_dir / "embeddings"
        x, q = embed_nsynth(train, cache_dir=cache), embed_nsynth(test, cache_dir=cache)
        label = "nsynth"
    else:
        path = Path(args.data)
        if path.suffix == ".fvecs":
            if args.queries is None:
                raise SystemExit(f"--data {path} needs --queries Q.fvecs")
            x, q = read_fvecs(path), read_fvecs(args.queries)
        elif path.suffix == ".safetensors":  # "database" and "queries" (a text-set cache file)
            from safetensors.numpy import load_file

            arrays = load_file(str(path))
            x, q = arrays["database"], arrays["queries"]
        elif path.suffix in (".hdf5", ".h5"):
            ds = read_ann_hdf5(path)
            x, q = ds.train, ds.test
            if ds.distance == "angular":
                x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
                q = q / np.maximum(np.linalg.norm(q, axis=1, keepdims=True), 1e-12)
        else:
            raise SystemExit(
                f"--data {args.data!r}: expected synthetic, text, words, nsynth, a .fvecs, "
                ".hdf5 or .safetensors file"
            )
        label = path.name
    x = np.ascontiguousarray(x[: args.n], dtype=np.float32)
    q = np.ascontiguousarray(q[: args.nq], dtype=np.float32)
    return label, x, q


def build(desc: str, fdesc: str, dim: int, train: np.ndarray, x: np.ndarray):
    """Both indexes, each trained by its own library and filled; and (train, add) seconds."""
    import faiss

    import vq

    built, seconds = {}, {}
    for system in ("vq", "faiss"):
        index = vq.index_factory(dim, desc) if system == "vq" else faiss.index_factory(dim, fdesc)
        start = time.perf_counter()
        index.train(train)
        t_train = time.perf_counter() - start
        start = time.perf_counter()
        index.add(x)
        built[system], seconds[system] = index, (t_train, time.perf_counter() - start)
    return built, seconds


def faiss_searcher(index, params: dict):
    """A faiss search function with the sweep point's nprobe / k_factor set."""
    import faiss

    if "nprobe" in params:
        faiss.extract_index_ivf(index).nprobe = params["nprobe"]
    if "k_factor" in params:
        faiss.downcast_index(index).k_factor = params["k_factor"]
    return index.search


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_data_arguments(p)
    p.add_argument("--M", type=int, default=None, help="PQ sub-quantizers (default dim // 8)")
    p.add_argument("--index", nargs="+", default=None, help="index types (default: all nine)")
    p.add_argument("--nprobe", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    p.add_argument("--k-factor", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    p.add_argument("--refine-nprobe", type=int, default=16, help="nprobe of the RFlat sweep")
    p.add_argument("--k", type=int, default=K, help="neighbours per search")
    p.add_argument("--threads", type=int, default=2, help="threads for every system")
    p.add_argument("--rounds", type=int, default=3, help="alternating timing rounds (best kept)")
    p.add_argument("--min-seconds", type=float, default=0.1, help="least time per timing sample")
    p.add_argument("--name", default="ann", help="results/<name>.csv and .png")
    args = p.parse_args(argv)

    from vq.datasets import ground_truth, recall_at

    set_threads(args.threads)
    label, x, q = load_data(args)
    n, dim = x.shape
    nq = q.shape[0]
    nlist = args.nlist or default_nlist(n)
    M = args.M or max(1, dim // 8)
    train = x[: min(n, args.ntrain)]
    k = min(args.k, n)
    truth = ground_truth(x, q, max(k, min(K, n)))[1]

    rows = []
    for desc in args.index or index_types(nlist, M):
        fdesc = faiss_description(desc)
        built, seconds = build(desc, fdesc, dim, train, x)
        for param, params in sweep(desc, nlist, args.nprobe, args.k_factor, args.refine_nprobe):
            searchers = {
                "vq": lambda params=params, own=built["vq"]: own.search(q, k, **params),
                "faiss": faiss_searcher(built["faiss"], params),
            }
            found = {"vq": searchers["vq"]()[1], "faiss": searchers["faiss"](q, k)[1]}
            t = alternate(
                {"vq": searchers["vq"], "faiss": lambda s=searchers["faiss"]: s(q, k)},
                rounds=args.rounds,
                min_seconds=args.min_seconds,
            )
            for system in ("vq", "faiss"):
                rows.append(
                    {
                        "data": label,
                        "index": desc,
                        "system": system,
                        "param": param,
                        **{
                            f"recall@{r}": recall_at(found[system], truth, r)
                            if r <= k
                            else float("nan")
                            for r in (1, 10, 100)
                        },
                        "QPS": nq / t[system],
                        "vq / faiss": t["faiss"] / t["vq"],
                        "train s": seconds[system][0],
                        "add s": seconds[system][1],
                    }
                )
        built = searchers = None  # free both indexes before building the next type
    title = (
        f"## ANN recall vs QPS: {label}, n={n}, d={dim}, {nq} queries, k={k}, "
        f"{train.shape[0]} training vectors (each library trains its own index; "
        "vq / faiss = QPS ratio)"
    )
    report(args.name, title, args.threads, rows, list(rows[0]))
    with figure(args.name, size=(8, 5)) as ax:
        colors = {}
        for r in rows:
            colors.setdefault(r["index"], f"C{len(colors)}")
        for desc, color in colors.items():
            for system, style in (("vq", "o-"), ("faiss", "s--")):
                pts = [r for r in rows if r["index"] == desc and r["system"] == system]
                ax.plot(
                    [r["recall@10"] for r in pts],
                    [r["QPS"] for r in pts],
                    style,
                    color=color,
                    label=f"{desc} ({system})",
                    markersize=4,
                )
        ax.set_xlabel("recall@10")
        ax.set_ylabel("queries per second")
        ax.set_yscale("log")
        ax.set_title(f"{label}, n={n}, {args.threads} threads (faiss dashed)")
        ax.legend(fontsize=6, ncol=2)
    return rows


if __name__ == "__main__":
    main()
