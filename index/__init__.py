"""ANN indexes built from the quantizers (installed as ``vq.index``).

:class:`FlatIndex` (exact), :class:`PQIndex` (ADC over PQ codes), :class:`IVFFlat` and
:class:`IVFPQ`, :class:`IVFSQ` (inverted lists), :class:`SQIndex` (scalar-quantizer
codes), :class:`PreTransform` (OPQ rotation in front of an index),
:class:`Refine` (exact re-ranking), :class:`HNSW` (graph); :func:`index_factory` builds them
from faiss-style strings,
``index.save`` / :func:`load_index` persist them, :func:`from_faiss` / :func:`to_faiss` convert.
Every index is a ``torch.nn.Module``: quantizers are submodules, stored data are buffers.

The modules, bottom to top (each imports only from those below it):

- knowing no index: ``locking`` (the readers-writer lock), ``fileformat`` (the file: safetensors
  + JSON metadata, checksums, atomic writes), ``lean`` (the lean path of small searches),
  ``static`` (what the static-shape searches share), ``searching`` (the general path's
  plumbing: options, results by id), ``fastscan`` (4-bit packed codes), ``faiss_build`` (what
  each kind's ``to_faiss`` uses), ``memory`` (the bytes a module tree holds: ``Index.nbytes``);
- ``base`` (:class:`Index`) and ``wrapper`` (indexes around another);
- the kinds, each with its static search, its consistency checks and its ``to_faiss``:
  ``flat``, ``pq``, ``sq``, ``hnsw``, ``ivf`` (what the IVF kinds share), ``ivfflat``,
  ``ivfpq``, ``ivfsq``, ``transform``, ``refine``;
- ``factory`` (:func:`index_factory`, configurations), then ``faiss_interop``
  (:func:`from_faiss`) and ``io`` (:func:`load_index`), which build indexes of every kind.
"""

from vq.index.base import Index
from vq.index.factory import index_factory
from vq.index.faiss_interop import from_faiss, to_faiss
from vq.index.filters import IdFilter
from vq.index.flat import FlatIndex
from vq.index.hnsw import HNSW
from vq.index.hnsw_sq import HNSWSQ
from vq.index.io import load_index
from vq.index.ivf import IVFIndex
from vq.index.ivfflat import IVFFlat
from vq.index.ivfpq import IVFPQ
from vq.index.ivfsq import IVFSQ
from vq.index.pq import PQIndex
from vq.index.refine import Refine
from vq.index.sq import SQIndex
from vq.index.transform import PreTransform

__all__ = [
    "IVFPQ",
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
    "Refine",
    "SQIndex",
    "from_faiss",
    "index_factory",
    "load_index",
    "to_faiss",
]
