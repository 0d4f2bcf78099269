"""IVF-Flat with sketches (``"IVF…,Flat(sketch)"``) against plain IVF-Flat and faiss's
``IndexIVFFlat`` on the same lists: vq trains the plain index, faiss gets it by ``to_faiss()``
(same centroids, same lists) and the sketched index is trained alike (same seed: the same
centroids, checked), so all three return the same ids and only the scans differ.

    python -m bench.sketch [--data text|nsynth|synthetic|X.fvecs] [--n 300000] [--nlist N]

Sweeps nprobe; QPS timed alternately (A B C A B C, each sample at least --min-seconds, best
of --rounds), --threads threads for every system. Prints a table and writes
bench/results/<name>.csv (--name, default "sketch").
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from bench.ann import add_data_arguments, default_nlist, load_data
from bench.common import alternate, report, set_threads


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_data_arguments(p)
    p.set_defaults(data="text", n=300_000)
    p.add_argument("--nprobe", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128])
    p.add_argument("--k", type=int, default=10, help="neighbours per search")
    p.add_argument("--threads", type=int, default=2, help="threads for every system")
    p.add_argument("--rounds", type=int, default=3, help="alternating timing rounds (best kept)")
    p.add_argument("--min-seconds", type=float, default=0.2, help="least time per timing sample")
    p.add_argument("--name", default="sketch", help="results/<name>.csv")
    args = p.parse_args(argv)

    import torch

    import vq
    from vq.datasets import ground_truth, recall_at

    set_threads(args.threads)
    label, x, q = load_data(args)
    n, dim = x.shape
    nlist = args.nlist or default_nlist(n)
    k = min(args.k, n)
    truth = ground_truth(x, q, k)[1]
    train = x[: min(n, args.ntrain)]
    built = {}
    for kind in ("Flat", "Flat(sketch)"):
        index = vq.index_factory(dim, f"IVF{nlist},{kind}")
        start = time.perf_counter()
        index.train(train)
        index.add(x)
        built[kind] = (index, time.perf_counter() - start)
    plain, sketched = built["Flat"][0], built["Flat(sketch)"][0]
    if not torch.equal(plain.quantizer.codebook, sketched.quantizer.codebook):
        raise SystemExit("the two vq indexes trained different centroids: lists differ")
    theirs = plain.to_faiss()
    rows = []
    for nprobe in sorted({min(p, nlist) for p in args.nprobe}):
        theirs.nprobe = nprobe
        systems = {
            "sketch": lambda nprobe=nprobe: sketched.search(q, k, nprobe=nprobe),
            "plain": lambda nprobe=nprobe: plain.search(q, k, nprobe=nprobe),
            "faiss": lambda: theirs.search(q, k),
        }
        found = {name: np.asarray(fn()[1]) for name, fn in systems.items()}
        t = alternate(systems, rounds=args.rounds, min_seconds=args.min_seconds)
        rows.append(
            {
                "nprobe": nprobe,
                f"recall@{k}": recall_at(found["sketch"], truth, k),
                "QPS sketch": q.shape[0] / t["sketch"],
                "QPS plain": q.shape[0] / t["plain"],
                "QPS faiss": q.shape[0] / t["faiss"],
                "sketch / plain": t["plain"] / t["sketch"],
                "sketch / faiss": t["faiss"] / t["sketch"],
                "same ids as plain": float(np.mean(found["sketch"] == found["plain"])),
                "same ids as faiss": float(np.mean(found["sketch"] == found["faiss"])),
            }
        )
    title = (
        f"## IVF{nlist},Flat(sketch) against IVF{nlist},Flat and faiss IndexIVFFlat (same lists), "
        f"{label}, n={n}, d={dim}, {len(q)} queries, k={k}; bytes/vector "
        f"{sketched.nbytes() / n:.0f} against {plain.nbytes() / n:.0f}; train + add "
        f"{built['Flat(sketch)'][1]:.1f} s against {built['Flat'][1]:.1f} s"
    )
    report(args.name, title, args.threads, rows, list(rows[0]))
    return rows


if __name__ == "__main__":
    main()
