"""ANN indexes built from the quantizers (installed as ``vq.index``).

:class:`FlatIndex` (exact), :class:`PQIndex` (ADC over PQ codes), :class:`IVFFlat` and
:class:`IVFPQ` (inverted lists). Every index is a ``torch.nn.Module``: quantizers are
submodules, stored data are buffers.
"""

from vq.index.base import Index
from vq.index.flat import FlatIndex
from vq.index.ivf import IVFFlat, IVFIndex
from vq.index.ivfpq import IVFPQ
from vq.index.pq import PQIndex

__all__ = ["IVFPQ", "FlatIndex", "IVFFlat", "IVFIndex", "Index", "PQIndex"]
