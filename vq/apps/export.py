"""``vq export``: a saved index (vq or faiss file) to ONNX, or the audit of ONNX models.

vq export my.index -o search.onnx --batch-size 64 -k 10 --nprobe 16   [--check queries.fvecs]
vq export faiss.index -o search.onnx --batch-size 1                   (a faiss.write_index file)
vq export --audit search.onnx                                         (exit 1 unless static)
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

import vq
from vq._cpu import torch_only
from vq.apps.common import read_vectors
from vq.export import OnnxRunner, audit, to_onnx


def main(argv: list[str], prog: str = "vq export") -> int:
    p = argparse.ArgumentParser(
        prog=prog,
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "index", type=Path, nargs="+", help="a saved index (or ONNX models with --audit)"
    )
    p.add_argument("-o", "--output", type=Path, help="the .onnx file to write")
    p.add_argument("--audit", action="store_true", help="audit ONNX models instead of exporting")
    p.add_argument("--batch-size", type=int, default=1, help="queries per call (default 1)")
    p.add_argument("-k", type=int, default=None, help="neighbours per query (default: saved k)")
    p.add_argument("--nprobe", type=int, default=None, help="IVF lists probed (default: saved)")
    p.add_argument("--k-factor", type=int, default=None, help="re-ranking factor (default: saved)")
    p.add_argument(
        "--capacity", type=int, default=None, help="slots per padded list (default: longest list)"
    )
    p.add_argument(
        "--code-dtype",
        choices=["uint8", "int16", "int32", "int64"],
        default=None,
        help="dtype of the code tables in the graph (int32 for TensorRT; default: as stored)",
    )
    p.add_argument("--dynamic-batch", action="store_true", help="symbolic batch axis")
    p.add_argument(
        "--filtered",
        action="store_true",
        help="a second input 'allowed' (bool [largest id + 1]): the ids a search may return",
    )
    p.add_argument("--opset", type=int, default=None, help="ONNX opset (default 20)")
    p.add_argument(
        "--check",
        type=Path,
        default=None,
        metavar="QUERIES",
        help="compare ONNX Runtime with the torch path on these queries (.fvecs/.bvecs/.hdf5)",
    )
    args = p.parse_args(argv)
    if not args.audit and (len(args.index) != 1 or args.output is None):
        p.error("give one index file and -o OUTPUT.onnx (or --audit MODEL.onnx ...)")
    try:
        return _audit(args.index) if args.audit else _export(args)
    except ImportError as err:  # an optional package: one line, as other input errors
        raise RuntimeError(str(err)) from err


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
    start = time.perf_counter()
    path = to_onnx(
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
