"""ANN indexes built from the quantizers (installed as ``vq.index``).

:class:`FlatIndex` (exact), :class:`PQIndex` (ADC over PQ codes), :class:`IVFFlat` and
:class:`IVFPQ` (inverted lists), :class:`PreTransform` (OPQ rotation in front of an index),
:class:`Refine` (exact re-ranking); :func:`index_factory` builds them from faiss-style strings,
``index.save`` / :func:`load_index` persist them, :func:`from_faiss` / :func:`to_faiss` convert.
Every index is a ``torch.nn.Module``: quantizers are submodules, stored data are buffers.
"""

from vq.index.base import Index
from vq.index.factory import index_factory
from vq.index.faiss_interop import from_faiss, to_faiss
from vq.index.flat import FlatIndex
from vq.index.io import load_index
from vq.index.ivf import IVFFlat, IVFIndex
from vq.index.ivfpq import IVFPQ
from vq.index.pq import PQIndex
from vq.index.refine import Refine
from vq.index.transform import PreTransform

__all__ = [
    "IVFPQ",
    "FlatIndex",
    "IVFFlat",
    "IVFIndex",
    "Index",
    "PQIndex",
    "PreTransform",
    "Refine",
    "from_faiss",
    "index_factory",
    "load_index",
    "to_faiss",
]
