"""Inverted lists of scalar-quantizer codes (faiss ``IndexIVFScalarQuantizer``, factory
``"IVF1024,SQ8"``): the coarse step, lists and probing are
:class:`vq.index.ivf.ivf_index.IVFIndex`'s; each list stores the :class:`vq.ScalarQuantizer` bytes
of its vectors' residuals to its centroid (``by_residual``, faiss's default) or of the vectors
themselves.

Scores follow faiss's scanners: squared L2 ``||(q - c) - r̂||²`` by residual (the query's
residual to the probed list's centroid against the decoded residual), ``||q - x̂||²``
otherwise; inner products ``⟨q, c⟩ + ⟨q, r̂⟩`` by residual, ``⟨q, x̂⟩`` otherwise.
"""

from __future__ import annotations

import torch

from vq._checks import check_flag
from vq.faiss_interop import sq_from_faiss
from vq.index.core.faiss_build import faiss_metric, import_faiss
from vq.index.core.filters import kernel_mask
from vq.index.core.ranges import probed_hits
from vq.index.core.registry import register
from vq.index.core.searchers import kept
from vq.index.flat.sq_index import (
    SQ_FACTORY,
    codes_problem,
    copy_ranges,
    kernel_arrays,
    sq_bits,
    sq_faiss_type,
    sq_quantizer,
)
from vq.index.ivf.ivf_faiss import lists_from_faiss
from vq.index.ivf.ivf_index import IVF_FACTORY, IVFIndex, IVFSearch, ivf_arguments
from vq.kernels.common.bundles import RangeHits, SQLists, TopK, plain
from vq.kernels.exact.range_scans import sq_hits
from vq.kernels.sq import sq_scans as sq_kernels
from vq.quantizers.scalar_codes import decode_stored, stored_values


class IVFSQ(IVFIndex):
    """IVF with scalar-quantized vectors or residuals.

    Args:
        dim: vector dimension.
        nlist: inverted lists.
        bits: 8, 6, 4, "fp16" or "bf16" (see :class:`vq.ScalarQuantizer`).
        by_residual: encode ``x - c`` (the residual to the list's centroid; faiss's default)
            rather than x. The quantizer's ranges are then trained on residuals.
        metric, k, nprobe, coarse_niter, coarse_init, seed, verbose, spill, soar_lambda,
            coarse_hnsw, spherical: as :class:`vq.index.IVFIndex` (spilled by residual: each
            copy encodes its residual to its own list's centroid).
        margin: widen the trained ranges (see :class:`vq.ScalarQuantizer`).

    Submodules and buffers (beyond :class:`IVFIndex`'s):
        sq: the :class:`vq.ScalarQuantizer`; codes: uint8 [n_rows, code_size], in list order.
    """

    row_buffers = ("codes",)

    def __init__(
        self,
        dim: int,
        nlist: int,
        bits: int | str = 8,
        by_residual: bool = True,
        metric: str = "l2",
        k: int = 10,
        nprobe: int = 1,
        *,
        margin: float = 0.0,
        coarse_niter: int = 10,
        coarse_init: str = "auto",
        seed: int = 1234,
        verbose: bool = False,
        spill: bool = False,
        soar_lambda: float = 1.0,
        coarse_hnsw: int = 0,
        spherical: bool = False,
    ):
        super().__init__(
            dim,
            nlist,
            metric,
            k,
            nprobe,
            coarse_niter=coarse_niter,
            coarse_init=coarse_init,
            seed=seed,
            verbose=verbose,
            spill=spill,
            soar_lambda=soar_lambda,
            coarse_hnsw=coarse_hnsw,
            spherical=spherical,
        )
        self.by_residual = check_flag(by_residual, "by_residual")
        self.sq = sq_quantizer(dim, bits, margin)
        self.register_buffer("codes", torch.zeros(0, self.sq.code_size, dtype=torch.uint8))

    @property
    def is_trained(self) -> bool:
        return self.quantizer.is_trained and self.sq.is_trained

    @property
    def bits(self) -> int | str:
        return self.sq.bits

    def config(self) -> dict:
        return {**super().config(), **self.sq.config(), "by_residual": self.by_residual}

    def vector_ns(self) -> float:
        return self.dim / (8 if self.bits == 8 else 3)

    def _rows_problem(self) -> str | None:
        return codes_problem(self.codes, self.n_rows, self.sq)

    def _empty_faiss(self, quantizer) -> tuple:
        faiss, qtype = import_faiss(), sq_faiss_type(self.sq)
        metric = faiss_metric(self.metric)
        out = faiss.IndexIVFScalarQuantizer(
            quantizer, self.dim, self.nlist, qtype, metric, self.by_residual
        )
        copy_ranges(self.sq, out.sq)
        return out, self.codes.cpu().numpy()

    @classmethod
    def from_faiss(cls, f, metric: str) -> IVFSQ:
        """The IVFSQ of a faiss ``IndexIVFScalarQuantizer`` ``f``: the same centroids (or
        graph), ranges, lists, codes, ids and nprobe."""
        lists = lists_from_faiss(f, metric)
        out = cls(f.d, f.nlist, 8, f.by_residual, metric, nprobe=f.nprobe, **lists.routed)
        out.sq = sq_from_faiss(f.sq)
        out.codes = torch.from_numpy(lists.joined().reshape(-1, f.code_size))
        return lists.fill(out)

    # -- training and adding --------------------------------------------------------------
    def learn(self, x: torch.Tensor) -> None:
        self._train_coarse(x)
        self.sq.fit(self._residuals(x, self._assign(x)) if self.by_residual else x)

    def _residuals(self, x: torch.Tensor, lists: torch.Tensor) -> torch.Tensor:
        return x - self.quantizer.codebook.float().index_select(0, lists)

    def _encode_rows(self, x: torch.Tensor, lists: torch.Tensor) -> dict[str, torch.Tensor]:
        target = self._residuals(x, lists) if self.by_residual else x
        return {"codes": self.sq.encode_rows(target)}

    def decode_rows(self, rows: torch.Tensor) -> torch.Tensor:
        rows = rows.to(self.device)
        x = self.sq.decode(self.codes[rows])
        if self.by_residual:
            x = x + self.quantizer.codebook.float()[self._row_lists(rows)]
        return x

    # -- search ---------------------------------------------------------------------------
    def searcher(self, k=None, *, nprobe=None, capacity=None, copy=True) -> IVFSQSearch:
        """The search as a static-shape graph over a snapshot of the lists (``copy=False``:
        over the index's own), padded to one ``capacity`` (see :class:`IVFSQSearch`; what
        :mod:`vq.export` writes out)."""
        return IVFSQSearch(self, k, nprobe, capacity, copy)

    def _scan_numba(self, q, coarse, lists, out_dist, out_rows, ranked, allowed, store) -> None:
        offset, scale, kind = kernel_arrays(self, self.sq)
        sq_lists = SQLists(
            store.offsets.numpy(),
            store.codes.numpy(),
            self._centroid_array(),
            self.by_residual,
            offset,
            scale,
        )
        probes, ip = lists.contiguous().numpy(), self.metric == "ip"
        out = TopK(out_dist.numpy(), out_rows.numpy())
        sq_kernels.sq_ivf_scan(q.contiguous().numpy(), sq_lists, kind, probes, allowed, ip, out)

    def range_hits(self, q, radius: float, allowed=None, nprobe=None, max_codes=None) -> list:
        """The probed lists' hits by the scan's distances on the codes
        (:func:`vq.kernels.exact.range_scans.sq_hits`), a block of queries (bounded probed rows) at
        a time."""
        ip, mask = self.metric == "ip", kernel_mask(self, allowed)
        lists = self.nearest_lists(q, self.effective_nprobe(nprobe))[1].numpy()
        qn, codes, offsets = q.contiguous().numpy(), self.codes.numpy(), self.offsets.numpy()
        offset, scale, kind = kernel_arrays(self, self.sq)
        sq_lists = SQLists(offsets, codes, self._centroid_array(), self.by_residual, offset, scale)

        def call(s, e, starts, t, rows, vals, counts):
            hits = RangeHits(starts, t, rows, vals, counts)
            sq_hits(qn[s:e], sq_lists, kind, lists[s:e], mask, ip, hits)

        return probed_hits(radius, ip, lists, self.list_sizes().numpy(), call, self._copy_ids())

    def _lean_kernel(self, store) -> tuple:
        offset, scale, kind = kernel_arrays(self, self.sq)
        sq_lists = SQLists(
            store.offsets.numpy(),
            store.codes.numpy(),
            self._centroid_array(),
            self.by_residual,
            offset,
            scale,
        )
        return sq_kernels.sq_ivf_lean, (plain(sq_lists), kind)


class IVFSQSearch(IVFSearch):
    """:class:`IVFSQ`'s search as a static-shape graph: the stored values of the probed lists'
    slots decoded (:func:`vq.quantizers.scalar_codes.decode_stored`), scored against the query
    (or, by residual, its residual to each probed centroid), plus the slot bias, then a top-k.

    Buffers (beyond :class:`IVFSearch`'s): values [n_rows, dim], in list order (levels as
    uint8, or float16 / bfloat16 values); vmin, vdiff: float32 [dim].
    """

    def __init__(self, index: IVFSQ, k=None, nprobe=None, capacity=None, copy: bool = True):
        super().__init__(index, k, nprobe, capacity, copy)
        self.bits, self.by_residual = index.sq.bits, index.by_residual
        self.register_buffer("values", stored_values(index.codes, index.dim, self.bits))
        self.register_buffer("vmin", kept(index.sq.vmin.float(), copy))
        self.register_buffer("vdiff", kept(index.sq.vdiff.float(), copy))

    def search(self, queries: torch.Tensor, k: int, nprobe=None, allowed=None, limit=None):
        """``allowed``: bool [ntotal] (False: skipped); ``limit``: int64 [B], the lists each
        query probes (<= nprobe; default all)."""
        nprobe = self.lists_probed(nprobe)
        _, lists = self.probe(queries, nprobe)
        rows = self.gather_lists(self.list_rows, lists)  # [B, C]
        picked = self.values.index_select(0, rows.clamp_min(0).reshape(-1))
        x = decode_stored(picked, self.vmin, self.vdiff, self.bits)
        b, d = queries.shape[0], self.dim
        x = x.reshape(b, nprobe, self.capacity, d)
        q = queries[:, None, None, :]
        if self.metric == "ip":
            scores = (x * q).sum(-1)
            if self.by_residual:  # ⟨q, c⟩ of each probe
                c = self.centroids.index_select(0, lists.reshape(-1)).reshape(b, nprobe, d)
                scores = scores + (c * queries[:, None, :]).sum(-1)[:, :, None]
            scores = -scores
        else:
            if self.by_residual:  # the query's residual to each probed centroid
                c = self.centroids.index_select(0, lists.reshape(-1)).reshape(b, nprobe, d)
                q = (queries[:, None, :] - c)[:, :, None, :]
            scores = ((q - x) ** 2).sum(-1)
        scores = scores.reshape(b, -1) + self.gather_lists(self.slot_bias, lists)
        bias = self.candidate_bias(lists, allowed, limit)
        scores = scores if bias is None else scores + bias
        return self.results(*self.top(scores, k, rows), k)

    def chunk_rows(self, k: int, nprobe: int | None = None) -> int:
        return max(1, (1 << 25) // (self.lists_probed(nprobe) * self.capacity * self.dim))


def _from_description(match, dim: int, metric: str) -> IVFSQ:
    args = ivf_arguments(match)
    return IVFSQ(dim, args.pop("nlist"), sq_bits(match["bits"]), metric=metric, **args)


register(
    IVFSQ,
    example="IVF16,SQ8",
    factory=IVF_FACTORY + "," + SQ_FACTORY,
    build=_from_description,
    syntax="IVF<nlist>,SQ<8|6|4|fp16|bf16>",
    family=IVF_FACTORY,
    faiss=("IndexIVFScalarQuantizer",),
)
