"""Finite scalar quantization: a fixed grid instead of a learned codebook.

Each of the L = ``len(levels)`` code dimensions is squashed by a shifted tanh into the range of
``levels[i]`` integers and rounded (straight-through); the code is the mixed-radix number of the
rounded coordinates. The implicit codebook has ``Π levels`` codewords, nothing to learn, no
commitment loss, no dead codes, and nothing to synchronise across processes.

Reference: F. Mentzer, D. Minnen, E. Agustsson, M. Tschannen, "Finite scalar quantization:
VQ-VAE made simple", ICLR 2024.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from vq.quantizers.base import Quantizer
from vq.quantizers.codec import Metric
from vq.quantizers.functional import code_counts, codeword_tables
from vq.quantizers.layer import Step

#: widens the tanh bound by 0.1% past the outermost grid values, inside their rounding intervals
#: (every level count, 2 included, keeps all its values; vector-quantize-pytorch's bound)
_EPS = 1e-3
#: the most codes an FSQ codebook may have (its usage counts hold a float per code, as an
#: LFQ codebook's: :data:`vq.quantizers.lfq.MAX_BITS`)
MAX_CODES = 1 << 24


def fsq_levels(levels: Sequence[int]) -> list[int]:
    """``levels`` as a list of ints, checked: each >= 2, at most :data:`MAX_CODES` codes."""
    levels = [int(v) for v in levels]
    if not levels or min(levels) < 2:
        raise ValueError(f"levels must be a non-empty list of integers >= 2, got {levels}")
    if math.prod(levels) > MAX_CODES:
        raise ValueError(
            f"levels {levels} give {math.prod(levels):,} codes; FSQ takes at most "
            f"{MAX_CODES:,} (2^24: each step counts every code's usage). Use fewer or "
            "smaller levels, or ResidualFSQ to add stages of a smaller grid"
        )
    return levels


class FSQ(Quantizer):
    """Finite scalar quantizer with ``levels[i]`` values on code dimension i.

    Args:
        levels: values per code dimension, each >= 2, e.g. ``[8, 5, 5, 5]`` (1000 codes) or
            ``[8, 8, 8, 5, 5, 5]`` (64,000); the paper's recommendations for 2^8–2^16 codes.
            At most :data:`MAX_CODES` (2^24) codes in all; more is a ValueError.
        dim: input dimension; when it differs from ``len(levels)``, learned ``nn.Linear``
            projections map into and out of the code space (default: ``len(levels)``).
        channel_first: ``forward`` takes ``[B, dim, ...]``.

    Codes are ``[...]``, one integer in ``[0, Π levels)``; ``decode`` gives the grid values
    (in [-1, 1] per code dimension) mapped through ``project_out`` when there is one, and
    ``distance_tables`` (``[nq, 1, K]``) enumerates the K grid points. ``fit`` has nothing to
    train (it only checks its input); the layer needs no ``fit`` and ``forward``'s loss is 0.
    """

    def __init__(
        self, levels: Sequence[int], dim: int | None = None, *, channel_first: bool = False
    ):
        levels = fsq_levels(levels)
        code_dim = len(levels)
        super().__init__(
            code_dim if dim is None else dim,
            math.prod(levels),
            (),
            codebook_dim=code_dim,
            channel_first=channel_first,
        )
        self.levels = tuple(levels)
        basis = [math.prod(levels[:i]) for i in range(code_dim)]
        self.register_buffer("_levels", torch.tensor(levels), persistent=False)
        self.register_buffer("_basis", torch.tensor(basis), persistent=False)
        self.mark_trained()

    def _min_training_vectors(self) -> int:
        return 1

    def _fit(self, x: torch.Tensor) -> None:
        pass

    def _bound(self, z: torch.Tensor) -> torch.Tensor:
        """Squash z [n, L] into the rounding intervals of ``levels`` integers: ``(-(L-1)/2,
        (L-1)/2)`` widened by ``_EPS`` (the even-level grids are shifted by half a step)."""
        levels = self._levels.to(z.dtype)
        half = (levels - 1) * (1 + _EPS) / 2
        offset = torch.where(self._levels % 2 == 0, 0.5, 0.0).to(z.dtype)
        return torch.tanh(z + torch.atanh(offset / half)) * half - offset

    def _half_width(self, dtype: torch.dtype) -> torch.Tensor:
        return (self._levels // 2).to(dtype)

    def _digits(self, z: torch.Tensor) -> torch.Tensor:
        """Rounded coordinates shifted to [0, levels): int64 [n, L]."""
        return torch.round(self._bound(z)).long() + self._levels // 2

    def _encode(self, x: torch.Tensor) -> torch.Tensor:
        return (self._digits(x.float()) * self._basis).sum(-1)

    def _decode(self, codes: torch.Tensor) -> torch.Tensor:
        # codes are non-negative: truncating division is floor division (one Div in ONNX)
        quotient = torch.div(codes.reshape(-1, 1).long(), self._basis, rounding_mode="trunc")
        half = self._half_width(torch.float32)
        return (torch.remainder(quotient, self._levels).float() - half) / half

    def static_encode(self, x: torch.Tensor) -> torch.Tensor:
        """``encode`` as one static-shape graph (its only path), float32 Tensor[n, dim] →
        int64 Tensor[n]: ``project_in`` when ``dim`` differs from ``len(levels)``, the bounded,
        rounded coordinates, their mixed-radix number. What :mod:`vq.export` writes out."""
        return self._encode(self._code_space(x))

    def static_decode(self, codes: torch.Tensor) -> torch.Tensor:
        """``decode`` as one static-shape graph: integer codes Tensor[n] → float32 Tensor[n,
        dim] (the grid point, then ``project_out``)."""
        return self._output_space(self._decode(codes))

    def _codebook_groups(self) -> torch.Tensor:
        grid = torch.arange(self.codebook_size, device=self._levels.device)
        return self._decode(grid)[None]

    def _quantize(self, z, weight, lead, update) -> Step:
        bounded = self._bound(z)
        rounded = bounded + (torch.round(bounded) - bounded).detach()  # straight through
        codes = ((torch.round(bounded.detach()).long() + self._levels // 2) * self._basis).sum(-1)
        quantized = rounded / self._half_width(z.dtype)
        zero, counts = z.new_zeros(()), code_counts(codes[None], self.codebook_size, weight)
        return Step(quantized, codes, zero, zero, counts)

    def tables(self, queries: torch.Tensor, metric: Metric) -> torch.Tensor:
        """float32 queries [nq, dim] → tables [nq, 1, K] over the grid points."""
        return codeword_tables(queries, self._output_codebooks()[0], metric)
