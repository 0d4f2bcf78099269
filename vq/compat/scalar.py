"""vector-quantize-pytorch's codebook-free layers on vq's: ``FSQ``, ``LFQ``, ``ResidualFSQ`` and
``ResidualLFQ``.

Each class takes the anchor's constructor arguments (names and defaults of version 1.32),
builds :class:`vq.FSQ`, :class:`vq.LFQ`, :class:`vq.ResidualFSQ` or :class:`vq.ResidualLFQ`
(the residual ones with ``per_stage_gradient=True``, the anchor's gradient rule) as ``.layer``
(``.layers`` for LFQ), and returns what the anchor returns: ``(quantized, indices)`` for the
FSQ layers (int32 indices), ``(quantized, indices, loss)`` for the LFQ layers (int64; LFQ's a
named tuple, as the anchor's). Projections are drawn where and in the order the anchor draws
them, so the same seed gives the same weights, and equal inputs give equal codes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import nn

from vq.compat.common import (
    Refused,
    drop_stages,
    dropout_options,
    refuse,
    refuse_call,
    residual_codes,
    sign_corners,
    stage_losses,
)
from vq.quantizers import FSQ as VQFSQ
from vq.quantizers import LFQ as VQLFQ
from vq.quantizers import ResidualFSQ as VQResidualFSQ
from vq.quantizers import ResidualLFQ as VQResidualLFQ

_FLOAT32 = "vq quantizes in float32 whatever the input dtype"
#: FSQ's arguments vq cannot honour
FSQ_REFUSED: Refused = {
    "allowed_dtypes": ((torch.float32, torch.float64), _FLOAT32),
    "force_quantization_f32": (True, _FLOAT32),
    "preserve_symmetry": (False, "vq.FSQ's grid is the paper's (vq.ResidualFSQ's the symmetric)"),
    "noise_dropout": (0.0, "vq.FSQ has no noise dropout"),
    "bound_hard_clamp": (False, "vq.FSQ bounds its input with tanh"),
    "orthogonal_rotation": (False, "vq.FSQ has no rotation of the code space"),
}

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
    "force_quantization_f32": (True, _FLOAT32),
    "orthogonal_rotation": (False, "vq's LFQ has no rotation of the code space"),
}

_DROPOUT_MULTIPLE = (1, "vq drops any number of stages, drawn per sample")
_STAGES = "vq's residual stages are fixed by the residual layer"
RESIDUAL_FSQ_REFUSED: Refused = {
    "quantize_dropout_multiple_of": _DROPOUT_MULTIPLE,
    "soft_clamp_input_value": (None, "vq soft-clamps the input to ±L/(L-1), the anchor's default"),
    **{name: FSQ_REFUSED[name] for name in FSQ_REFUSED if name != "bound_hard_clamp"},
    "num_codebooks": (1, _STAGES),
    "keep_num_codebooks_dim": (None, _STAGES),
    "scale": (None, _STAGES),
    "channel_first": (False, "use is_channel_first"),
    "projection_has_bias": (True, "vq's projections have biases"),
    "return_indices": (True, _STAGES),
}
RESIDUAL_LFQ_REFUSED: Refused = {
    **LFQ_REFUSED,
    "quantize_dropout_multiple_of": _DROPOUT_MULTIPLE,
    "num_codebooks": (1, _STAGES),
    "keep_num_codebooks_dim": (None, _STAGES),
    "has_projections": (None, "vq projects when dim != log2(codebook_size)"),
    "projection_has_bias": (True, "vq's projections have biases"),
    "channel_first": (None, "ResidualLFQ takes [batch, ..., dim]"),
}


class FSQ(nn.Module):
    """vector-quantize-pytorch's ``FSQ`` on :class:`vq.FSQ` (one grid on every codebook's slice
    when ``num_codebooks > 1``).

    Args (the anchor's; those vq cannot honour raise a ValueError naming them):
        levels: values per code dimension.
        dim: input dimension (learned projections when it differs from ``len(levels) ·
            num_codebooks``).
        num_codebooks, keep_num_codebooks_dim: codebooks per vector, and whether indices keep
            their last axis (default: when there are several).
        channel_first: input ``[B, dim, ...]`` (inputs of 4 or more axes always are).
        projection_has_bias, return_indices: as the anchor's.
        scale: kept as ``.scale``; the anchor does not use it either.

    ``forward(z)`` returns ``(quantized, indices)``: quantized in z's layout, indices int32
    ``[B, ...]`` (channels last; ``[..., num_codebooks]`` when kept), or None without
    ``return_indices``. ``indices_to_codes(indices)`` gives ``quantized`` back.
    """

    def __init__(
        self,
        levels: Sequence[int],
        dim: int | None = None,
        num_codebooks: int = 1,
        keep_num_codebooks_dim: bool | None = None,
        scale: float | None = None,
        channel_first: bool = False,
        projection_has_bias: bool = True,
        return_indices: bool = True,
        **options,
    ):
        super().__init__()
        refuse("FSQ", options, FSQ_REFUSED)
        self.levels = [int(v) for v in levels]
        keep = num_codebooks > 1 if keep_num_codebooks_dim is None else bool(keep_num_codebooks_dim)
        if num_codebooks > 1 and not keep:
            raise ValueError("FSQ: num_codebooks > 1 needs keep_num_codebooks_dim=True")
        self.codebook_dim, self.num_codebooks = len(self.levels), num_codebooks
        inner = self.codebook_dim * num_codebooks
        self.dim = inner if dim is None else dim
        self.keep_num_codebooks_dim, self.scale = keep, scale
        self.channel_first, self.return_indices = channel_first, return_indices
        self.project_in: nn.Linear | None = None  # when the layer does not project itself
        self.project_out: nn.Linear | None = None
        self.whole = num_codebooks == 1 and (projection_has_bias or self.dim == inner)
        if self.whole:
            self.layer = VQFSQ(self.levels, self.dim)
        else:
            if self.dim != inner:
                self.project_in = nn.Linear(self.dim, inner, bias=projection_has_bias)
                self.project_out = nn.Linear(inner, self.dim, bias=projection_has_bias)
            self.layer = VQFSQ(self.levels)
        self.codebook_size = self.layer.codebook_size

    @property
    def implicit_codebook(self) -> torch.Tensor:
        """Every code's grid point, float32 [K, len(levels)]."""
        return self.layer.effective_codebooks()[0]

    def forward(self, z: torch.Tensor):
        """See the class docstring."""
        move = z.dim() >= 4 or self.channel_first
        rows = z.movedim(1, -1) if move else z
        if self.whole:
            out = self.layer(rows)
            quantized, codes = out.quantized, out.codes[..., None]
        else:
            h = rows if self.project_in is None else self.project_in(rows)
            lead = h.shape[:-1]
            out = self.layer(h.reshape(*lead, self.num_codebooks, self.codebook_dim))
            quantized, codes = out.quantized.reshape(*lead, -1), out.codes
            if self.project_out is not None:
                quantized = self.project_out(quantized)
        codes = (codes if self.keep_num_codebooks_dim else codes[..., 0]).int()
        if move:
            quantized = quantized.movedim(-1, 1)
        return quantized, codes if self.return_indices else None

    def indices_to_codes(self, indices: torch.Tensor) -> torch.Tensor:
        """The reconstruction of int ``indices`` (as ``forward`` returns them) → float32, in
        the layout ``forward`` gives (channels first for image or video indices)."""
        keep = self.keep_num_codebooks_dim
        image_like = indices.dim() >= 3 + int(keep)
        idx = (indices if keep else indices[..., None]).long()
        lead = idx.shape[:-1]
        codes = self.layer.static_decode(idx.reshape(-1))  # the grid (through its projection)
        codes = codes.reshape(*lead, -1)
        if self.project_out is not None:
            codes = self.project_out(codes)
        return codes.movedim(-1, 1) if image_like or self.channel_first else codes


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
            decoded = self._decode(codes).to(quantized.dtype)
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

    def _decode(self, codes: torch.Tensor, project_out: bool = True) -> torch.Tensor:
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
        codes = self._decode(idx, project_out)
        return codes.movedim(-1, 1) if move else codes


class ResidualFSQ(nn.Module):
    """vector-quantize-pytorch's ``ResidualFSQ`` on :class:`vq.ResidualFSQ` (symmetric grids,
    the input soft-clamped to ±L/(L-1), stage m scaled by L^-m, each stage passing its
    residual's gradient).

    Args: levels, num_quantizers, dim, is_channel_first, quantize_dropout,
        quantize_dropout_cutoff_index (each training sample keeps n stages, n uniform in
        [cutoff + 1, Q], drawn per sample), bound_hard_clamp (only True).

    ``forward(x, return_all_codes=False)`` returns ``(quantized, indices)``, indices int32
    ``[..., Q]`` (``[B, Q, ...]`` channel-first, as the anchor's; -1 at dropped stages).
    """

    def __init__(
        self,
        *,
        levels: Sequence[int],
        num_quantizers: int,
        dim: int | None = None,
        is_channel_first: bool = False,
        quantize_dropout: bool = False,
        quantize_dropout_cutoff_index: int = 0,
        bound_hard_clamp: bool = True,
        **options,
    ):
        super().__init__()
        refuse("ResidualFSQ", options, RESIDUAL_FSQ_REFUSED)
        if not bound_hard_clamp:
            raise ValueError(
                "ResidualFSQ: bound_hard_clamp=False is not supported by vq.compat (vq's stages "
                "clamp to their grid)"
            )
        self.levels, self.num_quantizers = [int(v) for v in levels], num_quantizers
        self.is_channel_first = is_channel_first
        self.layer = VQResidualFSQ(
            self.levels,
            num_quantizers,
            dim,
            per_stage_gradient=True,
            **dropout_options(quantize_dropout, quantize_dropout_cutoff_index, num_quantizers),
        )
        self.dim, self.codebook_size = self.layer.dim, self.layer.codebook_size

    @property
    def codebooks(self) -> torch.Tensor:
        """Every stage's scaled grid points, float32 [Q, K, len(levels)]."""
        return self.layer.effective_codebooks()

    def forward(
        self, x: torch.Tensor, return_all_codes: bool = False, rand_quantize_dropout_fixed_seed=None
    ):
        """See the class docstring."""
        refuse_call(
            "ResidualFSQ.forward",
            rand_quantize_dropout_fixed_seed=rand_quantize_dropout_fixed_seed,
        )
        rows = x.movedim(1, -1) if self.is_channel_first else x
        out = self.layer(rows)
        codes = drop_stages(out.codes.long(), out.num_stages)
        ret = [out.quantized, codes.int()]
        if return_all_codes:
            ret.append(self.get_codes_from_indices(codes))
        if self.is_channel_first:
            ret[0], ret[1] = ret[0].movedim(-1, 1), ret[1].movedim(-1, 1)
        return tuple(ret)

    def get_codes_from_indices(self, indices: torch.Tensor) -> torch.Tensor:
        """Every stage's scaled grid point of ``indices`` [..., q] → float32 [Q, ..., L]."""
        return residual_codes(self.codebooks, indices)

    def get_output_from_indices(self, indices: torch.Tensor) -> torch.Tensor:
        """The reconstruction of ``indices`` [..., q] → float32 [..., dim] (channels last)."""
        codes = self.get_codes_from_indices(indices).sum(0)
        project_out = self.layer.project_out
        return codes if project_out is None else project_out(codes)


class ResidualLFQ(nn.Module):
    """vector-quantize-pytorch's ``ResidualLFQ`` on :class:`vq.ResidualLFQ` (stage m's codes
    ``±2^-m``, each stage with its entropy loss, each passing its residual's gradient).

    Args: dim, num_quantizers, codebook_size, quantize_dropout, quantize_dropout_cutoff_index,
        and LFQ's entropy_loss_weight, commitment_loss_weight, diversity_gamma.

    ``forward(x, mask=None, return_all_codes=False)`` returns ``(quantized, indices [..., Q]
    int64, losses [Q])``: each stage's ``entropy_loss_weight · (per-sample − γ · batch
    entropy) + β · commitment`` in training (the commitment part's gradient as
    :func:`vq.compat.common.stage_losses` says), zeros in eval mode.
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
