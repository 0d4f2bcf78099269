"""vector-quantize-pytorch's layers, by their names, arguments and return values, on vq's.

For code written against vector-quantize-pytorch (version 1.34)::

    from vq.compat import VectorQuantize, ResidualVQ, FSQ, LFQ   # was: from vector_quantize_pytorch

    layer = VectorQuantize(dim=256, codebook_size=512, decay=0.8, commitment_weight=1.0)
    quantized, indices, commit_loss = layer(x)         # x [B, N, 256]
    x_hat = layer.get_output_from_indices(indices)     # == quantized in eval mode

Every class takes the anchor's constructor arguments with the anchor's defaults — so its layers
learn as the anchor's do: EMA codebooks with decay 0.8, a random start (the anchor's draws, from
the global generator, in its order) unless ``kmeans_init=True``, the rotation trick, every
residual stage passing its own gradient — and returns the anchor's tuples (int64 indices, -1 at
padding and dropped stages; the FSQ layers' int32). An argument vq cannot honour raises a
ValueError that names it when given a value other than the anchor's default; the tables of
those arguments and the reasons are ``*_REFUSED`` beside each class, in its module
(:mod:`vq.compat.vector_quantize`, :mod:`~vq.compat.residual_vq`, :mod:`~vq.compat.simvq`,
:mod:`~vq.compat.finite_scalar`, :mod:`~vq.compat.lookup_free`).

The vq layer doing the work is ``.layer`` (LFQ: ``.layers``): the same module with vq's
interface — ``encode``/``decode``, :class:`vq.QuantizerOutput`, ``vq.export`` to ONNX, index
building — for when the anchor's interface is no longer needed. An eval-mode forward exports
with ``torch.export`` as the vq layer's does.

Where the two libraries differ (each documented at its class): quantizer dropout draws the
number of stages per sample (the anchor: one per batch); the per-stage losses of residual layers
carry the gradient of their mean each (exact for their sum and their mean); ``freeze_codebook``
runs the vq layer in eval mode (no quantizer dropout then); beam search, cosine residual stages,
orthogonal and diversity regularisers, stochastic sampling, DiVeQ, affine parameters and
implicit neural codebooks are refused.
"""

from vq.compat.finite_scalar import FSQ, ResidualFSQ
from vq.compat.lookup_free import LFQ, ResidualLFQ
from vq.compat.residual_vq import GroupedResidualVQ, ResidualVQ
from vq.compat.simvq import ResidualSimVQ, SimVQ
from vq.compat.vector_quantize import VectorQuantize

__all__ = [
    "FSQ",
    "LFQ",
    "GroupedResidualVQ",
    "ResidualFSQ",
    "ResidualLFQ",
    "ResidualSimVQ",
    "ResidualVQ",
    "SimVQ",
    "VectorQuantize",
]
