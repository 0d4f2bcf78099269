"""vector-quantize-pytorch's ``VectorQuantize`` on :class:`vq.VectorQuantizer` (multi-headed:
on :class:`vq.GroupedResidualVQ` when every head has its own codebook).

It takes the anchor's constructor arguments (names and defaults of version 1.34), builds the vq
layer that learns as the anchor's does, held as ``.layer``, and returns what the anchor returns:
``(quantized, indices, loss)``, int64 indices, ``-1`` at padding, the loss zero in eval mode.

The codebook starts where the anchor's starts: a kaiming-uniform draw from the global generator
in the anchor's order (after the input/output projections, which are redrawn in its order too),
so that ``torch.manual_seed(s)`` before either library's constructor gives the same weights and
codebook. With ``kmeans_init=True`` each library runs its own k-means on the first batch.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from vq.compat.anchor_forward import frozen, lens_to_mask
from vq.compat.anchor_start import (
    anchor_codebooks,
    dead_code_ratios,
    learning_rule,
    own_draws,
    redraw_projections,
    start_from,
)
from vq.compat.refusals import Refused, check_sync, refuse, refuse_call
from vq.quantizers import GroupedResidualVQ as VQGroupedResidualVQ
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
        decay, eps, kmeans_init, kmeans_iters: the EMA rule (:class:`vq.EMA`, ``smoothing=
            "codeword"``); ``kmeans_init=False`` starts from the anchor's random codebook.
        dead_code_threshold_ratio, reset_cluster_size_ratio: codes used less than this
            fraction of the mean usage restart from batch vectors (``vq.EMA(dead_code_ratio=…,
            reset_ratio=…)``). threshold_ema_dead_code, reset_cluster_size: their deprecated
            aliases, converted as the anchor converts them (``v >= 1``: ``v / codebook_size``),
            with a DeprecationWarning.
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
        dead_code_threshold_ratio: float = 0.0,
        reset_cluster_size_ratio: float | None = None,
        threshold_ema_dead_code: float | None = None,
        reset_cluster_size: float | None = None,
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
            dead_code=dead_code_ratios(
                "VectorQuantize",
                codebook_size,
                dead_code_threshold_ratio=dead_code_threshold_ratio,
                reset_cluster_size_ratio=reset_cluster_size_ratio,
                threshold_ema_dead_code=threshold_ema_dead_code,
                reset_cluster_size=reset_cluster_size,
            ),
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
        self._build(learning, use_cosine_sim, kmeans_init)

    def _build(self, learning, use_cosine_sim: bool, kmeans_init: bool) -> None:
        """``.layer`` and the multi-headed projections, drawn in the anchor's order: the
        projections, then (without ``kmeans_init``) the codebooks."""
        dim, heads, codebook_size = self.dim, self.heads, self.codebook_size
        layer_options = dict(
            learning=learning,
            commitment_weight=self.commitment_weight,
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
            elif self.separate_codebook_per_head:
                self.layer = VQGroupedResidualVQ(
                    inner, heads, 1, codebook_size, per_stage_gradient=True, **layer_options
                )
            else:
                self.layer = VectorQuantizer(
                    self.codebook_dim, codebook_size, cosine=use_cosine_sim, **layer_options
                )
        redraw_projections(self.layer)
        if not kmeans_init:
            groups = heads if self.separate_codebook_per_head else 1
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
