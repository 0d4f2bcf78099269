"""What every residual (multi-stage) layer shares: quantizer dropout and decoding from a prefix.

Stage m of a residual layer quantizes what stages 0..m-1 left over, so the first n stages alone
are a coarser code of the same vector. Trained with quantizer dropout (a random number of stages
per sample), the decoder learns every such bitrate, and ``decode(codes, num_stages=n)`` serves
them. :class:`Stages` is mixed into :class:`vq.ResidualVQ`, :class:`vq.ResidualFSQ` and
:class:`vq.ResidualLFQ`; a subclass gives ``num_quantizers``, ``quantizer_dropout``,
``dropout_min_stages`` and :meth:`Stages._decode_prefix`.

References:
    N. Zeghidour et al., "SoundStream: an end-to-end neural audio codec", IEEE/ACM TASLP 2021;
    R. Kumar et al., "High-fidelity audio compression with improved RVQGAN" (DAC), NeurIPS 2023
    (per-sample quantizer dropout).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from vq._checks import as_codes, like_input


def check_stage_options(num_quantizers: int, quantizer_dropout: float, min_stages: int) -> None:
    """Raise ValueError for a bad number of stages or dropout setting."""
    if num_quantizers < 1:
        raise ValueError(f"num_quantizers must be >= 1, got {num_quantizers}")
    if not 0.0 <= quantizer_dropout <= 1.0:
        raise ValueError(f"quantizer_dropout must lie in [0, 1], got {quantizer_dropout}")
    if not 1 <= min_stages <= num_quantizers:
        raise ValueError(
            f"dropout_min_stages must lie in [1, num_quantizers={num_quantizers}], got {min_stages}"
        )


class Stages:
    """Quantizer dropout and prefix decoding for a layer of ``num_quantizers`` stages whose codes
    are ``[..., Q]`` (the last axis of ``code_shape``)."""

    num_quantizers: int
    quantizer_dropout: float
    dropout_min_stages: int

    def _decode_prefix(self, codes: torch.Tensor) -> torch.Tensor:
        """Code-space reconstruction float32 [n, code_dim] from the first m stages' codes,
        integer [n, *code_shape[:-1], m] on the device."""
        raise NotImplementedError

    def _stage_mask(
        self, lead: tuple[int, ...], device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Quantizer dropout: stages per sample, int64 [B] (B = the first axis of the batch),
        and which stages each row keeps, float [n, Q] (None when every row keeps all)."""
        q = self.num_quantizers
        batch = lead[0] if lead else 1
        per_sample = math.prod(lead[1:]) if lead else 1
        stages = torch.full((batch,), q, dtype=torch.long, device=device)
        if not (self.training and self.quantizer_dropout > 0):
            return stages, None
        drop = torch.rand(batch, device=device) < self.quantizer_dropout
        fewer = torch.randint(self.dropout_min_stages, q + 1, (batch,), device=device)
        stages = torch.where(drop, fewer, stages)
        keep = (torch.arange(q, device=device) < stages[:, None]).float()  # [B, Q]
        return stages, keep[:, None, :].expand(batch, per_sample, q).reshape(-1, q)

    def decode(self, codes: Any, num_stages: int | None = None) -> Any:
        """Reconstructions of integer ``codes`` [..., *code_shape] → float [..., dim].

        Args:
            codes: integer codes [..., Q] (numpy or torch; ``[..., G, Q]`` for grouped layers),
                or [..., num_stages].
            num_stages: decode from the first ``num_stages`` stages only (the coarser
                bitrates a model trained with quantizer dropout serves); None uses all Q.
        """
        q = self.num_quantizers
        if num_stages is None and len(self.code_shape) == 1:
            return super().decode(codes)  # the codec's: in steps, the CPU kernel where there is one
        if num_stages is None:
            num_stages = q
        if not 1 <= num_stages <= q:
            raise ValueError(f"num_stages must lie in [1, {q}], got {num_stages}")
        self._require_trained("decode")
        c = as_codes(codes, None, self.codebook_size)
        inner = self.code_shape[:-1]
        tail = tuple(c.shape[c.dim() - len(inner) - 1 :]) if c.dim() > len(inner) else ()
        if tail not in ((*inner, q), (*inner, num_stages)):
            shapes = dict.fromkeys((q, num_stages))
            want = " or ".join("[..., " + ", ".join(map(str, (*inner, m))) + "]" for m in shapes)
            raise ValueError(f"codes: expected codes {want}, got shape {tuple(c.shape)}")
        lead = c.shape[: c.dim() - len(inner) - 1]
        rows = c[..., :num_stages].reshape(-1, *inner, num_stages).to(self.device)
        with torch.no_grad():
            x_hat = self._output_space(self._decode_prefix(rows))
        return like_input(x_hat.reshape(*lead, self.dim), codes)
