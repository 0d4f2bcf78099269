"""What a quantizer layer's ``forward`` returns (:class:`QuantizerOutput`), and what a
subclass's quantization step hands the shared pipeline (:class:`Step`): see
:mod:`vq.quantizers.layer`."""

from __future__ import annotations

from typing import NamedTuple

import torch


class QuantizerOutput(NamedTuple):
    """What ``forward`` returns.

    Attributes:
        quantized: Tensor[..., dim] (or ``[B, dim, ...]`` for channel-first layers), the
            reconstruction, in the input's dtype; its gradient reaches the input through the
            straight-through estimator (or the rotation trick). Zero at masked positions.
        codes: integer Tensor[..., *code_shape] of ``code_dtype`` (masked positions hold the
            codes of whatever they contained).
        loss: scalar, ``commitment_weight · commitment + codebook_weight · codebook_loss``:
            what to add to the training loss.
        commitment: scalar, mean squared distance between the input (in code space) and its
            detached reconstruction (ResidualVQ: the mean over stages of the distance to each
            partial reconstruction).
        codebook_loss: scalar, the same distance with the input detached and the codebook
            learning (0 unless ``learning`` is gradient-based).
        perplexity: ``exp`` of the entropy of this batch's code distribution: scalar for a
            single codebook, Tensor[G] per codebook (PQ groups, RVQ stages).
        usage: fraction of the codes used at least once in this batch, same shape.
        num_stages: residual layers only: int64 Tensor[B], the stages each sample used (fewer
            than ``num_quantizers`` under quantizer dropout); None otherwise.
        per_sample_entropy: LFQ layers in training mode: the mean entropy of each vector's
            code distribution (scalar; Tensor[Q] per stage for ResidualLFQ); None otherwise.
        codebook_entropy: LFQ layers in training mode: the entropy of the batch's mean code
            distribution, same shape.
        stage_commitment: residual layers with a commitment term (ResidualVQ, ResidualLFQ):
            detached float32 Tensor[Q] (GroupedResidualVQ: [G, Q]), stage m's mean squared
            distance ``||z - P_m||² / d`` over the vectors it kept (what
            vector-quantize-pytorch reports per stage); ``commitment`` is their mean weighted
            by those vectors. None otherwise.
    """

    quantized: torch.Tensor
    codes: torch.Tensor
    loss: torch.Tensor
    commitment: torch.Tensor | None = None
    codebook_loss: torch.Tensor | None = None
    perplexity: torch.Tensor | None = None
    usage: torch.Tensor | None = None
    num_stages: torch.Tensor | None = None
    per_sample_entropy: torch.Tensor | None = None
    codebook_entropy: torch.Tensor | None = None
    stage_commitment: torch.Tensor | None = None


class Step(NamedTuple):
    """What a subclass's ``_quantize`` returns, for the rows of the batch in code space."""

    quantized: torch.Tensor  # float32 [n, code_dim], with the gradient path to the input
    codes: torch.Tensor  # int64 [n, *code_shape]
    commitment: torch.Tensor  # scalar
    codebook_loss: torch.Tensor  # scalar (0 unless the codebooks learn by gradient)
    counts: torch.Tensor  # float32 [G, K], code counts of the batch per codebook
    num_stages: torch.Tensor | None = None  # int64 [B] (residual layers)
    aux_loss: torch.Tensor | None = None  # scalar added to ``loss`` as it is (LFQ's entropy)
    entropies: tuple[torch.Tensor, torch.Tensor] | None = None  # per sample, codebook (LFQ)
    stage_commitment: torch.Tensor | None = None  # detached [Q] (residual layers)
