"""``vq.Quantizer``, the base class of every quantizer: an offline codec and a training layer.

The two halves are separate pieces, each readable on its own:
:class:`vq.quantizers.codec.Codec` (the trained flag, ``fit``, ``encode``/``decode`` and their
lean small-batch path, ``distance_tables``, input checks, and the row-level methods indexes
call) and :class:`vq.quantizers.layer.TrainingLayer` (the training ``forward``: layout and
mask, projections, cosine normalisation, codebook learning, losses, gradient estimators).
:class:`Quantizer` composes them; the layer's code space (projections, normalisation) is the one
the codec encodes in.
"""

from __future__ import annotations

from vq.quantizers.codec import Codec
from vq.quantizers.layer import TrainingLayer


class Quantizer(TrainingLayer, Codec):
    """Base class: subclasses implement ``_fit``, ``_encode``, ``_decode`` and ``tables`` on
    float32 ``[n, code_dim]`` tensors already on the module's device (see
    :class:`~vq.quantizers.codec.Codec`), and ``_quantize`` for the training forward (see
    :class:`~vq.quantizers.layer.TrainingLayer`).

    Public methods accept numpy arrays or torch tensors (on any device) and give back the same
    kind (numpy, or a tensor on the input's device). A learning layer may be fit too (k-means
    initialisation from a data set rather than the first batch); its usage statistics then
    start from the code counts of the fit data.

    Layer options (keyword arguments of every subclass that trains as a layer):
        learning: None (codebooks come from ``fit`` and stay fixed in ``forward``), "ema",
            "grad", or a :class:`vq.EMA` / :class:`vq.Gradient` with its settings (k-means
            initialisation on the first training batch, dead-code restart): the codebooks then
            learn in ``forward`` and the layer needs no ``fit``. "simvq" /
            :class:`vq.SimVQ` (VectorQuantizer, ResidualVQ, GroupedResidualVQ): a frozen random
            codebook behind a learned linear map (:meth:`effective_codebooks`).
        commitment_weight: β, the weight of the commitment loss in ``loss``.
        rotation_trick: pass gradients with the rotation trick instead of straight through.
        cosine: l2-normalise inputs and codewords (cosine-similarity codebooks).
        codebook_dim: quantize in a ``codebook_dim``-dimensional code space reached by a learned
            ``nn.Linear`` (``project_in``), and map back with ``project_out`` (factorized
            codes); None quantizes the input as it is.
        channel_first: ``forward`` takes ``[B, dim, ...]`` (conv feature maps) instead of
            ``[..., dim]``; ``encode``/``decode`` always use ``[..., dim]``.
    """

    def __init__(
        self,
        dim: int,
        codebook_size: int,
        code_shape: tuple[int, ...],
        *,
        commitment_weight: float = 1.0,
        rotation_trick: bool = False,
        cosine: bool = False,
        codebook_dim: int | None = None,
        channel_first: bool = False,
    ):
        super().__init__(dim, codebook_size, code_shape)  # the codec's (the layer has none)
        self._init_layer(
            commitment_weight=commitment_weight,
            rotation_trick=rotation_trick,
            cosine=cosine,
            codebook_dim=codebook_dim,
            channel_first=channel_first,
        )
