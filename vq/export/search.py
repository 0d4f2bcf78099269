"""Search graphs: an index's own static search (``index.searcher(...)``, written once next to
each index kind, the function its torch path runs) with the specs and metadata of an exported
model: queries float32 [B, dim] → distances float32 [B, k], ids int64 [B, k].

Distances follow :meth:`vq.index.Index.search` (squared L2 ascending or inner products
descending; missing results are id -1 with +inf, -inf for "ip"), and equal the index's torch
path (``vq._cpu.torch_only()``) up to float32 rounding. See :mod:`vq.index.static` for how the
searches stay static (inverted lists padded to a fixed ``capacity``, +inf on padding).
"""

from __future__ import annotations

import json

import torch

from vq._checks import check_positive
from vq.export.base import ExportModule, TensorSpec
from vq.index.base import Index


def search_module(
    index: Index,
    k: int,
    nprobe: int | None = None,
    k_factor: int | None = None,
    capacity: int | None = None,
    code_dtype: torch.dtype | None = None,
) -> ExportModule:
    """The search graph of a trained, filled index (wrappers recursively).

    Args:
        index: FlatIndex, PQIndex, IVFFlat, IVFPQ, or PreTransform / Refine around them.
        k: neighbours per query.
        nprobe: lists probed (IVF; default the index's ``nprobe``, at most nlist).
        k_factor: candidates per result for Refine (default the index's ``k_factor``).
        capacity: slots per padded inverted list (IVF; default the longest list).
        code_dtype: integer dtype of the stored codes inside the graph (PQ, IVFPQ; default
            as the index stores them).
    """
    options = {"nprobe": nprobe, "k_factor": k_factor, "capacity": capacity}
    options = {name: check_positive(v, name) for name, v in options.items() if v is not None}
    if code_dtype is not None:
        options["code_dtype"] = code_dtype
    if not hasattr(index, "searcher"):
        raise TypeError(
            f"no search graph for {type(index).__name__}; supported: FlatIndex, PQIndex, "
            "IVFFlat, IVFPQ, and PreTransform / Refine around them"
        )
    graph = index.searcher(check_positive(k, "k"), **options)
    queries = TensorSpec("queries", torch.float32, (index.dim,))
    distances = TensorSpec("distances", torch.float32, (graph.k,))
    ids = TensorSpec("ids", torch.int64, (graph.k,))
    return ExportModule(graph, (queries,), (distances, ids), _metadata(index, graph))


def _metadata(index: Index, graph: torch.nn.Module) -> dict[str, str]:
    """The index's facts, and the options its graph (or a wrapped one) baked in."""
    metadata = {
        "dim": str(index.dim),
        "k": str(graph.k),
        "metric": index.metric,
        "ntotal": str(index.ntotal),
        "index": json.dumps({"class": type(index).__name__, **index.config()}),
    }
    for module in graph.modules():
        if hasattr(module, "capacity"):  # an inverted-file search
            metadata.update(
                nprobe=str(module.nprobe),
                nlist=str(module.nlist),
                capacity=str(module.capacity),
                padding_overhead=f"{module.nlist * module.capacity / max(1, module.ntotal):.3f}",
            )
        for name in ("code_dtype", "by_residual", "k_factor"):
            if hasattr(module, name):
                metadata[name] = str(getattr(module, name)).removeprefix("torch.")
    return metadata
