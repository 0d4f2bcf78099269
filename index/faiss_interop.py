"""Indexes to and from faiss (``pip install 'vq[faiss]'``), for the types both have.

    >>> index = vq.index.from_faiss(faiss.read_index("my.faissindex"))   # then index.save(...)
    >>> findex = index.to_faiss()                                        # faiss.Index

Same trained parameters and stored codes on both sides give the same search results (ties
aside). Supported: IndexFlat (L2/IP), IndexPQ, IndexIVFFlat, IndexIVFPQ (flat coarse
quantizer), IndexScalarQuantizer and IndexIVFScalarQuantizer (QT_8bit, QT_6bit, QT_4bit,
QT_fp16, QT_bf16), IndexPreTransform with one OPQMatrix or PCAMatrix and / or an L2
NormalizationTransform first (faiss's ``"L2norm,"``: vq's ``normalize``), IndexRefineFlat,
IndexHNSWFlat, IndexHNSWSQ, IndexIDMap around Flat/PQ/HNSW
(what non-sequential ids need in faiss), and the 4-bit fast-scan IndexPQFastScan and
IndexIVFPQFastScan (even M).

:func:`from_faiss` must know every kind, so it sits here, above them; the other way, each kind
converts itself (``Index.to_faiss``, next to its class, on the pieces in
:mod:`vq.index.core.faiss_build`), and :func:`to_faiss` only calls it.
"""

from __future__ import annotations

import numpy as np
import torch

from vq.faiss_interop import (
    kmeans_index_from_centroids,
    opq_from_faiss,
    pq_from_faiss,
    pq_to_faiss,
    sq_from_faiss,
    unpack_codes,
)
from vq.index.core.base import Index
from vq.index.core.faiss_build import import_faiss
from vq.index.flat.flat_index import FlatIndex
from vq.index.flat.pq_index import PQIndex
from vq.index.flat.sq_index import SQIndex
from vq.index.graph.hnsw import HNSW
from vq.index.graph.hnsw_graph import graph_from_faiss
from vq.index.graph.hnsw_sq import hnswsq_from_faiss
from vq.index.ivf.ivf_index import IVFIndex
from vq.index.ivf.ivfflat import IVFFlat
from vq.index.ivf.ivfpq import IVFPQ
from vq.index.ivf.ivfsq import IVFSQ
from vq.index.wrappers.refine import Refine
from vq.index.wrappers.transform import PreTransform
from vq.kernels.fastscan import fastscan_scans as packed4
from vq.quantizers.pca import PCA


def _metric(findex) -> str:
    faiss = import_faiss()
    if findex.metric_type == faiss.METRIC_L2:
        return "l2"
    if findex.metric_type == faiss.METRIC_INNER_PRODUCT:
        return "ip"
    raise ValueError(
        f"only L2 and inner-product faiss indexes convert, got metric {findex.metric_type}"
    )


def _bytes(ptr, n: int) -> np.ndarray:
    return import_faiss().rev_swig_ptr(ptr, n).copy() if n else np.zeros(0, np.uint8)


def from_faiss(findex) -> Index:
    """A vq index holding the same parameters, vectors/codes and ids as a faiss index."""
    faiss = import_faiss()
    f = faiss.downcast_index(findex)
    if isinstance(f, faiss.IndexIDMap):
        inner = from_faiss(f.index)
        id_map = torch.from_numpy(faiss.vector_to_array(f.id_map).astype(np.int64))
        inner._renumber(id_map)
        return inner
    if isinstance(f, faiss.IndexPreTransform):
        chain = [faiss.downcast_VectorTransform(f.chain.at(i)) for i in range(f.chain.size())]
        normalize = bool(chain) and isinstance(chain[0], faiss.NormalizationTransform)
        if normalize and float(chain[0].norm) != 2.0:
            raise ValueError(f"only L2 normalisation converts, got norm {chain[0].norm}")
        if len(chain) - normalize > 1:
            raise ValueError(
                "only an IndexPreTransform with an L2 NormalizationTransform (first) and at "
                "most one OPQMatrix or PCAMatrix converts"
            )
        out = _pretransform(chain[-1], f.index) if len(chain) > normalize else from_faiss(f.index)
        out.normalize = out.normalize or normalize  # (faiss's "L2norm,": where vectors enter)
        return out
    if isinstance(f, faiss.IndexRefine):
        refine_index = faiss.downcast_index(f.refine_index)
        if not isinstance(refine_index, faiss.IndexFlat):
            raise ValueError("only IndexRefineFlat (exact re-ranking) converts")
        out = Refine(from_faiss(f.base_index), k_factor=max(1, round(f.k_factor)))
        out.vectors = torch.from_numpy(refine_index.reconstruct_n(0, refine_index.ntotal))
        return out
    metric = _metric(f)
    if isinstance(f, faiss.IndexHNSWFlat):
        return hnsw_from_faiss(f, metric)
    if isinstance(f, faiss.IndexHNSWSQ):
        return hnswsq_from_faiss(f, metric)
    if isinstance(f, faiss.IndexFlat):
        out = FlatIndex(f.d, metric)
        out.vectors = torch.from_numpy(
            f.reconstruct_n(0, f.ntotal) if f.ntotal else np.zeros((0, f.d), np.float32)
        )
    elif isinstance(f, faiss.IndexPQ):
        out = PQIndex(f.d, f.pq.M, f.pq.nbits, metric)
        out.pq = pq_from_faiss(f.pq)
        out.codes = _codes(faiss.vector_to_array(f.codes), f.pq)
    elif isinstance(f, faiss.IndexPQFastScan):
        out = PQIndex(f.d, f.pq.M, f.pq.nbits, metric, fast_scan=_fast_scan_M(f.pq) > 0)
        out.pq = pq_from_faiss(f.pq)
        raw = faiss.vector_to_array(f.codes).reshape(-1, f.M2 // 2, 32)
        out.codes = torch.from_numpy(packed4.unpack_codes(raw, f.ntotal))
    elif isinstance(f, faiss.IndexScalarQuantizer):
        out = SQIndex(f.d, 8, metric)
        out.sq = sq_from_faiss(f.sq)
        out.codes = torch.from_numpy(faiss.vector_to_array(f.codes).reshape(-1, f.code_size))
    elif isinstance(
        f,
        faiss.IndexIVFFlat
        | faiss.IndexIVFPQ
        | faiss.IndexIVFPQFastScan
        | faiss.IndexIVFScalarQuantizer,
    ):
        return _ivf_from_faiss(f, metric)
    else:
        raise ValueError(f"faiss {type(f).__name__} has no vq counterpart")
    return out


def _pretransform(matrix, findex) -> PreTransform:
    """A :class:`PreTransform` of the faiss ``OPQMatrix`` or ``PCAMatrix`` ``matrix`` in front
    of the faiss index ``findex``, converted."""
    faiss = import_faiss()
    if isinstance(matrix, faiss.PCAMatrix):
        return PreTransform(PCA.from_faiss(matrix), from_faiss(findex))
    if not isinstance(matrix, faiss.OPQMatrix):
        raise ValueError(
            f"only OPQMatrix and PCAMatrix pre-transforms convert, got {type(matrix).__name__}"
        )
    inner = from_faiss(findex)
    pq = getattr(inner, "pq", None)
    fpq = pq_to_faiss(pq) if pq is not None else faiss.ProductQuantizer(matrix.d_out, matrix.M, 8)
    return PreTransform(opq_from_faiss(matrix, fpq), inner)


def _fast_scan_M(fpq) -> int:
    if fpq.M % 2:
        raise ValueError(
            f"vq's fast-scan packs sub-quantizers in pairs; this faiss index has M={fpq.M}"
        )
    return fpq.M


def _codes(raw: np.ndarray, fpq) -> torch.Tensor:
    """faiss's packed PQ codes → [n, M] codes."""
    return torch.from_numpy(unpack_codes(raw, fpq.M, fpq.nbits))


def _ivf_from_faiss(f, metric: str) -> IVFIndex:
    faiss = import_faiss()
    quantizer = faiss.downcast_index(f.quantizer)
    routed_by_graph = isinstance(quantizer, faiss.IndexHNSWFlat)
    graph = hnsw_from_faiss(quantizer, metric) if routed_by_graph else None
    if graph is None and not isinstance(quantizer, faiss.IndexFlat):
        raise ValueError(
            "only IVF indexes with a flat or HNSW-flat coarse quantizer convert, got "
            f"{type(quantizer).__name__}"
        )
    routed = {"coarse_hnsw": graph.M} if graph is not None else {}
    fast_scan = isinstance(f, faiss.IndexIVFPQFastScan)
    if fast_scan or isinstance(f, faiss.IndexIVFPQ):
        out: IVFIndex = IVFPQ(
            f.d,
            f.nlist,
            f.pq.M,
            f.pq.nbits,
            f.by_residual,
            metric,
            nprobe=f.nprobe,
            fast_scan=fast_scan and _fast_scan_M(f.pq) > 0,
            **routed,
        )
        out.pq = pq_from_faiss(f.pq)
    elif isinstance(f, faiss.IndexIVFScalarQuantizer):
        out = IVFSQ(f.d, f.nlist, 8, f.by_residual, metric, nprobe=f.nprobe)
        out.sq = sq_from_faiss(f.sq)
    else:
        out = IVFFlat(f.d, f.nlist, metric, nprobe=f.nprobe, **routed)
    if graph is not None:
        out.coarse_graph = graph
        out.quantizer = kmeans_index_from_centroids(graph.vectors.numpy())
    else:
        out.quantizer = kmeans_index_from_centroids(quantizer.reconstruct_n(0, f.nlist))
    invlists = f.invlists
    sizes = np.array([invlists.list_size(i) for i in range(f.nlist)], dtype=np.int64)
    if fast_scan:  # block-packed lists, 32 vectors a block: 16 bytes per pair of codes
        pairs = -(-f.pq.M // 2)
        codes = [
            packed4.unpack_codes(
                _bytes(invlists.get_codes(i), -(-int(s) // 32) * 32 * pairs).reshape(-1, pairs, 32),
                int(s),
            )
            for i, s in enumerate(sizes)
        ]
    else:
        code_size = invlists.code_size
        codes = [_bytes(invlists.get_codes(i), int(s) * code_size) for i, s in enumerate(sizes)]
    ids = [
        faiss.rev_swig_ptr(invlists.get_ids(i), int(s)).copy() if s else np.zeros(0, np.int64)
        for i, s in enumerate(sizes)
    ]
    if fast_scan:
        out.codes = torch.from_numpy(np.concatenate(codes)[:, : f.pq.M])
    elif isinstance(out, IVFPQ):
        out.codes = _codes(np.concatenate(codes) if codes else np.zeros(0, np.uint8), f.pq)
    elif isinstance(out, IVFSQ):
        raw = np.concatenate(codes) if codes else np.zeros(0, np.uint8)
        out.codes = torch.from_numpy(raw.reshape(-1, f.code_size))
    else:
        raw = np.concatenate(codes) if codes else np.zeros(0, np.uint8)
        out.vectors = torch.from_numpy(raw.view(np.float32).reshape(-1, f.d))
    out.ids = torch.from_numpy(np.concatenate(ids).astype(np.int64))
    out.offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64))
    return out


def to_faiss(index: Index):
    """The faiss index equivalent to ``index`` (parameters, stored data, ids, nprobe):
    ``index.to_faiss()``, which each kind implements for itself."""
    return index.to_faiss()


def hnsw_from_faiss(f, metric: str) -> HNSW:
    """An :class:`HNSW` with the graph, vectors, entry point, efConstruction and efSearch of
    the faiss ``IndexHNSWFlat`` ``f`` (its ``storage`` an ``IndexFlat``)."""
    faiss = import_faiss()
    storage = faiss.downcast_index(f.storage)
    if not isinstance(storage, faiss.IndexFlat):
        raise ValueError(f"only IndexHNSWFlat converts, got storage {type(storage).__name__}")
    M, nbr0, levels, up_off, up_nbr, entry = graph_from_faiss(faiss, f)
    h = f.hnsw
    out = HNSW(f.d, M, metric, efConstruction=int(h.efConstruction), efSearch=int(h.efSearch))
    n = f.ntotal
    data = storage.reconstruct_n(0, n) if n else np.zeros((0, f.d), np.float32)
    out._set_graph(data, nbr0, levels, up_off, up_nbr, entry, torch.device("cpu"))
    out.check_consistent()
    return out
