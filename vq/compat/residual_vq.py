"""vector-quantize-pytorch's residual codebook layers on vq's: ``ResidualVQ`` on
:class:`vq.ResidualVQ` and ``GroupedResidualVQ`` on :class:`vq.GroupedResidualVQ`, every stage
passing its own gradient (``per_stage_gradient=True``), held as ``.layer``.

Each takes the anchor's constructor arguments (names and defaults of version 1.34; those of
:class:`~vq.compat.VectorQuantize` for every stage) and returns what the anchor returns:
``(quantized, indices, losses)``, int64 indices ``[..., Q]`` with ``-1`` at padding and at
stages left out by quantizer dropout, a loss per stage (zeros in eval mode). The codebooks start
where the anchor's start: one kaiming-uniform draw per stage from the global generator, in the
anchor's order.
"""

from __future__ import annotations

import torch
from torch import nn

from vq.compat.anchor_forward import drop_stages, frozen, residual_codes, stage_losses
from vq.compat.anchor_start import (
    anchor_codebooks,
    dead_code_ratios,
    dropout_options,
    learning_rule,
    own_draws,
    redraw_projections,
    start_from,
)
from vq.compat.refusals import DROPOUT_MULTIPLE, Refused, check_sync, refuse, refuse_call
from vq.compat.vector_quantize import VECTOR_QUANTIZE_REFUSED
from vq.quantizers import GroupedResidualVQ as VQGroupedResidualVQ
from vq.quantizers import ResidualVQ as VQResidualVQ

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
    "quantize_dropout_multiple_of": DROPOUT_MULTIPLE,
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
        decay, eps, kmeans_init, kmeans_iters, dead_code_threshold_ratio,
        reset_cluster_size_ratio, threshold_ema_dead_code, reset_cluster_size, commitment_weight,
        rotation_trick, ema_update, learnable_codebook, freeze_codebook,
        return_zeros_for_masked_padding, sync_codebook: as :class:`VectorQuantize`'s, for
            every stage.

    ``forward(x, mask=None, return_all_codes=False, freeze_codebook=False)`` returns
    ``(quantized, indices, losses)``: indices int64 ``[..., Q]`` (-1 at padding and at dropped
    stages), losses Tensor[Q], each stage's ``commitment_weight ·`` commitment in training (see
    :func:`vq.compat.anchor_forward.stage_losses` for their gradient), zeros in eval mode; with
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
        dead_code_threshold_ratio: float = 0.0,
        reset_cluster_size_ratio: float | None = None,
        threshold_ema_dead_code: float | None = None,
        reset_cluster_size: float | None = None,
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
            dead_code=dead_code_ratios(
                "ResidualVQ",
                codebook_size,
                dead_code_threshold_ratio=dead_code_threshold_ratio,
                reset_cluster_size_ratio=reset_cluster_size_ratio,
                threshold_ema_dead_code=threshold_ema_dead_code,
                reset_cluster_size=reset_cluster_size,
            ),
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
        dead_code_threshold_ratio: float = 0.0,
        reset_cluster_size_ratio: float | None = None,
        threshold_ema_dead_code: float | None = None,
        reset_cluster_size: float | None = None,
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
            dead_code=dead_code_ratios(
                "GroupedResidualVQ",
                codebook_size,
                dead_code_threshold_ratio=dead_code_threshold_ratio,
                reset_cluster_size_ratio=reset_cluster_size_ratio,
                threshold_ema_dead_code=threshold_ema_dead_code,
                reset_cluster_size=reset_cluster_size,
            ),
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
