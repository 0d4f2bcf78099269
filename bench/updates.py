"""``remove_ids`` against faiss: the time to remove m ids from a filled IVF index.

    python -m bench.updates [--n 1000000] [--dim 128] [--index IVF1024,PQ16 IVF1024,PQ32x4fs]
                            [--remove 10,1000,100000] [--rounds 3]

vq builds each index (trained on ``--ntrain`` vectors, then n added) and faiss gets the same
lists through ``to_faiss()``. Each system first removes one id (kernels loaded, and vq's
buffers its own: an index loaded from a file copies them on its first write, which the row
"first remove after load" times on a freshly loaded copy). Then, for each m, both remove the
same m random stored ids, alternately, ``--rounds`` times (the median is kept; each round
new ids), and search 10 queries right after (the first search after a change: vq's fast-scan
indexes repack the lists the removal changed, those that lost rows and those it rotated, and
copy the others' blocks; the first row's search times are those of the index before any
removal). vq's removal copies, per touched list, a kept row into each removed row's place, and
moves each later list down by R rows by copying min(R, its size) rows (R removed before it):
few rows for a few ids, up to about every row once R passes the list sizes (1,000 ids over
1,024 lists of ~1,000 rows move about half the rows). faiss keeps each list in its own array
and moves none. "n/a" where faiss's ``remove_ids`` raises (fast-scan kinds in some faiss
versions).
Prints a table; writes bench/results/updates.csv.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from bench.common import report, set_threads


def _timed(call) -> float:
    t0 = time.perf_counter()
    call()
    return time.perf_counter() - t0


def _faiss_remove(index, ids) -> float | None:
    import numpy as np

    try:
        return _timed(lambda: index.remove_ids(np.ascontiguousarray(ids, dtype=np.int64)))
    except RuntimeError:  # (IndexIVFPQFastScan: not implemented)
        return None


def _first_after_load(index, ids) -> float:
    import vq

    with tempfile.TemporaryDirectory() as tmp:
        index.save(Path(tmp) / "index.vq")
        loaded = vq.load_index(Path(tmp) / "index.vq")
        return _timed(lambda: loaded.remove_ids(ids))


def bench_index(description: str, x, q, args) -> list[dict]:
    import numpy as np

    import vq

    rng = np.random.default_rng(0)
    index = vq.index_factory(x.shape[1], description)
    index.train(x[: min(len(x), args.ntrain)])
    index.add(x)
    other = index.to_faiss()
    alive = np.arange(len(x))
    first = rng.choice(alive, 1, replace=False)
    index.remove_ids(first)
    faiss_ok = _faiss_remove(other, first) is not None
    alive = np.setdiff1d(alive, first)
    index.search(q, 10), other.search(q, 10)  # (tables built, kernels loaded)
    unchanged = {
        "vq": statistics.median(_timed(lambda: index.search(q, 10)) for _ in range(3)),
        "faiss": statistics.median(_timed(lambda: other.search(q, 10)) for _ in range(3)),
    }
    rows = [
        {
            "index": description,
            "n": len(x),
            "removed": args.sizes[0],
            "case": "first remove after load",
            "vq ms": 1e3 * _first_after_load(index, rng.choice(alive, args.sizes[0], False)),
            "vq next search ms": 1e3 * unchanged["vq"],
            "faiss next search ms": 1e3 * unchanged["faiss"],
        }
    ]
    for m in args.sizes:
        times = {"vq": [], "faiss": [], "vq search": [], "faiss search": []}
        for _ in range(args.rounds if m < len(alive) // (2 * args.rounds) else 1):
            gone = rng.choice(alive, m, replace=False)
            alive = np.setdiff1d(alive, gone)
            times["vq"].append(_timed(lambda g=gone: index.remove_ids(g)))
            times["vq search"].append(_timed(lambda: index.search(q, 10)))
            if faiss_ok:
                times["faiss"].append(_faiss_remove(other, gone))
                times["faiss search"].append(_timed(lambda: other.search(q, 10)))
        med = {k: 1e3 * statistics.median(v) if v else None for k, v in times.items()}
        rows.append(
            {
                "index": description,
                "n": len(x),
                "removed": m,
                "case": "in place",
                "vq ms": med["vq"],
                "faiss ms": med["faiss"] if faiss_ok else "n/a",
                "vq / faiss": med["vq"] / med["faiss"] if faiss_ok else "",
                "vq next search ms": med["vq search"],
                "faiss next search ms": med["faiss search"] if faiss_ok else "n/a",
            }
        )
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", type=int, default=1_000_000, help="vectors stored")
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--index", nargs="+", default=["IVF1024,PQ16", "IVF1024,PQ32x4fs"])
    p.add_argument("--remove", default="10,1000,100000", help="ids removed per call")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--ntrain", type=int, default=100_000)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    args.sizes = [int(s) for s in args.remove.split(",")]

    from vq.datasets import anisotropic_vectors

    set_threads(args.threads)
    x = anisotropic_vectors(args.n + 10, args.dim, decay=0.95, seed=0)
    q, x = x[args.n :], x[: args.n]
    rows = [row for description in args.index for row in bench_index(description, x, q, args)]
    columns = ["index", "n", "removed", "case", "vq ms", "faiss ms", "vq / faiss",
               "vq next search ms", "faiss next search ms"]  # fmt: skip
    for row in rows:
        for c in columns:
            row.setdefault(c, "")
    title = f"## remove_ids: ms per call, vq and faiss on the same lists ({args.threads} threads)"
    report("updates", title, args.threads, rows, columns)
    return rows


if __name__ == "__main__":
    main()
