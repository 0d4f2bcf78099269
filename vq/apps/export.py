"""``vq export``: a saved index (vq or faiss file) to ONNX, or the audit of ONNX models
(the options: :func:`vq.apps.arguments.export`).

    vq export my.index -o search.onnx --batch-size 64 -k 10 --nprobe 16  [--check queries.fvecs]
    vq export faiss.index -o search.onnx --batch-size 1                  (a faiss.write_index file)
    vq export --audit search.onnx                                        (exit 1 unless static)
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

import vq
from vq._cpu import torch_only
from vq.apps.arguments import parse
from vq.apps.common import (
    InputError,
    check_k,
    check_writable,
    open_input,
    read_vectors,
    run_command,
    writing,
)
from vq.export import OnnxRunner, audit, to_onnx


def main(argv: list[str] | None = None, prog: str = "vq export") -> int:
    """``vq export`` with the command line ``argv``; returns the exit status."""
    return run_command(run, parse("export", argv, prog))


def run(args: argparse.Namespace) -> int:
    """Export (or with ``args.audit``, audit), given the parsed arguments."""
    if not args.audit:
        check_writable(args.output, "-o")
    try:
        return _audit(args.index) if args.audit else _export(args)
    except ImportError as err:  # an optional package: one line, as other input errors
        raise InputError(str(err)) from err


def _audit(paths: list[Path]) -> int:
    clean = True
    for path in paths:
        report = audit(path)
        print(f"{path}:\n{report}\n")
        clean = clean and report.clean
    return 0 if clean else 1


def load_any_index(path: Path):
    """A vq index from a vq file (``index.save``) or a faiss file (``faiss.write_index``)."""
    try:
        return vq.load_index(path)
    except ValueError as vq_error:
        if "not a vq index" not in str(vq_error):
            raise
        try:
            import faiss
        except ImportError:
            raise ValueError(
                f"{path}: not a vq index file; install faiss-cpu to read faiss index files"
            ) from vq_error
        try:
            findex = faiss.read_index(str(path))
        except RuntimeError as faiss_error:
            raise ValueError(
                f"{path}: neither a vq index nor a faiss index file ({faiss_error})"
            ) from vq_error
        return vq.index.from_faiss(findex)


def _export(args) -> int:
    index = load_any_index(args.index[0])
    if args.k is not None:  # before a graph of [batch, k] outputs is built
        check_k(args.k, index.ntotal, args.batch_size)
    if args.check is not None:  # its queries checked before the export, read after
        queries = open_input(args.check, "test")
        if queries.shape[1] != index.dim:
            raise InputError(
                f"--check {args.check}: vectors of dim {queries.shape[1]}, the index's are "
                f"of dim {index.dim}"
            )
    start = time.perf_counter()
    path = writing(
        args.output,
        lambda: to_onnx(
            index,
            args.output,
            batch_size=args.batch_size,
            k=args.k,
            nprobe=args.nprobe,
            k_factor=args.k_factor,
            capacity=args.capacity,
            code_dtype=args.code_dtype,
            dynamic_batch=args.dynamic_batch,
            opset=args.opset,
            filtered=args.filtered,
        ),
    )
    seconds = time.perf_counter() - start
    report = audit(path)
    size = sum(f.stat().st_size for f in path.parent.glob(path.name + "*")) / 2**20
    print(
        f"wrote {path} ({size:.1f} MiB) in {seconds:.1f} s: {type(index).__name__}, "
        f"{index.ntotal} vectors; {', '.join(report.inputs)} -> {', '.join(report.outputs)}"
    )
    print("audit: " + ("static" if report.clean else "NOT static\n" + str(report)))
    if args.check is not None:
        print(_check(index, path, args.check))
    return 0


def _check(index, path: Path, queries_path: Path) -> str:
    """ONNX Runtime against the index's torch path on the given queries, in one line."""
    runner = OnnxRunner(path)
    queries = read_vectors(queries_path, "test")
    meta = runner.metadata
    k, nprobe = int(meta["k"]), meta.get("nprobe")
    params = {} if nprobe is None else {"nprobe": int(nprobe)}
    if "k_factor" in meta:
        params["k_factor"] = int(meta["k_factor"])
    if runner.id_space is not None:  # a filtered search: check it with every other id allowed
        params["allowed"] = np.arange(runner.id_space) % 2 == 0
    start = time.perf_counter()
    D, I = runner(queries, **({"allowed": params["allowed"]} if "allowed" in params else {}))
    seconds = time.perf_counter() - start
    with torch_only():
        D_ref, I_ref = index.search(queries, k, **params)
    same_rows = float((I == I_ref).all(axis=1).mean())
    finite = np.isfinite(D_ref)
    diff = float(np.abs(D[finite] - D_ref[finite]).max()) if finite.any() else 0.0
    untied = 0  # differing ids whose reference distance is tied with no other result
    for r, c in zip(*np.nonzero(I != I_ref), strict=True):
        close = np.isclose(D_ref[r], D_ref[r, c], rtol=1e-4, atol=1e-4)
        untied += int(close.sum() == 1 and not close[-1])
    return (
        f"check: {len(queries)} queries, ONNX Runtime {len(queries) / seconds:.0f} QPS; rows with "
        f"identical ids {same_rows:.4f}, differences not explained by ties {untied}, "
        f"max |distance difference| {diff:.3g}"
    )
