"""vq: PyTorch-native vector quantization and ANN search.

>>> import vq
>>> pq = vq.ProductQuantizer(dim=128, M=16).fit(x)
>>> codes = pq.encode(x)            # uint8 [n, 16]
>>> x_hat = pq.decode(codes)        # float32 [n, 128]
"""

import os as _os

# OpenMP threads that finished a parallel region wait for the next one. libgomp's default is
# to spin for a long while (~300,000 rounds), which starves other runtimes' threads on a small
# machine (faiss brings its own libgomp); passive waiting puts them to sleep at once, and each
# parallel kernel then pays tens of µs to wake them (an IVF search runs several: 1.3x slower
# at 1M vectors, 2x at 3,300). A short spin keeps the threads awake between the kernels of
# one search and asleep between searches. Only runtimes loaded after this line see it, and
# an explicit OMP_WAIT_POLICY or GOMP_SPINCOUNT is kept.
if "OMP_WAIT_POLICY" not in _os.environ and "GOMP_SPINCOUNT" not in _os.environ:
    _os.environ["GOMP_SPINCOUNT"] = "10000"

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
