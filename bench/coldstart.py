"""Time to the first answer in a new process: vq against faiss (``python -m bench.coldstart``).

For each index kind the parent builds one index with faiss and saves it in both formats (vq
imports faiss's, so both answer from the same codes); then a fresh child process per sample
imports the library, loads the index and runs its first search, timing each step with
``perf_counter``. Quantizers: the first ``encode`` after loading saved codebooks (faiss:
``ProductQuantizer.compute_codes``). The layer: the first training step of an EMA
``VectorQuantizer``. vq runs with its kernel cache warm (filled by a run before the samples)
and cold (an empty ``NUMBA_CACHE_DIR``). Import time is reported apart; samples alternate vq
and faiss and the best of ``--repeats`` is kept.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np

from bench.common import machine_header, markdown_table, write_csv

INDEXES = (
    "Flat",
    "PQ16",
    "IVF64,Flat",
    "IVF64,PQ16",
    "OPQ16,IVF64,PQ16",
    "PQ32x4fs",
    "IVF64,PQ32x4fs",
    "IVF64,PQ32x4fsr,RFlat",
)
QUANTIZERS = ("ProductQuantizer", "OPQ", "ResidualVQ", "VectorQuantizer")
LAYER = "VectorQuantizer layer step"

# each child prints one JSON line: seconds to import, load, first call, second call
_VQ_INDEX = """
import time; t0 = time.perf_counter()
import json, sys, numpy as np, vq
t1 = time.perf_counter()
index = vq.load_index(sys.argv[1]); q = np.load(sys.argv[2])
t2 = time.perf_counter(); index.search(q, 10); t3 = time.perf_counter(); index.search(q, 10)
print(json.dumps([t1 - t0, t2 - t1, t3 - t2, time.perf_counter() - t3]))
"""
_FAISS_INDEX = """
import time; t0 = time.perf_counter()
import json, sys, numpy as np, faiss
t1 = time.perf_counter()
index = faiss.read_index(sys.argv[1]); q = np.load(sys.argv[2])
t2 = time.perf_counter(); index.search(q, 10); t3 = time.perf_counter(); index.search(q, 10)
print(json.dumps([t1 - t0, t2 - t1, t3 - t2, time.perf_counter() - t3]))
"""
_VQ_QUANTIZER = """
import time; t0 = time.perf_counter()
import json, sys, numpy as np, vq
from safetensors.torch import load_file
t1 = time.perf_counter()
name, dim, path, q = sys.argv[3], int(sys.argv[4]), sys.argv[1], np.load(sys.argv[2])
args = json.loads(sys.argv[5])
quantizer = getattr(vq, name)(dim, **args); quantizer.load_state_dict(load_file(path))
t2 = time.perf_counter(); quantizer.encode(q); t3 = time.perf_counter(); quantizer.encode(q)
print(json.dumps([t1 - t0, t2 - t1, t3 - t2, time.perf_counter() - t3]))
"""
_FAISS_PQ = """
import time; t0 = time.perf_counter()
import json, sys, numpy as np, faiss
t1 = time.perf_counter()
pq = faiss.read_ProductQuantizer(sys.argv[1]); q = np.load(sys.argv[2])
t2 = time.perf_counter(); pq.compute_codes(q); t3 = time.perf_counter(); pq.compute_codes(q)
print(json.dumps([t1 - t0, t2 - t1, t3 - t2, time.perf_counter() - t3]))
"""


def child(code: str, *args: str, cache_dir: str | None = None) -> list[float]:
    """Run ``code`` in a fresh interpreter; its [import, load, first, second] seconds."""
    env = dict(os.environ)
    if cache_dir is not None:
        env["NUMBA_CACHE_DIR"] = cache_dir
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"child failed: {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _layer_child(dim: int, cache_dir: str | None = None) -> list[float]:
    code = """
    import time; t0 = time.perf_counter()
    import json, sys, torch, vq
    t1 = time.perf_counter()
    dim = int(sys.argv[1]); torch.manual_seed(0)
    layer = vq.VectorQuantizer(dim, 256, learning="ema").train()
    z = torch.randn(512, dim, requires_grad=True)
    steps = []
    for _ in range(2):
        s = time.perf_counter()
        out = layer(z)
        (out.quantized.square().mean() + out.loss).backward()
        steps.append(time.perf_counter() - s)
    print(json.dumps([t1 - t0, 0.0, steps[0], steps[1]]))
    """
    return child(code, str(dim), cache_dir=cache_dir)


def build(folder: Path, n: int, dim: int, kinds: list[str]) -> dict[str, tuple]:
    """Save every item in ``folder``; the child arguments of each."""
    import faiss
    import safetensors.torch
    import torch

    import vq
    from vq.index import from_faiss

    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, dim), dtype=np.float32)
    q = folder / "queries.npy"
    np.save(q, rng.standard_normal((100, dim), dtype=np.float32))
    items = {}
    for kind in kinds:
        if kind in QUANTIZERS:
            args = {"ProductQuantizer": {"M": 16}, "OPQ": {"M": 16}}.get(kind, {})
            if kind == "VectorQuantizer":
                args = {"codebook_size": 256}
            if kind == "ResidualVQ":
                args = {"num_quantizers": 4, "codebook_size": 256}
            quantizer = getattr(vq, kind)(dim, **args).fit(torch.from_numpy(x[:20_000]))
            path = folder / f"{kind}.safetensors"
            safetensors.torch.save_file(quantizer.state_dict(), path)
            vq_args = (_VQ_QUANTIZER, str(path), str(q), kind, str(dim), json.dumps(args))
            faiss_args = None
            if kind == "ProductQuantizer":
                pq = faiss.ProductQuantizer(dim, 16, 8)
                pq.train(x[:20_000])
                faiss.write_ProductQuantizer(pq, str(folder / "pq.faiss"))
                faiss_args = (_FAISS_PQ, str(folder / "pq.faiss"), str(q))
            items[kind] = (vq_args, faiss_args)
            continue
        if kind == LAYER:
            items[kind] = ("layer", None)
            continue
        index = faiss.index_factory(dim, kind)
        index.train(x)
        index.add(x)
        name = kind.replace(",", "_")
        faiss.write_index(index, str(folder / f"{name}.faiss"))
        from_faiss(index).save(folder / f"{name}.vq")
        items[kind] = (
            (_VQ_INDEX, str(folder / f"{name}.vq"), str(q)),
            (_FAISS_INDEX, str(folder / f"{name}.faiss"), str(q)),
        )
    return items


def run_item(spec, dim: int, cache_dir: str | None = None) -> list[float]:
    if spec == "layer":
        return _layer_child(dim, cache_dir)
    return child(spec[0], *spec[1:], cache_dir=cache_dir)


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=20_000, help="vectors per index (default 20,000)")
    p.add_argument("--dim", type=int, default=64, help="dimension (default 64)")
    p.add_argument("--kinds", nargs="*", default=[*INDEXES, *QUANTIZERS, LAYER])
    p.add_argument("--repeats", type=int, default=3, help="warm samples per system (best kept)")
    p.add_argument("--no-cold", action="store_true", help="skip the empty-cache runs")
    args = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        items = build(Path(tmp), args.n, args.dim, args.kinds)
        for kind, (vq_spec, faiss_spec) in items.items():
            run_item(vq_spec, args.dim)  # fills the kernel cache
            vq_best, faiss_best = [np.inf] * 4, [np.inf] * 4
            for _ in range(args.repeats):  # alternating: vq, faiss, vq, faiss, ...
                vq_best = np.minimum(vq_best, run_item(vq_spec, args.dim)).tolist()
                if faiss_spec is not None:
                    faiss_best = np.minimum(faiss_best, child(*faiss_spec)).tolist()
            row = {
                "kind": kind,
                "vq import s": vq_best[0],
                "vq load+first s": vq_best[1] + vq_best[2],
                "vq second s": vq_best[3],
            }
            if faiss_spec is not None:
                faiss_first = faiss_best[1] + faiss_best[2]
                row.update({
                    "faiss import s": faiss_best[0],
                    "faiss load+first s": faiss_first,
                    "warm bar (<= 0.25 s, <= 2x faiss + 0.1 s)": "met"
                    if row["vq load+first s"] <= min(0.25, 2 * faiss_first + 0.1)
                    else "not met",
                })  # fmt: skip
            if not args.no_cold:
                with tempfile.TemporaryDirectory() as empty:
                    start = time.perf_counter()
                    cold = run_item(vq_spec, args.dim, cache_dir=empty)
                    row["vq cold load+first s"] = cold[1] + cold[2]
                    row["cold process s"] = time.perf_counter() - start
            rows.append(row)
            print(f"{kind}: {row}", flush=True)
    columns = [
        "kind",
        "vq import s",
        "vq load+first s",
        "vq cold load+first s",
        "faiss import s",
        "faiss load+first s",
        "vq second s",
        "warm bar (<= 0.25 s, <= 2x faiss + 0.1 s)",
    ]
    print("\nTime to the first answer in a new process (best of the warm samples)")
    print(machine_header(os.cpu_count() or 1) + " (the children keep their defaults)\n")
    print(markdown_table(rows, columns))
    write_csv("coldstart", rows, columns)
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
