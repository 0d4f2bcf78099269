"""The main job: vq against faiss on NSynth audio embeddings.

    vq nsynth                      # synthetic NSynth-format notes (built once)
    vq nsynth --nsynth-root PATH   # a real NSynth download (train/ and test/)

(or ``python -m vq.apps.nsynth``; the options: :func:`vq.apps.arguments.nsynth`).

Steps: build (or reuse) an NSynth-format data set, embed every note with torchaudio (log-mel
statistics), then build vq's and faiss's indexes with the same parameters — Flat, PQ, IVFPQ,
OPQ+IVFPQ, each library training its own — and print recall@1/10/100, QPS, training time and
bytes per vector side by side. The database is the train split, the queries are the test split
(instruments never seen in training). A second table runs the quantizer validation (same
codebooks ⇒ same codes; trained independently ⇒ same quality) on the same embeddings.

Exits non-zero if a check fails: vq's recall@10 more than 0.01 below faiss's for an index,
or any validation check.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import vq
from vq.apps import validate
from vq.apps.arguments import parse
from vq.apps.common import faiss_available, run_command, set_threads
from vq.datasets import NSynth, embed_nsynth, ground_truth, recall_at, synthesize_nsynth

#: how far below faiss's recall@10 vq may fall (one training seed; the tests average three)
RECALL_TOLERANCE = 0.01


@dataclass
class Row:
    index: str
    system: str
    recall: tuple[float, float, float]
    qps: float
    train_s: float
    bytes_per_vector: float


def default_data_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "vq"


def synthetic_dataset(data_dir: Path, instruments: int, seed: int, verbose: bool):
    """The train and test splits of a synthetic NSynth-format set, generated on first use."""
    root = data_dir / f"nsynth-synthetic-i{instruments}-s{seed}"
    for split, n in (("train", instruments), ("test", max(1, instruments // 10))):
        if not (root / split / "examples.json").exists():
            synthesize_nsynth(root, n_instruments=n, split=split, seed=seed, verbose=verbose)
    return NSynth(root, split="train"), NSynth(root, split="test")


class Notes:
    """Some notes of a dataset (what ``embed_nsynth`` needs: items, ``note_strs``, ``root``)."""

    def __init__(self, dataset, indices: np.ndarray):
        self.dataset, self.indices = dataset, [int(i) for i in indices]
        self.note_strs = [dataset.note_strs[i] for i in self.indices]
        self.root = getattr(dataset, "root", None)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int):
        return self.dataset[self.indices[i]]


def recalls(found: np.ndarray, truth: np.ndarray) -> tuple[float, float, float]:
    """recall@1, @10, @100 (see :func:`vq.datasets.recall_at`)."""
    return tuple(recall_at(found, truth, r) for r in (1, 10, 100))


def _best_time(fn, min_seconds: float = 0.1, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        calls, start = 0, time.perf_counter()
        while True:
            fn()
            calls += 1
            if time.perf_counter() - start >= min_seconds:
                break
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def compare_indexes(
    xb: np.ndarray, xq: np.ndarray, truth: np.ndarray, descriptions: list[str], nprobe: int
) -> list[Row]:
    """vq and faiss, each trained on ``xb`` with the same factory string, searched with
    ``xq`` for 100 neighbours."""
    import faiss  # optional: imported where the comparison needs it

    from vq.kernels.jit import background

    rows = []
    for desc in descriptions:
        for system in ("vq", "faiss"):
            if system == "vq":
                index = vq.index_factory(xb.shape[1], desc)
            else:  # no polysemous training: it only permutes codes, and costs seconds
                index = faiss.index_factory(xb.shape[1], _faiss_desc(desc))
            start = time.perf_counter()
            index.train(xb)
            train_s = time.perf_counter() - start
            index.add(xb)
            if "IVF" in desc:
                if system == "vq":
                    index.nprobe = nprobe
                else:
                    faiss.extract_index_ivf(index).nprobe = nprobe
            # vq's kernels compile here when they must: the times are of the kernels, not of
            # the torch path a first search answers on while they compile in the background
            with background.waiting():
                _, found = index.search(xq, 100)
                seconds = _best_time(lambda index=index: index.search(xq, 100))
            rows.append(
                Row(
                    desc,
                    system,
                    recalls(found, truth),
                    len(xq) / seconds,
                    train_s,
                    _file_bytes(index, system) / len(xb),
                )
            )
    return rows


def _faiss_desc(desc: str) -> str:
    return re.sub(r"(^|,)(PQ\d+(?:x\d+)?)(?=,|$)", r"\1\2np", desc)


def _file_bytes(index, system: str) -> int:
    if system == "faiss":
        import faiss

        return int(faiss.serialize_index(index).nbytes)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "index.vq"
        index.save(path)
        return path.stat().st_size


def print_rows(rows: list[Row]) -> list[str]:
    """Print the comparison table; returns the indexes that fail the recall check."""
    columns = ["index", "system", "recall@1", "recall@10", "recall@100", "QPS", "train s"]
    print("| " + " | ".join([*columns, "bytes/vector", "result"]) + " |")
    print("|---|---|---|---|---|---|---|---|---|")
    failed = []
    by_key = {(r.index, r.system): r for r in rows}
    for r in rows:
        result = ""
        if r.system == "vq":
            ref = by_key[(r.index, "faiss")]
            ok = r.recall[1] >= ref.recall[1] - RECALL_TOLERANCE
            result = "ok" if ok else "FAIL"
            if not ok:
                failed.append(r.index)
        print(
            f"| {r.index} | {r.system} | {r.recall[0]:.4f} | {r.recall[1]:.4f} | {r.recall[2]:.4f} "
            f"| {r.qps:.0f} | {r.train_s:.2f} | {r.bytes_per_vector:.1f} | {result} |"
        )
    return failed


@dataclass(frozen=True)
class IndexParameters:
    """What the comparison builds for ``n`` database vectors of dimension ``dim``: ``M``
    sub-quantizers of ``nbits`` bits (``pq``, e.g. "PQ16x5") and ``nlist`` IVF lists."""

    M: int
    nbits: int
    pq: str
    nlist: int

    @classmethod
    def for_size(cls, n: int, dim: int) -> IndexParameters:
        M = dim // 8
        # at least ~10 training vectors per centroid: 8-bit codes from about 2,500 notes up
        nbits = int(min(8, max(4, np.floor(np.log2(n / 10)))))
        pq = f"PQ{M}" + ("" if nbits == 8 else f"x{nbits}")
        nlist = int(min(1024, max(8, 2 ** round(np.log2(max(1, n / 48))))))
        return cls(M, nbits, pq, nlist)

    def descriptions(self) -> list[str]:
        """The index descriptions compared, from exact search to OPQ+IVFPQ."""
        ivf = f"IVF{self.nlist},{self.pq}"
        return ["Flat", self.pq, ivf, f"OPQ{self.M},{ivf}"]


def load_splits(args: argparse.Namespace, data_dir: Path) -> tuple[NSynth, NSynth, str]:
    """The train and test splits (a real download with ``--nsynth-root``, else the synthetic
    set) and a phrase naming them."""
    if args.nsynth_root is not None:
        train = NSynth(args.nsynth_root, split="train")
        test = NSynth(args.nsynth_root, split="test")
        return train, test, f"NSynth at {args.nsynth_root}"
    train, test = synthetic_dataset(data_dir, args.instruments, args.seed, not args.quiet)
    source = (
        f"synthetic NSynth-format notes ({args.instruments} train instruments, seed {args.seed})"
    )
    return train, test, source


def sample_notes(train, max_notes: int | None, seed: int):
    """At most ``max_notes`` (>= 1) of the train notes, drawn before embedding (only these are
    read)."""
    if max_notes is None or max_notes >= len(train):
        return train
    pick = np.random.default_rng(seed).choice(len(train), max_notes, replace=False)
    return Notes(train, np.sort(pick))


def embed_splits(train, test, method: str, data_dir: Path, verbose: bool):
    """float32 [n, dim] database and [nq, dim] query embeddings (cached under ``data_dir``)."""
    cache = data_dir / "embeddings"
    xb = embed_nsynth(train, method=method, cache_dir=cache, verbose=verbose)
    xq = embed_nsynth(test, method=method, cache_dir=cache, verbose=verbose)
    return xb, xq


def main(argv: list[str] | None = None, prog: str = "vq nsynth") -> int:
    """The job with the command line ``argv`` (see :func:`vq.apps.arguments.nsynth`); returns
    the exit status: 0, 1 if a check fails, 2 for bad input."""
    return run_command(run, parse("nsynth", argv, prog))


def run(args: argparse.Namespace) -> int:
    """The job, given its parsed arguments."""
    if not faiss_available():
        return 2
    set_threads(args.threads, faiss=True)
    data_dir = args.data_dir or default_data_dir()
    train, test, source = load_splits(args, data_dir)
    train = sample_notes(train, args.max_notes, args.seed)
    xb, xq = embed_splits(train, test, args.method, data_dir, not args.quiet)
    params = IndexParameters.for_size(len(xb), xb.shape[1])
    _, truth = ground_truth(xb, xq, 100)
    print(
        f"# vq against faiss on {source}: {len(xb)} database notes, {len(xq)} queries, "
        f"{args.method} embeddings of dim {xb.shape[1]}, {args.threads} threads\n"
    )
    rows = compare_indexes(xb, xq, truth, params.descriptions(), args.nprobe)
    failed = print_rows(rows)
    print(
        f"\nrecall@r: overlap of the r returned with the true r nearest (exact search); nprobe "
        f"{args.nprobe}; QPS for {len(xq)} queries of k=100; bytes/vector: saved file size / n; "
        f"result: vq's recall@10 within {RECALL_TOLERANCE} of faiss's."
    )
    if not args.skip_validation:
        print("\n## Validation against faiss on the same embeddings\n")
        checks = validate.checks_on(xb, xb, xq, args.threads, params.nbits)
        failed += validate.print_checks(checks)
    print(f"\n{'all checks passed' if not failed else 'FAILED: ' + ', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
