"""vq: PyTorch-native vector quantization and ANN search.

>>> import vq
>>> pq = vq.ProductQuantizer(dim=128, M=16).fit(x)
>>> codes = pq.encode(x)            # uint8 [n, 16]
>>> x_hat = pq.decode(codes)        # float32 [n, 128]
"""

import os as _os

# torch and numba each bring an OpenMP runtime; with the default active wait, one's threads
# spin after every parallel region and starve the other's, and a search alternates torch and
# numba steps (a small IVF search ran 10x slower on 2 cores). Passive waiting fixes it; it
# only applies to runtimes loaded after this line, and an explicit setting is kept.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from vq.clustering import KMeansResult, kmeans, lbg  # noqa: E402
from vq.index import (
    IVFPQ,
    FlatIndex,
    IVFFlat,
    PQIndex,
    PreTransform,
    Refine,
    index_factory,
    load_index,
)
from vq.quantizers import (
    EMA,
    FSQ,
    OPQ,
    Gradient,
    Learning,
    ProductQuantizer,
    Quantizer,
    QuantizerOutput,
    ResidualVQ,
    VectorQuantizer,
)

__version__ = "0.1.0"

__all__ = [
    "EMA",
    "FSQ",
    "IVFPQ",
    "OPQ",
    "FlatIndex",
    "Gradient",
    "IVFFlat",
    "PQIndex",
    "PreTransform",
    "Refine",
    "KMeansResult",
    "Learning",
    "ProductQuantizer",
    "Quantizer",
    "QuantizerOutput",
    "ResidualVQ",
    "VectorQuantizer",
    "index_factory",
    "kmeans",
    "lbg",
    "load_index",
]
