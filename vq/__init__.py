"""vq: PyTorch-native vector quantization and ANN search.

>>> import vq
>>> pq = vq.ProductQuantizer(dim=128, M=16).fit(x)
>>> codes = pq.encode(x)            # uint8 [n, 16]
>>> x_hat = pq.decode(codes)        # float32 [n, 128]
"""

import vq._openmp  # noqa: F401  (first: an OpenMP setting that must precede torch)
from vq._version import __version__ as __version__
from vq.clustering import KMeansResult, kmeans, lbg
from vq.index import (
    HNSW,
    HNSWSQ,
    IVFPQ,
    IVFSQ,
    FlatIndex,
    IdFilter,
    IVFFlat,
    PQIndex,
    PreTransform,
    Refine,
    SQIndex,
    index_factory,
    load_index,
)
from vq.kernels.threads import get_num_threads, set_num_threads
from vq.quantizers import (
    EMA,
    FSQ,
    LFQ,
    OPQ,
    PCA,
    Gradient,
    GroupedResidualVQ,
    Learning,
    ProductQuantizer,
    Quantizer,
    QuantizerOutput,
    ResidualFSQ,
    ResidualLFQ,
    ResidualVQ,
    ScalarQuantizer,
    SimVQ,
    VectorQuantizer,
)

__all__ = [
    "EMA",
    "FSQ",
    "IVFPQ",
    "IVFSQ",
    "OPQ",
    "PCA",
    "FlatIndex",
    "IdFilter",
    "HNSW",
    "HNSWSQ",
    "Gradient",
    "GroupedResidualVQ",
    "IVFFlat",
    "PQIndex",
    "PreTransform",
    "Refine",
    "SQIndex",
    "KMeansResult",
    "LFQ",
    "Learning",
    "ProductQuantizer",
    "Quantizer",
    "QuantizerOutput",
    "ResidualFSQ",
    "ResidualLFQ",
    "ResidualVQ",
    "ScalarQuantizer",
    "SimVQ",
    "VectorQuantizer",
    "get_num_threads",
    "index_factory",
    "kmeans",
    "lbg",
    "load_index",
    "set_num_threads",
]
