"""vq.HNSW and vq.HNSWSQ against faiss IndexHNSWFlat (and hnswlib where it is installed):
build time at the same M and efConstruction, then QPS and recall@10 over an efSearch sweep,
and the best QPS that reaches recall 0.90 / 0.95 / 0.99; memory per vector.

    python -m bench.hnsw [--n 100000] [--dim 128] [--M 32] [--efc 40] [--nq 1000] [--threads 2]
                         [--unit-norm] [--vectors FILE] [--systems vq,vq-int8,vq-rabitq,...]

The data are anisotropic Gaussian vectors (variance decaying over a random basis, as
embeddings have), or the first n rows and nq queries of ``--vectors``, a safetensors file
holding "database" and "queries" (such as the cache file of
:func:`vq.datasets.text.sentence_embeddings`). Systems: vq (float traversal), vq-int8 (int8
traversal, exact re-rank), vq-rabitq (the beam's distances exact, each read only where the
neighbour's RaBitQ estimate may put it in the beam), vq-sq8 / vq-fp16 (``HNSW<M>,SQ8`` /
``HNSW<M>,SQfp16``: codes only),
vq-sq8-rfp16 (``HNSW<M>,SQ8,Refine(SQfp16)``: the beam re-ranked on fp16 vectors), faiss,
hnswlib. Builds alternate the systems ``--build-rounds`` times (best kept); searches
alternate at each efSearch (best of 3). Writes bench/results/hnsw.csv (the sweep) and
hnsw_summary.csv.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from bench.common import alternate, hnswlib_bytes, report, set_threads

EF = (10, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
TARGETS = (0.90, 0.95, 0.99)


def recall(found: np.ndarray, truth: np.ndarray) -> float:
    k = truth.shape[1]
    return float(np.mean([len(set(a) & set(b)) for a, b in zip(found, truth, strict=True)]) / k)


def builders(x: np.ndarray, M: int, efc: int, threads: int) -> dict:
    import faiss

    import vq

    def build_vq():
        index = vq.HNSW(x.shape[1], M, efConstruction=efc)
        index.add(x)
        return index

    def build_walk(traversal):
        def build():
            index = vq.HNSW(x.shape[1], M, efConstruction=efc, traversal=traversal)
            index.add(x)
            return index

        return build

    def build_sq(bits):
        def build():
            index = vq.HNSWSQ(x.shape[1], M, bits=bits, efConstruction=efc)
            index.train(x)
            index.add(x)
            return index

        return build

    def build_faiss():
        index = faiss.IndexHNSWFlat(x.shape[1], M)
        index.hnsw.efConstruction = efc
        index.add(x)
        return index

    def build_sq8_refine_fp16():  # HNSW<M>,SQ8,Refine(SQfp16): the beam re-ranked on fp16
        index = vq.Refine(vq.HNSWSQ(x.shape[1], M, bits=8, efConstruction=efc), storage="fp16")
        index.train(x)
        index.add(x)
        return index

    out = {"vq": build_vq, "vq-int8": build_walk("int8"), "vq-rabitq": build_walk("rabitq"),
           "vq-sq8": build_sq(8),
           "vq-fp16": build_sq("fp16"), "vq-sq8-rfp16": build_sq8_refine_fp16,
           "faiss": build_faiss}  # fmt: skip
    try:
        import hnswlib
    except ImportError:
        return out

    def build_hnswlib():
        index = hnswlib.Index("l2", x.shape[1])
        index.init_index(x.shape[0], M=M, ef_construction=efc, random_seed=1)
        index.set_num_threads(threads)
        index.add_items(x)
        return index

    out["hnswlib"] = build_hnswlib
    return out


def searchers(built: dict, q: np.ndarray, k: int) -> dict:
    def vq_search(ef, name="vq"):
        return lambda: built[name].search(q, k, efSearch=ef)[1]

    def faiss_search(ef):
        def run():
            built["faiss"].hnsw.efSearch = ef
            return built["faiss"].search(q, k)[1]

        return run

    def hnswlib_search(ef):
        def run():
            built["hnswlib"].set_ef(max(ef, k))
            return built["hnswlib"].knn_query(q, k)[0]

        return run

    def refined_search(ef):  # the whole beam re-ranked: k_factor = efSearch / k
        index = built["vq-sq8-rfp16"]
        return lambda: index.search(q, k, efSearch=ef, k_factor=max(1, ef // k))[1]

    table = {"vq": vq_search, "faiss": faiss_search, "hnswlib": hnswlib_search,
             "vq-sq8-rfp16": refined_search}  # fmt: skip
    for name in ("vq-int8", "vq-rabitq", "vq-sq8", "vq-fp16"):
        table[name] = lambda ef, name=name: vq_search(ef, name)
    return {name: table[name] for name in built}


def bytes_per_vector(name: str, index, n: int, dim: int, M: int) -> float:
    if name.startswith("vq"):
        return index.nbytes() / n  # buffers and search caches (Index.nbytes)
    if name == "faiss":
        import faiss

        h = index.hnsw
        graph = faiss.vector_to_array(h.neighbors).nbytes + 4 * n + 8 * (n + 1)
        return dim * 4 + graph / n
    return hnswlib_bytes(n, dim, M) / n


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=100_000)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--M", type=int, default=32)
    p.add_argument("--efc", type=int, default=40)
    p.add_argument("--nq", type=int, default=1000)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--build-rounds", type=int, default=1)
    p.add_argument("--unit-norm", action="store_true", help="normalise (as sentence embeddings)")
    p.add_argument("--vectors", help="safetensors file with 'database' and 'queries' arrays")
    systems = "vq,vq-int8,vq-rabitq,vq-sq8,vq-fp16,vq-sq8-rfp16,faiss,hnswlib"
    p.add_argument("--systems", default=systems)
    args = p.parse_args(argv)

    import faiss

    import vq
    from vq.datasets import anisotropic_vectors

    set_threads(args.threads)
    if args.vectors:
        from safetensors.numpy import load_file

        stored = load_file(args.vectors)
        x = np.ascontiguousarray(stored["database"][: args.n], dtype=np.float32)
        q = np.ascontiguousarray(stored["queries"][: args.nq], dtype=np.float32)
        args.dim = x.shape[1]
    else:
        data = anisotropic_vectors(args.n + args.nq, args.dim, decay=0.95, seed=0)
        if args.unit_norm:
            data /= np.linalg.norm(data, axis=1, keepdims=True)
        x, q = np.ascontiguousarray(data[: args.n]), np.ascontiguousarray(data[args.n :])
    truth = faiss.knn(q, x, 10)[1]
    vq.HNSW(args.dim, args.M).add(x[:2000])  # compile (or load) the kernels first
    fns = builders(x, args.M, args.efc, args.threads)
    fns = {name: fns[name] for name in args.systems.split(",") if name in fns}
    build_s, built = {name: float("inf") for name in fns}, {}
    for _ in range(args.build_rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            built[name] = fn()
            build_s[name] = min(build_s[name], time.perf_counter() - start)
    runs = searchers(built, q, 10)
    rows = []
    for ef in EF:
        found = {name: make(ef)() for name, make in runs.items()}
        seconds = alternate({name: make(ef) for name, make in runs.items()}, min_seconds=0.2)
        for name in runs:
            r = recall(found[name], truth)
            rows.append(
                {"system": name, "efSearch": ef, "recall@10": r, "QPS": len(q) / seconds[name]}
            )
    title = f"HNSW{args.M}, efConstruction {args.efc}, {len(x)} x {args.dim}, {len(q)} queries"
    report("hnsw", title, args.threads, rows, ["system", "efSearch", "recall@10", "QPS"])
    summary = []
    for name in runs:
        size = bytes_per_vector(name, built[name], len(x), args.dim, args.M)
        row = {"system": name, "build s": build_s[name], "bytes/vector": size}
        for t in TARGETS:
            ok = [r["QPS"] for r in rows if r["system"] == name and r["recall@10"] >= t]
            row[f"QPS@{t:.2f}"] = max(ok) if ok else float("nan")
        summary.append(row)
    columns = ["system", "build s", "bytes/vector", *[f"QPS@{t:.2f}" for t in TARGETS]]
    print()
    report("hnsw_summary", "best QPS reaching each recall@10", args.threads, summary, columns)


if __name__ == "__main__":
    main()
