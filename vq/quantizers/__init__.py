"""The quantizers, all ``torch.nn.Module``s with one interface (see :class:`Quantizer`: an
offline codec, :mod:`.codec`, and a training layer, :mod:`.layer`), and how their codebooks
learn when they train as layers (:class:`EMA`, :class:`Gradient`)."""

from vq.quantizers.base import Quantizer
from vq.quantizers.fsq import FSQ
from vq.quantizers.layer import QuantizerOutput
from vq.quantizers.learning import EMA, Gradient, Learning
from vq.quantizers.opq import OPQ
from vq.quantizers.product import ProductQuantizer
from vq.quantizers.residual import ResidualVQ
from vq.quantizers.scalar import ScalarQuantizer
from vq.quantizers.vector import VectorQuantizer

__all__ = [
    "EMA",
    "FSQ",
    "OPQ",
    "Gradient",
    "Learning",
    "ProductQuantizer",
    "Quantizer",
    "QuantizerOutput",
    "ResidualVQ",
    "ScalarQuantizer",
    "VectorQuantizer",
]
