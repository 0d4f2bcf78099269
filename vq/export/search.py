"""Search graphs: an index's own static search (``index.searcher(...)``, written once next to
each index kind, the function its torch path runs) with the specs and metadata of an exported
model: queries float32 [B, dim] → distances float32 [B, k], ids int64 [B, k]; a filtered search
(``filtered=True``) takes a second input, ``allowed`` bool [id_space], one mask over the ids
for the whole call (the graph gathers it onto the stored rows, which then never win).

Distances follow :meth:`vq.index.Index.search` (squared L2 ascending or inner products
descending; missing results are id -1 with +inf, -inf for "ip"), and equal the index's torch
path (``vq._cpu.torch_only()``) up to float32 rounding. See :mod:`vq.index.core.searchers` for how
the searches stay static (inverted lists padded to a fixed ``capacity``, +inf on padding).
"""

from __future__ import annotations

import json

import torch
from torch import nn

from vq._checks import check_positive
from vq.export.base import ExportModule, TensorSpec
from vq.index.core.base import Index
from vq.index.core.registry import kinds

#: the largest id space a filtered search graph takes as a mask (bool, one byte per id)
MAX_ID_SPACE = 1 << 31


def search_module(
    index: Index,
    k: int,
    nprobe: int | None = None,
    k_factor: int | None = None,
    capacity: int | None = None,
    code_dtype: torch.dtype | None = None,
    filtered: bool = False,
) -> ExportModule:
    """The search graph of a trained, filled index (wrappers recursively).

    Args:
        index: an index whose kind has a static-shape search (``index.has_searcher()``:
            every registered kind whose ``exports`` is true, and PreTransform / Refine around
            them).
        k: neighbours per query.
        nprobe: lists probed (IVF; default the index's ``nprobe``, at most nlist).
        k_factor: candidates per result for Refine (default the index's ``k_factor``).
        capacity: slots per padded inverted list (IVF; default the longest list).
        code_dtype: integer dtype of the stored codes inside the graph (PQ, IVFPQ; default
            as the index stores them).
        filtered: add the input ``allowed`` bool [id_space] (id_space: the largest stored
            id + 1): ids whose entry is False are never returned (faiss's ``IDSelector``
            per search call). The graph's results equal ``index.search(q, k,
            allowed=mask)`` where k allowed vectors are among those it scans (an IVF graph
            probes its fixed ``nprobe`` lists; it does not probe further as the CPU search
            does).
    """
    options = {"nprobe": nprobe, "k_factor": k_factor, "capacity": capacity}
    options = {name: check_positive(v, name) for name, v in options.items() if v is not None}
    if code_dtype is not None:
        options["code_dtype"] = code_dtype
    if not (isinstance(index, Index) and index.has_searcher()):
        supported = ", ".join(k.name for k in kinds() if k.exports and not k.wrapper)
        raise TypeError(
            f"no search graph for {type(index).__name__}; supported: {supported}, and "
            "PreTransform / Refine around them"
        )
    graph = index.searcher(check_positive(k, "k"), **options)
    inputs = (TensorSpec("queries", torch.float32, (index.dim,)),)
    distances = TensorSpec("distances", torch.float32, (graph.k,))
    ids = TensorSpec("ids", torch.int64, (graph.k,))
    metadata = _metadata(index, graph)
    if filtered:
        graph = FilteredSearch(index, graph)
        inputs += (TensorSpec("allowed", torch.bool, (graph.id_space,), batched=False),)
        metadata.update(filtered="true", id_space=str(graph.id_space))
    return ExportModule(graph, inputs, (distances, ids), metadata)


class FilteredSearch(nn.Module):
    """A search graph that takes a mask over the ids: ``forward(queries, allowed)`` with
    ``allowed`` bool [id_space] runs ``searcher.search(queries, k, allowed=rows)``, ``rows``
    bool [ntotal] being ``allowed`` gathered at each stored row's id (one Gather).

    Buffers:
        row_ids: int64 [ntotal], the id of each stored row (absent when the ids are the rows:
        the mask is then the rows' own).
    """

    def __init__(self, index: Index, searcher: nn.Module) -> None:
        super().__init__()
        if not _takes_filter(searcher):
            raise ValueError(
                f"a {type(index).__name__} search graph takes no filter; export it without "
                "filtered=True, or filter with a Flat, PQ, SQ or IVF index"
            )
        self.searcher, self.k = searcher, searcher.k
        row_ids = index.stored_ids().detach().clone()
        self.sequential = bool(torch.equal(row_ids, torch.arange(len(row_ids)).to(row_ids)))
        self.id_space = int(row_ids.max()) + 1 if len(row_ids) else 0
        if self.id_space > MAX_ID_SPACE:
            raise ValueError(
                f"the largest id is {self.id_space - 1}: a mask over ids up to it would take "
                f"{self.id_space / 2**30:.0f} GiB; renumber the ids below 2**31 to export a "
                "filtered search"
            )
        if not self.sequential:
            self.register_buffer("row_ids", row_ids)

    def forward(self, queries: torch.Tensor, allowed: torch.Tensor):
        rows = allowed if self.sequential else allowed.index_select(0, self.row_ids)
        return self.searcher.search(self.searcher.prepared(queries), self.k, allowed=rows)


def _takes_filter(searcher: nn.Module) -> bool:
    """Whether a filtered export of ``searcher`` holds: every static search takes ``allowed``
    (:class:`vq.index.core.searchers.Searcher`), unless it declares ``filter_export = False``
    (the HNSW walk, whose filter lacks the index's exact fallback) or wraps one that does."""
    inner = getattr(searcher, "inner", None)
    if not getattr(searcher, "filter_export", True):
        return False
    return not isinstance(inner, nn.Module) or _takes_filter(inner)


def _metadata(index: Index, graph: torch.nn.Module) -> dict[str, str]:
    """The index's facts, and the options its graph (or a wrapped one) baked in."""
    metadata = {
        "dim": str(index.dim),
        "k": str(graph.k),
        "metric": index.metric_name,
        "normalize": str(bool(index.normalize)).lower(),
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
