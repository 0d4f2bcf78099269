"""The static-shape search of the IVF kinds: the coarse probe (:func:`probe`) and
:class:`IVFSearch`, which :class:`vq.index.ivf.ivfflat.IVFFlatSearch` and
:class:`vq.index.ivf.ivfpq_search.IVFPQSearch` extend (the inverted lists padded to one
capacity, a +inf bias on the padding slots), each id kept once over spilled lists (see
:mod:`vq.index.ivf.spill`)."""

from __future__ import annotations

import torch

from vq._checks import check_positive
from vq.index.core.searchers import INF, Searcher, kept, top_rows
from vq.index.ivf.spill import unique_top


def probe(queries, centroids, centroid_norms, nprobe: int, metric: str):
    """The ``nprobe`` (<= nlist) nearest lists of each query, as one static-shape graph:
    queries float32 [B, dim], centroids float32 [nlist, dim] and their squared norms [nlist],
    metric "l2" or "ip" (lists are probed by the index's metric, as faiss does) → coarse scores
    float32 [B, nprobe], ascending (squared L2 clamped at 0, or negated inner products), and
    lists int64 [B, nprobe]."""
    if metric == "ip":
        return torch.topk(-(queries @ centroids.T), nprobe, dim=1, largest=False, sorted=True)
    scores = torch.addmm(centroid_norms, queries, centroids.T, alpha=-2.0)
    q2 = (queries * queries).sum(dim=1, keepdim=True)
    if nprobe == 1:  # ranked before adding ||q||², as the nearest-centroid assignment
        val, lists = torch.topk(scores, 1, dim=1, largest=False, sorted=True)
        return (val + q2).clamp_min(0.0), lists
    val, lists = torch.topk(scores + q2, nprobe, dim=1, largest=False, sorted=True)
    return val.clamp_min(0.0), lists


def padded_rows(offsets: torch.Tensor, capacity: int) -> torch.Tensor:
    """int64 [nlist, capacity]: the storage rows of each CSR inverted list, -1 past its end."""
    slots = torch.arange(capacity, device=offsets.device)
    return torch.where(slots < offsets.diff()[:, None], offsets[:-1, None] + slots, -1)


class IVFSearch(Searcher):
    """Shared by the IVF searches (see :class:`vq.index.core.searchers.Searcher`): coarse probing,
    and the inverted lists padded to one ``capacity`` (a probe reads that many slots).

    Args:
        index: the IVF index; k: neighbours ``forward`` returns (default the index's).
        nprobe: lists ``forward`` probes (default the index's, at most nlist).
        capacity: slots per list (default and minimum: the longest list).
        copy: hold a snapshot (True) or the index's own storage (the torch path).

    Buffers:
        centroids: float32 [nlist, dim]; centroid_norms: float32 [nlist];
        list_rows: int64 [nlist, capacity], the storage row of each slot (-1 for padding);
        slot_bias: float32 [nlist, capacity], added to every slot's score: +inf for padding.
    """

    def __init__(self, index, k, nprobe, capacity, copy: bool):
        super().__init__(index, k, copy)
        longest = max(1, int(index.list_sizes().max()))
        capacity = longest if capacity is None else int(capacity)
        if capacity < longest:
            raise ValueError(
                f"capacity={capacity} is shorter than the longest inverted list ({longest} "
                f"vectors); pass capacity >= {longest} or leave it to the default"
            )
        self.nlist, self.capacity, self.spill = index.nlist, capacity, index.spill
        self.nprobe = min(index.nprobe if nprobe is None else int(nprobe), index.nlist)
        c = index.quantizer.codebook.detach().float()
        self.register_buffer("centroids", kept(c, copy))
        self.register_buffer("centroid_norms", (c * c).sum(dim=1))
        rows = padded_rows(index.offsets, capacity)
        self.register_buffer("list_rows", rows)
        self.register_buffer("slot_bias", torch.where(rows < 0, INF, 0.0))

    def probe(self, queries: torch.Tensor, nprobe: int) -> tuple[torch.Tensor, torch.Tensor]:
        return probe(queries, self.centroids, self.centroid_norms, nprobe, self.metric)

    def top(self, scores: torch.Tensor, k: int, rows: torch.Tensor):
        """:func:`vq.index.core.searchers.top_rows` of the candidates (each id once when spilled:
        :func:`vq.index.ivf.spill.unique_top`)."""
        if self.spill:
            return unique_top(scores, k, rows, self.id_table)
        return top_rows(scores, k, rows)

    def lists_probed(self, nprobe: int | None) -> int:
        """``nprobe`` checked and capped at nlist (default: the one fixed at construction)."""
        return self.nprobe if nprobe is None else min(check_positive(nprobe, "nprobe"), self.nlist)

    @staticmethod
    def gather_lists(table: torch.Tensor, lists: torch.Tensor) -> torch.Tensor:
        """Rows [B, nprobe * capacity, …] of a padded ``table`` [nlist, capacity, …]."""
        picked = table.index_select(0, lists.reshape(-1))
        return picked.reshape(lists.shape[0], -1, *table.shape[2:])

    def candidate_bias(self, lists, allowed=None, limit=None):
        """float32 [B, nprobe * capacity] added to the scores of the probed slots (``lists``
        int64 [B, nprobe]) by a filtered search: +inf for rows ``allowed`` (bool [ntotal])
        skips and for probes p >= ``limit`` (int64 [B]: the lists each query probes), or
        None where neither is given."""
        bias = None
        if allowed is not None:
            rows = self.list_rows.clamp_min(0)
            table = torch.where(allowed.index_select(0, rows.reshape(-1)), 0.0, INF)
            bias = self.gather_lists(table.reshape(rows.shape), lists)
        if limit is not None:
            n, nprobe = lists.shape
            probes = torch.arange(nprobe, device=lists.device)
            cut = torch.where(probes[None, :] < limit[:, None], 0.0, INF)  # [B, nprobe]
            cut = cut[:, :, None].expand(n, nprobe, self.capacity).reshape(n, -1)
            bias = cut if bias is None else bias + cut
        return bias
