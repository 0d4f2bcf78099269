"""Encode/decode throughput of PQ, OPQ and RVQ against faiss, with the same codebooks.

    python -m bench.encode [--n 200000] [--dim 128] [--M 16] [--threads 2]

Each pair of systems gets identical codebooks (faiss-trained, copied into vq), so the table also
reports the fraction of identical codes. Writes bench/results/encode.csv and encode.png.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from bench.common import alternate, figure, report, set_threads


def _load(module, **buffers):
    state = {"trained": torch.tensor(True), **buffers}
    module.load_state_dict(state)
    return module


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", type=int, default=200_000, help="vectors to encode")
    p.add_argument("--dim", type=int, default=128, help="vector dimension")
    p.add_argument("--M", type=int, default=16, help="PQ/OPQ sub-quantizers (8 bits each)")
    p.add_argument("--rvq-stages", type=int, default=4, help="RVQ stages (256 codewords each)")
    p.add_argument("--threads", type=int, default=2, help="threads for every system")
    p.add_argument("--rounds", type=int, default=5, help="alternating timing rounds (best kept)")
    args = p.parse_args(argv)

    import faiss

    import vq
    from vq.datasets import clustered_vectors

    set_threads(args.threads)
    d, M, n = args.dim, args.M, args.n
    x = clustered_vectors(n, d, n_clusters=1000, seed=0)
    train = x[:50_000]
    rows = []

    def pair(label, ours_fn, faiss_fn, ours_codes, faiss_codes, unit):
        t = alternate({"vq": ours_fn, "faiss": faiss_fn}, rounds=args.rounds)
        same = float((np.asarray(ours_codes) == np.asarray(faiss_codes)).all(-1).mean())
        rows.append(
            {
                "operation": label,
                "vq vectors/s": n / t["vq"],
                "faiss vectors/s": n / t["faiss"],
                "vq / faiss": t["faiss"] / t["vq"],
                "identical codes": same if unit == "encode" else "",
            }
        )

    # PQ
    fpq = faiss.ProductQuantizer(d, M, 8)
    fpq.train(train)
    cb = torch.from_numpy(faiss.vector_to_array(fpq.centroids).reshape(M, 256, d // M))
    pq = _load(vq.ProductQuantizer(d, M), codebooks=cb)
    codes, fcodes = pq.encode(x), fpq.compute_codes(x)
    pair(
        f"PQ{M} encode", lambda: pq.encode(x), lambda: fpq.compute_codes(x), codes, fcodes, "encode"
    )
    pair(f"PQ{M} decode", lambda: pq.decode(fcodes), lambda: fpq.decode(fcodes), 0, 0, "decode")

    # OPQ (faiss OPQMatrix + ProductQuantizer vs vq.OPQ with the same rotation and codebooks)
    opq_f = faiss.OPQMatrix(d, M)
    opq_f.niter = 10
    opq_f.train(train)
    pq_f = faiss.ProductQuantizer(d, M, 8)
    pq_f.train(opq_f.apply(train))
    rot = torch.from_numpy(faiss.vector_to_array(opq_f.A).reshape(d, d))
    opq = vq.OPQ(d, M)
    opq.load_state_dict(
        {
            "trained": torch.tensor(True),
            "rotation": rot,
            "pq.trained": torch.tensor(True),
            "pq.codebooks": torch.from_numpy(
                faiss.vector_to_array(pq_f.centroids).reshape(M, 256, d // M)
            ),
        }
    )
    ocodes, focodes = opq.encode(x), pq_f.compute_codes(opq_f.apply(x))
    pair(
        f"OPQ{M} encode",
        lambda: opq.encode(x),
        lambda: pq_f.compute_codes(opq_f.apply(x)),
        ocodes,
        focodes,
        "encode",
    )

    # RVQ, greedy and beam 4
    stages = args.rvq_stages
    for beam in (1, 4):
        frq = faiss.ResidualQuantizer(d, stages, 8)
        frq.max_beam_size = beam
        frq.train(train[:20_000])
        rcb = torch.from_numpy(faiss.vector_to_array(frq.codebooks).reshape(stages, 256, d))
        rq = _load(vq.ResidualVQ(d, stages, 256, beam_size=beam), codebooks=rcb)
        sub = x[: n // 4] if beam > 1 else x  # beam search is slow on both sides
        rcodes, frcodes = rq.encode(sub), frq.compute_codes(sub)
        scale = len(sub) / n
        t = alternate(
            {
                "vq": lambda rq=rq, sub=sub: rq.encode(sub),
                "faiss": lambda frq=frq, sub=sub: frq.compute_codes(sub),
            },
            rounds=args.rounds,
        )
        rows.append(
            {
                "operation": f"RVQ {stages}x8 beam {beam} encode",
                "vq vectors/s": n * scale / t["vq"],
                "faiss vectors/s": n * scale / t["faiss"],
                "vq / faiss": t["faiss"] / t["vq"],
                "identical codes": float((rcodes == frcodes).all(-1).mean()),
            }
        )

    cols = ["operation", "vq vectors/s", "faiss vectors/s", "vq / faiss", "identical codes"]
    title = f"## encode/decode throughput: n={n}, d={d} (same codebooks on both sides)"
    report("encode", title, args.threads, rows, cols)
    with figure("encode", (7, 4)) as ax:
        ax.barh([r["operation"] for r in rows], [r["vq / faiss"] for r in rows])
        ax.axvline(1.0, color="k", lw=1)
        ax.set_xlabel("throughput vq / faiss (higher is better)")
    return rows


if __name__ == "__main__":
    main()
