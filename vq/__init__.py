"""vq: PyTorch-native vector quantization and ANN search.

>>> import vq
>>> pq = vq.ProductQuantizer(dim=128, M=16).fit(x)
>>> codes = pq.encode(x)            # uint8 [n, 16]
>>> x_hat = pq.decode(codes)        # float32 [n, 128]

The names below are imported on first use (``vq.IVFPQ``, ``from vq import kmeans``), so that
``import vq`` itself costs neither torch nor numba: a program that only needs a submodule, or
the ``vq`` command answering ``--help``, starts in a fraction of a second. Submodules
(``vq.index``, ``vq.datasets``, ...) load the same way on first attribute access. (The
torch operator ``torch.ops.vq.kmeans_init``, which a compiled quantizer layer's training step
calls, is registered when :mod:`vq.quantizers` loads: use a quantizer name, or import it, before
loading a saved program that calls the operator.)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

import vq._openmp  # noqa: F401  (first: an OpenMP setting that must precede torch)
from vq._version import __version__ as __version__

#: each public name and the module that defines it (loaded when the name is first used)
_EXPORTS = {
    "KMeansResult": "vq.clustering",
    "kmeans": "vq.clustering",
    "lbg": "vq.clustering",
    "FlatIndex": "vq.index",
    "HNSW": "vq.index",
    "HNSWSQ": "vq.index",
    "IVFFlat": "vq.index",
    "IVFPQ": "vq.index",
    "IVFRaBitQ": "vq.index",
    "IVFSQ": "vq.index",
    "IdFilter": "vq.index",
    "PQIndex": "vq.index",
    "PreTransform": "vq.index",
    "RaBitQIndex": "vq.index",
    "Refine": "vq.index",
    "SQIndex": "vq.index",
    "index_factory": "vq.index",
    "load_index": "vq.index",
    "get_num_threads": "vq.kernels.common.threads",
    "set_num_threads": "vq.kernels.common.threads",
    "EMA": "vq.quantizers",
    "FSQ": "vq.quantizers",
    "Gradient": "vq.quantizers",
    "GroupedResidualVQ": "vq.quantizers",
    "LFQ": "vq.quantizers",
    "Learning": "vq.quantizers",
    "OPQ": "vq.quantizers",
    "PCA": "vq.quantizers",
    "ProductQuantizer": "vq.quantizers",
    "Quantizer": "vq.quantizers",
    "QuantizerOutput": "vq.quantizers",
    "RaBitQ": "vq.quantizers",
    "ResidualFSQ": "vq.quantizers",
    "ResidualLFQ": "vq.quantizers",
    "ResidualVQ": "vq.quantizers",
    "ScalarQuantizer": "vq.quantizers",
    "SimVQ": "vq.quantizers",
    "VectorQuantizer": "vq.quantizers",
}

__all__ = [
    "EMA",
    "FSQ",
    "IVFPQ",
    "IVFRaBitQ",
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
    "RaBitQ",
    "RaBitQIndex",
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


def __getattr__(name: str) -> Any:
    """The public name or submodule ``name``, imported now and kept (PEP 562)."""
    module = _EXPORTS.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value
        return value
    if not name.startswith("__"):
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as err:
            if err.name != f"{__name__}.{name}":
                raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if TYPE_CHECKING:  # what static tools see: the imports as they run on first use
    from vq.clustering import KMeansResult, kmeans, lbg
    from vq.index import (
        HNSW,
        HNSWSQ,
        IVFPQ,
        IVFSQ,
        FlatIndex,
        IdFilter,
        IVFFlat,
        IVFRaBitQ,
        PQIndex,
        PreTransform,
        RaBitQIndex,
        Refine,
        SQIndex,
        index_factory,
        load_index,
    )
    from vq.kernels.common.threads import get_num_threads, set_num_threads
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
        RaBitQ,
        ResidualFSQ,
        ResidualLFQ,
        ResidualVQ,
        ScalarQuantizer,
        SimVQ,
        VectorQuantizer,
    )
