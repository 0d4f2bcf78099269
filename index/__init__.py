"""ANN indexes built from the quantizers (installed as ``vq.index``).

So far: :class:`FlatIndex` (exact) and :class:`PQIndex` (ADC over PQ codes). IVF, OPQ
pre-transform, re-ranking, the factory and persistence come with the rest of the index work.
"""

from vq.index.base import Index
from vq.index.flat import FlatIndex
from vq.index.pq import PQIndex

__all__ = ["FlatIndex", "Index", "PQIndex"]
