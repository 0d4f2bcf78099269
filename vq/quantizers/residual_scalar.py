"""Residual stacks of codebook-free quantizers: residual FSQ and residual LFQ.

Stage m quantizes what stages 0..m-1 left, on a grid scaled down stage after stage, so that
each stage refines the last (no codebook to learn, nothing to collapse, nothing to sync):

- :class:`ResidualFSQ`: the input is soft-clamped to ``±L/(L-1)`` per code dimension (L
  levels), then stage m rounds ``clamp(r / L^-m, -1, 1)`` to the L-point uniform grid on
  ``[-1, 1]`` (symmetric: ``±1`` are grid points) and outputs it times ``L^-m``. The residual
  of an L-level uniform quantizer is uniform over one cell, ``±1/(L-1)`` wide, and the L-point
  grid that quantizes it best ends at ``±1/L`` of it: hence the scale ``L^-m`` (the one
  vector-quantize-pytorch uses).
- :class:`ResidualLFQ`: stage m takes the signs of the residual, ``±scale · 2^-m`` (a binary
  expansion), with MAGVIT-v2's entropy loss on every stage (:mod:`vq.quantizers.lfq`).

Both train with per-sample quantizer dropout and decode from any prefix of stages
(:class:`vq.quantizers.stages.Stages`); the output's gradient reaches the input straight through
(through the soft clamp for FSQ).

References:
    F. Mentzer et al., "Finite scalar quantization: VQ-VAE made simple", ICLR 2024.
    J. D. Parker et al., "Scaling transformers for low-bitrate high-quality speech coding",
    2024 (residual FSQ with a symmetric grid). L. Yu et al. (MAGVIT-v2), ICLR 2024 (LFQ).
    N. Zeghidour et al., "SoundStream", 2021 (residual stages, quantizer dropout).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from vq.parallel import sync
from vq.quantizers.additive import additive_tables
from vq.quantizers.base import Quantizer
from vq.quantizers.codec import Metric
from vq.quantizers.fsq import fsq_levels
from vq.quantizers.functional import code_counts, row_norms, stage_estimate
from vq.quantizers.layer import Step
from vq.quantizers.lfq import (
    check_entropy_options,
    lfq_bits,
    lfq_entropies,
    register_bit_tables,
    sign_values,
)
from vq.quantizers.stages import Stages, check_stage_options


class ScalarStages(Stages, Quantizer):
    """Base of the residual scalar quantizers: subclasses give ``_bound`` (the input of stage
    0), ``_stage_codes`` and ``_stage_values``, and optionally ``_stage_entropies``."""

    #: whether ``loss`` holds a commitment term (LFQ's codes are not bounded; FSQ's are)
    has_commitment = True

    def __init__(
        self,
        dim: int | None,
        code_dim: int,
        codebook_size: int,
        num_quantizers: int,
        *,
        quantizer_dropout: float,
        dropout_min_stages: int,
        commitment_weight: float,
        rotation_trick: bool,
        channel_first: bool,
        per_stage_gradient: bool,
    ):
        check_stage_options(num_quantizers, quantizer_dropout, dropout_min_stages)
        super().__init__(
            code_dim if dim is None else dim,
            codebook_size,
            (num_quantizers,),
            commitment_weight=commitment_weight,
            rotation_trick=rotation_trick,
            codebook_dim=code_dim,
            channel_first=channel_first,
        )
        self.num_quantizers, self.quantizer_dropout = num_quantizers, quantizer_dropout
        self.dropout_min_stages = dropout_min_stages
        self.per_stage_gradient = bool(per_stage_gradient)

    # -- subclass hooks -------------------------------------------------------------------
    def _bound(self, z: torch.Tensor) -> torch.Tensor:
        return z

    def _stage_codes(self, r: torch.Tensor, m: int) -> torch.Tensor:
        """Codes of stage m for residuals float32 [n, code_dim] → int64 [n]."""
        raise NotImplementedError

    def _stage_values(self, codes: torch.Tensor, m: int) -> torch.Tensor:
        """Stage m's contribution (scaled) of integer codes [n] → float32 [n, code_dim]."""
        raise NotImplementedError

    def _stage_input(self, r: torch.Tensor, m: int) -> torch.Tensor:
        """What stage m quantizes of its residual r [n, code_dim] (with r's gradient), under
        ``per_stage_gradient``: r itself, unless a subclass clamps it."""
        return r

    def _stage_entropies(self, r, m, weight, synced) -> tuple[torch.Tensor, torch.Tensor] | None:
        return None

    # -- the codec --------------------------------------------------------------------------
    def _min_training_vectors(self) -> int:
        return 1

    def _fit(self, x: torch.Tensor) -> None:
        pass

    def _encode(self, x: torch.Tensor) -> torch.Tensor:
        residual, codes = self._bound(x), []
        for m in range(self.num_quantizers):
            c = self._stage_codes(residual, m)
            residual = residual - self._stage_values(c, m)
            codes.append(c)
        return torch.stack(codes, dim=1)

    def _decode_prefix(self, codes: torch.Tensor) -> torch.Tensor:
        parts = [self._stage_values(codes[:, m], m) for m in range(codes.shape[1])]
        return torch.stack(parts).sum(0)

    def _decode(self, codes: torch.Tensor) -> torch.Tensor:
        return self._decode_prefix(codes.reshape(-1, self.num_quantizers))

    def static_encode(self, x: torch.Tensor) -> torch.Tensor:
        """``encode`` as one static-shape graph, float32 Tensor[n, dim] → int64 Tensor[n, Q]:
        ``project_in`` when there is one, then the stages."""
        return self._encode(self._code_space(x))

    def static_decode(self, codes: torch.Tensor) -> torch.Tensor:
        """``decode`` as one static-shape graph: integer codes Tensor[n, Q] → float32
        Tensor[n, dim] (the sum of the stages' values, then ``project_out``)."""
        return self._output_space(self._decode(codes))

    def _codebook_groups(self) -> torch.Tensor:
        """Every stage's values of every code, float32 [Q, K, code_dim] (its implicit
        codebooks; ``distance_tables`` reads them)."""
        grid = torch.arange(self.codebook_size, device=self.device)
        return torch.stack([self._stage_values(grid, m) for m in range(self.num_quantizers)])

    def tables(self, queries: torch.Tensor, metric: Metric) -> torch.Tensor:
        """float32 queries [nq, dim] → tables [nq, Q, K] (l2: as :class:`vq.ResidualVQ`'s)."""
        return additive_tables(queries, self._output_codebooks(), metric)

    # -- the layer --------------------------------------------------------------------------
    def _quantize(self, z, weight, lead, update) -> Step:
        """Stage by stage on ``u = _bound(z)``; the output is ``u`` straight through to the
        kept stages' sum. Commitment: the mean over stages of ``||u - sg(P_m)||²`` (P_m the
        sum through stage m); LFQ stages add their entropy loss on their residual. Under
        ``per_stage_gradient`` the output is the sum of the stages' own estimates instead
        (:func:`vq.quantizers.functional.stage_estimate` of ``_stage_input``)."""
        stages, keep = self._stage_mask(lead, z.device)
        synced = self.training and torch.is_grad_enabled() and sync.active()
        u = self._bound(z)
        residual = u.detach().clone()
        kept = torch.zeros_like(residual)
        squares, rows, codes, counts, entropies = [], [], [], [], []  # squares, rows: per stage
        per_stage = None  # Σ_m of the stages' own estimates (per_stage_gradient)
        for m in range(self.num_quantizers):
            w = weight if keep is None else (keep[:, m] if weight is None else keep[:, m] * weight)
            c = self._stage_codes(residual, m)
            q = self._stage_values(c, m)
            r = u - (u.detach() - residual)  # r_m with its gradient to z
            if self.training:
                found = self._stage_entropies(r, m, w, synced)
                if found is not None:
                    entropies.append(found)
            if self.per_stage_gradient:
                keep_m = None if keep is None else keep[:, m, None]
                part = stage_estimate(self._stage_input(r, m), q, self.rotation_trick, keep_m)
                per_stage = part if per_stage is None else per_stage + part
            residual = residual - q
            kept = kept + (q if keep is None else q * keep[:, m, None])
            if self.has_commitment:  # ||u - sg(P_m)||² = ||r_{m+1}||² with u's gradient
                diff = u - (u.detach() - residual)
                sq = row_norms(diff)
                squares.append(sq.sum() if w is None else (sq * w).sum())
                rows.append(u.new_full((), float(u.shape[0])) if w is None else w.sum())
            codes.append(c)
            counts.append(code_counts(c[None], self.codebook_size, w))
        commitment, stage_commitment = u.new_zeros(()), None
        if squares:
            squares, rows = torch.stack(squares), torch.stack(rows)
            commitment = squares.sum() / (rows.sum() * u.shape[1]).clamp_min(1.0)
            stage_commitment = squares.detach() / (rows * u.shape[1]).clamp_min(1.0)
        aux, breakdown = None, None
        if entropies:
            per_sample = torch.stack([e[0] for e in entropies])
            codebook = torch.stack([e[1] for e in entropies])
            aux = self.entropy_loss_weight * (per_sample - self.diversity_gamma * codebook).sum()
            breakdown = (per_sample, codebook)
        quantized = per_stage if self.per_stage_gradient else self._estimate(u, kept)
        codes, counts = torch.stack(codes, dim=1), torch.cat(counts)
        zero = z.new_zeros(())
        return Step(
            quantized, codes, commitment, zero, counts, stages, aux, breakdown, stage_commitment
        )


class ResidualFSQ(ScalarStages):
    """``num_quantizers`` stages of finite scalar quantization, each on the residual of the
    last, on a grid ``L^-m`` times finer (see the module docstring).

    Args:
        levels: values per code dimension, each >= 2 (e.g. ``[8, 5, 5, 5]``: 1000 codes per
            stage; at most 2^24, :data:`vq.quantizers.fsq.MAX_CODES`).
        num_quantizers: stages Q.
        dim: input dimension; learned projections map into and out of the ``len(levels)``-d
            code space when it differs (default: ``len(levels)``).
        quantizer_dropout, dropout_min_stages: per-sample quantizer dropout in training (see
            :class:`vq.ResidualVQ`); ``decode(codes, num_stages=n)`` decodes a prefix.
        rotation_trick, channel_first: layer options (see :class:`vq.Quantizer`).
        per_stage_gradient: False: the output is the soft-clamped input straight through to
            the sum of the stages. True (vector-quantize-pytorch's ``ResidualFSQ``): every kept
            stage passes its residual's gradient where the residual lies inside its grid
            (``|r| <= L^-m``, the clamp), and the input's gradient is their sum.

    Codes are ``[..., Q]``, integers in ``[0, Π levels)`` (mixed radix, first dimension least
    significant, as :class:`vq.FSQ`). Nothing to fit or learn; ``loss`` is 0.
    """

    has_commitment = False

    def __init__(
        self,
        levels: Sequence[int],
        num_quantizers: int,
        dim: int | None = None,
        *,
        quantizer_dropout: float = 0.0,
        dropout_min_stages: int = 1,
        rotation_trick: bool = False,
        channel_first: bool = False,
        per_stage_gradient: bool = False,
    ):
        levels = fsq_levels(levels)
        super().__init__(
            dim,
            len(levels),
            math.prod(levels),
            num_quantizers,
            quantizer_dropout=quantizer_dropout,
            dropout_min_stages=dropout_min_stages,
            commitment_weight=0.0,
            rotation_trick=rotation_trick,
            channel_first=channel_first,
            per_stage_gradient=per_stage_gradient,
        )
        self.levels = tuple(levels)
        lv = torch.tensor(levels)
        basis = [math.prod(levels[:i]) for i in range(len(levels))]
        scales = torch.stack([lv.double() ** -m for m in range(num_quantizers)]).float()
        self.register_buffer("_levels", lv, persistent=False)
        self.register_buffer("_basis", torch.tensor(basis), persistent=False)
        self.register_buffer("_scales", scales, persistent=False)  # [Q, L]
        self.register_buffer("_clamp", (lv / (lv - 1)).float(), persistent=False)
        self.mark_trained()

    def _bound(self, z: torch.Tensor) -> torch.Tensor:
        return torch.tanh(z / self._clamp) * self._clamp

    def _stage_input(self, r: torch.Tensor, m: int) -> torch.Tensor:
        return torch.maximum(torch.minimum(r, self._scales[m]), -self._scales[m])

    def _stage_codes(self, r: torch.Tensor, m: int) -> torch.Tensor:
        v = torch.clamp(r / self._scales[m], -1.0, 1.0)
        digits = torch.round((v + 1.0) * ((self._levels - 1).float() / 2.0)).long()
        return (digits * self._basis).sum(-1)

    def _stage_values(self, codes: torch.Tensor, m: int) -> torch.Tensor:
        quotient = torch.div(codes.long().reshape(-1, 1), self._basis, rounding_mode="trunc")
        digits = torch.remainder(quotient, self._levels).float()
        return (digits * (2.0 / (self._levels - 1).float()) - 1.0) * self._scales[m]


class ResidualLFQ(ScalarStages):
    """``num_quantizers`` stages of lookup-free quantization, stage m taking the signs of the
    residual at ``±scale · 2^-m``, each with its entropy loss.

    Args:
        dim: input dimension; learned projections map into and out of the ``num_bits``-d code
            space when it differs (default: ``num_bits``).
        num_quantizers: stages Q.
        codebook_size: 2^bits codes per stage; or give ``num_bits``.
        entropy_loss_weight, commitment_weight, diversity_gamma, inv_temperature, scale: as
            :class:`vq.LFQ` (every stage's entropy loss is weighted alike and summed; the
            commitment is the mean over stages of ``||z - sg(P_m)||²``).
        quantizer_dropout, dropout_min_stages: per-sample quantizer dropout in training;
            ``decode(codes, num_stages=n)`` decodes a prefix.
        rotation_trick, channel_first: layer options (see :class:`vq.Quantizer`).
        per_stage_gradient: False: the output is the input straight through to the sum of the
            stages. True (vector-quantize-pytorch's ``ResidualLFQ``): every kept stage passes
            its residual's gradient, so the input's gradient from the output is Q × (the kept
            stages ×) the upstream one, beside the entropy and commitment terms.

    Codes are ``[..., Q]`` (the sign bits of each stage, most significant first, as
    :class:`vq.LFQ`). The output's ``per_sample_entropy`` and ``codebook_entropy`` are
    Tensor[Q] in training mode.
    """

    def __init__(
        self,
        dim: int | None = None,
        num_quantizers: int = 2,
        codebook_size: int | None = None,
        *,
        num_bits: int | None = None,
        entropy_loss_weight: float = 0.1,
        commitment_weight: float = 0.25,
        diversity_gamma: float = 1.0,
        inv_temperature: float = 100.0,
        scale: float = 1.0,
        quantizer_dropout: float = 0.0,
        dropout_min_stages: int = 1,
        rotation_trick: bool = False,
        channel_first: bool = False,
        per_stage_gradient: bool = False,
    ):
        bits = lfq_bits(codebook_size, num_bits, dim)
        check_entropy_options(entropy_loss_weight, diversity_gamma, inv_temperature, scale)
        super().__init__(
            dim,
            bits,
            1 << bits,
            num_quantizers,
            quantizer_dropout=quantizer_dropout,
            dropout_min_stages=dropout_min_stages,
            commitment_weight=commitment_weight,
            rotation_trick=rotation_trick,
            channel_first=channel_first,
            per_stage_gradient=per_stage_gradient,
        )
        self.num_bits, self.scale = bits, float(scale)
        self.entropy_loss_weight, self.diversity_gamma = entropy_loss_weight, diversity_gamma
        self.inv_temperature = float(inv_temperature)
        register_bit_tables(self, bits)
        self.mark_trained()

    def _stage_scale(self, m: int) -> float:
        return self.scale * 2.0**-m

    def _stage_codes(self, r: torch.Tensor, m: int) -> torch.Tensor:
        return ((r > 0).long() * self._bit_weights).sum(-1)

    def _stage_values(self, codes: torch.Tensor, m: int) -> torch.Tensor:
        return sign_values(codes.reshape(-1), self._bit_weights, self._stage_scale(m))

    def _stage_entropies(self, r, m, weight, synced):
        tables = (self._high_bits, self._low_bits)
        scale = self._stage_scale(m)
        return lfq_entropies(r, scale, self.inv_temperature, weight, tables, synced)
