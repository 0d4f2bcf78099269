"""Exported graphs in ONNX Runtime against the same graphs in torch eager mode.

    python -m bench.export [--n 200000] [--dim 128] [--M 16] [--nlist 1024] [--nprobe 16]

Encoding (PQ16 and a 4-stage residual VQ, batches of 1 and 256 vectors) and IVFPQ search
(k = 10, batches of 1 and 64 queries): the ``vq.export`` module runs in torch eager mode and,
written with ``vq.export.to_onnx``, in ONNX Runtime (CPU provider), with the same thread count,
timed alternately (A B A B), each sample repeated to at least 0.1 s, the best of several kept.
The library's own CPU path (numba kernels, dynamic shapes) is timed too, for reference. Prints
a table; writes bench/results/export.csv and export.png.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import torch

from bench.common import alternate, figure, report, set_threads


def _session(path: Path, threads: int):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", type=int, default=200_000, help="vectors in the IVFPQ index")
    p.add_argument("--dim", type=int, default=128, help="vector dimension")
    p.add_argument("--M", type=int, default=16, help="PQ sub-quantizers (8 bits each)")
    p.add_argument("--rvq-stages", type=int, default=4, help="residual VQ stages (256 codewords)")
    p.add_argument("--nlist", type=int, default=1024, help="inverted lists")
    p.add_argument("--nprobe", type=int, default=16, help="lists probed")
    p.add_argument("--k", type=int, default=10, help="neighbours per query")
    p.add_argument("--ntrain", type=int, default=50_000, help="training vectors")
    p.add_argument("--encode-batches", type=int, nargs="+", default=[1, 256])
    p.add_argument("--search-batches", type=int, nargs="+", default=[1, 64])
    p.add_argument("--threads", type=int, default=2, help="threads for every system")
    p.add_argument("--rounds", type=int, default=5, help="alternating timing rounds (best kept)")
    p.add_argument("--min-seconds", type=float, default=0.1, help="shortest timed sample")
    args = p.parse_args(argv)

    import vq
    from vq.datasets import anisotropic_vectors
    from vq.export import export_module, to_onnx

    set_threads(args.threads)
    big = max(max(args.encode_batches), max(args.search_batches))
    both = anisotropic_vectors(args.n + big, args.dim, decay=0.95, seed=0)
    x, q = both[: args.n], both[args.n :]
    train = x[: args.ntrain]
    codecs = {
        f"PQ{args.M} encode": vq.ProductQuantizer(args.dim, args.M, niter=10).fit(train),
        f"RVQ {args.rvq_stages}x8 encode": vq.ResidualVQ(
            args.dim, args.rvq_stages, 256, niter=10, refine_iters=0
        ).fit(train),
    }
    index = vq.IVFPQ(args.dim, args.nlist, args.M, nprobe=args.nprobe)
    index.train(train)
    index.add(x)

    rows = []
    folder = Path(tempfile.mkdtemp(prefix="vq-bench-export-"))

    def measure(label, obj, what, batch, native, **options):
        module = export_module(obj, what, **options)
        path = to_onnx(obj, folder / f"{len(rows)}.onnx", batch_size=batch, what=what, **options)
        session = _session(path, args.threads)
        name = session.get_inputs()[0].name
        data = q[:batch]
        tensor = torch.from_numpy(data)

        def eager():
            with torch.inference_mode():
                return module(tensor)

        def onnx():
            return session.run(None, {name: data})

        t = alternate(
            {"onnx": onnx, "eager": eager, "vq": lambda: native(data)},
            rounds=args.rounds,
            min_seconds=args.min_seconds,
        )
        theirs = eager()
        ours, theirs = onnx()[-1], (theirs[-1] if isinstance(theirs, tuple) else theirs).numpy()
        same = (ours == theirs).reshape(batch, -1).all(axis=1).mean()  # codes or ids, per row
        rows.append(
            {
                "operation": label,
                "batch": batch,
                "ONNX Runtime ms": 1e3 * t["onnx"],
                "torch eager ms": 1e3 * t["eager"],
                "eager / ONNX Runtime": t["eager"] / t["onnx"],
                "vq (numba) ms": 1e3 * t["vq"],
                "identical rows": float(same),
            }
        )

    for label, quantizer in codecs.items():
        for batch in args.encode_batches:
            measure(label, quantizer, "encode", batch, quantizer.encode)
    search_label = f"IVF{args.nlist},PQ{args.M} search, nprobe {args.nprobe}, n={args.n}"
    for batch in args.search_batches:
        measure(
            search_label,
            index,
            "search",
            batch,
            lambda d: index.search(d, args.k),
            k=args.k,
            nprobe=args.nprobe,
        )

    columns = [
        "operation",
        "batch",
        "ONNX Runtime ms",
        "torch eager ms",
        "eager / ONNX Runtime",
        "vq (numba) ms",
        "identical rows",
    ]
    report(
        "export",
        f"Exported graphs: ONNX Runtime vs torch eager, {args.threads} threads",
        args.threads,
        rows,
        columns,
    )
    with figure("export", size=(7, 4)) as ax:
        labels = [f"{r['operation'].split(',')[0]} b{r['batch']}" for r in rows]
        pos = np.arange(len(rows))
        ax.bar(pos - 0.2, [r["ONNX Runtime ms"] for r in rows], 0.4, label="ONNX Runtime")
        ax.bar(pos + 0.2, [r["torch eager ms"] for r in rows], 0.4, label="torch eager")
        ax.set_xticks(pos, labels, rotation=20, ha="right", fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("ms per call (lower is better)")
        ax.legend()
    return rows


if __name__ == "__main__":
    main()
