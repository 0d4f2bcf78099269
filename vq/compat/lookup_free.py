"""vector-quantize-pytorch's lookup-free quantizers on vq's: ``LFQ`` on :class:`vq.LFQ` (held as
``.layers``, one per codebook) and ``ResidualLFQ`` on :class:`vq.ResidualLFQ` (with
``per_stage_gradient=True``, the anchor's gradient rule; held as ``.layer``).

Each takes the anchor's constructor arguments (names and defaults of version 1.34) and returns
what the anchor returns: ``(quantized, indices, loss)``, int64 indices (LFQ's a named tuple, as
the anchor's). Projections are drawn where and in the order the anchor draws them, so the same
seed gives the same weights, and equal inputs give equal codes. (A paper: Yu et al., "Language
Model Beats Diffusion: Tokenizer is Key to Visual Generation" (MAGVIT-v2), ICLR 2024.)
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import nn

from vq.compat.anchor_forward import drop_stages, residual_codes, sign_corners, stage_losses
from vq.compat.anchor_start import dropout_options
from vq.compat.refusals import DROPOUT_MULTIPLE, FIXED_STAGES, FLOAT32, Refused, refuse, refuse_call
from vq.quantizers import LFQ as VQLFQ
from vq.quantizers import ResidualLFQ as VQResidualLFQ

_ENTROPY = "vq's entropy loss is MAGVIT-v2's, over every vector"
#: LFQ's arguments vq cannot honour
LFQ_REFUSED: Refused = {
    "straight_through_activation": (nn.Identity, "vq's LFQ passes the gradient straight through"),
    "frac_per_sample_entropy": (1.0, _ENTROPY),
    "soft_clamp_input_value": (None, "vq's LFQ has no soft clamp of its input"),
    "cosine_sim_project_in": (False, "vq's projections are linear layers"),
    "cosine_sim_project_in_scale": (None, "vq's projections are linear layers"),
    "experimental_softplus_entropy_loss": (False, _ENTROPY),
    "entropy_loss_offset": (5.0, _ENTROPY),
    "spherical": (False, "vq has no binary spherical quantization"),
    "force_quantization_f32": (True, FLOAT32),
    "orthogonal_rotation": (False, "vq's LFQ has no rotation of the code space"),
}
RESIDUAL_LFQ_REFUSED: Refused = {
    **LFQ_REFUSED,
    "quantize_dropout_multiple_of": DROPOUT_MULTIPLE,
    "num_codebooks": (1, FIXED_STAGES),
    "keep_num_codebooks_dim": (None, FIXED_STAGES),
    "has_projections": (None, "vq projects when dim != log2(codebook_size)"),
    "projection_has_bias": (True, "vq's projections have biases"),
    "channel_first": (None, "ResidualLFQ takes [batch, ..., dim]"),
}


class Return(NamedTuple):
    """What LFQ's ``forward`` returns, as the anchor's ``Return``."""

    quantized: torch.Tensor
    indices: torch.Tensor
    entropy_aux_loss: torch.Tensor


class LossBreakdown(NamedTuple):
    """LFQ's ``return_loss_breakdown=True`` terms, as the anchor's (zeros in eval mode)."""

    per_sample_entropy: torch.Tensor
    batch_entropy: torch.Tensor
    commitment: torch.Tensor


class LFQ(nn.Module):
    """vector-quantize-pytorch's ``LFQ`` on :class:`vq.LFQ` (one per codebook when
    ``num_codebooks > 1``, each with its own entropy terms, averaged as the anchor does).

    Args (the anchor's; those vq cannot honour raise a ValueError naming them):
        dim, codebook_size: input dimension and 2^bits codes per codebook (either may be
            left out); learned projections when ``dim != bits · num_codebooks``.
        entropy_loss_weight, diversity_gamma: MAGVIT-v2's entropy loss.
        commitment_loss_weight: β of ``||z - sg(q)||²``.
        num_codebooks, keep_num_codebooks_dim: as :class:`FSQ`'s.
        codebook_scale: the codeword values ``±codebook_scale``.
        has_projections, projection_has_bias: as the anchor's.
        channel_first: None moves the channels last for inputs of 4 or more axes.

    ``forward(x, inv_temperature=100.0, return_loss_breakdown=False, mask=None)`` returns
    ``Return(quantized, indices, entropy_aux_loss)`` (and :class:`LossBreakdown`): indices
    int64, the loss ``entropy_loss_weight · (per-sample − γ · batch entropy) + β ·
    commitment`` in training, 0 in eval mode. Padding (``mask`` False) is left out of the
    losses and quantized as it is, as the anchor's.
    """

    def __init__(
        self,
        *,
        dim: int | None = None,
        codebook_size: int | None = None,
        entropy_loss_weight: float = 0.1,
        commitment_loss_weight: float = 0.0,
        diversity_gamma: float = 1.0,
        num_codebooks: int = 1,
        keep_num_codebooks_dim: bool | None = None,
        codebook_scale: float = 1.0,
        has_projections: bool | None = None,
        projection_has_bias: bool = True,
        channel_first: bool | None = None,
        **options,
    ):
        super().__init__()
        refuse("LFQ", options, LFQ_REFUSED)
        if dim is None and codebook_size is None:
            raise ValueError("LFQ: give dim or codebook_size (or both)")
        codebook_size = 2**dim if codebook_size is None else int(codebook_size)
        if codebook_size < 2 or codebook_size & (codebook_size - 1):
            raise ValueError(
                f"LFQ: codebook_size must be a power of two, got {codebook_size} (try "
                f"{2 ** math.ceil(math.log2(max(codebook_size, 2)))})"
            )
        bits = codebook_size.bit_length() - 1
        inner = bits * num_codebooks
        self.dim = inner if dim is None else dim
        projects = self.dim != inner if has_projections is None else bool(has_projections)
        if not projects and self.dim != inner:
            raise ValueError(
                f"LFQ: has_projections=False needs dim = log2(codebook_size) · num_codebooks = "
                f"{inner}, got dim={self.dim}"
            )
        keep = num_codebooks > 1 if keep_num_codebooks_dim is None else bool(keep_num_codebooks_dim)
        if num_codebooks > 1 and not keep:
            raise ValueError("LFQ: num_codebooks > 1 needs keep_num_codebooks_dim=True")
        self.codebook_size, self.codebook_dim = codebook_size, bits
        self.num_codebooks = num_codebooks
        self.keep_num_codebooks_dim, self.channel_first = keep, channel_first
        self.codebook_scale = float(codebook_scale)
        self.commitment_loss_weight = float(commitment_loss_weight)
        options = dict(
            entropy_loss_weight=entropy_loss_weight,
            commitment_weight=commitment_loss_weight,
            diversity_gamma=diversity_gamma,
            scale=codebook_scale,
        )
        self.project_in: nn.Linear | None = None  # when the layer does not project itself
        self.project_out: nn.Linear | None = None
        self.whole = num_codebooks == 1 and projects == (self.dim != inner)
        self.whole = self.whole and (projection_has_bias or not projects)
        if self.whole:
            self.layers = nn.ModuleList([VQLFQ(self.dim, codebook_size, **options)])
        else:
            if projects:
                self.project_in = nn.Linear(self.dim, inner, bias=projection_has_bias)
                self.project_out = nn.Linear(inner, self.dim, bias=projection_has_bias)
            layers = [VQLFQ(num_bits=bits, **options) for _ in range(num_codebooks)]
            self.layers = nn.ModuleList(layers)

    @property
    def layer(self) -> VQLFQ:
        """The vq layer when there is one codebook (``layers[0]``)."""
        return self.layers[0]

    def forward(
        self,
        x: torch.Tensor,
        inv_temperature: float = 100.0,
        return_loss_breakdown: bool = False,
        mask: torch.Tensor | None = None,
    ):
        """See the class docstring."""
        move = x.dim() >= 4 if self.channel_first is None else bool(self.channel_first)
        rows = x.movedim(1, -1) if move else x
        if mask is not None:
            mask = mask.reshape(rows.shape[:-1])
        z = rows if self.project_in is None else self.project_in(rows)
        parts = z.chunk(self.num_codebooks, dim=-1) if self.num_codebooks > 1 else (z,)
        outs = []
        for layer, part in zip(self.layers, parts, strict=True):
            if layer.inv_temperature != float(inv_temperature):
                layer.inv_temperature = float(inv_temperature)
            outs.append(layer(part, mask))
        quantized = torch.cat([out.quantized for out in outs], dim=-1)
        if self.project_out is not None:
            quantized = self.project_out(quantized)
        codes = torch.stack([out.codes.long() for out in outs], dim=-1)  # [..., c]
        if mask is not None:  # the anchor quantizes padding too
            decoded = self._output_of_codes(codes).to(quantized.dtype)
            quantized = torch.where(mask[..., None], quantized, decoded)
        if self.training:

            def mean(name):
                return torch.stack([getattr(out, name) for out in outs]).mean()

            loss, commitment = mean("loss"), mean("commitment")
            breakdown = LossBreakdown(
                mean("per_sample_entropy"),
                mean("codebook_entropy"),
                commitment if self.commitment_loss_weight > 0 else torch.zeros_like(commitment),
            )
        else:
            loss = quantized.new_zeros(())
            breakdown = LossBreakdown(loss, loss, loss)
        if not self.keep_num_codebooks_dim:
            codes = codes[..., 0]
        if move:
            quantized = quantized.movedim(-1, 1)
        ret = Return(quantized, codes, loss)
        return (ret, breakdown) if return_loss_breakdown else ret

    def _output_of_codes(self, codes: torch.Tensor, project_out: bool = True) -> torch.Tensor:
        """Integer codes [..., num_codebooks] → float32 [..., dim] (channels last), or the
        corners [..., bits · num_codebooks] without ``project_out``."""
        corners = [
            sign_corners(codes[..., i], self.codebook_dim, self.codebook_scale)
            for i in range(self.num_codebooks)
        ]
        out = torch.cat(corners, dim=-1)
        linear = self.project_out if not self.whole else self.layers[0].project_out
        return out if linear is None or not project_out else linear(out)

    def indices_to_codes(self, indices: torch.Tensor, project_out: bool = True) -> torch.Tensor:
        """The reconstruction of int ``indices`` (as ``forward`` returns them) → float32, in
        the layout ``forward`` gives (``project_out=False``: the ±scale corners)."""
        image_like = indices.dim() >= 3 + int(self.keep_num_codebooks_dim)
        move = image_like if self.channel_first is None else bool(self.channel_first)
        idx = indices if self.keep_num_codebooks_dim else indices[..., None]
        codes = self._output_of_codes(idx, project_out)
        return codes.movedim(-1, 1) if move else codes


class ResidualLFQ(nn.Module):
    """vector-quantize-pytorch's ``ResidualLFQ`` on :class:`vq.ResidualLFQ` (stage m's codes
    ``±2^-m``, each stage with its entropy loss, each passing its residual's gradient).

    Args: dim, num_quantizers, codebook_size, quantize_dropout, quantize_dropout_cutoff_index,
        and LFQ's entropy_loss_weight, commitment_loss_weight, diversity_gamma.

    ``forward(x, mask=None, return_all_codes=False)`` returns ``(quantized, indices [..., Q]
    int64, losses [Q])``: each stage's ``entropy_loss_weight · (per-sample − γ · batch
    entropy) + β · commitment`` in training (the commitment part's gradient as
    :func:`vq.compat.anchor_forward.stage_losses` says), zeros in eval mode.
    """

    def __init__(
        self,
        *,
        dim: int,
        num_quantizers: int,
        codebook_size: int,
        quantize_dropout: bool = False,
        quantize_dropout_cutoff_index: int = 0,
        entropy_loss_weight: float = 0.1,
        commitment_loss_weight: float = 0.0,
        diversity_gamma: float = 1.0,
        **options,
    ):
        super().__init__()
        refuse("ResidualLFQ", options, RESIDUAL_LFQ_REFUSED)
        self.dim, self.num_quantizers, self.codebook_size = dim, num_quantizers, codebook_size
        self.commitment_loss_weight = float(commitment_loss_weight)
        self.entropy_loss_weight, self.diversity_gamma = entropy_loss_weight, diversity_gamma
        self.layer = VQResidualLFQ(
            dim,
            num_quantizers,
            codebook_size,
            entropy_loss_weight=entropy_loss_weight,
            commitment_weight=commitment_loss_weight,
            diversity_gamma=diversity_gamma,
            per_stage_gradient=True,
            **dropout_options(quantize_dropout, quantize_dropout_cutoff_index, num_quantizers),
        )

    @property
    def codebooks(self) -> torch.Tensor:
        """Every stage's codewords ``±2^-m``, float32 [Q, K, bits]."""
        return self.layer.effective_codebooks()

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        return_all_codes: bool = False,
        rand_quantize_dropout_fixed_seed=None,
    ):
        """See the class docstring."""
        refuse_call(
            "ResidualLFQ.forward",
            rand_quantize_dropout_fixed_seed=rand_quantize_dropout_fixed_seed,
        )
        out = self.layer(x, mask)
        codes = drop_stages(out.codes.long(), out.num_stages)
        quantized = out.quantized
        if mask is not None:  # the anchor quantizes padding too
            decoded = self.get_output_from_indices(codes).to(quantized.dtype)
            quantized = torch.where(mask[..., None], quantized, decoded)
        if self.training:
            weight = self.commitment_loss_weight
            entropy = out.per_sample_entropy - self.diversity_gamma * out.codebook_entropy
            commitment = stage_losses(True, weight * out.commitment, out.stage_commitment, weight)
            losses = self.entropy_loss_weight * entropy + commitment
        else:
            losses = quantized.new_zeros(self.num_quantizers)
        if return_all_codes:
            return quantized, codes, losses, self.get_codes_from_indices(codes)
        return quantized, codes, losses

    def get_codes_from_indices(self, indices: torch.Tensor) -> torch.Tensor:
        """Every stage's codeword of ``indices`` [..., q] → float32 [Q, ..., bits]."""
        return residual_codes(self.codebooks, indices)

    def get_output_from_indices(self, indices: torch.Tensor) -> torch.Tensor:
        """The reconstruction of ``indices`` [..., q] → float32 [..., dim]."""
        codes = self.get_codes_from_indices(indices).sum(0)
        project_out = self.layer.project_out
        return codes if project_out is None else project_out(codes)
