"""What the compat layers' forwards share: masks from sequence lengths, frozen codebooks, and
the anchor's per-stage outputs of residual layers (codes with -1 for dropped stages, a loss per
stage, the codewords of indices).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn


@contextmanager
def frozen(layer: nn.Module, freeze: bool):
    """Run ``layer`` without updating its codebooks (eval mode) when ``freeze``."""
    if not freeze:  # touches nothing (a graph being exported sees no module mutated)
        yield
        return
    was = layer.training
    layer.train(False)
    try:
        yield
    finally:
        layer.train(was)


def lens_to_mask(lens: torch.Tensor, length: int) -> torch.Tensor:
    """Sequence lengths int Tensor[B] → bool Tensor[B, length], True inside each sequence."""
    return torch.arange(length, device=lens.device) < lens[:, None]


def drop_stages(codes: torch.Tensor, num_stages: torch.Tensor | None) -> torch.Tensor:
    """Codes int64 [B, ..., Q] with -1 at the stages quantizer dropout left out of each sample
    (``num_stages`` int64 [B], the stages each sample kept), as the anchor writes them."""
    if num_stages is None:
        return codes
    kept = num_stages.reshape(-1, *([1] * (codes.dim() - 1)))
    stage = torch.arange(codes.shape[-1], device=codes.device)
    return codes.masked_fill(stage >= kept, -1)


def stage_losses(
    training: bool, loss: torch.Tensor, stage_commitment: torch.Tensor, weight: float
) -> torch.Tensor:
    """The anchor's loss per stage, Tensor[*stages] (zeros in eval mode, as the anchor's).

    In value ``weight · stage_commitment`` (vq's detached per-stage commitments). Each entry
    carries the gradient of vq's ``loss`` (the mean over stages), so that their sum has the
    gradient of the sum of the anchor's per-stage losses and their mean that of their mean —
    what training code does with them; a weighted sum of stages does not."""
    if not training:
        return torch.zeros_like(stage_commitment)
    return weight * stage_commitment + (loss - loss.detach())


def residual_codes(codebooks: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """Each stage's codeword of integer ``indices`` [..., q] (q <= Q stages; -1, and the
    stages past q, give zeros) from ``codebooks`` [Q, K, d] → Tensor[Q, ..., d]."""
    q = codebooks.shape[0]
    indices = indices.long()
    if indices.shape[-1] > q:
        raise ValueError(f"indices: expected at most {q} stages, got {indices.shape[-1]}")
    if indices.shape[-1] < q:
        indices = F.pad(indices, (0, q - indices.shape[-1]), value=-1)
    stage = torch.arange(q, device=indices.device)
    codes = codebooks[stage, indices.clamp_min(0)]  # [..., Q, d]
    codes = codes * (indices >= 0)[..., None].to(codes.dtype)
    return codes.movedim(-2, 0)


def sign_corners(indices: torch.Tensor, bits: int, scale: float) -> torch.Tensor:
    """LFQ's codewords of integer ``indices`` [...]: ``±scale`` per bit, most significant
    first → float32 Tensor[..., bits]."""
    shifts = torch.arange(bits - 1, -1, -1, device=indices.device)
    ones = (indices.long()[..., None] >> shifts) & 1
    return (2.0 * ones.float() - 1.0) * scale
