"""The four quantizers, all ``torch.nn.Module``s with one interface (see :class:`Quantizer`)."""

from vq.quantizers.base import Quantizer, QuantizerOutput
from vq.quantizers.opq import OPQ
from vq.quantizers.product import ProductQuantizer
from vq.quantizers.residual import ResidualVQ
from vq.quantizers.vector import VectorQuantizer

__all__ = [
    "OPQ",
    "ProductQuantizer",
    "Quantizer",
    "QuantizerOutput",
    "ResidualVQ",
    "VectorQuantizer",
]
