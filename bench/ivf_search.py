"""IVFPQ against faiss IndexIVFPQ: search QPS over an nprobe sweep, add throughput, memory and
file size, with the same trained parameters (so both return the same neighbours).

    python -m bench.ivf_search [--n 1000000] [--dim 128] [--nlist 1024] [--M 16] [--nq 1000]

Also trains vq on its own on the same sample (time; recall@10 at each nprobe). The data are
anisotropic Gaussian vectors (variance decaying over a random basis, as embeddings have),
whose nearest neighbours an IVFPQ can find; recall@10 is the overlap of the 10 found with the
true 10 nearest. Prints tables; writes bench/results/ivf_search.csv, ivf_add.csv and
ivf_search.png.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from bench.common import alternate, figure, report, set_threads


def faiss_bytes(findex) -> int:
    """Bytes held by a faiss IndexIVFPQ: inverted lists (codes + ids), centroids, PQ
    codebooks and the precomputed table."""
    import faiss

    inv = findex.invlists
    stored = sum(inv.list_size(i) for i in range(findex.nlist)) * (inv.code_size + 8)
    centroids = findex.nlist * findex.d * 4
    pq = faiss.vector_to_array(findex.pq.centroids).nbytes
    table = faiss.vector_to_array(findex.precomputed_table).nbytes
    return stored + centroids + pq + table


def vq_bytes(index) -> int:
    """Bytes held by a vq index's tensors (parameters and buffers, precomputed table included)."""
    return sum(t.numel() * t.element_size() for t in index.state_dict(keep_vars=True).values()) + (
        index.precomputed_table.numel() * 4
    )


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", type=int, default=1_000_000, help="database vectors")
    p.add_argument("--dim", type=int, default=128, help="vector dimension")
    p.add_argument("--nlist", type=int, default=1024, help="inverted lists")
    p.add_argument("--M", type=int, default=16, help="PQ sub-quantizers (8 bits each)")
    p.add_argument("--nq", type=int, default=1000, help="queries")
    p.add_argument("--k", type=int, default=10, help="neighbours per query")
    p.add_argument("--ntrain", type=int, default=100_000, help="training vectors")
    p.add_argument("--nprobe", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    p.add_argument("--threads", type=int, default=2, help="threads for every system")
    p.add_argument("--rounds", type=int, default=3, help="alternating timing rounds (best kept)")
    args = p.parse_args(argv)

    import faiss

    import vq
    from vq.datasets import anisotropic_vectors, recall_at

    set_threads(args.threads)
    both = anisotropic_vectors(args.n + args.nq, args.dim, decay=0.95, seed=0)
    x, q = both[: args.n], both[args.n :]
    train = x[: args.ntrain]
    exact = faiss.IndexFlatL2(args.dim)
    exact.add(x)
    truth = exact.search(q, args.k)[1]
    del exact

    # -- training, independently (informational) ------------------------------------------
    desc = f"IVF{args.nlist},PQ{args.M}np"
    ref = faiss.index_factory(args.dim, desc)
    start = time.perf_counter()
    ref.train(train)
    t_faiss_train = time.perf_counter() - start
    own = vq.IVFPQ(args.dim, args.nlist, args.M)
    start = time.perf_counter()
    own.train(train)
    t_vq_train = time.perf_counter() - start

    # -- add: same trained parameters, timed alternately ----------------------------------
    index = vq.index.from_faiss(ref)  # trained, empty

    def vq_add():
        index.offsets.zero_()
        index.codes, index.ids = index.codes[:0], index.ids[:0]
        index.add(x)

    def faiss_add():
        ref.reset()
        ref.add(x)

    t_add = alternate({"vq": vq_add, "faiss": faiss_add}, rounds=2, min_seconds=0.0)
    own.add(x)

    # -- memory and file size ---------------------------------------------------------------
    with tempfile.TemporaryDirectory() as tmp:
        index.save(os.path.join(tmp, "index.vq"))
        faiss.write_index(ref, os.path.join(tmp, "index.faiss"))
        vq_file = os.path.getsize(os.path.join(tmp, "index.vq"))
        faiss_file = os.path.getsize(os.path.join(tmp, "index.faiss"))
    index.precompute_table()  # held, as faiss holds it
    add_rows = [
        {
            "index": f"IVF{args.nlist},PQ{args.M}, n={args.n}",
            "vq add vec/s": args.n / t_add["vq"],
            "faiss add vec/s": args.n / t_add["faiss"],
            "add vq / faiss": t_add["faiss"] / t_add["vq"],
            "vq MiB": vq_bytes(index) / 2**20,
            "faiss MiB": faiss_bytes(ref) / 2**20,
            "memory vq / faiss": vq_bytes(index) / faiss_bytes(ref),
            "file vq / faiss": vq_file / faiss_file,
            "train s vq": t_vq_train,
            "train s faiss": t_faiss_train,
        }
    ]

    # -- search over the nprobe sweep --------------------------------------------------------
    rows = []
    for nprobe in args.nprobe:
        ref.nprobe = nprobe
        _, I = index.search(q, args.k, nprobe=nprobe)
        _, If = ref.search(q, args.k)
        t = alternate(
            {
                "vq": lambda nprobe=nprobe: index.search(q, args.k, nprobe=nprobe),
                "faiss": lambda: ref.search(q, args.k),
            },
            rounds=args.rounds,
        )
        rows.append(
            {
                "nprobe": nprobe,
                "vq QPS": args.nq / t["vq"],
                "faiss QPS": args.nq / t["faiss"],
                "vq / faiss": t["faiss"] / t["vq"],
                "recall@10": recall_at(I, truth, 10),
                "identical top-k rows": float((I == If).all(axis=1).mean()),
                "recall@10, vq-trained": recall_at(
                    own.search(q, args.k, nprobe=nprobe)[1], truth, 10
                ),
            }
        )
    title = (
        f"## IVFPQ search: IVF{args.nlist},PQ{args.M}, n={args.n}, {args.nq} queries, k={args.k} "
        "(same trained parameters; last column: vq trained on its own)"
    )
    report("ivf_search", title, args.threads, rows, list(rows[0]))
    print()
    report(
        "ivf_add",
        "## IVFPQ add, memory, file size, training",
        args.threads,
        add_rows,
        list(add_rows[0]),
    )
    with figure("ivf_search") as ax:
        for name in ("vq", "faiss"):
            ax.plot(
                [r["recall@10"] for r in rows], [r[f"{name} QPS"] for r in rows], "o-", label=name
            )
        ax.set_xlabel("recall@10")
        ax.set_ylabel("queries per second")
        ax.set_yscale("log")
        ax.set_title(f"IVF{args.nlist},PQ{args.M}, {args.n} vectors, {args.threads} threads")
        ax.legend()
    return rows


if __name__ == "__main__":
    main()
