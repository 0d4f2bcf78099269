"""Spilled IVF lists (SOAR) against plain ones: recall@10 and QPS at equal nprobe, the same
coarse centroids on both sides (the spilled index is built from the plain one's quantizer), so
the only difference is the second copy of each vector.

    python -m bench.spill [--data synthetic|text|nsynth|X.hdf5|X.safetensors] [--n 100000]
                          [--dim 64] [--nlist 1024] [--kind Flat]

The data as bench.ann reads them: anisotropic Gaussian vectors (as embeddings have, the
default), the real sentence-embedding set (``--data text``, or its cached ``.safetensors``),
NSynth embeddings, or an ann-benchmarks ``.hdf5`` file (its train / test sets). Searches are
timed alternately (plain, spilled, plain, …; best of ``--rounds``). Prints a table; writes
bench/results/<name>.csv.
"""

from __future__ import annotations

import argparse

from bench.ann import add_data_arguments, load_data
from bench.common import alternate, report, set_threads


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_data_arguments(p)
    p.set_defaults(n=100_000, dim=64, nlist=1024, seed=7)
    p.add_argument("--kind", default="Flat", help="what the lists store: Flat, SQ8, PQ16, …")
    p.add_argument("--soar-lambda", type=float, default=1.0, help="SOAR's λ")
    p.add_argument("--nprobe", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    p.add_argument("--threads", type=int, default=2, help="threads for vq's kernels and torch")
    p.add_argument("--rounds", type=int, default=3, help="alternating timing rounds (best kept)")
    p.add_argument("--name", default="spill", help="results/<name>.csv")
    args = p.parse_args(argv)

    import numpy as np

    import vq
    from vq.datasets import ground_truth, recall_at

    set_threads(args.threads)
    label, xb, xq = load_data(args)
    xb, xq = np.ascontiguousarray(xb), np.ascontiguousarray(xq)
    truth = ground_truth(xb, xq, 10).ids
    dim = xb.shape[1]
    plain = vq.index_factory(dim, f"IVF{args.nlist},{args.kind}")
    plain.train(xb[: max(args.ntrain, 40 * args.nlist)])
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
        f"{label}, {len(xb)} x {dim}, {len(xq)} queries, k=10"
    )
    report(args.name, title, args.threads, rows, list(rows[0]))
    return rows


if __name__ == "__main__":
    main()
