"""HNSW over scalar-quantizer codes, no float vectors kept (faiss ``IndexHNSWSQ``, factory
``"HNSW32,SQ8"``, ``"HNSW32,SQ4"``, ``"HNSW32,SQfp16"``, ``"HNSW32,SQbf16"``).

The graph is :class:`vq.HNSW`'s; the nodes are stored as :class:`vq.ScalarQuantizer` codes
(faiss's bytes: ``dim`` bytes per vector at 8 bits, ``2 * dim`` for fp16 / bf16), the search
walks the graph with the distances of :mod:`vq.kernels.sq.sq_scans` (a query against codes) and
returns those distances, as faiss does. The insertion compares decoded vectors (the stored
codes and the batch's, decoded for the time of an ``add``: ``4 * dim`` bytes per vector of
temporary memory), so that the graph links what the search will see. Memory per vector:
the codes plus the graph (``8M + 4`` bytes on level 0, and about ``4M / (M - 1)`` for the
upper levels), against ``4 * dim`` plus the graph for :class:`vq.HNSW`.
"""

from __future__ import annotations

import numpy as np
import torch

from vq.faiss_interop import sq_from_faiss
from vq.index.core.faiss_build import faiss_metric, import_faiss, with_id_map
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
from vq.index.graph.hnsw import HNSW
from vq.index.graph.hnsw_graph import graph_from_faiss, hnsw_to_faiss
from vq.index.graph.hnsw_searcher import HNSWSearch
from vq.quantizers.scalar_codes import decode_stored, stored_values


class HNSWSQSearch(HNSWSearch):
    """:class:`HNSWSQ`'s static search (:class:`vq.index.graph.hnsw_searcher.HNSWSearch`) over the
    codes: the nodes a step scores are gathered as stored levels (or fp16 / bf16 values) and
    decoded there (:func:`vq.quantizers.scalar_codes.decode_stored`), the distances those of
    the decoded codes, as the kernel's; no float32 copy of the vectors is held.

    Buffers: values uint8 (float16 / bfloat16) [ntotal, dim]; vmin, vdiff float32 [dim]; the
    graph buffers of :class:`HNSWSearch` (no ``vectors``).
    """

    def register_nodes(self, index, copy: bool) -> None:
        self.bits = index.sq.bits
        self.register_buffer("values", stored_values(index.codes, index.dim, self.bits))
        self.register_buffer("vmin", kept(index.sq.vmin.float(), copy))
        self.register_buffer("vdiff", kept(index.sq.vdiff.float(), copy))

    def node_vectors(self, rows: torch.Tensor) -> torch.Tensor:
        values = self.values.index_select(0, rows)
        return decode_stored(values, self.vmin, self.vdiff, self.bits)


class HNSWSQ(HNSW):
    """HNSW graph over scalar-quantizer codes (faiss ``IndexHNSWSQ``).

    Args:
        dim, M, metric, k, efConstruction, efSearch, seed, verbose: as :class:`vq.HNSW`.
        bits: 8, 6, 4, "fp16" or "bf16" (see :class:`vq.ScalarQuantizer`; 8, 6 and 4 need
            ``train``).
        margin: widen the trained ranges (see :class:`vq.ScalarQuantizer`).

    Submodules and buffers: ``sq``, the quantizer; ``codes`` uint8 [ntotal, code_size]; the
    graph buffers of :class:`vq.HNSW` (``vectors`` stays empty).
    """

    static_search = HNSWSQSearch  #: the class of :meth:`searcher`

    def __init__(
        self,
        dim: int,
        M: int = 32,
        bits: int | str = 8,
        metric: str = "l2",
        k: int = 10,
        efConstruction: int = 40,
        efSearch: int = 16,
        seed: int = 12345,
        verbose: bool = False,
        *,
        margin: float = 0.0,
    ):
        super().__init__(dim, M, metric, k, efConstruction, efSearch, seed, verbose)
        self.sq = sq_quantizer(dim, bits, margin)
        self.register_buffer("codes", torch.zeros(0, self.sq.code_size, dtype=torch.uint8))

    @property
    def is_trained(self) -> bool:
        return self.sq.is_trained

    @property
    def bits(self) -> int | str:
        return self.sq.bits

    @property
    def ntotal(self) -> int:
        return int(self.codes.shape[0])

    def config(self) -> dict:
        out = {**super().config(), **self.sq.config()}
        del out["traversal"]
        return out

    def growing_buffers(self) -> tuple[str, ...]:
        return (*super().growing_buffers(), "codes")

    def learn(self, x: torch.Tensor) -> None:
        self.sq.fit(x)

    def encode_batch(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"codes": self.sq.encode_rows(x).to(torch.uint8)}

    def _build_vectors(self, encoded: dict[str, torch.Tensor]) -> np.ndarray:
        codes = torch.cat([self.codes, encoded["codes"].to(self.codes.device)])
        return self.sq.decode(codes).float().cpu().contiguous().numpy()

    def _keep_batch(self, encoded: dict[str, torch.Tensor], data: np.ndarray) -> None:
        self.codes = torch.cat([self.codes, encoded["codes"].to(self.codes.device)])

    def _stored_rows(self) -> dict[str, torch.Tensor]:
        return {"codes": self.codes}

    def decode_rows(self, rows: torch.Tensor) -> torch.Tensor:
        return self.sq.decode(self.codes[rows.to(self.device)]).float()

    def _storage_problem(self) -> str | None:
        if self.vectors.shape[0]:
            return f"{self.vectors.shape[0]} float vectors (HNSWSQ keeps codes only)"
        return codes_problem(self.codes, self.ntotal, self.sq)

    def _search_store(self) -> tuple:
        empty = np.zeros((0, self.dim), np.float32)
        offset, scale, kind = kernel_arrays(self, self.sq)
        return empty, self.codes.cpu().contiguous().numpy(), offset, scale, kind

    def vector_ns(self) -> float:
        return self.dim / 8

    def faiss_counterpart(self):
        """faiss ``IndexHNSWSQ`` with the same graph, ranges and codes (in an ``IndexIDMap``
        unless the ids are 0 … ntotal - 1)."""
        faiss = import_faiss()
        qtype, metric = sq_faiss_type(self.sq), faiss_metric(self.metric)
        out = faiss.IndexHNSWSQ(self.dim, qtype, self.M, metric)
        hnsw_to_faiss(self, faiss, out.hnsw)
        storage = faiss.downcast_index(out.storage)
        copy_ranges(self.sq, storage.sq)
        storage.is_trained = out.is_trained = True
        faiss.copy_array_to_vector(self.codes.cpu().numpy().ravel(), storage.codes)
        storage.ntotal = out.ntotal = self.ntotal
        return with_id_map(out, self.stored_ids())

    @classmethod
    def from_faiss(cls, f, metric: str) -> HNSWSQ:
        """The HNSWSQ of a faiss ``IndexHNSWSQ`` (see :func:`hnswsq_from_faiss`)."""
        return hnswsq_from_faiss(f, metric)


register(
    HNSWSQ,
    example="HNSW16,SQ8",
    factory=r"HNSW(\d+)," + SQ_FACTORY,
    build=lambda m, dim, metric: HNSWSQ(dim, int(m[1]), sq_bits(m["bits"]), metric),
    syntax="HNSW<M>,SQ8|SQ6|SQ4|SQfp16|SQbf16",
    faiss=("IndexHNSWSQ",),
)


def hnswsq_from_faiss(f, metric: str) -> HNSWSQ:
    """An :class:`HNSWSQ` with the graph, ranges, codes, entry point, efConstruction and
    efSearch of the faiss ``IndexHNSWSQ`` ``f``."""
    faiss = import_faiss()
    storage = faiss.downcast_index(f.storage)
    if not isinstance(storage, faiss.IndexScalarQuantizer):
        raise ValueError(f"only IndexHNSWSQ converts, got storage {type(storage).__name__}")
    sq = sq_from_faiss(storage.sq)
    M, nbr0, levels, up_off, up_nbr, entry = graph_from_faiss(faiss, f)
    h = f.hnsw
    out = HNSWSQ(
        f.d, M, sq.bits, metric, efConstruction=int(h.efConstruction), efSearch=int(h.efSearch)
    )
    out.sq = sq
    codes = faiss.vector_to_array(storage.codes).reshape(f.ntotal, sq.code_size)
    out.codes = torch.from_numpy(codes.copy())
    out._set_graph(None, nbr0, levels, up_off, up_nbr, entry, torch.device("cpu"))
    out.check_consistent()
    return out
