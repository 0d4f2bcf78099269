"""Recall frontiers: each library swept over the configurations its users pick, and the best QPS
each reaches at recall@10 >= 0.80, 0.90, 0.95 and 0.99 (k = 10, same data, same threads).

    python -m bench.frontier [--data text|words|nsynth|synthetic|X.fvecs|X.hdf5] [--n 300000]

Systems (each where importable; ``make bench`` installs all of them):
- vq: IVF{nlist},PQ{d/2}x4fs,RFlat (nprobe x k_factor), IVF{nlist},Flat (nprobe), and every
  other --vq description given (an HNSW description sweeps efSearch, an IVF one nprobe, and
  nprobe x k_factor where it re-ranks: ",RFlat" or ",Refine(SQfp16)");
  "HNSW32:int8" is vq.HNSW(d, 32, traversal="int8") ("HNSW32:rabitq": traversal="rabitq"),
  "HNSW32:int8:efc200" with
  efConstruction=200, hnswlib's build beam here; "HNSW32,SQ8,Refine(SQfp16)" and other
  factory strings as vq.index_factory reads them, ":efc200" setting a graph's build beam,
  a Refine around a graph re-ranking the beam: k_factor = efSearch / k);
- faiss: the same fast-scan + RFlat and IVF,Flat, HNSW{M} for each --hnsw-M (efSearch), and
  IVF RaBitQ fast-scan + RFlat with 1-bit and 4-bit (extended RaBitQ) codes (nprobe x k_factor),
  and every --faiss factory string given (swept as vq's descriptions are);
- hnswlib: each --hnsw-M (default 16, hnswlib's own example, and 32), ef_construction=200 (ef);
- ScaNN: tree (num_leaves ~ 2 sqrt(n)) + score_ah(2, 0.2) + reorder (leaves x reorder), with
  and without its SOAR spilling (soar_lambda 1.5), as vq's own "IVF…(soar),…" descriptions.
- usearch (HNSW, each --hnsw-M, expansion_add 200; expansion_search), NGT's ONNG (epsilon) and
  Intel SVS's float32 Vamana (each --svs-R, build window 128, alpha 1.2; search_window_size), as
  bench.graph_peers builds them (SVS's LVQ, which refuses non-Intel CPUs, is probed and its
  answer printed).

The default grids step by about 1.5x (nprobe 1…512, at most nlist; efSearch 10…512), as
finely for every library: at a recall level, a coarser grid decides more than the systems do.
Every point of
every system is timed in one alternating loop (each round visits all points in
turn; each sample repeats a search of all queries until it lasts --min-seconds; the best of
--rounds is kept), so that the machine's noise falls on all systems alike. Prints the points,
the frontier table (with the bytes per vector of each best point: vq's ``Index.nbytes``, faiss's
serialized size, hnswlib's by :func:`bench.common.hnswlib_bytes`, the graph peers' as
bench.graph_peers says; and the seconds its index took to build, training included, on
--threads threads) and the ratio of vq's best
to the best peer at each level, and of vq's best among its indexes that hold no more bytes
per vector than hnswlib's best there; writes
results/<name>.csv, <name>-frontier.csv and <name>.png. Data as bench.ann ("text" is the
all-MiniLM-L6-v2 set of vq.datasets.text: 300k sentences of local text, unit norm; "words"
the same model over single words and two-word phrases of that text, vq.datasets.words).
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from functools import partial

import numpy as np

from bench.ann import add_data_arguments, load_data
from bench.common import alternate, figure, hnswlib_bytes, report, set_threads
from bench.graph_peers import ngt_points, svs_lvq_refusal, svs_points, usearch_points

LEVELS = (0.80, 0.90, 0.95, 0.99)
K = 10
Search = Callable[[], np.ndarray]  # runs all queries, returns ids [nq, K]
Points = list[tuple[str, Search]]
Held = Callable[[], float] | None  # bytes the built index holds, after its searches ran


def vq_points(desc: str, x, train, q, nprobes, k_factors, efs) -> tuple[Points, Held]:
    """vq's index of ``desc``, trained and filled, its sweep, and its ``nbytes``."""
    import vq

    base, *options = desc.split(":")
    efc = [int(o[3:]) for o in options if o.startswith("efc")]
    if base.startswith("HNSW") and "," not in base and options:  # HNSW32:int8[:efc200]
        walk = next((o for o in options if o in ("int8", "rabitq")), "float")
        index = vq.HNSW(x.shape[1], int(base[4:]), efConstruction=efc[0] if efc else 40,
                        traversal=walk)  # fmt: skip
    else:  # a factory string, [:efcN] setting a graph's build beam
        index = vq.index_factory(x.shape[1], base)
        graph = getattr(index, "index", index)
        if efc:
            graph.efConstruction = efc[0]
    index.train(train)
    index.add(x)
    if desc.split(",")[0].startswith("HNSW"):  # (not IVF…_HNSW: graph-routed lists)
        if "Refine" in desc:  # the beam's efSearch nodes re-ranked (k_factor = efSearch / k)
            points = [(f"efSearch={e}", lambda e=e: index.search(
                q, K, efSearch=e, k_factor=max(1, e // K))[1]) for e in efs]  # fmt: skip
        else:
            points = [(f"efSearch={e}", lambda e=e: index.search(q, K, efSearch=e)[1]) for e in efs]
    elif reranks(desc):
        points = [
            (f"nprobe={p},k_factor={f}", refined(index, q, p, f))
            for p in nprobes
            for f in k_factors
        ]
    else:
        points = [(f"nprobe={p}", lambda p=p: index.search(q, K, nprobe=p)[1]) for p in nprobes]
    return points, lambda: float(index.nbytes())


def reranks(desc: str) -> bool:
    """Whether the IVF index of ``desc`` re-ranks (",RFlat" or ",Refine(…)": swept over
    nprobe x k_factor)."""
    return desc.endswith("RFlat") or ",Refine(" in desc


def refined(index, q, nprobe: int, k_factor: int) -> Search:
    """A vq re-ranking search at one sweep point."""
    return lambda: index.search(q, K, nprobe=nprobe, k_factor=k_factor)[1]


def faiss_points(desc: str, x, train, q, nprobes, k_factors, efs) -> tuple[Points, Held]:
    """faiss's index of ``desc`` (its own training), its sweep, and its bytes (its
    serialized size: what it holds, less small bookkeeping)."""
    import faiss

    if "RaBitQ" in desc and not hasattr(faiss, "IndexIVFRaBitQFastScan"):
        raise ImportError(f"faiss {faiss.__version__} has no RaBitQ fast-scan (1.13 or later)")
    index = faiss.index_factory(x.shape[1], desc)
    index.train(train)
    index.add(x)

    def run(**params) -> Search:
        space = faiss.ParameterSpace()
        label = ",".join(f"{k}={v}" for k, v in params.items())

        def search():
            space.set_index_parameters(index, label)
            return index.search(q, K)[1]

        return search

    def held() -> float:
        return float(faiss.serialize_index(index).nbytes)

    if desc.startswith("HNSW"):
        return [(f"efSearch={e}", run(efSearch=e)) for e in efs], held
    if reranks(desc):
        points = [
            (f"nprobe={p},k_factor={f}", run(nprobe=p, k_factor_rf=f))
            for p in nprobes
            for f in k_factors
        ]
        return points, held
    return [(f"nprobe={p}", run(nprobe=p)) for p in nprobes], held


def hnswlib_points(x, q, M: int, threads: int, efs) -> tuple[Points, Held]:
    """hnswlib, ``M``, ef_construction=200, L2, swept over ef; its bytes as
    :func:`bench.common.hnswlib_bytes` estimates them."""
    import hnswlib

    index = hnswlib.Index(space="l2", dim=x.shape[1])
    index.init_index(max_elements=len(x), M=M, ef_construction=200, random_seed=0)
    index.set_num_threads(threads)
    index.add_items(x, np.arange(len(x)))

    def run(ef: int) -> Search:
        def search():
            index.set_ef(max(ef, K))
            return index.knn_query(q, k=K)[0]

        return search

    return [(f"ef={e}", run(e)) for e in efs], lambda: hnswlib_bytes(*x.shape, M)


def scann_points(x, train_n: int, q, threads: int, soar: bool = False) -> tuple[Points, Held]:
    """ScaNN: tree + asymmetric hashing + exact reorder, swept over leaves and reorder; with
    ``soar``, its SOAR spilling (soar_lambda 1.5, ScaNN's default) in the tree, which ScaNN
    builds for dot products only: on unit-norm data (where they rank as L2 does), else none."""
    import scann

    leaves = int(2 ** round(math.log2(2 * math.sqrt(len(x)))))
    spill, distance = {}, "squared_l2"
    if soar:
        if not np.allclose(np.linalg.norm(x[:1000], axis=1), 1.0, atol=1e-3):
            print("skipped ScaNN SOAR: it needs dot products, and these vectors are not unit norm")
            return [], None
        spill, distance = {"soar_lambda": 1.5}, "dot_product"
    searcher = (
        scann.scann_ops_pybind.builder(x, K, distance)
        .tree(
            num_leaves=leaves,
            num_leaves_to_search=16,
            training_sample_size=min(train_n, len(x)),
            **spill,
        )
        .score_ah(2, anisotropic_quantization_threshold=0.2)
        .reorder(100)
        .build()
    )
    searcher.set_num_threads(threads)

    def run(nl: int, reorder: int) -> Search:
        def search():
            return searcher.search_batched_parallel(
                q, leaves_to_search=nl, pre_reorder_num_neighbors=reorder
            )[0]

        return search

    points = [
        (f"leaves={nl},reorder={r}", run(nl, r))
        for nl in (4, 8, 16, 32, 64, 128, 256)
        for r in (20, 50, 100, 200)
    ]
    return points, None  # (ScaNN does not say)


def frontier(rows: list[dict], system: str, level: float) -> dict | None:
    """The fastest of ``system``'s points at recall@10 >= level, or None."""
    ok = [r for r in rows if r["system"] == system and r["recall@10"] >= level]
    return max(ok, key=lambda r: r["QPS"]) if ok else None


def cell(point: dict | None) -> str:
    """A frontier table's entry: QPS (index, sweep point, bytes per vector where known, build
    seconds)."""
    if point is None:
        return "-"
    size = point["B/vector"]
    size = "" if math.isnan(size) else f", {size:,.0f} B"
    built = f", built in {point['build seconds']:,.1f} s"
    return f"{point['QPS']:,.0f} ({point['index']} {point['param']}{size}{built})"


def build_all(args, x, train, q) -> dict[tuple[str, str], tuple[Points, Held, float]]:
    """Every system's built indexes, as their sweeps, bytes and build seconds, keyed by
    (system, index)."""
    nlist, M = args.nlist, x.shape[1] // 2
    fast = f"IVF{nlist},PQ{M}x4fs,RFlat"
    plan: list[tuple[str, str, Callable]] = []
    for desc in [fast, f"IVF{nlist},Flat", *args.vq]:
        plan.append(("vq", desc, lambda d=desc: vq_points(d, x, train, q, *args.sweeps)))
    rabitq = [f"IVF{nlist},RaBitQfs,RFlat", f"IVF{nlist},RaBitQfs4,RFlat"]
    graphs = [f"HNSW{m}" for m in args.hnsw_M]
    for desc in [fast, f"IVF{nlist},Flat", *graphs, *rabitq, *args.faiss]:
        plan.append(("faiss", desc, lambda d=desc: faiss_points(d, x, train, q, *args.sweeps)))
    for m in args.hnsw_M:
        graph = partial(hnswlib_points, x, q, m, args.threads, args.sweeps[2])
        plan.append(("hnswlib", f"M={m}", graph))
    plan.append(("scann", "tree+AH", lambda: scann_points(x, len(train), q, args.threads)))
    plan.append(("scann", "tree+AH+SOAR",
                 lambda: scann_points(x, len(train), q, args.threads, soar=True)))  # fmt: skip
    for m in args.hnsw_M:
        graph = partial(usearch_points, x, q, m, args.threads, args.sweeps[2])
        plan.append(("usearch", f"M={m}", graph))
    plan.append(("ngt", "ONNG", partial(ngt_points, x, q, args.threads)))
    for r in args.svs_R:
        graph = partial(svs_points, x, q, r, args.threads, args.sweeps[2])
        plan.append(("svs", f"Vamana R={r}", graph))
    built = {}
    for system, desc, make in plan:
        if system not in args.systems:
            continue
        try:
            start = time.perf_counter()
            points, held = make()
            seconds = time.perf_counter() - start
            if points:  # (none: the system cannot build this kind here, and said why)
                built[system, desc] = points, held, seconds
                print(f"built {system} {desc} in {seconds:.1f} s", flush=True)
        except ImportError as err:
            print(f"skipped {system} {desc}: {err}")
    if "svs" in args.systems and any(s == "svs" for s, _ in built):
        refusal = svs_lvq_refusal()
        print("svs LVQ: " + (f"refused here ({refusal})" if refusal else "builds here (not swept)"))
    return built


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_data_arguments(p)
    p.set_defaults(data="text", n=300_000)
    p.add_argument("--vq", nargs="*", default=[], help="more vq descriptions (e.g. HNSW32)")
    p.add_argument("--faiss", nargs="*", default=[],
                   help="more faiss factory strings (e.g. IVF1024,PQ192x4fs,RFlat)")  # fmt: skip
    systems = ["vq", "faiss", "hnswlib", "scann", "usearch", "ngt", "svs"]
    p.add_argument("--systems", nargs="+", default=systems, help="(each skipped if absent)")
    nprobes = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512]
    p.add_argument("--nprobe", type=int, nargs="+", default=nprobes)
    p.add_argument("--k-factor", type=int, nargs="+", default=[2, 4, 8, 16])
    p.add_argument("--ef", type=int, nargs="+",
                   default=[10, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 512])  # fmt: skip
    p.add_argument("--hnsw-M", type=int, nargs="+", default=[16, 32],
                   help="M of faiss's, hnswlib's, usearch's graphs (one index each)")  # fmt: skip
    p.add_argument("--svs-R", type=int, nargs="+", default=[32, 64],
                   help="graph_max_degree of SVS's Vamana graphs (one index each)")  # fmt: skip
    p.add_argument("--threads", type=int, default=2, help="threads for every system")
    p.add_argument("--rounds", type=int, default=3, help="alternating timing rounds (best kept)")
    p.add_argument("--min-seconds", type=float, default=0.1, help="least time per timing sample")
    p.add_argument("--name", default="frontier", help="results/<name>.csv and .png")
    args = p.parse_args(argv)
    if min(args.hnsw_M) < 2:
        p.error(f"--hnsw-M: each M must be at least 2 (links per node), got {args.hnsw_M}")

    from vq.datasets import ground_truth, recall_at

    set_threads(args.threads)
    label, x, q = load_data(args)
    n, dim = x.shape
    args.nlist = args.nlist or int(2 ** round(math.log2(4 * math.sqrt(n))))
    args.sweeps = ([p for p in args.nprobe if p <= args.nlist], args.k_factor, args.ef)
    train = x[: min(n, args.ntrain)]
    truth = ground_truth(x, q, K)[1]
    built = build_all(args, x, train, q)
    points = {(s, d, lab): fn for (s, d), (pts, _, _) in built.items() for lab, fn in pts}
    recall = {key: recall_at(fn(), truth, K) for key, fn in points.items()}
    per_vector = {key: held() / n for key, (_, held, _) in built.items() if held}  # (caches built)
    seconds = alternate(
        {key: fn for key, fn in points.items() if recall[key] >= LEVELS[0] - 0.05},
        rounds=args.rounds,
        min_seconds=args.min_seconds,
    )
    rows = [
        {
            "system": s,
            "index": d,
            "param": lab,
            "recall@10": recall[s, d, lab],
            "QPS": len(q) / t,
            "B/vector": per_vector.get((s, d), math.nan),
            "build seconds": built[s, d][2],
        }
        for (s, d, lab), t in seconds.items()
    ]
    title = f"## Points: {label}, n={n}, d={dim}, {len(q)} queries, k={K}"
    report(args.name, title, args.threads, rows, list(rows[0]))
    systems = sorted({r["system"] for r in rows})
    table = []
    for level in LEVELS:
        best = {s: frontier(rows, s, level) for s in systems}
        peers = [b["QPS"] for s, b in best.items() if s != "vq" and b]
        row = {"recall@10 >=": level}
        for s in systems:
            b = best[s]
            row[s] = cell(b)
        vq_best = best.get("vq")
        ratio = f"{vq_best['QPS'] / max(peers):.2f}" if vq_best and peers else None
        row["vq / best peer"] = ratio or ("only vq" if vq_best else "-")
        if best.get("hnswlib"):  # vq's best among its indexes of at most the bytes per
            graph_bytes = best["hnswlib"]["B/vector"]  # vector of hnswlib's best here
            lean = [r for r in rows if r["system"] == "vq" and r["B/vector"] <= graph_bytes]
            small = frontier(lean, "vq", level)
            ratio = small and peers and f"{small['QPS'] / max(peers):.2f} ({small['index']})"
            row["vq ≤ hnswlib's bytes / best peer"] = ratio or "-"
        table.append(row)
    title = f"## Frontier: best QPS at each recall@10, {label}, n={n}, {args.threads} threads"
    report(f"{args.name}-frontier", title, args.threads, table, list(table[0]))
    with figure(args.name, size=(8, 5)) as ax:
        for i, s in enumerate(systems):
            pts = sorted((r["recall@10"], r["QPS"]) for r in rows if r["system"] == s)
            hull, best_q = [], 0.0  # the upper-right envelope: best QPS at each recall or above
            for rec, qps in reversed(pts):
                if qps > best_q:
                    hull.append((rec, qps))
                    best_q = qps
            ax.plot(*zip(*sorted(hull), strict=True), "o-", color=f"C{i}", label=s, markersize=4)
        ax.set_xlabel("recall@10")
        ax.set_ylabel("queries per second")
        ax.set_yscale("log")
        ax.set_title(f"{label}, n={n}, {args.threads} threads")
        ax.legend()
    return rows


if __name__ == "__main__":
    main()
