"""ANN indexes built from the quantizers (installed as ``vq.index``).

:class:`FlatIndex` (exact), :class:`PQIndex` (ADC over PQ codes), :class:`IVFFlat` and
:class:`IVFPQ`, :class:`IVFSQ`, :class:`IVFRaBitQ` (inverted lists), :class:`SQIndex`
(scalar-quantizer codes), :class:`RaBitQIndex` (1-bit RaBitQ codes), :class:`PreTransform`
(OPQ rotation in front of an index),
:class:`Refine` (exact re-ranking), :class:`HNSW` (graph); :func:`index_factory` builds them
from faiss-style strings,
``index.save`` / :func:`load_index` persist them, :func:`from_faiss` / :func:`to_faiss` convert.
Every index is a ``torch.nn.Module``: quantizers are submodules, stored data are buffers.

The packages, bottom to top (each imports only from those below it; docs/architecture.md):

- ``core``: what every kind shares — the readers-writer lock, the index file (safetensors +
  JSON metadata, checksums, atomic writes) and mapped files, the lean path of small searches,
  the static-shape searchers' common parts, the general path's plumbing, filters, range search,
  4-bit packed codes, what each kind's ``to_faiss`` uses, the bytes a module tree holds, the
  registry of kinds (``core.registry``); then :class:`Index` (``core.base``: the contract a
  kind implements), its searches and engine switch (``core.search_paths``) and its writes to
  the stored rows (``core.updates``);
- the kinds, each with its static search, its consistency checks, its faiss conversions and
  its registration: ``flat`` (FlatIndex, PQIndex, SQIndex), ``ivf`` (IVFIndex, what the IVF
  kinds share: lists, probing, spilling, sketches, the lean search; IVFFlat, IVFPQ, IVFSQ),
  ``graph`` (HNSW, HNSWSQ) and ``wrappers`` (PreTransform, Refine);
- ``factory`` (:func:`index_factory`, configurations), then ``faiss_interop``
  (:func:`from_faiss`) and ``io`` (:func:`load_index`), which build indexes of every
  registered kind.
"""

from vq.index.core.base import Index
from vq.index.core.filters import IdFilter
from vq.index.factory import index_factory
from vq.index.faiss_interop import from_faiss, to_faiss
from vq.index.flat.flat_index import FlatIndex
from vq.index.flat.pq_index import PQIndex
from vq.index.flat.rabitq_index import RaBitQIndex
from vq.index.flat.sq_index import SQIndex
from vq.index.graph.hnsw import HNSW
from vq.index.graph.hnsw_sq import HNSWSQ
from vq.index.io import load_index
from vq.index.ivf.ivf_index import IVFIndex
from vq.index.ivf.ivf_rabitq import IVFRaBitQ
from vq.index.ivf.ivfflat import IVFFlat
from vq.index.ivf.ivfpq import IVFPQ
from vq.index.ivf.ivfsq import IVFSQ
from vq.index.wrappers.refine import Refine
from vq.index.wrappers.transform import PreTransform

__all__ = [
    "IVFPQ",
    "IVFRaBitQ",
    "IVFSQ",
    "FlatIndex",
    "IdFilter",
    "HNSW",
    "HNSWSQ",
    "IVFFlat",
    "IVFIndex",
    "Index",
    "PQIndex",
    "PreTransform",
    "RaBitQIndex",
    "Refine",
    "SQIndex",
    "from_faiss",
    "index_factory",
    "load_index",
    "to_faiss",
]
