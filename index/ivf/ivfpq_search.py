"""IVFPQ's search as one static-shape torch function (:class:`IVFPQSearch`, its torch engine
and what :mod:`vq.export` writes out), and faiss's per-vector term of L2 search by residual
that it adds (:func:`residual_terms`, which the numba scan reads too)."""

from __future__ import annotations

import torch

from vq.index.core.searchers import INF, kept
from vq.index.flat.pq_index import stored_codes
from vq.index.ivf.ivf_searchers import IVFSearch
from vq.quantizers.product import lookup_tables, pq_decode


def residual_terms(index, rows: int = 1 << 16) -> torch.Tensor:
    """faiss's per-vector term ``||r||² + 2⟨c, r⟩`` of L2 search by residual (r the decoded
    residual of a stored row, c its list's centroid): float32 [n_rows], in storage order,
    computed ``rows`` vectors at a time."""
    cb, centroids = index.pq.codebooks.detach().float(), index.quantizer.codebook.detach().float()
    lists = torch.repeat_interleave(
        torch.arange(index.nlist, device=centroids.device), index.list_sizes()
    )
    out, codes = torch.empty(index.n_rows, device=centroids.device), index.codes  # (once)
    for s in range(0, index.n_rows, rows):
        r = pq_decode(codes[s : s + rows], cb)
        c = centroids.index_select(0, lists[s : s + rows])
        out[s : s + rows] = (r * r).sum(-1) + 2.0 * (c * r).sum(-1)
    return out


class IVFPQSearch(IVFSearch):
    """:class:`vq.index.IVFPQ`'s search as a static-shape graph (by residual or not, L2 or inner
    product, fast-scan too with float tables): one look-up table per query, summed over the
    padded codes of the probed lists, plus the slot bias (faiss's precomputed ``||r||² +
    2⟨c, r⟩`` per stored vector for L2 by residual, +inf for padding) and, by residual, the
    coarse term of each probe; then a top-k. One table per query serves every probe.

    Args:
        index, k, nprobe, capacity, copy: as :class:`vq.index.ivf.ivf_index.IVFSearch`.
        code_dtype: integer dtype of the codes held (default as stored).

    Buffers (beyond :class:`IVFSearch`'s): codebooks: float32 [M, ksub, dsub]; list_codes:
    [M, nlist, capacity], the codes of every slot (0 in padding).
    """

    def __init__(self, index, k=None, nprobe=None, capacity=None, code_dtype=None, copy=True):
        super().__init__(index, k, nprobe, capacity, copy)
        self.by_residual = index.by_residual
        if index.metric == "ip":  # ⟨x, c + r⟩: the coarse term is -⟨x, c⟩, by residual
            self.table, self.scale = "ip", -1.0
        elif index.by_residual:  # ||x - c||² + (||r||² + 2⟨c, r⟩) - 2⟨x, r⟩
            self.table, self.scale = "ip", -2.0
        else:
            self.table, self.scale = "l2", 1.0
        self.register_buffer("codebooks", kept(index.pq.codebooks.float(), copy))
        codes = stored_codes(index, code_dtype)
        self.code_dtype = codes.dtype
        rows = self.list_rows
        padded = torch.where(rows[..., None] < 0, 0, codes[rows.clamp_min(0)]).to(codes.dtype)
        self.register_buffer("list_codes", padded.permute(2, 0, 1).contiguous())
        if self.scale == -2.0:
            self.slot_bias = torch.where(rows < 0, INF, residual_terms(index)[rows.clamp_min(0)])

    def search(self, queries: torch.Tensor, k: int, nprobe=None, allowed=None, limit=None):
        """``limit``: int64 [B], the lists each query probes (<= nprobe; default all)."""
        nprobe = self.lists_probed(nprobe)
        coarse, lists = self.probe(queries, nprobe)
        tables = lookup_tables(queries, self.codebooks, self.table)  # [M, B, ksub]
        tables = tables if self.scale == 1.0 else self.scale * tables
        scores = self.gather_lists(self.slot_bias, lists)  # [B, C]
        if self.by_residual:  # the coarse term of each probe, over its capacity slots
            n, c = scores.shape
            per_probe = scores.reshape(n, nprobe, self.capacity) + coarse[:, :, None]
            scores = per_probe.reshape(n, c)
        # one element-wise gather per sub-quantizer: GatherElements in ONNX, which ONNX Runtime
        # ran several times faster here than a Gather from flattened tables at offset indices
        for m in range(self.list_codes.shape[0]):
            codes = self.gather_lists(self.list_codes[m], lists).long()  # [B, C]
            scores = scores + torch.gather(tables[m], 1, codes)
        bias = self.candidate_bias(lists, allowed, limit)
        scores = scores if bias is None else scores + bias
        return self.results(*self.top(scores, k, self.gather_lists(self.list_rows, lists)), k)

    def chunk_rows(self, k: int, nprobe: int | None = None) -> int:
        return max(1, (1 << 23) // (self.lists_probed(nprobe) * self.capacity))
