"""Stateless pieces of the training forward: gradient estimators, masked losses, code usage.

Everything here is plain tensor algebra with static shapes (no ``.item()``, no boolean-mask
indexing), so it runs the same eagerly, under ``torch.compile(fullgraph=True)`` and in
``torch.export``.

References:
    A. van den Oord, O. Vinyals, K. Kavukcuoglu, "Neural discrete representation learning",
    NeurIPS 2017 (straight-through estimator, commitment and codebook losses).
    C. Fifty et al., "Restructuring vector quantization with the rotation trick", ICLR 2025.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def straight_through(z: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``q`` in value, identity in gradient: ``z + sg(q - z)``.

    Args:
        z: Tensor[..., d], the encoder output (carries the gradient).
        q: Tensor[..., d], its quantization (any gradient it carries is ignored).
    """
    return z + (q - z).detach()


class _StraightThroughLoss(torch.autograd.Function):
    @staticmethod
    def forward(z, q, loss, direction, scale):
        return q, loss

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[3], inputs[4])
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, grad_q, grad_loss):
        direction, scale = ctx.saved_tensors
        if grad_loss is None:
            return grad_q, None, None, None, None
        if grad_q is None:
            return direction * (grad_loss * scale), None, None, None, None
        return torch.addcmul(grad_q, direction, grad_loss * scale), None, None, None, None


def straight_through_loss(
    z: torch.Tensor,
    q: torch.Tensor,
    loss: torch.Tensor,
    direction: torch.Tensor,
    scale: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The straight-through output and the commitment loss as one autograd node.

    ``(q, loss)`` in value; the gradient reaches ``z`` as the identity through ``q`` and as
    ``scale · direction`` (= ∂loss/∂z, precomputed) through ``loss``. Equivalent to
    ``(z + sg(q - z), ||z - sg(q)||² / N)`` with ``direction = z - q`` and ``scale = 2 / N``,
    without the [n, d] temporaries those build in the forward pass and their sum in the
    backward pass.

    Args:
        z: Tensor[n, d] with gradient; q: detached Tensor[n, d]; loss: detached scalar;
        direction: detached Tensor[n, d]; scale: detached scalar tensor.
    """
    return _StraightThroughLoss.apply(z, q, loss, direction, scale)


def rotation_trick(z: torch.Tensor, q: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``q`` in value; the gradient reaches ``z`` through the rotation and rescaling that maps
    ``z`` onto ``q`` (held constant), so it keeps its angle to the codeword (Fifty et al. 2025).

    With ``u = z/|z|``, ``v = q/|q|`` and ``w = (u + v)/|u + v|``, the rotation is
    ``R = I - 2wwᵀ + 2vuᵀ`` and the output ``sg(|q|/|z|) · R z``; a final straight-through
    correction makes the value exactly ``q`` despite rounding.

    Args:
        z: Tensor[..., d] with gradient; q: Tensor[..., d] (detached inside).
    """
    q = q.detach()
    z_norm = z.detach().norm(dim=-1, keepdim=True).clamp_min(eps)
    q_norm = q.norm(dim=-1, keepdim=True).clamp_min(eps)
    u, v = z.detach() / z_norm, q / q_norm
    w = F.normalize(u + v, dim=-1, eps=eps)
    rotated = z - 2.0 * (z * w).sum(-1, keepdim=True) * w + 2.0 * (z * u).sum(-1, keepdim=True) * v
    out = rotated * (q_norm / z_norm)
    return out + (q - out).detach()


def stage_estimate(r: torch.Tensor, q: torch.Tensor, rotate: bool, keep) -> torch.Tensor:
    """One stage's output under ``per_stage_gradient``: ``q`` [n, d] (detached) in value, with
    the gradient of the stage's residual ``r`` [n, d] straight through, or through the rotation
    of ``r`` onto ``q`` (:func:`rotation_trick`); times ``keep`` [n, 1] (its quantizer-dropout
    mask) unless None."""
    out = rotation_trick(r, q) if rotate else r + (q - r).detach()
    return out if keep is None else out * keep


def codeword_tables(queries: torch.Tensor, codewords: torch.Tensor, metric: str) -> torch.Tensor:
    """ADC tables of one codebook: float32 queries [nq, d], codewords [K, d] → [nq, 1, K],
    inner products (``metric="ip"``) or squared L2 distances clamped at 0."""
    dots = queries @ codewords.T
    if metric == "ip":
        return dots[:, None, :]
    sq = (queries * queries).sum(1, keepdim=True) - 2.0 * dots + (codewords * codewords).sum(1)
    return sq.clamp_min(0.0)[:, None, :]


def training_rows(codebook_size: int) -> int:
    """Rows per distance block in a training step: up to 64 MiB of float32 distances, so that
    a step makes one or two GEMM + arg-min passes per codebook rather than one per 4 MiB block
    (each pass hands the cores from torch's thread pool to numba's and back, which costs more
    than the work when other processes — data loaders — hold cores)."""
    return max(1024, (1 << 24) // max(codebook_size, 1))


def row_norms(x: torch.Tensor) -> torch.Tensor:
    """``||x_i||²`` of the rows of Tensor[..., d] → [...], without an [..., d] temporary."""
    return torch.einsum("...d,...d->...", x, x)


def masked_mse(a: torch.Tensor, b: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
    """Mean squared difference over the vectors whose ``weight`` is non-zero.

    Args:
        a, b: Tensor[..., n, d] (any leading group axes).
        weight: float Tensor[n] of 0/1 (1 = counts), or None for a plain mean.

    Returns:
        A scalar: ``Σ w ||a - b||² / (Σ w · groups · d)`` (0 when every weight is 0).
    """
    if weight is None:
        return F.mse_loss(a, b)
    sq = ((a - b) ** 2).sum(-1)  # [..., n]
    per_row = a.shape[-1] * (sq.numel() // max(sq.shape[-1], 1))
    return (sq * weight).sum() / (weight.sum() * per_row).clamp_min(1.0)


def code_counts(
    codes: torch.Tensor, codebook_size: int, weight: torch.Tensor | None = None
) -> torch.Tensor:
    """How often each code is used, per codebook.

    Args:
        codes: integer Tensor[G, n], the codes of n vectors in G codebooks.
        codebook_size: K.
        weight: float Tensor[n] or [G, n] (0 for padding), or None.

    Returns:
        float32 Tensor[G, K] (``index_add_``, not ``bincount``, so the shape never depends on the
        data).
    """
    groups, n = codes.shape
    flat = codes.long() + torch.arange(groups, device=codes.device)[:, None] * codebook_size
    if weight is None:
        values = torch.ones(groups * n, device=codes.device)
    else:
        values = weight.float().expand(groups, n).reshape(-1)
    counts = torch.zeros(groups * codebook_size, device=codes.device)
    return counts.index_add_(0, flat.reshape(-1), values).reshape(groups, codebook_size)


def usage_statistics(counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Perplexity and fraction of codes used, per codebook.

    Args:
        counts: float Tensor[G, K] of code counts in a batch.

    Returns:
        ``(perplexity, usage)``, float32 Tensor[G] each: ``exp(H(p))`` of the code distribution
        (K when every code is equally used, 1 when one code takes everything) and the fraction
        of the K codes used at least once.
    """
    total = counts.sum(-1, keepdim=True).clamp_min(1e-12)
    p = counts / total
    entropy = -(p * torch.log(p.clamp_min(1e-12))).sum(-1)
    return entropy.exp(), (counts > 0).float().mean(-1)
