"""Shared benchmark plumbing: thread pinning, alternating timing, tables, CSV and the header,
fresh child processes and their memory."""

from __future__ import annotations

import csv
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
REPO = RESULTS.parent.parent


def rss_kib(field: str = "VmRSS") -> int:
    """Resident set size in KiB from Linux /proc: "VmRSS" now, "VmHWM" its peak ("RssAnon",
    "RssFile": its parts).

    The peak is read from VmHWM, not ``ru_maxrss``: on Linux a process keeps the ``ru_maxrss``
    of the process that forked it across exec, so a child would report its parent's peak.
    """
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0  # not Linux, or a field this kernel lacks


def run_fresh(module: str, function: str, *args) -> dict:
    """``module.function(*args)`` in a fresh Python process (its memory counted from zero),
    which prints one JSON line last; returns that line parsed."""
    code = f"from {module} import {function}; {function}(" + ", ".join(map(repr, args)) + ")"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(f"{module}.{function}{args[:2]} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def set_threads(n: int) -> None:
    """Give torch, vq's kernels and faiss the same thread count."""
    import faiss
    import torch

    import vq

    torch.set_num_threads(n)
    vq.set_num_threads(n)
    faiss.omp_set_num_threads(n)


#: the CPU flags a result file records (the SIMD sets the kernels and faiss choose between)
SIMD_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
              "avx512_bf16", "amx_tile", "asimd", "sve")  # fmt: skip
#: the libraries a result file records the versions of, where they are installed
LIBRARIES = ("torch", "numba", "numpy", "faiss", "hnswlib", "scann", "usearch", "ngtpy", "svs",
             "onnxruntime", "vector_quantize_pytorch")  # fmt: skip
#: the distributions of those whose module has no ``__version__``
_DISTRIBUTIONS = {"svs": "scalable-vs"}


def _cpu() -> tuple[str, list[str]]:
    """The CPU's model name and the :data:`SIMD_FLAGS` it has (Linux /proc/cpuinfo)."""
    cpu, flags = "", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and not cpu:
                cpu = value.strip()
            elif key.strip() in ("flags", "Features") and not flags:
                flags = set(value.split())
    except OSError:
        pass
    return cpu or platform.processor() or "unknown", [f for f in SIMD_FLAGS if f in flags]


def _version(module: str) -> str:
    """The installed version of ``module``'s distribution, or "unknown"."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(_DISTRIBUTIONS.get(module, module))
    except PackageNotFoundError:
        return "unknown"


def machine_info(threads: int | None) -> dict:
    """What a result was measured on: CPU model and SIMD features, the fast-scan kernels'
    instruction set, cores, threads per system, Python and library versions, the UTC date.
    Libraries are looked up among the modules the run imported (none is imported here but vq's
    kernel selection)."""
    import vq
    from vq.kernels.fastscan.fastscan_scans import best_isa

    cpu, features = _cpu()
    versions = {"python": platform.python_version(), "vq": vq.__version__}
    for name in LIBRARIES:
        module = sys.modules.get(name)
        if module is not None:
            versions[name] = getattr(module, "__version__", None) or _version(name)
    return {
        "cpu": cpu,
        "features": features,
        "kernels": best_isa(),
        "cores": os.cpu_count(),
        "threads": threads,
        "libraries": versions,
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }


def machine_header(threads: int) -> str:
    import faiss  # noqa: F401  (recorded among the libraries)
    import numba  # noqa: F401
    import numpy  # noqa: F401
    import torch  # noqa: F401

    m = machine_info(threads)
    versions = ", ".join(f"{k} {v}" for k, v in m["libraries"].items() if k != "python")
    return (
        f"machine: {m['cpu']} ({m['kernels']} kernels), {m['cores']} cores, "
        f"{threads} threads per system; {versions}"
    )


def alternate(
    systems: dict[str, Callable[[], object]], rounds: int = 3, min_seconds: float = 0.1
) -> dict[str, float]:
    """Best seconds per call of each system, timed alternately (A B A B …).

    Each sample repeats the call until it lasts at least ``min_seconds``; the best of ``rounds``
    samples is kept, which is the least noisy estimate on a shared machine.
    """
    best = {name: float("inf") for name in systems}
    for fn in systems.values():  # warm-up (numba compilation, caches)
        fn()
    for _ in range(rounds):
        for name, fn in systems.items():
            calls, start = 0, time.perf_counter()
            while True:
                fn()
                calls += 1
                elapsed = time.perf_counter() - start
                if elapsed >= min_seconds:
                    break
            best[name] = min(best[name], elapsed / calls)
    return best


def markdown_table(rows: list[dict], columns: list[str]) -> str:
    def fmt(v):
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def write_csv(
    name: str,
    rows: list[dict],
    columns: list[str],
    *,
    threads: int | None = None,
    title: str = "",
) -> Path:
    """Write ``results/<name>.csv`` and beside it ``results/<name>.json``: the title, the
    command line and :func:`machine_info` (what ``python -m bench.render`` captions tables
    with). ``bench/results/published/`` holds the files the docs cite (``python -m bench.render
    --publish NAME`` copies a run there)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    meta = {
        "name": name,
        "title": title,
        "command": "python -m " + " ".join([_module_name(), *sys.argv[1:]]),
        "machine": machine_info(threads),
        "source": "measured",
    }
    path.with_suffix(".json").write_text(json.dumps(meta, indent=1) + "\n")
    return path


def _module_name() -> str:
    """The running benchmark as ``python -m`` names it (``bench.kmeans``)."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name:
        return spec.name.removesuffix(".__main__")
    return Path(sys.argv[0]).stem if sys.argv and sys.argv[0] else "bench"


def report(name: str, title: str, threads: int, rows: list[dict], columns: list[str]) -> None:
    """Print the title, the machine header and the table; write ``results/<name>.csv``."""
    print(title)
    print(machine_header(threads) + "\n")
    print(markdown_table(rows, columns))
    write_csv(name, rows, columns, threads=threads, title=title)


@contextmanager
def figure(name: str, size: tuple[float, float] = (6, 4)) -> Iterator:
    """A matplotlib Axes (headless backend), saved to ``results/<name>.png`` on exit."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=size)
    try:
        yield ax
        fig.tight_layout()
        RESULTS.mkdir(parents=True, exist_ok=True)
        fig.savefig(RESULTS / f"{name}.png", dpi=120)
    finally:
        plt.close(fig)


def hnswlib_bytes(n: int, dim: int, M: int) -> float:
    """hnswlib's bytes (float32 vectors): per vector its level-0 block (2M links and their
    count, the vector, the label), its link-list pointer, level, lock (a 40-byte mutex) and
    label-map entry (about 40 bytes), and the upper levels' M links for the 1 / (M - 1) levels
    a node has on average above 0; the 65,536 label locks. Checked against the resident
    memory of a build (100k x 128, M 32: 902 bytes a vector by this, 913 measured; M 16: 775
    and 786)."""
    per_vector = (2 * M * 4 + 4) + dim * 4 + 8 + 8 + 4 + 40 + 40 + (M * 4 + 4) / (M - 1)
    return n * per_vector + 65_536 * 40
