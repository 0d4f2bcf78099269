"""Memory of adding n vectors, vq against faiss: peak RSS and saved bytes per vector.

    python -m bench.memory [--n 1000000] [--dim 128] [--index IVF1024,PQ16 PQ16]

Each library trains its index here on the same sample and saves it empty; then every
(index, system) adds the n vectors in a fresh Python process, so its peak RSS (VmHWM) is its
own. The child reads its RSS after loading the data and the empty index (imports included), adds,
and reads the peak: "RSS increase" is peak - RSS after loading, what adding cost; "resident
increase" is the RSS still held after the add (the filled index). File bytes/vector is the size of
the saved full index (vq ``index.save``, ``faiss.write_index``) over n. Prints a table; writes
bench/results/memory.csv.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from bench.common import report, rss_kib, run_fresh, set_threads


def child(system: str, data: str, empty: str, out: str, threads: int) -> None:
    """Run in a fresh process: load data and the empty trained index, add, report RSS as JSON."""
    import numpy as np

    set_threads(threads)
    x = np.load(data)
    if system == "vq":
        import vq

        index = vq.load_index(empty)
    else:
        import faiss

        index = faiss.read_index(empty)
    # warm up on a throwaway copy: numba loads its compiled kernels (and LLVM) on first use,
    # a one-off cost of the process, not of the index
    warm = vq.load_index(empty) if system == "vq" else faiss.read_index(empty)
    warm.add(x[:1000])
    del warm
    loaded_rss = rss_kib()
    loaded_peak = rss_kib("VmHWM")
    index.add(x)
    peak = rss_kib("VmHWM")
    after_rss = rss_kib()
    if system == "vq":
        index.save(out)
    else:
        faiss.write_index(index, out)
    result = {
        "loaded_rss": loaded_rss,
        "loaded_peak": loaded_peak,
        "peak": peak,
        "after_rss": after_rss,
        "file": os.path.getsize(out),
    }
    print(json.dumps(result))


def run_child(system: str, data: Path, empty: Path, out: Path, threads: int) -> dict:
    return run_fresh("bench.memory", "child", system, str(data), str(empty), str(out), threads)


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", type=int, default=1_000_000, help="vectors added")
    p.add_argument("--dim", type=int, default=128, help="vector dimension")
    p.add_argument("--index", nargs="+", default=["IVF1024,PQ16", "PQ16"], help="index types")
    p.add_argument("--ntrain", type=int, default=100_000, help="training vectors (at most n)")
    p.add_argument("--threads", type=int, default=2, help="threads for every system")
    args = p.parse_args(argv)

    import faiss
    import numpy as np

    import vq
    from bench.ann import faiss_description
    from vq.datasets import anisotropic_vectors

    set_threads(args.threads)
    x = anisotropic_vectors(args.n, args.dim, decay=0.95, seed=0)
    train = x[: min(args.n, args.ntrain)]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        data = tmp / "x.npy"
        np.save(data, x)
        del x
        for desc in args.index:
            own = vq.index_factory(args.dim, desc)
            own.train(train)
            own.save(tmp / "empty.vq")
            ref = faiss.index_factory(args.dim, faiss_description(desc))
            ref.train(train)
            faiss.write_index(ref, str(tmp / "empty.faiss"))
            del own, ref
            result = {
                system: run_child(
                    system, data, tmp / f"empty.{system}", tmp / f"full.{system}", args.threads
                )
                for system in ("vq", "faiss")
            }
            for system, r in result.items():
                increase = (r["peak"] - r["loaded_rss"]) / 1024
                other = result["faiss"]
                rows.append(
                    {
                        "index": desc,
                        "system": system,
                        "n": args.n,
                        "peak RSS MiB": r["peak"] / 1024,
                        "RSS after load MiB": r["loaded_rss"] / 1024,
                        "RSS increase MiB": increase,
                        "resident increase MiB": (r["after_rss"] - r["loaded_rss"]) / 1024,
                        "file bytes/vector": r["file"] / args.n,
                        "increase vq / faiss": (
                            (result["vq"]["peak"] - result["vq"]["loaded_rss"])
                            / max(1, other["peak"] - other["loaded_rss"])
                        ),
                        "file vq / faiss": result["vq"]["file"] / other["file"],
                    }
                )
    title = (
        f"## Memory of adding n={args.n} vectors of dim {args.dim} (fresh process per build; "
        "increase = peak RSS - RSS after loading data and the empty index)"
    )
    report("memory", title, args.threads, rows, list(rows[0]))
    return rows


if __name__ == "__main__":
    main()
