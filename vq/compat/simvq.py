"""vector-quantize-pytorch's ``SimVQ`` and ``ResidualSimVQ`` on vq's layers learning by
:class:`vq.SimVQ`: a frozen Gaussian codebook C behind a learned linear map W, held as
``.layer`` (:class:`vq.VectorQuantizer`, :class:`vq.ResidualVQ` with every stage passing its
own gradient).

Each takes the anchor's constructor arguments (names and defaults of version 1.34) and returns
what the anchor returns: ``(quantized, indices, loss)`` (``losses`` per stage for the residual
layer), int64 indices, the loss in training and eval mode alike, as the anchor's.
"""

from __future__ import annotations

import torch
from torch import nn

from vq.compat.anchor_forward import drop_stages, residual_codes, stage_losses
from vq.compat.anchor_start import dropout_options
from vq.compat.refusals import DROPOUT_MULTIPLE, Refused, refuse, refuse_call
from vq.quantizers import ResidualVQ as VQResidualVQ
from vq.quantizers import SimVQ as VQSimVQ
from vq.quantizers import VectorQuantizer

_CODEBOOK_TRANSFORM = "vq's SimVQ map is one linear layer, W c_k"
SIMVQ_REFUSED: Refused = {
    "codebook_transform": (None, _CODEBOOK_TRANSFORM),
    "frozen_codebook_dim": (None, "vq's frozen SimVQ codebook has the input's dimension"),
}
RESIDUAL_SIMVQ_REFUSED: Refused = {
    **SIMVQ_REFUSED,
    "quantize_dropout_multiple_of": DROPOUT_MULTIPLE,
}


def identity(t):
    """SimVQ's default ``init_fn``: the frozen codebook as drawn."""
    return t


class SimVQ(nn.Module):
    """vector-quantize-pytorch's ``SimVQ`` on :class:`vq.VectorQuantizer` learning by
    :class:`vq.SimVQ`: a frozen Gaussian codebook C behind a learned linear map W (drawn in
    the anchor's order: the same seed gives the same C and W).

    Args:
        dim, codebook_size, channel_first, rotation_trick: as the anchor's.
        input_to_quantize_commit_loss_weight, commitment_weight: the loss is
            ``commitment_weight · (||sg(x) − W c||² + input_to_quantize_commit_loss_weight ·
            ||x − sg(W c)||²)`` (means over elements), in training and eval mode alike.
        init_fn: only the default (no transform of the frozen codebook).

    ``forward(x)`` returns ``(quantized, indices int64, loss)``; ``indices_to_codes(indices)``
    the codewords ``W c`` in the input's layout.
    """

    def __init__(
        self,
        dim: int,
        codebook_size: int,
        init_fn=identity,
        channel_first: bool = False,
        rotation_trick: bool = True,
        input_to_quantize_commit_loss_weight: float = 0.25,
        commitment_weight: float = 1.0,
        **options,
    ):
        super().__init__()
        refuse("SimVQ", options, SIMVQ_REFUSED)
        _check_init_fn("SimVQ", init_fn)
        self.dim, self.codebook_size, self.channel_first = dim, codebook_size, channel_first
        self.layer = VectorQuantizer(
            dim,
            codebook_size,
            learning=VQSimVQ(codebook_weight=commitment_weight),
            commitment_weight=commitment_weight * input_to_quantize_commit_loss_weight,
            rotation_trick=rotation_trick,
        )

    @property
    def codebook(self) -> torch.Tensor:
        """The codewords ``W c_k``, float32 [K, dim] (with the gradient to W)."""
        return self.layer.effective_codebooks()[0]

    def forward(self, x: torch.Tensor):
        """See the class docstring."""
        rows = x.movedim(1, -1) if self.channel_first else x
        out = self.layer(rows)
        quantized = out.quantized.movedim(-1, 1) if self.channel_first else out.quantized
        return quantized, out.codes.long(), out.loss

    def indices_to_codes(self, indices: torch.Tensor) -> torch.Tensor:
        """The codewords of ``indices`` [...] → float32 [..., dim] (channels first when the
        layer is)."""
        codes = self.codebook[indices.long()]
        return codes.movedim(-1, 1) if self.channel_first else codes


class ResidualSimVQ(nn.Module):
    """vector-quantize-pytorch's ``ResidualSimVQ`` on :class:`vq.ResidualVQ` learning by
    :class:`vq.SimVQ`: every stage its own frozen codebook and learned map, every stage
    passing its residual's gradient (rotated onto its codeword by default).

    ``forward(x, return_all_codes=False)`` returns ``(quantized, indices [..., Q], losses [Q])``
    (each stage's SimVQ loss, in training and eval mode alike; -1 at dropped stages).
    """

    def __init__(
        self,
        *,
        dim: int,
        num_quantizers: int,
        codebook_size: int,
        heads: int = 1,
        quantize_dropout: bool = False,
        quantize_dropout_cutoff_index: int = 0,
        channel_first: bool = False,
        rotation_trick: bool = True,
        input_to_quantize_commit_loss_weight: float = 0.25,
        commitment_weight: float = 1.0,
        init_fn=identity,
        **options,
    ):
        super().__init__()
        refuse("ResidualSimVQ", options, RESIDUAL_SIMVQ_REFUSED)
        _check_init_fn("ResidualSimVQ", init_fn)
        if heads != 1:
            raise ValueError("ResidualSimVQ: heads must be 1 (vector-quantize-pytorch's too)")
        self.dim, self.num_quantizers, self.codebook_size = dim, num_quantizers, codebook_size
        self.channel_first = channel_first
        self.stage_weight = commitment_weight * (1.0 + input_to_quantize_commit_loss_weight)
        self.layer = VQResidualVQ(
            dim,
            num_quantizers,
            codebook_size,
            learning=VQSimVQ(codebook_weight=commitment_weight),
            commitment_weight=commitment_weight * input_to_quantize_commit_loss_weight,
            rotation_trick=rotation_trick,
            per_stage_gradient=True,
            **dropout_options(quantize_dropout, quantize_dropout_cutoff_index, num_quantizers),
        )

    @property
    def codebooks(self) -> torch.Tensor:
        """Every stage's codewords ``W_m c``, float32 [Q, K, dim]."""
        return self.layer.effective_codebooks()

    def forward(
        self,
        x: torch.Tensor,
        return_all_codes: bool = False,
        rand_quantize_dropout_fixed_seed=None,
    ):
        """See the class docstring."""
        refuse_call(
            "ResidualSimVQ.forward",
            rand_quantize_dropout_fixed_seed=rand_quantize_dropout_fixed_seed,
        )
        rows = x.movedim(1, -1) if self.channel_first else x
        out = self.layer(rows)
        codes = drop_stages(out.codes.long(), out.num_stages)
        losses = stage_losses(True, out.loss, out.stage_commitment, self.stage_weight)
        quantized = out.quantized.movedim(-1, 1) if self.channel_first else out.quantized
        if return_all_codes:
            return quantized, codes, losses, self.get_codes_from_indices(codes)
        return quantized, codes, losses

    def get_codes_from_indices(self, indices: torch.Tensor) -> torch.Tensor:
        """Every stage's codeword of ``indices`` [..., q] → float32 [Q, ..., dim] (channels
        first after Q when the layer is channel-first)."""
        codes = residual_codes(self.codebooks, indices)
        return codes.movedim(-1, 2) if self.channel_first else codes

    def get_output_from_indices(self, indices: torch.Tensor) -> torch.Tensor:
        """The reconstruction of ``indices`` → float32, in the layer's layout."""
        return self.get_codes_from_indices(indices).sum(0)


def _check_init_fn(owner: str, init_fn) -> None:
    if init_fn is not identity and getattr(init_fn, "__name__", None) != "identity":
        raise ValueError(
            f"{owner}: init_fn={init_fn!r} is not supported by vq.compat (vq's frozen SimVQ "
            "codebook is drawn from N(0, 1/dim) as the anchor's default)"
        )
