"""The quantizers, all ``torch.nn.Module``s with one interface (see :class:`Quantizer`: an
offline codec, :mod:`.codec`, and a training layer, :mod:`.layer`), and how their codebooks
learn when they train as layers (:class:`EMA`, :class:`Gradient`, :class:`SimVQ`)."""

from vq.quantizers.base import Quantizer
from vq.quantizers.fsq import FSQ
from vq.quantizers.grouped import GroupedResidualVQ
from vq.quantizers.layer import QuantizerOutput
from vq.quantizers.learning import EMA, Gradient, Learning, SimVQ
from vq.quantizers.lfq import LFQ
from vq.quantizers.opq import OPQ
from vq.quantizers.pca import PCA
from vq.quantizers.product import ProductQuantizer
from vq.quantizers.rabitq import RaBitQ, RaBitQCodes
from vq.quantizers.residual import ResidualVQ
from vq.quantizers.residual_scalar import ResidualFSQ, ResidualLFQ
from vq.quantizers.scalar import ScalarQuantizer
from vq.quantizers.vector import VectorQuantizer

__all__ = [
    "EMA",
    "FSQ",
    "OPQ",
    "PCA",
    "Gradient",
    "GroupedResidualVQ",
    "LFQ",
    "Learning",
    "ProductQuantizer",
    "Quantizer",
    "QuantizerOutput",
    "RaBitQ",
    "RaBitQCodes",
    "ResidualFSQ",
    "ResidualLFQ",
    "ResidualVQ",
    "ScalarQuantizer",
    "SimVQ",
    "VectorQuantizer",
]
