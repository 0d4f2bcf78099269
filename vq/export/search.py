"""Static-shape search graphs of the indexes: queries [B, dim] → distances [B, k], ids [B, k].

Every module copies or derives its constants from a filled index at construction:

- Flat: the vectors and their squared norms; one matrix product and a top-k.
- PQ: the codebooks and the codes (transposed to [M, ntotal]); per-query look-up tables from one
  batched matrix product, summed over the M sub-codes with gathers, then a top-k.
- IVF: the coarse centroids (probing is a matrix product and a top-k over ``nlist``) and the
  inverted lists padded to a fixed ``capacity``: vectors or codes [nlist, capacity, …], an id
  table with -1 and a per-slot bias that is +inf for padding, so padding never wins. IVFPQ folds
  faiss's per-list term ``||r||² + 2⟨c, r⟩`` (L2, by residual) into that per-slot bias, so one
  table per query serves every probe.
- PreTransform: the OPQ rotation, then the wrapped index's graph.
- Refine: the wrapped graph's ``k * k_factor`` candidates, re-ranked on the exact vectors.

Distances follow :meth:`vq.index.Index.search`: squared L2 ascending or inner products
descending; missing results (k larger than the candidates) are id -1 with +inf (-inf for "ip").
Results equal the index's torch path (``vq._cpu.torch_only()``) up to float32 rounding.
"""

from __future__ import annotations

import json

import torch

from vq.export.base import ExportModule, TensorSpec
from vq.index import IVFPQ, FlatIndex, IVFFlat, PQIndex, PreTransform, Refine
from vq.index.base import Index
from vq.index.ivf import IVFIndex

INF = float("inf")


class SearchModule(ExportModule):
    """Base of the search graphs: specs, metadata and the final top-k."""

    def __init__(self, index: Index, k: int):
        super().__init__()
        self.k, self.metric, self.dim = int(k), index.metric, index.dim
        self.inputs = (TensorSpec("queries", torch.float32, (index.dim,)),)
        self.outputs = (
            TensorSpec("distances", torch.float32, (self.k,)),
            TensorSpec("ids", torch.int64, (self.k,)),
        )
        self.metadata.update(
            dim=str(index.dim),
            k=str(self.k),
            metric=index.metric,
            ntotal=str(index.ntotal),
            index=json.dumps({"class": type(index).__name__, **index.config()}),
        )

    def _ids_buffer(self, index: Index) -> None:
        """Register ``id_table`` int64 [ntotal], or nothing when the ids are the row numbers."""
        ids = index.stored_ids()
        self.sequential = bool(torch.equal(ids, torch.arange(ids.shape[0], device=ids.device)))
        if not self.sequential:
            self.register_buffer("id_table", ids.clone())

    def _results(self, scores: torch.Tensor, ids: torch.Tensor | None):
        """Top-k of ``scores`` [B, C] (smaller is nearer, +inf for padding) and their ids.

        Args:
            scores: float32 [B, C].
            ids: None (ids are the positions), int64 [C] (an id per position) or int64 [B, C]
                (an id per query and position).

        Returns:
            distances float32 [B, k] (negated back for "ip") and ids int64 [B, k].
        """
        n, c = scores.shape
        kk = min(self.k, c)
        val, pos = torch.topk(scores, kk, dim=1, largest=False, sorted=True)
        if ids is None:
            found = pos
        elif ids.dim() == 1:
            found = ids.index_select(0, pos.reshape(-1)).reshape(n, kk)
        else:
            found = ids.gather(1, pos)
        found = torch.where(torch.isinf(val), -1, found)
        dist = -val if self.metric == "ip" else val
        return _pad_results(dist, found, self.k, self.metric)


def _pad_results(dist: torch.Tensor, ids: torch.Tensor, k: int, metric: str):
    """Append missing results (+inf / -inf and id -1) up to k columns."""
    pad = k - dist.shape[1]
    if pad <= 0:
        return dist, ids
    fill = INF if metric == "l2" else -INF
    dist = torch.cat([dist, dist.new_full((dist.shape[0], pad), fill)], dim=1)
    ids = torch.cat([ids, ids.new_full((ids.shape[0], pad), -1)], dim=1)
    return dist, ids


class FlatSearch(SearchModule):
    """:class:`vq.FlatIndex`: exact scores against every stored vector, then a top-k."""

    def __init__(self, index: FlatIndex, k: int):
        super().__init__(index, k)
        x = index.vectors.detach().float()
        self.register_buffer("vectors", x.clone())  # [ntotal, dim]
        self.register_buffer("norms", (x * x).sum(dim=1))  # [ntotal]
        self._ids_buffer(index)

    def forward(self, queries: torch.Tensor):
        n, kk = queries.shape[0], min(self.k, self.vectors.shape[0])
        if self.metric == "l2":
            scores = torch.addmm(self.norms, queries, self.vectors.T, alpha=-2.0)
            val, pos = torch.topk(scores, kk, dim=1, largest=False, sorted=True)
            dist = (val + (queries * queries).sum(dim=1, keepdim=True)).clamp_min(0.0)
        else:
            dist, pos = torch.topk(queries @ self.vectors.T, kk, dim=1, largest=True, sorted=True)
        ids = (
            pos
            if self.sequential
            else self.id_table.index_select(0, pos.reshape(-1)).reshape(n, kk)
        )
        return _pad_results(dist, ids, self.k, self.metric)


class LookupTables(torch.nn.Module):
    """Per-query ADC tables of a product quantizer, laid out [M, B, ksub], smaller is nearer.

    ``kind``: "l2" (``||q_m - c||²``, clamped at 0), "-ip" (``-⟨q_m, c⟩``) or "-2ip"
    (``-2⟨q_m, c⟩``, the query term of IVFPQ's L2 residual decomposition).
    """

    def __init__(self, pq, kind: str):
        super().__init__()
        if kind not in ("l2", "-ip", "-2ip"):
            raise ValueError(f"kind must be 'l2', '-ip' or '-2ip', got {kind!r}")
        self.kind, self.M, self.dsub = kind, pq.M, pq.dsub
        cb = pq.codebooks.detach().float()
        self.register_buffer("codebooks_t", cb.transpose(1, 2).contiguous())  # [M, dsub, ksub]
        self.register_buffer("norms", (cb * cb).sum(-1)[:, None, :])  # [M, 1, ksub]

    def forward(self, queries: torch.Tensor) -> torch.Tensor:
        subs = queries.reshape(-1, self.M, self.dsub).transpose(0, 1)  # [M, B, dsub]
        dots = torch.bmm(subs, self.codebooks_t)  # [M, B, ksub]
        if self.kind == "-ip":
            return -dots
        if self.kind == "-2ip":
            return -2.0 * dots
        sq = (subs * subs).sum(-1, keepdim=True) - 2.0 * dots + self.norms
        return sq.clamp_min(0.0)


def _pq_codes(index, dtype: torch.dtype | None) -> torch.Tensor:
    """The stored codes [ntotal, M] of a PQ or IVFPQ index (one code per sub-quantizer), as
    ``dtype`` (default: as stored)."""
    codes, pq = index.codes, index.pq
    if codes.dim() != 2 or codes.shape[1] != pq.M:
        raise NotImplementedError(
            f"{type(index).__name__} stores codes of shape {tuple(codes.shape)}; the export "
            f"reads one code per sub-quantizer, [ntotal, {pq.M}]"
        )
    return codes.detach().to(dtype or codes.dtype)


class PQSearch(SearchModule):
    """:class:`vq.PQIndex`: tables per query, summed over the stored codes, then a top-k."""

    def __init__(self, index: PQIndex, k: int, code_dtype: torch.dtype | None = None):
        super().__init__(index, k)
        self.M, self.ksub = index.pq.M, index.pq.ksub
        self.tables = LookupTables(index.pq, "l2" if index.metric == "l2" else "-ip")
        codes = _pq_codes(index, code_dtype)
        self.register_buffer("codes_t", codes.T.contiguous())  # [M, ntotal]
        self.metadata["code_dtype"] = str(codes.dtype).removeprefix("torch.")
        self._ids_buffer(index)

    def forward(self, queries: torch.Tensor):
        tables = self.tables(queries)  # [M, B, ksub]
        n = queries.shape[0]
        if isinstance(n, int) and n == 1:
            # one query: element-wise gathers (GatherElements, ~10x a Gather in ONNX Runtime)
            scores = torch.gather(tables[0], 1, self.codes_t[:1].long())  # [1, ntotal]
            for m in range(1, self.M):
                scores = scores + torch.gather(tables[m], 1, self.codes_t[m : m + 1].long())
            return self._results(scores, None if self.sequential else self.id_table)
        # a batch: rows of the transposed tables, B contiguous values per code (~4x faster)
        tables = tables.transpose(1, 2)  # [M, ksub, B]
        scores = tables[0].index_select(0, self.codes_t[0].long())  # [ntotal, B]
        for m in range(1, self.M):
            scores = scores + tables[m].index_select(0, self.codes_t[m].long())
        return self._results(scores.T, None if self.sequential else self.id_table)


def padded_rows(offsets: torch.Tensor, capacity: int) -> torch.Tensor:
    """int64 [nlist, capacity]: the storage rows of each CSR inverted list, -1 past its end."""
    sizes = offsets.diff()
    slots = torch.arange(capacity, device=offsets.device)
    return torch.where(slots < sizes[:, None], offsets[:-1, None] + slots, -1)


class IVFSearch(SearchModule):
    """Shared by the IVF graphs: coarse probing and the padded id table and slot bias."""

    def __init__(self, index: IVFIndex, k: int, nprobe: int, capacity: int | None):
        super().__init__(index, k)
        longest = int(index.list_sizes().max())
        capacity = longest if capacity is None else _positive(capacity, "capacity")
        if capacity < longest:
            raise ValueError(
                f"capacity={capacity} is shorter than the longest inverted list ({longest} "
                f"vectors); pass capacity >= {longest} or leave it to the default"
            )
        self.nlist, self.nprobe, self.capacity = index.nlist, min(nprobe, index.nlist), capacity
        c = index.quantizer.codebook.detach().float()
        self.register_buffer("centroids", c.clone())  # [nlist, dim]
        self.register_buffer("centroid_norms", (c * c).sum(dim=1))  # [nlist]
        rows = padded_rows(index.offsets, capacity)
        ids = index.stored_ids()
        self.register_buffer("list_ids", torch.where(rows < 0, -1, ids[rows.clamp_min(0)]))
        self.register_buffer("slot_bias", torch.where(rows < 0, INF, 0.0))  # [nlist, capacity]
        self.metadata.update(
            nprobe=str(self.nprobe),
            nlist=str(self.nlist),
            capacity=str(capacity),
            padding_overhead=f"{self.nlist * capacity / max(1, index.ntotal):.3f}",
        )

    def probe(self, queries: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Coarse scores float32 [B, nprobe] (as the index's ``_probe``) and lists [B, nprobe]."""
        if self.metric == "ip":
            scores = -(queries @ self.centroids.T)
            return torch.topk(scores, self.nprobe, dim=1, largest=False, sorted=True)
        scores = torch.addmm(self.centroid_norms, queries, self.centroids.T, alpha=-2.0)
        q2 = (queries * queries).sum(dim=1, keepdim=True)
        if self.nprobe == 1:  # as the index: an arg-min before adding ||q||²
            val, lists = torch.topk(scores, 1, dim=1, largest=False, sorted=True)
            return (val + q2).clamp_min(0.0), lists
        val, lists = torch.topk(scores + q2, self.nprobe, dim=1, largest=False, sorted=True)
        return val.clamp_min(0.0), lists

    def gather_lists(self, table: torch.Tensor, lists: torch.Tensor) -> torch.Tensor:
        """Rows ``[B, nprobe * capacity, …]`` of a padded ``table`` [nlist, capacity, …]."""
        picked = table.index_select(0, lists.reshape(-1))
        return picked.reshape(lists.shape[0], -1, *table.shape[2:])


class IVFFlatSearch(IVFSearch):
    """:class:`vq.IVFFlat`: exact scores against the padded vectors of the probed lists."""

    def __init__(self, index: IVFFlat, k: int, nprobe: int, capacity: int | None = None):
        super().__init__(index, k, nprobe, capacity)
        rows = padded_rows(index.offsets, self.capacity)
        x = index.vectors.detach().float()
        padded = torch.where(rows[..., None] < 0, 0.0, x[rows.clamp_min(0)])
        self.register_buffer("list_vectors", padded)  # [nlist, capacity, dim]

    def forward(self, queries: torch.Tensor):
        _, lists = self.probe(queries)
        cand = self.gather_lists(self.list_vectors, lists)  # [B, C, dim]
        q = queries[:, None, :]
        if self.metric == "ip":
            scores = -(cand * q).sum(-1)
        else:
            scores = ((cand - q) ** 2).sum(-1)
        scores = scores + self.gather_lists(self.slot_bias, lists)
        return self._results(scores, self.gather_lists(self.list_ids, lists))


class IVFPQSearch(IVFSearch):
    """:class:`vq.IVFPQ` (by_residual or not, L2 or inner product): one look-up table per
    query, summed over the padded codes of the probed lists, plus the per-slot bias (faiss's
    precomputed ``||r||² + 2⟨c, r⟩`` for L2 residuals, +inf for padding) and, by residual,
    the coarse term of each probe."""

    def __init__(
        self,
        index: IVFPQ,
        k: int,
        nprobe: int,
        capacity: int | None = None,
        code_dtype: torch.dtype | None = None,
    ):
        super().__init__(index, k, nprobe, capacity)
        pq = index.pq
        self.M, self.ksub, self.by_residual = pq.M, pq.ksub, index.by_residual
        if index.metric == "ip":
            kind = "-ip"
        else:
            kind = "-2ip" if index.by_residual else "l2"
        self.tables = LookupTables(pq, kind)
        codes = _pq_codes(index, code_dtype)
        self.metadata["code_dtype"] = str(codes.dtype).removeprefix("torch.")
        rows = padded_rows(index.offsets, self.capacity)
        padded = torch.where(rows[..., None] < 0, 0, codes[rows.clamp_min(0)]).to(codes.dtype)
        self.register_buffer("list_codes", padded.permute(2, 0, 1).contiguous())  # [M, nlist, cap]
        if kind == "-2ip":  # ||r||² + 2⟨c, r⟩ of every stored vector, r its decoded residual
            r = torch.as_tensor(pq.decode(index.codes.detach()))
            lists = torch.repeat_interleave(
                torch.arange(index.nlist, device=codes.device), index.list_sizes()
            )
            c = index.quantizer.codebook.detach().float().index_select(0, lists)
            bias = (r * r).sum(-1) + 2.0 * (c * r).sum(-1)
            self.slot_bias = torch.where(rows < 0, INF, bias[rows.clamp_min(0)])
        self.metadata["by_residual"] = str(index.by_residual)

    def forward(self, queries: torch.Tensor):
        coarse, lists = self.probe(queries)
        n, c = queries.shape[0], self.nprobe * self.capacity
        tables = self.tables(queries)  # [M, B, ksub]
        scores = self.gather_lists(self.slot_bias, lists)  # [B, C]
        if self.by_residual:  # the coarse term of each probe, over its capacity slots
            per_probe = scores.reshape(n, self.nprobe, self.capacity) + coarse[:, :, None]
            scores = per_probe.reshape(n, c)
        # one element-wise gather per sub-quantizer: GatherElements in ONNX, which ONNX Runtime
        # ran several times faster here than a Gather from flattened tables at offset indices
        for m in range(self.M):
            codes = self.gather_lists(self.list_codes[m], lists).long()  # [B, C]
            scores = scores + torch.gather(tables[m], 1, codes)
        return self._results(scores, self.gather_lists(self.list_ids, lists))


class PreTransformSearch(SearchModule):
    """:class:`vq.PreTransform`: the OPQ rotation, then the wrapped index's graph."""

    def __init__(self, index: PreTransform, inner: SearchModule):
        super().__init__(index, inner.k)
        self.register_buffer("rotation_t", index.transform.rotation.detach().float().T.contiguous())
        self.inner = inner
        self.metadata = {**inner.metadata, **self.metadata}

    def forward(self, queries: torch.Tensor):
        return self.inner(queries @ self.rotation_t)


class RefineSearch(SearchModule):
    """:class:`vq.Refine`: the wrapped graph's ``k * k_factor`` candidates re-ranked by their
    exact distances to the query."""

    def __init__(self, index: Refine, inner: SearchModule, k: int, k_factor: int):
        super().__init__(index, k)
        self.inner = inner
        self.register_buffer("vectors", index.vectors.detach().float().clone())
        self._ids_buffer(index)
        self.metadata = {**inner.metadata, **self.metadata, "k_factor": str(k_factor)}

    def forward(self, queries: torch.Tensor):
        _, rows = self.inner(queries)  # [B, C]: rows of this index, -1 where missing
        n, c = rows.shape
        safe = rows.clamp_min(0).reshape(-1)
        cand = self.vectors.index_select(0, safe).reshape(n, c, -1)
        q = queries[:, None, :]
        if self.metric == "ip":
            scores = -(cand * q).sum(-1)
        else:
            scores = ((cand - q) ** 2).sum(-1)
        scores = torch.where(rows < 0, INF, scores)
        ids = rows if self.sequential else self.id_table.index_select(0, safe).reshape(n, c)
        return self._results(scores, torch.where(rows < 0, -1, ids))


def searcher(
    index: Index,
    k: int,
    nprobe: int | None = None,
    k_factor: int | None = None,
    capacity: int | None = None,
    code_dtype: torch.dtype | None = None,
) -> SearchModule:
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
    k = _positive(k, "k")
    if isinstance(index, Refine):
        k_factor = index.k_factor if k_factor is None else _positive(k_factor, "k_factor")
        inner = searcher(index.index, k * k_factor, nprobe, None, capacity, code_dtype)
        return RefineSearch(index, inner, k, k_factor)
    if isinstance(index, PreTransform):
        inner = searcher(index.index, k, nprobe, k_factor, capacity, code_dtype)
        return PreTransformSearch(index, inner)
    if isinstance(index, IVFIndex):
        nprobe = index.nprobe if nprobe is None else _positive(nprobe, "nprobe")
        if isinstance(index, IVFPQ):
            return IVFPQSearch(index, k, nprobe, capacity, code_dtype)
        if isinstance(index, IVFFlat):
            return IVFFlatSearch(index, k, nprobe, capacity)
    if isinstance(index, PQIndex):
        return PQSearch(index, k, code_dtype)
    if isinstance(index, FlatIndex):
        return FlatSearch(index, k)
    raise TypeError(
        f"no search graph for {type(index).__name__}; supported: FlatIndex, PQIndex, IVFFlat, "
        "IVFPQ, and PreTransform / Refine around them"
    )


def _positive(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)
