"""Searching a memory-mapped index: peak RSS of load + search, ``vq.load_index(path, mmap=True)``
against the in-memory load, and what verifying the checksum costs.

    python -m bench.mmap [--n 1000000] [--dim 128] [--index IVF1024,PQ16] [--nprobe 16]
                         [--cache warm,cold]

Builds the index once and saves it; then each mode loads the file and searches ``--nq`` queries
in a fresh Python process, so that its peak RSS is its own. The child first searches a small
throwaway index of the same kind, loaded the same way (numba loads its compiled kernels and
LLVM once per process, a cost of the process rather than of the index), then reads its RSS,
loads, reads its RSS again, searches, and reads the peak (VmHWM from /proc, not
``ru_maxrss``: on Linux a child keeps the ``ru_maxrss`` of the process that forked it across
exec, see bench/memory.py) and
the anonymous memory (RssAnon) held after the search. Each mode runs twice: with the file's
pages in the page cache as the parent wrote them ("warm"), and dropped from it first
(``posix_fadvise(DONTNEED)``, "cold": a file larger than memory, or not read lately). A mapped
file's pages that a process touches count in its RSS, and from a warm cache the kernel maps
whole large folios around each fault, so an IVF search reads its probed lists with ``pread``
instead (:mod:`vq.index.core.mapped`: the bytes copied into memory freed after the call, nothing
mapped). IVFPQ's precomputed table is filled for the probed lists only (anonymous memory).
Two baselines: the in-memory load's peak (its loader holds the file's pages and the copy at
once) and its RSS once loaded (the copy alone). Prints a table (load
s, search s, RSS after load, peak RSS increase and its ratio to the in-memory load, anonymous
memory, identical results); writes bench/results/mmap.csv.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from bench.common import report, rss_kib, run_fresh, set_threads

MODES = {"in memory": {}, "mmap": {"mmap": True}, "mmap + verify": {"mmap": True, "verify": True}}


def child(mode: str, cache: str, path: str, small: str, queries: str, out: str, nprobe: int):
    """Run in a fresh process: warm up, load ``path`` as ``mode`` says (``cache`` "cold":
    the file's pages dropped from the page cache first), search, report JSON."""
    import numpy as np

    import vq
    from vq.index.core import fileformat

    set_threads(1)
    q = np.load(queries)
    small_bytes = fileformat.SMALL_BYTES
    if "mmap" in MODES[mode]:  # the small index's tensors mapped too, whatever their size
        fileformat.SMALL_BYTES = 0
    warm = vq.load_index(small, **MODES[mode])
    fileformat.SMALL_BYTES = small_bytes
    warm.search(q, 10, nprobe=nprobe)  # the kernels of this search loaded, its tables built
    warm.search(q[:1], 10, nprobe=nprobe)
    del warm
    if cache == "cold":  # what a file larger than memory, or not read lately, looks like
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    before, anon = rss_kib(), rss_kib("RssAnon")
    t0 = time.perf_counter()
    index = vq.load_index(path, **MODES[mode])
    t1 = time.perf_counter()
    loaded = rss_kib()
    _, ids = index.search(q, 10, nprobe=nprobe)
    t2 = time.perf_counter()
    np.save(out, ids)
    result = {"before": before, "peak": rss_kib("VmHWM"), "load": t1 - t0, "search": t2 - t1}
    result["anon"], result["loaded"] = rss_kib("RssAnon") - anon, loaded - before
    print(json.dumps(result))


def _run(*args) -> dict:
    return run_fresh("bench.mmap", "child", *args)


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", type=int, default=1_000_000, help="vectors stored")
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--index", default="IVF1024,PQ16", help="vq.index_factory description")
    p.add_argument("--nq", type=int, default=10, help="queries searched")
    p.add_argument("--nprobe", type=int, default=16)
    p.add_argument("--ntrain", type=int, default=100_000)
    p.add_argument(
        "--cache",
        default="warm,cold",
        help="page cache states measured: "
        "warm (the file just written), cold (its pages dropped before the load)",
    )
    args = p.parse_args(argv)

    import numpy as np

    import vq
    from vq.datasets import anisotropic_vectors

    set_threads(2)
    x = anisotropic_vectors(args.n + args.nq, args.dim, decay=0.95, seed=0)
    q, x = x[args.n :], x[: args.n]
    index = vq.index_factory(args.dim, args.index)
    index.train(x[: min(args.n, args.ntrain)])
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        small = vq.index_factory(args.dim, args.index)
        small.load_state_dict(index.state_dict())  # trained, empty
        small.add(x[:2000])
        small.save(tmp / "small.vq")
        index.add(x)
        index.save(tmp / "index.vq")
        del index, x
        np.save(tmp / "q.npy", q)
        results = {}
        for cache in args.cache.split(","):
            for mode in MODES:
                out = tmp / f"ids-{len(results)}.npy"
                r = _run(mode, cache, str(tmp / "index.vq"), str(tmp / "small.vq"),
                         str(tmp / "q.npy"), str(out), args.nprobe)  # fmt: skip
                r["ids"] = np.load(out)
                results[mode, cache] = r
        size = (tmp / "index.vq").stat().st_size
    for (mode, cache), r in results.items():
        base = results["in memory", cache]
        increase = (r["peak"] - r["before"]) / 1024
        rows.append(
            {
                "index": args.index,
                "n": args.n,
                "page cache": cache,
                "mode": mode,
                "file MiB": size / 2**20,
                "load s": r["load"],
                "search s": r["search"],
                "RSS increase after load MiB": r["loaded"] / 1024,
                "peak RSS increase MiB": increase,
                "increase / in-memory": increase
                / max(1e-9, (base["peak"] - base["before"]) / 1024),
                "increase / in-memory loaded": increase / max(1e-9, base["loaded"] / 1024),
                "anonymous increase MiB": r["anon"] / 1024,
                "anonymous / in-memory": r["anon"] / max(1, base["anon"]),
                "same ids": bool(np.array_equal(r["ids"], results["in memory", "warm"]["ids"])),
            }
        )
    title = (
        f"## Load and search {args.nq} queries (nprobe {args.nprobe}) of a saved {args.index}, "
        f"n={args.n}: peak RSS increase over the RSS before loading (fresh process per mode)"
    )
    report("mmap", title, 1, rows, list(rows[0]))
    return rows


if __name__ == "__main__":
    main()
