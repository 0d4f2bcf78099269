"""Time to the first answer in a new process: vq against faiss (``python -m bench.coldstart``).

    python -m bench.coldstart [--n 20000] [--dim 64] [--nq 100] [--kinds KIND ...]
                              [--repeats 3] [--no-cold] [--threads 2] [--cli-n 50000]

The parent builds every item once in a temporary folder; then a fresh child process per sample
(``python -c``) imports the library, loads the item and calls it twice, timing each step with
``perf_counter`` inside the child; the parent adds the child's whole wall time ("process").

- Index kinds: vq builds its own (``vq.index_factory``, train and add on n seeded Gaussian
  vectors, ``save``), faiss the same description (``faiss.index_factory``, ``write_index``);
  the call is a search of --nq queries, k=10, nprobe 1 (both libraries' default).
- Quantizers: vq fits each and saves its ``state_dict`` (safetensors: quantizers have no file
  format of their own); the child constructs it and loads the state. faiss gets the same
  codebooks (``vq.faiss_interop``): ``ProductQuantizer.compute_codes``, OPQMatrix + IndexPQ
  ``sa_encode``, IndexResidualQuantizer ``sa_encode`` (beam 1, as vq's default) and
  ``IndexFlatL2.assign`` over the VectorQuantizer's codebook. The call encodes --nq vectors.
- The layer: one training step (forward and backward of a batch of 512, training mode) of
  ``vq.VectorQuantizer(dim, 256, learning="ema")`` built in the child; the first step includes
  the k-means initialisation. faiss has no counterpart ("n/a").
- The CLI: ``vq search INDEX --queries Q.fvecs -k 10`` on IVF256,PQ32x4fs,RFlat of --cli-n
  vectors and 100 queries, timed as the subprocess's whole wall time (faiss: its child on the
  same kind, also whole), cache warm only.

vq's kernel cache: the cold sample runs first, with ``NUMBA_CACHE_DIR`` an empty folder (every
kernel compiles, the first calls answering on the torch path while the kernels compile in the
background); an unrecorded child then compiles, in the process, whatever the cold one left for
its background server to finish; the warm samples use that folder (with --no-cold, and for the
CLI, the user's cache after one unrecorded run). Warm samples alternate
vq and faiss (A B A B); the best of --repeats is kept. Children get --threads through
OMP_NUM_THREADS, MKL_NUM_THREADS and NUMBA_NUM_THREADS; the CLI also through --threads.

The issue's bars: warm load + first call <= 0.25 s and <= 2 x faiss + 0.1 s; cold <= 10 s.
Prints a table; writes bench/results/coldstart.csv.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

import bench
from bench.ann import faiss_description
from bench.common import machine_header, markdown_table, set_threads, write_csv
from vq.apps.warmup import COMMON

INDEXES = COMMON  # the kinds `vq warmup` compiles: what a cold start is measured on
QUANTIZERS = {  # constructor arguments after dim
    "ProductQuantizer": {"M": 16},
    "OPQ": {"M": 16},
    "ResidualVQ": {"num_quantizers": 4, "codebook_size": 256},
    "VectorQuantizer": {"codebook_size": 256},
}
LAYER = "VectorQuantizer layer step"
CLI = "vq search (CLI)"
CLI_INDEX = "IVF256,PQ32x4fs,RFlat"
KINDS = [*INDEXES, *QUANTIZERS, LAYER, CLI]
WARM_BAR, WARM_PER_FAISS, WARM_SLACK, COLD_BAR = 0.25, 2.0, 0.1, 10.0
COLUMNS = [
    "kind",
    "vq import s",
    "vq load+first s",
    "vq cold load+first s",
    "vq second s",
    "faiss import s",
    "faiss load+first s",
    "vq / faiss load+first",
    "vq process s",
    "faiss process s",
    "warm bar",
    "cold bar",
]
CSV_COLUMNS = [
    *COLUMNS[:3],
    "vq load s",
    "vq first s",
    *COLUMNS[3:6],
    "faiss load s",
    "faiss first s",
    "faiss second s",
    *COLUMNS[6:9],
    "vq cold process s",
    *COLUMNS[9:],
    "identical codes",
]

# A child: import the library, load (the snippet defines ``call``), call twice; one JSON line.
_CHILD = """\
import json, sys, time
t0 = time.perf_counter()
import {library}
t1 = time.perf_counter()
import numpy as np
{load}
t2 = time.perf_counter()
call()
t3 = time.perf_counter()
call()
print(json.dumps([t1 - t0, t2 - t1, t3 - t2, time.perf_counter() - t3]))
"""
_VQ_INDEX = """\
index = vq.load_index(sys.argv[1])
q = np.load(sys.argv[2])
def call(): index.search(q, 10)"""
_FAISS_INDEX = """\
index = faiss.read_index(sys.argv[1])
q = np.load(sys.argv[2])
def call(): index.search(q, 10)"""
_VQ_QUANTIZER = """\
from safetensors.torch import load_file
q = np.load(sys.argv[2])
quantizer = getattr(vq, sys.argv[3])(q.shape[1], **json.loads(sys.argv[4]))
quantizer.load_state_dict(load_file(sys.argv[1]))
def call(): quantizer.encode(q)"""
_FAISS_PQ = """\
pq = faiss.read_ProductQuantizer(sys.argv[1])
q = np.load(sys.argv[2])
def call(): pq.compute_codes(q)"""
_FAISS_ENCODE = """\
index = faiss.read_index(sys.argv[1])
q = np.load(sys.argv[2])
def call(): index.sa_encode(q)"""
_FAISS_ASSIGN = """\
index = faiss.read_index(sys.argv[1])
q = np.load(sys.argv[2])
def call(): index.assign(q, 1)"""
_VQ_LAYER = """\
import torch
torch.manual_seed(0)
dim = int(sys.argv[1])
layer = vq.VectorQuantizer(dim, 256, learning="ema").train()
z = torch.randn(512, dim, requires_grad=True)
def call():
    out = layer(z)
    (out.quantized.square().mean() + out.loss).backward()"""

Sample = list[float]  # import, load, first, second, process seconds (nan: not measured)
Run = Callable[[dict], Sample]


def environment(threads: int, cache_dir: str | None = None) -> dict[str, str]:
    """The children's environment: ``threads`` for every library, an own kernel cache if set,
    and the user's kernel compiles (in the background unless they set otherwise; see
    :mod:`bench`)."""
    env = dict(os.environ)
    env.pop("VQ_BACKGROUND_COMPILE", None)
    if bench.BACKGROUND_SETTING is not None:
        env["VQ_BACKGROUND_COMPILE"] = bench.BACKGROUND_SETTING
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
        env[var] = str(threads)
    if cache_dir is not None:
        env["NUMBA_CACHE_DIR"] = cache_dir
    return env


def _process(command: list[str], env: dict) -> tuple[str, float]:
    start = time.perf_counter()
    out = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - start
    if out.returncode != 0:
        raise RuntimeError(f"{command[:3]} failed: {out.stderr.strip().splitlines()[-3:]}")
    return out.stdout, wall


def child(library: str, load: str, *args: str) -> Run:
    """A run of a fresh interpreter importing ``library`` and loading with ``load``."""
    # ``import vq`` is lazy (torch loads on first use): the import phase takes vq.index too,
    # so that it holds torch's import, as faiss's holds its own, and load + first call is the
    # work after it
    code = _CHILD.format(library="vq, vq.index" if library == "vq" else library, load=load)

    def run(env: dict) -> Sample:
        stdout, wall = _process([sys.executable, "-c", code, *args], env)
        return [*json.loads(stdout.strip().splitlines()[-1]), wall]

    return run


def cli_command(index: Path, queries: Path, threads: int) -> Run:
    """A run of ``vq search``: only its whole wall time is known."""
    script = Path(sys.executable).with_name("vq")
    vq = [str(script)] if script.exists() else [sys.executable, "-m", "vq.apps.cli"]
    command = [*vq, "search", str(index), "--queries", str(queries), "-k", "10"]
    command += ["--threads", str(threads)]

    def run(env: dict) -> Sample:
        return [math.nan] * 4 + [_process(command, env)[1]]

    return run


def build_index(folder: Path, kind: str, x: np.ndarray, q: Path) -> tuple[Run, Run]:
    """Save a vq and a faiss index of ``kind`` trained and filled with ``x``."""
    import faiss

    import vq

    name = kind.replace(",", "_")
    ours = vq.index_factory(x.shape[1], kind)
    ours.train(x)
    ours.add(x)
    ours.save(folder / f"{name}.vq")
    theirs = faiss.index_factory(x.shape[1], faiss_description(kind))
    theirs.train(x)
    theirs.add(x)
    faiss.write_index(theirs, str(folder / f"{name}.faiss"))
    return (
        child("vq", _VQ_INDEX, str(folder / f"{name}.vq"), str(q)),
        child("faiss", _FAISS_INDEX, str(folder / f"{name}.faiss"), str(q)),
    )


def build_quantizer(folder: Path, kind: str, x: np.ndarray, q: Path) -> tuple[Run, Run, float]:
    """Save a fitted vq quantizer's state, and faiss's encoder holding the same codebooks; the
    fraction of the queries both encode alike."""
    import faiss
    import safetensors.torch
    import torch

    import vq
    from vq import faiss_interop

    dim, args = x.shape[1], QUANTIZERS[kind]
    quantizer = getattr(vq, kind)(dim, **args).fit(torch.from_numpy(x))
    state = folder / f"{kind}.safetensors"
    safetensors.torch.save_file(quantizer.state_dict(), state)
    ours = child("vq", _VQ_QUANTIZER, str(state), str(q), kind, json.dumps(args))
    path = str(folder / f"{kind}.faiss")
    queries = np.load(q)
    codes = np.asarray(quantizer.encode(queries))
    if kind == "ProductQuantizer":
        fpq = faiss_interop.pq_to_faiss(quantizer)
        faiss.write_ProductQuantizer(fpq, path)
        same = np.all(fpq.compute_codes(queries) == codes, axis=1).mean()
        return ours, child("faiss", _FAISS_PQ, path, str(q)), float(same)
    if kind == "OPQ":
        matrix, fpq = faiss_interop.opq_to_faiss(quantizer)
        inner = faiss.IndexPQ(quantizer.dim_out, fpq.M, fpq.nbits)
        inner.pq, inner.is_trained = fpq, True
        index = faiss.IndexPreTransform(matrix, inner)
    elif kind == "ResidualVQ":
        frq = faiss_interop.rvq_to_faiss(quantizer)
        index = faiss.IndexResidualQuantizer(dim, frq.M, frq.nbits.at(0))
        index.rq, index.is_trained = frq, True
    else:  # one codebook: faiss's k-means assignment
        index = faiss.IndexFlatL2(dim)
        index.add(quantizer.codebook.detach().float().numpy())
        faiss.write_index(index, path)
        same = np.mean(index.assign(queries, 1)[:, 0] == codes)
        return ours, child("faiss", _FAISS_ASSIGN, path, str(q)), float(same)
    faiss.write_index(index, path)
    same = np.all(index.sa_encode(queries) == codes, axis=1).mean()
    return ours, child("faiss", _FAISS_ENCODE, path, str(q)), float(same)


def build_cli(folder: Path, args: argparse.Namespace) -> tuple[Run, Run]:
    """``vq search`` on a saved ``args.cli_index`` of ``args.cli_n`` vectors, 100 queries; faiss's
    child on the same kind and queries."""
    from vq.datasets import write_fvecs

    rng = np.random.default_rng(1)
    x = rng.standard_normal((args.cli_n, args.dim), dtype=np.float32)
    q = rng.standard_normal((100, args.dim), dtype=np.float32)
    write_fvecs(folder / "cli_queries.fvecs", q)
    np.save(folder / "cli_queries.npy", q)
    sub = folder / "cli"
    sub.mkdir()
    _, theirs = build_index(sub, args.cli_index, x, folder / "cli_queries.npy")
    index = sub / f"{args.cli_index.replace(',', '_')}.vq"
    return cli_command(index, folder / "cli_queries.fvecs", args.threads), theirs


def build(folder: Path, args: argparse.Namespace) -> dict[str, tuple[Run, Run | None, dict]]:
    """Every item of ``args.kinds`` saved under ``folder``: its vq run, faiss run (None: faiss
    has no counterpart) and columns known from the build."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.n, args.dim), dtype=np.float32)
    q = folder / "queries.npy"
    np.save(q, rng.standard_normal((args.nq, args.dim), dtype=np.float32))
    items: dict[str, tuple[Run, Run | None, dict]] = {}
    for kind in args.kinds:
        if kind in QUANTIZERS:
            ours, theirs, same = build_quantizer(folder, kind, x, q)
            items[kind] = (ours, theirs, {"identical codes": same})
        elif kind == LAYER:
            items[kind] = (child("vq", _VQ_LAYER, str(args.dim)), None, {})
        elif kind == CLI:
            items[kind] = (*build_cli(folder, args), {})
        else:
            items[kind] = (*build_index(folder, kind, x, q), {})
    return items


def best(samples: list[Sample], *parts: int) -> float:
    """The least total of ``parts`` over the samples (nan where not measured)."""
    return min((sum(s[i] for i in parts) for s in samples), default=math.nan)


def measure(kind: str, ours: Run, theirs: Run | None, args: argparse.Namespace) -> dict:
    """One row: cold sample, then warm samples alternating vq and faiss (best kept)."""
    row: dict = {"kind": kind}
    with tempfile.TemporaryDirectory() as cache:
        if args.no_cold or kind == CLI:
            warm = environment(args.threads)
            ours(warm)  # fills the user's kernel cache
        else:
            warm = environment(args.threads, cache)
            cold = ours(warm)  # empty cache: every kernel compiles, and is kept for the warm runs
            # the cold child exits without waiting for its background compiles: what they left
            # undone compiles in an unrecorded child, so that the warm samples find every kernel
            ours({**warm, "VQ_BACKGROUND_COMPILE": "0"})
            row["vq cold load+first s"] = cold[1] + cold[2]
            row["vq cold process s"] = cold[4]
            row["cold bar"] = "met" if cold[1] + cold[2] <= COLD_BAR else "not met"
        mine, ref = [], []
        for _ in range(args.repeats):
            mine.append(ours(warm))
            if theirs is not None:
                ref.append(theirs(environment(args.threads)))
    for system, samples in (("vq", mine), ("faiss", ref)):
        if not samples:
            continue
        for column, parts in (
            ("import", [0]),
            ("load", [1]),
            ("first", [2]),
            ("load+first", [1, 2]),
            ("second", [3]),
            ("process", [4]),
        ):
            value = best(samples, *parts)
            if not math.isnan(value):
                row[f"{system} {column} s"] = value
    if "vq load+first s" in row:
        first, bar = row["vq load+first s"], WARM_BAR
        if "faiss load+first s" in row:
            row["vq / faiss load+first"] = first / row["faiss load+first s"]
            bar = min(bar, WARM_PER_FAISS * row["faiss load+first s"] + WARM_SLACK)
        row["warm bar"] = "met" if first <= bar else f"not met (> {bar:.3g} s)"
    return row


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", type=int, default=20_000, help="vectors per index (default 20,000)")
    p.add_argument("--dim", type=int, default=64, help="dimension (default 64)")
    p.add_argument("--nq", type=int, default=100, help="queries / vectors per call (default 100)")
    p.add_argument("--kinds", nargs="+", default=KINDS, help="items (default: all)")
    p.add_argument("--repeats", type=int, default=3, help="warm samples per system (best kept)")
    p.add_argument("--no-cold", action="store_true", help="skip the empty-cache samples")
    p.add_argument("--threads", type=int, default=2, help="threads for both systems")
    p.add_argument("--cli-n", type=int, default=50_000, help="vectors of the CLI's index")
    p.add_argument("--cli-index", default=CLI_INDEX, help=f"the CLI's index (default {CLI_INDEX})")
    args = p.parse_args(argv)

    set_threads(args.threads)
    start = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        items = build(Path(tmp), args)
        print(f"built {len(items)} items in {time.perf_counter() - start:.0f} s", flush=True)
        for kind, (ours, theirs, known) in items.items():
            rows.append({**measure(kind, ours, theirs, args), **known})
            print(f"{kind}: {rows[-1]}", flush=True)
    shown = [{c: row.get(c, "n/a") for c in COLUMNS} for row in rows]
    print(
        f"\n## Time to the first answer in a new process: n={args.n:,}, d={args.dim}, "
        f"{args.nq} queries / vectors per call, k=10, nprobe 1; CLI: {args.cli_index}, "
        f"n={args.cli_n:,}, 100 queries (best of {args.repeats} warm samples; cold: an empty "
        f"kernel cache; bars: warm load+first <= {WARM_BAR} s and <= {WARM_PER_FAISS:g} x faiss "
        f"+ {WARM_SLACK} s, cold <= {COLD_BAR:g} s; {time.perf_counter() - start:.0f} s in all)"
    )
    print(machine_header(args.threads) + "\n")
    print(markdown_table(shown, COLUMNS))
    write_csv("coldstart", rows, CSV_COLUMNS)
    return rows


if __name__ == "__main__":
    main()
