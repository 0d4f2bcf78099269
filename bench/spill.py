"""Spilled IVF lists (SOAR) against plain ones: recall@10 and QPS at equal nprobe, the same
coarse centroids on both sides (the spilled index is built from the plain one's quantizer), so
the only difference is the second copy of each vector.

    python -m bench.spill [--n 100000] [--dim 64] [--nlist 1024] [--kind Flat] [--hdf5 FILE]

The data are anisotropic Gaussian vectors (as embeddings have), or an ann-benchmarks
``.hdf5`` file (``--hdf5``: its train / test sets, L2). Searches are timed alternately (plain,
spilled, plain, …; best of ``--rounds``). Prints a table; writes bench/results/spill.csv.
"""

from __future__ import annotations

import argparse

from bench.common import alternate, report, set_threads


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", type=int, default=100_000, help="database vectors (synthetic)")
    p.add_argument("--dim", type=int, default=64, help="vector dimension (synthetic)")
    p.add_argument("--nq", type=int, default=1000, help="queries")
    p.add_argument("--nlist", type=int, default=1024, help="inverted lists")
    p.add_argument("--kind", default="Flat", help="what the lists store: Flat, SQ8, PQ16, …")
    p.add_argument("--soar-lambda", type=float, default=1.0, help="SOAR's λ")
    p.add_argument("--nprobe", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    p.add_argument("--hdf5", help="an ann-benchmarks file to use instead of synthetic data")
    p.add_argument("--threads", type=int, default=2, help="threads for vq's kernels and torch")
    p.add_argument("--rounds", type=int, default=3, help="alternating timing rounds (best kept)")
    args = p.parse_args(argv)

    import numpy as np

    import vq
    from vq.datasets import anisotropic_vectors, ground_truth, read_ann_hdf5, recall_at

    set_threads(args.threads)
    if args.hdf5:
        data = read_ann_hdf5(args.hdf5)
        xb, xq = np.ascontiguousarray(data.train), np.ascontiguousarray(data.test[: args.nq])
    else:
        x = anisotropic_vectors(args.n + args.nq, args.dim, seed=7)
        xb, xq = x[: args.n], x[args.n :]
    truth = ground_truth(xb, xq, 10).ids
    dim = xb.shape[1]
    plain = vq.index_factory(dim, f"IVF{args.nlist},{args.kind}")
    plain.train(xb[: max(100_000, 40 * args.nlist)])
    plain.add(xb)
    spilled = vq.index_factory(dim, f"IVF{args.nlist}(soar={args.soar_lambda}),{args.kind}")
    stored = ("ids", "offsets", "vectors", "codes")  # the same centroids and codebooks, no data
    trained = {k: v for k, v in plain.state_dict().items() if k not in stored}
    spilled.load_state_dict(trained, strict=False)
    spilled.add(xb)

    rows = []
    for nprobe in args.nprobe:
        found = {
            name: index.search(xq, 10, nprobe=nprobe)[1]
            for name, index in (("plain", plain), ("soar", spilled))
        }
        seconds = alternate(
            {
                "plain": lambda nprobe=nprobe: plain.search(xq, 10, nprobe=nprobe),
                "soar": lambda nprobe=nprobe: spilled.search(xq, 10, nprobe=nprobe),
            },
            rounds=args.rounds,
        )
        rows.append(
            {
                "nprobe": nprobe,
                "recall_plain": recall_at(found["plain"], truth, 10),
                "recall_soar": recall_at(found["soar"], truth, 10),
                "qps_plain": len(xq) / seconds["plain"],
                "qps_soar": len(xq) / seconds["soar"],
                "qps_ratio": seconds["plain"] / seconds["soar"],
            }
        )
    title = (
        f"IVF{args.nlist},{args.kind} with and without SOAR spilling (λ={args.soar_lambda}), "
        f"{len(xb)} x {dim}, {len(xq)} queries, k=10"
    )
    report("spill", title, args.threads, rows, list(rows[0]))
    return rows


if __name__ == "__main__":
    main()
