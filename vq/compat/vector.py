"""vector-quantize-pytorch's codebook layers on vq's: ``VectorQuantize``, ``ResidualVQ``,
``GroupedResidualVQ``, ``SimVQ`` and ``ResidualSimVQ``.

Each class takes the anchor's constructor arguments (names and defaults of version 1.32),
builds the vq layer that learns as the anchor's does — :class:`vq.VectorQuantizer`,
:class:`vq.ResidualVQ` (every stage passing its own gradient, ``per_stage_gradient=True``),
:class:`vq.GroupedResidualVQ` — held as ``.layer``, and returns what the anchor returns:
``(quantized, indices, loss)``, int64 indices, ``-1`` at padding and at stages left out by
quantizer dropout, the loss zero in eval mode (SimVQ's excepted, as the anchor's).

The codebooks start where the anchor's start: kaiming-uniform draws from the global generator in
the anchor's order (after the input/output projections, which are redrawn in its order too), so
that ``torch.manual_seed(s)`` before either library's constructor gives the same weights and
codebooks. With ``kmeans_init=True`` each library runs its own k-means on the first batch.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from vq.compat.common import (
    Refused,
    anchor_codebooks,
    check_sync,
    drop_stages,
    dropout_options,
    frozen,
    learning_rule,
    lens_to_mask,
    own_draws,
    redraw_projections,
    refuse,
    refuse_call,
    residual_codes,
    stage_losses,
    start_from,
)
from vq.quantizers import GroupedResidualVQ as VQGroupedResidualVQ
from vq.quantizers import ResidualVQ as VQResidualVQ
from vq.quantizers import SimVQ as VQSimVQ
from vq.quantizers import VectorQuantizer

_AFFINE = "vq has no affine re-standardisation of the codebook"
_ORTHOGONAL = "vq has no orthogonal regularisation of the codebook"
_DIVERSITY = "vq has no codebook diversity loss (vq.compat.LFQ has MAGVIT-v2's entropy loss)"
_SAMPLING = "vq always takes the nearest codeword"
_INPLACE = "vq's gradient codebooks learn with the model's optimizer"

#: VectorQuantize's arguments vq cannot honour (the rest are the constructor's own)
VECTOR_QUANTIZE_REFUSED: Refused = {
    "sync_kmeans": (True, "vq's k-means initialisation always uses every process's vectors"),
    "layernorm_after_project_in": (False, "vq has no LayerNorm after project_in"),
    "commitment_use_cross_entropy_loss": (False, "vq's commitment is a squared distance"),
    "orthogonal_reg_weight": (0.0, _ORTHOGONAL),
    "orthogonal_reg_active_codes_only": (False, _ORTHOGONAL),
    "orthogonal_reg_max_codes": (None, _ORTHOGONAL),
    "codebook_diversity_loss_weight": (0.0, _DIVERSITY),
    "codebook_diversity_temperature": (100.0, _DIVERSITY),
    "stochastic_sample_codes": (False, _SAMPLING),
    "sample_codebook_temp": (1.0, _SAMPLING),
    "straight_through": (False, "vq has no Gumbel straight-through sampling"),
    "directional_reparam": (False, "vq has no DiVeQ reparameterisation"),
    "directional_reparam_variance": (5e-3, "vq has no DiVeQ reparameterisation"),
    "sync_affine_param": (False, _AFFINE),
    "vq_bridge": (None, "vq has no codebook bridge network"),
    "manual_ema_update": (False, "vq updates its codebooks in every training forward"),
    "in_place_codebook_optimizer": (None, _INPLACE),
    "manual_in_place_optimizer_update": (False, _INPLACE),
    "affine_param": (False, _AFFINE),
    "affine_param_batch_decay": (0.99, _AFFINE),
    "affine_param_codebook_decay": (0.9, _AFFINE),
    "sync_update_v": (0.0, "vq has no synchronous update rule"),
    "route_gradients_to_input": (True, "vq's output always passes its gradient to the input"),
}

_BEAM = (
    "vq's beam search (vq.ResidualVQ(beam_size=...)) ranks partial encodings by their squared "
    "error, as faiss's; vector-quantize-pytorch's by the sum of the stages' losses, so their "
    "codes differ"
)
#: ResidualVQ's arguments (its own and those it hands every VectorQuantize) vq cannot honour
RESIDUAL_VQ_REFUSED: Refused = {
    **VECTOR_QUANTIZE_REFUSED,
    "shared_codebook": (False, "vq's stages each have their own codebook"),
    "diveq": (False, "vq has no DiVeQ reparameterisation"),
    "heads": (1, "vector-quantize-pytorch's ResidualVQ refuses heads too"),
    "separate_codebook_per_head": (False, "ResidualVQ has no heads"),
    "quantize_dropout_multiple_of": (1, "vq drops any number of stages, drawn per sample"),
    "implicit_neural_codebook": (False, "vq has no implicit neural codebooks (QINCo)"),
    "mlp_kwargs": ({}, "vq has no implicit neural codebooks (QINCo)"),
    "beam_size": (None, _BEAM),
    "eval_beam_size": (None, _BEAM),
    "beam_score_quantizer_weights": (None, _BEAM),
    "quant_grad_frac": (0.0, "vq's stages pass no gradient to the stages before them"),
    "use_cosine_sim": (
        False,
        "vq's cosine stages l2-normalise the input before the first stage, the anchor's only "
        "each stage's input, so their codes differ after the first stage unless the inputs are "
        "unit vectors; vq.ResidualVQ(cosine=True) is vq's rule",
    ),
    "channel_last": (True, "ResidualVQ takes [batch, ..., dim], or accept_image_fmap=True"),
    "accept_3d_fmap": (False, "ResidualVQ takes [batch, ..., dim], or accept_image_fmap=True"),
}

GROUPED_RESIDUAL_VQ_REFUSED: Refused = {
    **RESIDUAL_VQ_REFUSED,
    "codebook_dim": (None, "vq.GroupedResidualVQ has no projections"),
}

_CODEBOOK_TRANSFORM = "vq's SimVQ map is one linear layer, W c_k"
SIMVQ_REFUSED: Refused = {
    "codebook_transform": (None, _CODEBOOK_TRANSFORM),
    "frozen_codebook_dim": (None, "vq's frozen SimVQ codebook has the input's dimension"),
}
RESIDUAL_SIMVQ_REFUSED: Refused = {
    **SIMVQ_REFUSED,
    "quantize_dropout_multiple_of": RESIDUAL_VQ_REFUSED["quantize_dropout_multiple_of"],
}


class LossBreakdown(NamedTuple):
    """VectorQuantize's ``return_loss_breakdown=True`` terms (the unweighted commitment; the
    other terms are those of options vq does not have, always 0)."""

    commitment: torch.Tensor
    codebook_diversity: torch.Tensor
    orthogonal_reg: torch.Tensor
    inplace_optimize: torch.Tensor


def _anchor_loss(out, weight: float) -> torch.Tensor:
    """``weight · commitment`` in value (the anchor's commitment; with a gradient codebook its
    one undetached term), with the gradient of vq's ``loss`` (commitment and codebook loss)."""
    return (weight * out.commitment).detach() + (out.loss - out.loss.detach())


class VectorQuantize(nn.Module):
    """vector-quantize-pytorch's ``VectorQuantize``: one codebook (or one per head), EMA by
    default, on :class:`vq.VectorQuantizer` (``heads > 1``: on vectors split into heads, one
    shared codebook, or per head :class:`vq.GroupedResidualVQ` of one stage per group).

    Args (the anchor's; those vq cannot honour raise a ValueError naming them):
        dim, codebook_size: input dimension and codewords K.
        codebook_dim: code-space dimension per head (learned projections when
            ``codebook_dim · heads != dim``).
        heads, separate_codebook_per_head: quantize ``heads`` slices of the projected vector,
            with one shared codebook or one each.
        decay, eps, kmeans_init, kmeans_iters, threshold_ema_dead_code: the EMA rule
            (:class:`vq.EMA`); ``kmeans_init=False`` starts from the anchor's random codebook.
        ema_update, learnable_codebook: ``learnable_codebook=True, ema_update=False`` learns the
            codebook by gradient (:class:`vq.Gradient`, codebook loss weight
            ``commitment_weight``).
        use_cosine_sim: cosine codebooks. commitment_weight: β.
        rotation_trick: None (the anchor's default) is True for ``dim > 1``.
        channel_last, accept_image_fmap, accept_3d_fmap: input ``[B, N, dim]`` (or ``[B,
            dim]``), ``[B, dim, N]``, ``[B, dim, H, W]`` or ``[B, dim, D, H, W]``.
        freeze_codebook: forward without updating the codebooks (vq's layer runs in eval mode).
        return_zeros_for_masked_padding: False returns the input at padding.
        sync_codebook: None or True (vq syncs under torch.distributed).

    ``forward(x, mask=None, lens=None, freeze_codebook=None, return_loss_breakdown=False)``
    returns ``(quantized, indices, loss)``: quantized in x's layout, indices int64 ``[B, N]``
    (``[B, H, W]`` for feature maps; a last axis of ``heads`` when multi-headed; -1 at padding),
    loss a scalar, ``commitment_weight ·`` the commitment in training and 0 in eval mode.
    """

    def __init__(
        self,
        dim: int,
        codebook_size: int,
        codebook_dim: int | None = None,
        heads: int = 1,
        separate_codebook_per_head: bool = False,
        decay: float = 0.8,
        eps: float = 1e-5,
        freeze_codebook: bool = False,
        kmeans_init: bool = False,
        kmeans_iters: int = 10,
        use_cosine_sim: bool = False,
        threshold_ema_dead_code: float = 0,
        channel_last: bool = True,
        accept_image_fmap: bool = False,
        accept_3d_fmap: bool = False,
        commitment_weight: float = 1.0,
        rotation_trick: bool | None = None,
        sync_codebook: bool | None = None,
        ema_update: bool | None = None,
        learnable_codebook: bool | None = None,
        return_zeros_for_masked_padding: bool = True,
        **options,
    ):
        super().__init__()
        refuse("VectorQuantize", options, VECTOR_QUANTIZE_REFUSED)
        check_sync("VectorQuantize", sync_codebook)
        if heads < 1:
            raise ValueError(f"heads must be >= 1, got {heads}")
        learning = learning_rule(
            "VectorQuantize",
            decay=decay,
            eps=eps,
            kmeans_init=kmeans_init,
            kmeans_iters=kmeans_iters,
            threshold_ema_dead_code=threshold_ema_dead_code,
            commitment_weight=commitment_weight,
            use_cosine_sim=use_cosine_sim,
            ema_update=ema_update,
            learnable_codebook=learnable_codebook,
        )
        separate = heads > 1 and separate_codebook_per_head
        if separate and use_cosine_sim:
            raise ValueError(
                "VectorQuantize: use_cosine_sim=True with separate_codebook_per_head=True is not "
                "supported by vq.compat (vq.GroupedResidualVQ has no cosine codebooks)"
            )
        self.dim, self.codebook_size, self.heads = dim, codebook_size, heads
        self.codebook_dim = dim if codebook_dim is None else codebook_dim
        self.separate_codebook_per_head = separate
        self.commitment_weight = float(commitment_weight)
        self.rotation_trick = dim > 1 if rotation_trick is None else bool(rotation_trick)
        self.channel_last, self.freeze_codebook = channel_last, freeze_codebook
        self.accept_image_fmap, self.accept_3d_fmap = accept_image_fmap, accept_3d_fmap
        self.channel_first = accept_image_fmap or accept_3d_fmap or not channel_last
        self.return_zeros_for_masked_padding = return_zeros_for_masked_padding
        layer_options = dict(
            learning=learning,
            commitment_weight=commitment_weight,
            rotation_trick=self.rotation_trick,
        )
        inner = self.codebook_dim * heads
        self.project_in: nn.Linear | None = None  # multi-headed only (else the layer's)
        self.project_out: nn.Linear | None = None
        if heads > 1 and inner != dim:
            self.project_in, self.project_out = nn.Linear(dim, inner), nn.Linear(inner, dim)
        with own_draws():
            if heads == 1:
                self.layer = VectorQuantizer(
                    dim,
                    codebook_size,
                    codebook_dim=self.codebook_dim,
                    cosine=use_cosine_sim,
                    **layer_options,
                )
            elif separate:
                self.layer = VQGroupedResidualVQ(
                    inner, heads, 1, codebook_size, per_stage_gradient=True, **layer_options
                )
            else:
                self.layer = VectorQuantizer(
                    self.codebook_dim, codebook_size, cosine=use_cosine_sim, **layer_options
                )
        redraw_projections(self.layer)
        if not kmeans_init:
            groups = heads if separate else 1
            books = anchor_codebooks(1, groups, codebook_size, self.codebook_dim, use_cosine_sim)
            start_from(self.layer, books)

    @property
    def codebook(self) -> torch.Tensor:
        """The codewords float32 [K, codebook_dim] ([heads, K, codebook_dim] per head)."""
        books = self.layer.effective_codebooks()
        return books if self.separate_codebook_per_head else books[0]

    def forward(
        self,
        x: torch.Tensor,
        indices=None,
        mask: torch.Tensor | None = None,
        lens: torch.Tensor | None = None,
        topk=None,
        sample_codebook_temp=None,
        freeze_codebook: bool | None = None,
        return_loss_breakdown: bool = False,
        codebook_transform_fn=None,
        ema_update_weight=None,
        accum_ema_update: bool = False,
        ema_update: bool | None = None,
    ):
        """See the class docstring; ``ema_update=False`` is ``freeze_codebook=True``."""
        refuse_call(
            "VectorQuantize.forward",
            indices=indices,
            topk=topk,
            sample_codebook_temp=sample_codebook_temp,
            codebook_transform_fn=codebook_transform_fn,
            ema_update_weight=ema_update_weight,
            accum_ema_update=accum_ema_update,
        )
        if lens is not None:
            mask = lens_to_mask(lens, x.shape[1])
        move = self.channel_first and x.dim() > 2
        rows = x.movedim(1, -1) if move else x
        freeze = self.freeze_codebook if freeze_codebook is None else freeze_codebook
        with frozen(self.layer, bool(freeze) or ema_update is False):
            quantized, codes, out = self._quantize(rows, mask)
        codes = codes.long()
        if mask is not None:
            codes = codes.masked_fill(~(mask[..., None] if self.heads > 1 else mask), -1)
            if not self.return_zeros_for_masked_padding:
                quantized = torch.where(mask[..., None], quantized, rows)
        if self.training:
            loss, commitment = _anchor_loss(out, self.commitment_weight), out.commitment
        else:
            loss = commitment = quantized.new_zeros(())
        if move:
            quantized = quantized.movedim(-1, 1)
        if not return_loss_breakdown:
            return quantized, codes, loss
        zero = loss.new_zeros(())
        return quantized, codes, loss, LossBreakdown(commitment, zero, zero, zero)

    def _quantize(self, rows: torch.Tensor, mask: torch.Tensor | None):
        """``rows`` [..., dim] → (quantized [..., dim], codes [...] or [..., heads], vq's
        output)."""
        if self.heads == 1:
            out = self.layer(rows, mask)
            return out.quantized, out.codes, out
        z = rows if self.project_in is None else self.project_in(rows)
        lead = z.shape[:-1]
        if self.separate_codebook_per_head:  # one stage per head: codes [..., heads, 1]
            out = self.layer(z, mask)
            quantized, codes = out.quantized, out.codes[..., 0]
        else:  # the heads as rows of one codebook
            heads_mask = None if mask is None else mask[..., None].expand(*lead, self.heads)
            out = self.layer(z.reshape(*lead, self.heads, self.codebook_dim), heads_mask)
            quantized, codes = out.quantized.reshape(*lead, -1), out.codes
        if self.project_out is not None:
            quantized = self.project_out(quantized)
            if mask is not None:
                quantized = quantized * mask[..., None].to(quantized.dtype)
        return quantized, codes, out

    def _codes(self, indices: torch.Tensor) -> torch.Tensor:
        """Code-space codewords of ``indices`` [...] (or [..., heads]) → [..., codebook_dim ·
        heads], channels last; -1 gives zeros."""
        books = self.layer.effective_codebooks()  # [1 or heads, K, codebook_dim]
        indices = indices.long()
        safe = indices.clamp_min(0)
        if self.separate_codebook_per_head:
            codes = books[torch.arange(self.heads, device=indices.device), safe]
        else:
            codes = books[0][safe]
        codes = codes * (indices >= 0)[..., None].to(codes.dtype)
        return codes.flatten(-2) if self.heads > 1 else codes

    def _layout(self, codes: torch.Tensor) -> torch.Tensor:
        return codes.movedim(-1, 1) if self.channel_first and codes.dim() > 2 else codes

    def get_codes_from_indices(self, indices: torch.Tensor) -> torch.Tensor:
        """Codewords of ``indices`` in the code space (before ``project_out``), float32
        ``[..., codebook_dim · heads]``, channels first for channel-first layers."""
        return self._layout(self._codes(indices))

    def get_output_from_indices(self, indices: torch.Tensor) -> torch.Tensor:
        """The reconstruction of ``indices``, float32 ``[..., dim]`` in the layer's layout: what
        an eval-mode ``forward`` returns as ``quantized``."""
        codes = self._codes(indices)
        project_out = self.project_out if self.heads > 1 else self.layer.project_out
        return self._layout(codes if project_out is None else project_out(codes))


class ResidualVQ(nn.Module):
    """vector-quantize-pytorch's ``ResidualVQ`` on :class:`vq.ResidualVQ` (EMA by default, the
    anchor's random start, every stage passing its residual's gradient: straight through or,
    by default, rotated onto its own codeword).

    Args (the anchor's, with the VectorQuantize arguments it hands each stage; those vq cannot
    honour raise a ValueError naming them):
        dim, num_quantizers, codebook_size, codebook_dim: Q stages of K codewords in a
            ``codebook_dim``-dimensional code space (one projection pair around the stack).
        quantize_dropout, quantize_dropout_cutoff_index: in training, each sample keeps its
            first n stages, n uniform in [cutoff + 1, Q] (drawn per sample; the anchor draws one
            n per batch).
        accept_image_fmap: input ``[B, dim, H, W]`` (the anchor's fails on it in 1.32).
        decay, eps, kmeans_init, kmeans_iters, threshold_ema_dead_code, commitment_weight,
        rotation_trick, ema_update, learnable_codebook, freeze_codebook,
        return_zeros_for_masked_padding, sync_codebook: as :class:`VectorQuantize`'s, for
            every stage.

    ``forward(x, mask=None, return_all_codes=False, freeze_codebook=False)`` returns
    ``(quantized, indices, losses)``: indices int64 ``[..., Q]`` (-1 at padding and at dropped
    stages), losses Tensor[Q], each stage's ``commitment_weight ·`` commitment in training (see
    :func:`vq.compat.common.stage_losses` for their gradient), zeros in eval mode; with
    ``return_all_codes`` also every stage's codewords ``[Q, ..., codebook_dim]``.
    """

    def __init__(
        self,
        *,
        dim: int,
        num_quantizers: int | None = None,
        codebook_size: int | tuple[int, ...],
        codebook_dim: int | None = None,
        quantize_dropout: bool = False,
        quantize_dropout_cutoff_index: int = 0,
        accept_image_fmap: bool = False,
        return_zeros_for_masked_padding: bool = True,
        decay: float = 0.8,
        eps: float = 1e-5,
        kmeans_init: bool = False,
        kmeans_iters: int = 10,
        threshold_ema_dead_code: float = 0,
        commitment_weight: float = 1.0,
        rotation_trick: bool | None = None,
        ema_update: bool | None = None,
        learnable_codebook: bool | None = None,
        freeze_codebook: bool = False,
        sync_codebook: bool | None = None,
        **options,
    ):
        super().__init__()
        refuse("ResidualVQ", options, RESIDUAL_VQ_REFUSED)
        check_sync("ResidualVQ", sync_codebook)
        num_quantizers, codebook_size = _stage_sizes(num_quantizers, codebook_size)
        learning = learning_rule(
            "ResidualVQ",
            decay=decay,
            eps=eps,
            kmeans_init=kmeans_init,
            kmeans_iters=kmeans_iters,
            threshold_ema_dead_code=threshold_ema_dead_code,
            commitment_weight=commitment_weight,
            use_cosine_sim=False,
            ema_update=ema_update,
            learnable_codebook=learnable_codebook,
        )
        self.dim, self.num_quantizers, self.codebook_size = dim, num_quantizers, codebook_size
        self.codebook_dim = dim if codebook_dim is None else codebook_dim
        self.commitment_weight = float(commitment_weight)
        self.accept_image_fmap, self.freeze_codebook = accept_image_fmap, freeze_codebook
        self.return_zeros_for_masked_padding = return_zeros_for_masked_padding
        rotate = self.codebook_dim > 1 if rotation_trick is None else bool(rotation_trick)
        with own_draws():
            self.layer = VQResidualVQ(
                dim,
                num_quantizers,
                codebook_size,
                codebook_dim=self.codebook_dim,
                learning=learning,
                commitment_weight=commitment_weight,
                rotation_trick=rotate,
                per_stage_gradient=True,
                **dropout_options(quantize_dropout, quantize_dropout_cutoff_index, num_quantizers),
            )
        redraw_projections(self.layer)
        if not kmeans_init:
            books = anchor_codebooks(num_quantizers, 1, codebook_size, self.codebook_dim, False)
            start_from(self.layer, books)

    @property
    def codebooks(self) -> torch.Tensor:
        """Every stage's codewords, float32 [Q, K, codebook_dim]."""
        return self.layer.effective_codebooks()

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        indices=None,
        return_all_codes: bool = False,
        sample_codebook_temp=None,
        freeze_codebook: bool = False,
        beam_size=None,
        rand_quantize_dropout_fixed_seed=None,
    ):
        """See the class docstring."""
        refuse_call(
            "ResidualVQ.forward",
            indices=indices,
            sample_codebook_temp=sample_codebook_temp,
            beam_size=beam_size,
            rand_quantize_dropout_fixed_seed=rand_quantize_dropout_fixed_seed,
        )
        rows = x.movedim(1, -1) if self.accept_image_fmap else x
        with frozen(self.layer, bool(freeze_codebook or self.freeze_codebook)):
            out = self.layer(rows, mask)
        quantized, codes = _padded(out, rows, mask, self.return_zeros_for_masked_padding)
        losses = stage_losses(self.training, out.loss, out.stage_commitment, self.commitment_weight)
        if self.accept_image_fmap:
            quantized = quantized.movedim(-1, 1)
        if return_all_codes:
            return quantized, codes, losses, self.get_codes_from_indices(codes)
        return quantized, codes, losses

    def get_codes_from_indices(self, indices: torch.Tensor) -> torch.Tensor:
        """Every stage's codeword of ``indices`` [..., q] (q <= Q; -1 and missing stages give
        zeros), in the code space → float32 [Q, ..., codebook_dim]."""
        return residual_codes(self.codebooks, indices)

    def get_output_from_indices(self, indices: torch.Tensor) -> torch.Tensor:
        """The reconstruction of ``indices`` [..., q] → float32 [..., dim] (``[B, dim, H, W]``
        for image feature maps): what an eval-mode ``forward`` returns as ``quantized``."""
        codes = self.get_codes_from_indices(indices).sum(0)
        project_out = self.layer.project_out
        out = codes if project_out is None else project_out(codes)
        return out.movedim(-1, 1) if self.accept_image_fmap else out


class GroupedResidualVQ(nn.Module):
    """vector-quantize-pytorch's ``GroupedResidualVQ`` on :class:`vq.GroupedResidualVQ`: the
    channels cut into ``groups`` slices, each quantized by its own residual stack (the
    :class:`ResidualVQ` arguments, for every group; one quantizer-dropout draw per sample).

    ``forward(x, mask=None, return_all_codes=False, freeze_codebook=False)`` returns
    ``(quantized, indices [G, ..., Q], losses [G, Q])``.
    """

    def __init__(
        self,
        *,
        dim: int,
        groups: int = 1,
        accept_image_fmap: bool = False,
        num_quantizers: int | None = None,
        codebook_size: int | tuple[int, ...],
        quantize_dropout: bool = False,
        quantize_dropout_cutoff_index: int = 0,
        return_zeros_for_masked_padding: bool = True,
        decay: float = 0.8,
        eps: float = 1e-5,
        kmeans_init: bool = False,
        kmeans_iters: int = 10,
        threshold_ema_dead_code: float = 0,
        commitment_weight: float = 1.0,
        rotation_trick: bool | None = None,
        ema_update: bool | None = None,
        learnable_codebook: bool | None = None,
        freeze_codebook: bool = False,
        sync_codebook: bool | None = None,
        **options,
    ):
        super().__init__()
        refuse("GroupedResidualVQ", options, GROUPED_RESIDUAL_VQ_REFUSED)
        check_sync("GroupedResidualVQ", sync_codebook)
        if groups < 1 or dim % groups:
            raise ValueError(f"groups must be >= 1 and divide dim={dim}, got {groups}")
        num_quantizers, codebook_size = _stage_sizes(num_quantizers, codebook_size)
        learning = learning_rule(
            "GroupedResidualVQ",
            decay=decay,
            eps=eps,
            kmeans_init=kmeans_init,
            kmeans_iters=kmeans_iters,
            threshold_ema_dead_code=threshold_ema_dead_code,
            commitment_weight=commitment_weight,
            use_cosine_sim=False,
            ema_update=ema_update,
            learnable_codebook=learnable_codebook,
        )
        self.dim, self.groups, self.num_quantizers = dim, groups, num_quantizers
        self.codebook_size, self.commitment_weight = codebook_size, float(commitment_weight)
        self.accept_image_fmap, self.freeze_codebook = accept_image_fmap, freeze_codebook
        self.return_zeros_for_masked_padding = return_zeros_for_masked_padding
        part = dim // groups
        rotate = part > 1 if rotation_trick is None else bool(rotation_trick)
        with own_draws():
            self.layer = VQGroupedResidualVQ(
                dim,
                groups,
                num_quantizers,
                codebook_size,
                learning=learning,
                commitment_weight=commitment_weight,
                rotation_trick=rotate,
                per_stage_gradient=True,
                **dropout_options(quantize_dropout, quantize_dropout_cutoff_index, num_quantizers),
            )
        if not kmeans_init:
            draws = groups * num_quantizers
            start_from(self.layer, anchor_codebooks(draws, 1, codebook_size, part, False))

    @property
    def codebooks(self) -> torch.Tensor:
        """Every group's stages' codewords, float32 [G, Q, K, dim / G]."""
        books = self.layer.effective_codebooks()
        return books.reshape(self.groups, self.num_quantizers, *books.shape[1:])

    def forward(
        self,
        x: torch.Tensor,
        indices=None,
        return_all_codes: bool = False,
        sample_codebook_temp=None,
        freeze_codebook: bool = False,
        mask: torch.Tensor | None = None,
    ):
        """See the class docstring."""
        refuse_call(
            "GroupedResidualVQ.forward", indices=indices, sample_codebook_temp=sample_codebook_temp
        )
        rows = x.movedim(1, -1) if self.accept_image_fmap else x
        with frozen(self.layer, bool(freeze_codebook or self.freeze_codebook)):
            out = self.layer(rows, mask)
        quantized, codes = _padded(out, rows, mask, self.return_zeros_for_masked_padding)
        losses = stage_losses(self.training, out.loss, out.stage_commitment, self.commitment_weight)
        if self.accept_image_fmap:
            quantized = quantized.movedim(-1, 1)
        codes = codes.movedim(-2, 0)  # [G, ..., Q]
        if return_all_codes:
            return quantized, codes, losses, self.get_codes_from_indices(codes)
        return quantized, codes, losses

    def get_codes_from_indices(self, indices: torch.Tensor) -> torch.Tensor:
        """Codewords of ``indices`` [G, ..., q] → float32 [G, Q, ..., dim / G]."""
        pairs = zip(self.codebooks, indices, strict=True)
        return torch.stack([residual_codes(books, i) for books, i in pairs])

    def get_output_from_indices(self, indices: torch.Tensor) -> torch.Tensor:
        """The reconstruction of ``indices`` [G, ..., q] → float32 [..., dim] (``[B, dim, H,
        W]`` for image feature maps): an eval-mode ``forward``'s ``quantized``."""
        out = torch.cat(list(self.get_codes_from_indices(indices).sum(1)), dim=-1)
        return out.movedim(-1, 1) if self.accept_image_fmap else out


def _stage_sizes(num_quantizers: int | None, codebook_size) -> tuple[int, int]:
    """(Q, K) from the anchor's ``num_quantizers`` and ``codebook_size`` (an int, or one size
    per stage, which must all be equal here)."""
    if isinstance(codebook_size, tuple | list):
        if len(set(codebook_size)) != 1:
            raise ValueError(
                f"codebook_size={codebook_size!r}: vq's residual stages all have the same size"
            )
        if num_quantizers not in (None, len(codebook_size)):
            raise ValueError(
                f"num_quantizers={num_quantizers} and {len(codebook_size)} codebook sizes disagree"
            )
        return len(codebook_size), int(codebook_size[0])
    if num_quantizers is None:
        raise ValueError("give num_quantizers (or one codebook_size per stage)")
    return int(num_quantizers), int(codebook_size)


def _padded(out, rows, mask, zeros: bool):
    """vq's reconstruction (the input at padding unless ``zeros``) and its codes, int64 with -1
    at padding and at dropped stages."""
    codes = drop_stages(out.codes.long(), out.num_stages)
    quantized = out.quantized
    if mask is not None:
        padding = ~mask.reshape(*mask.shape, *([1] * (codes.dim() - mask.dim())))
        codes = codes.masked_fill(padding, -1)
        if not zeros:
            quantized = torch.where(mask[..., None], quantized, rows)
    return quantized, codes


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
