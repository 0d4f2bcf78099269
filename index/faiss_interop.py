"""Indexes to and from faiss (``pip install 'vq[faiss]'``), for the types both have.

    >>> index = vq.index.from_faiss(faiss.read_index("my.faissindex"))   # then index.save(...)
    >>> findex = index.to_faiss()                                        # faiss.Index

Same trained parameters and stored codes on both sides give the same search results (ties
aside). Supported: IndexFlat (L2/IP), IndexPQ, IndexIVFFlat, IndexIVFPQ (flat coarse
quantizer), IndexScalarQuantizer and IndexIVFScalarQuantizer (QT_8bit, QT_6bit, QT_4bit,
QT_fp16, QT_bf16), IndexRaBitQ (1 bit; behind a RandomRotationMatrix or an orthogonal
LinearTransform too, which becomes the RaBitQIndex's rotation), IndexPreTransform with one
OPQMatrix or PCAMatrix and / or an L2 NormalizationTransform first (faiss's ``"L2norm,"``:
vq's ``normalize``), IndexRefineFlat,
IndexHNSWFlat, IndexHNSWSQ, IndexIDMap around Flat/PQ/HNSW
(what non-sequential ids need in faiss), and the 4-bit fast-scan IndexPQFastScan and
IndexIVFPQFastScan (even M).

:func:`from_faiss` unwraps faiss's wrappers (IndexIDMap, IndexPreTransform, IndexRefine) and
finds the kind of what they wrap in the registry (:mod:`vq.index.core.registry`: each kind
names the faiss classes its ``from_faiss`` converts); the other way, each kind converts itself
(``Index.to_faiss``, next to its class, on the pieces in :mod:`vq.index.core.faiss_build`),
and :func:`to_faiss` only calls it.
"""

from __future__ import annotations

import numpy as np
import torch

from vq.faiss_interop import opq_from_faiss, pq_to_faiss
from vq.index.core.base import Index
from vq.index.core.faiss_build import import_faiss, metric_of
from vq.index.core.registry import kinds
from vq.index.wrappers.refine import Refine
from vq.index.wrappers.transform import PreTransform
from vq.quantizers.pca import PCA


def from_faiss(findex) -> Index:
    """A vq index holding the same parameters, vectors/codes and ids as a faiss index."""
    faiss = import_faiss()
    f = faiss.downcast_index(findex)
    if isinstance(f, faiss.IndexIDMap):
        inner = from_faiss(f.index)
        id_map = torch.from_numpy(faiss.vector_to_array(f.id_map).astype(np.int64))
        inner.renumber(id_map)
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
    for kind in kinds():
        if any(isinstance(f, getattr(faiss, name)) for name in kind.faiss):
            return kind.cls.from_faiss(f, metric_of(f))
    raise ValueError(f"faiss {type(f).__name__} has no vq counterpart")


def _pretransform(matrix, findex) -> Index:
    """A :class:`PreTransform` of the faiss ``OPQMatrix`` or ``PCAMatrix`` ``matrix`` in front
    of the faiss index ``findex``, converted; or, for a square ``RandomRotationMatrix`` /
    ``LinearTransform`` before an ``IndexRaBitQ``, the RaBitQIndex holding it as its own
    rotation (``take_rotation``)."""
    faiss = import_faiss()
    if isinstance(matrix, faiss.PCAMatrix):
        return PreTransform(PCA.from_faiss(matrix), from_faiss(findex))
    square = type(matrix) in (faiss.RandomRotationMatrix, faiss.LinearTransform)
    if square and matrix.d_in == matrix.d_out and not matrix.have_bias:
        inner = from_faiss(findex)
        take_rotation = getattr(inner, "take_rotation", None)  # (RaBitQIndex: "RR,RaBitQ")
        if take_rotation is not None:
            a = faiss.vector_to_array(matrix.A).reshape(matrix.d_out, matrix.d_in)
            take_rotation(torch.from_numpy(a.T.copy()))
            return inner
    if not isinstance(matrix, faiss.OPQMatrix):
        raise ValueError(
            f"only OPQMatrix and PCAMatrix pre-transforms convert, got {type(matrix).__name__}"
        )
    inner = from_faiss(findex)
    pq = getattr(inner, "pq", None)
    fpq = pq_to_faiss(pq) if pq is not None else faiss.ProductQuantizer(matrix.d_out, matrix.M, 8)
    return PreTransform(opq_from_faiss(matrix, fpq), inner)


def to_faiss(index: Index):
    """The faiss index equivalent to ``index`` (parameters, stored data, ids, nprobe):
    ``index.to_faiss()``, which each kind implements for itself."""
    return index.to_faiss()
