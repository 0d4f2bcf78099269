"""Grouped residual vector quantization: the channels split into groups, each its own ResidualVQ.

A ``dim``-dimensional vector is cut into ``groups`` consecutive slices of ``dim / groups``
channels, and slice g is coded by residual stack g (:class:`vq.ResidualVQ`, with all its
options: beam search, EMA or gradient codebooks, k-means initialisation, dead-code restart).
G stacks of Q stages of K codes give ``Q · G · log2 K`` bits per vector with codebooks of
``dim / G`` dimensions: cheaper distances than one stack over ``dim``, as in HiFi-Codec.
Quantizer dropout draws one number of stages per sample for every group, so a prefix of stages
is a coarser code of the whole vector.

Reference:
    D. Yang et al., "HiFi-Codec: group-residual vector quantization for high fidelity audio
    codec", 2023.
"""

from __future__ import annotations

import torch
from torch import nn

from vq.quantizers.base import Quantizer
from vq.quantizers.codec import Metric
from vq.quantizers.layer import Step
from vq.quantizers.learning import Learning
from vq.quantizers.residual import ResidualVQ
from vq.quantizers.stages import Stages, check_stage_options


class GroupedResidualVQ(Stages, Quantizer):
    """``groups`` residual stacks of ``num_quantizers`` stages of ``codebook_size`` codewords,
    stack g on channels ``[g · dim/G, (g + 1) · dim/G)``.

    Args:
        dim: vector dimension d, a multiple of ``groups``.
        groups: G.
        num_quantizers, codebook_size, beam_size, refine_iters, niter, init, seed,
            max_points_per_centroid, learning, commitment_weight, rotation_trick,
            per_stage_gradient: as :class:`vq.ResidualVQ`, for every group (group g's
            k-means seeds are ``seed + 1000 g``).
        quantizer_dropout, dropout_min_stages: per-sample quantizer dropout, one draw per
            sample shared by the groups.
        channel_first: ``forward`` takes ``[B, dim, ...]``.

    Submodules:
        rvqs: the G :class:`vq.ResidualVQ` stacks (``rvqs[g].codebooks``: [Q, K, d/G]).

    Codes are ``[..., G, Q]``; ``decode(codes, num_stages=n)`` decodes the first n stages of
    every group. ``distance_tables`` is ``[nq, G · Q, K]`` (each group's tables in turn; for
    "l2" the same convention as :class:`vq.ResidualVQ`'s). ``perplexity`` and ``usage`` are
    Tensor[G · Q], group by group.
    """

    def __init__(
        self,
        dim: int,
        groups: int,
        num_quantizers: int,
        codebook_size: int,
        beam_size: int = 1,
        *,
        refine_iters: int = 2,
        niter: int = 25,
        init: str = "k-means++",
        seed: int = 1234,
        max_points_per_centroid: int = 256,
        quantizer_dropout: float = 0.0,
        dropout_min_stages: int = 1,
        learning: str | Learning | None = None,
        commitment_weight: float = 1.0,
        rotation_trick: bool = False,
        channel_first: bool = False,
        per_stage_gradient: bool = False,
    ):
        if groups < 1 or dim % groups:
            raise ValueError(f"groups must be >= 1 and divide dim={dim}, got {groups}")
        check_stage_options(num_quantizers, quantizer_dropout, dropout_min_stages)
        super().__init__(
            dim,
            codebook_size,
            (groups, num_quantizers),
            commitment_weight=commitment_weight,
            rotation_trick=rotation_trick,
            channel_first=channel_first,
        )
        self.groups, self.num_quantizers, self.beam_size = groups, num_quantizers, beam_size
        self.quantizer_dropout, self.dropout_min_stages = quantizer_dropout, dropout_min_stages
        self.rvqs = nn.ModuleList(
            ResidualVQ(
                dim // groups,
                num_quantizers,
                codebook_size,
                beam_size,
                refine_iters=refine_iters,
                niter=niter,
                init=init,
                seed=seed + 1000 * g,
                max_points_per_centroid=max_points_per_centroid,
                learning=learning,
                commitment_weight=commitment_weight,
                rotation_trick=rotation_trick,
                per_stage_gradient=per_stage_gradient,
            )
            for g in range(groups)
        )
        if all(rvq.is_trained for rvq in self.rvqs):  # learning without k-means
            self.mark_trained()

    def _pairs(self, x: torch.Tensor):
        """(stack g, channels of group g of ``x`` [n, dim]) for every group."""
        return zip(self.rvqs, x.chunk(self.groups, dim=-1), strict=True)

    # -- the layer hooks ------------------------------------------------------------------
    def learns(self) -> bool:
        return self.rvqs[0].learns()

    def codebook_loss_weight(self) -> float:
        return self.rvqs[0].codebook_loss_weight()

    def _codebook_groups(self) -> torch.Tensor:
        return torch.cat([rvq.codebooks for rvq in self.rvqs])

    def effective_codebooks(self) -> torch.Tensor:
        """Every group's stages' codewords, float32 [G · Q, K, dim / G], group after group."""
        return torch.cat([rvq.effective_codebooks() for rvq in self.rvqs])

    def _quantize(self, z, weight, lead, update) -> Step:
        stages, keep = self._stage_mask(lead, z.device)
        steps = [
            rvq._quantize_stages(part, weight, stages, keep, update) for rvq, part in self._pairs(z)
        ]
        if update:
            for rvq in self.rvqs:
                rvq.mark_trained()
        return Step(
            torch.cat([s.quantized for s in steps], dim=-1),
            torch.stack([s.codes for s in steps], dim=1),
            torch.stack([s.commitment for s in steps]).mean(),
            torch.stack([s.codebook_loss for s in steps]).mean(),
            torch.cat([s.counts for s in steps]),
            stages,
            stage_commitment=torch.stack([s.stage_commitment for s in steps]),
        )

    # -- the codec --------------------------------------------------------------------------
    def _fit(self, x: torch.Tensor) -> None:
        for rvq, part in self._pairs(x):
            part = part.contiguous()
            rvq._fit(part)
            rvq._after_fit(part)
            rvq.mark_trained()

    def _encode(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([rvq._encode(p.contiguous()) for rvq, p in self._pairs(x)], 1)

    def _decode(self, codes: torch.Tensor) -> torch.Tensor:
        codes = codes.reshape(-1, self.groups, self.num_quantizers)
        return torch.cat([rvq._decode(codes[:, g].contiguous()) for g, rvq in self._each()], -1)

    def _decode_prefix(self, codes: torch.Tensor) -> torch.Tensor:
        return torch.cat([rvq._decode_prefix(codes[:, g]) for g, rvq in self._each()], -1)

    def _each(self):
        return enumerate(self.rvqs)

    def static_encode(self, x: torch.Tensor) -> torch.Tensor:
        """``encode`` as one static-shape graph, float32 Tensor[n, dim] → int64 Tensor[n, G,
        Q]: each group's :meth:`vq.ResidualVQ.static_encode` on its channels."""
        return torch.stack([rvq.static_encode(p) for rvq, p in self._pairs(x.float())], 1)

    def static_decode(self, codes: torch.Tensor) -> torch.Tensor:
        """``decode`` as one static-shape graph: integer codes Tensor[n, G, Q] → float32
        Tensor[n, dim]."""
        return torch.cat([rvq.static_decode(codes[:, g]) for g, rvq in self._each()], -1)

    def tables(self, queries: torch.Tensor, metric: Metric) -> torch.Tensor:
        """float32 queries [nq, dim] → tables [nq, G · Q, K], group after group."""
        return torch.cat([rvq.tables(p, metric) for rvq, p in self._pairs(queries)], dim=1)
