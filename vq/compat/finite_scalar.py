"""vector-quantize-pytorch's finite scalar quantizers on vq's: ``FSQ`` on :class:`vq.FSQ` and
``ResidualFSQ`` on :class:`vq.ResidualFSQ` (with ``per_stage_gradient=True``, the anchor's
gradient rule), held as ``.layer``.

Each takes the anchor's constructor arguments (names and defaults of version 1.34) and returns
what the anchor returns: ``(quantized, indices)``, int32 indices. Projections are drawn where
and in the order the anchor draws them, so the same seed gives the same weights, and equal
inputs give equal codes. (A paper: Mentzer et al., "Finite Scalar Quantization: VQ-VAE Made
Simple", ICLR 2024.)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from vq.compat.anchor_forward import drop_stages, residual_codes
from vq.compat.anchor_start import dropout_options
from vq.compat.refusals import DROPOUT_MULTIPLE, FIXED_STAGES, FLOAT32, Refused, refuse, refuse_call
from vq.quantizers import FSQ as VQFSQ
from vq.quantizers import ResidualFSQ as VQResidualFSQ

#: FSQ's arguments vq cannot honour
FSQ_REFUSED: Refused = {
    "allowed_dtypes": ((torch.float32, torch.float64), FLOAT32),
    "force_quantization_f32": (True, FLOAT32),
    "preserve_symmetry": (False, "vq.FSQ's grid is the paper's (vq.ResidualFSQ's the symmetric)"),
    "noise_dropout": (0.0, "vq.FSQ has no noise dropout"),
    "bound_hard_clamp": (False, "vq.FSQ bounds its input with tanh"),
    "orthogonal_rotation": (False, "vq.FSQ has no rotation of the code space"),
}
RESIDUAL_FSQ_REFUSED: Refused = {
    "quantize_dropout_multiple_of": DROPOUT_MULTIPLE,
    "soft_clamp_input_value": (None, "vq soft-clamps the input to ±L/(L-1), the anchor's default"),
    **{name: FSQ_REFUSED[name] for name in FSQ_REFUSED if name != "bound_hard_clamp"},
    "num_codebooks": (1, FIXED_STAGES),
    "keep_num_codebooks_dim": (None, FIXED_STAGES),
    "scale": (None, FIXED_STAGES),
    "channel_first": (False, "use is_channel_first"),
    "projection_has_bias": (True, "vq's projections have biases"),
    "return_indices": (True, FIXED_STAGES),
}


class FSQ(nn.Module):
    """vector-quantize-pytorch's ``FSQ`` on :class:`vq.FSQ` (one grid on every codebook's slice
    when ``num_codebooks > 1``).

    Args (the anchor's; those vq cannot honour raise a ValueError naming them):
        levels: values per code dimension.
        dim: input dimension (learned projections when it differs from ``len(levels) ·
            num_codebooks``).
        num_codebooks, keep_num_codebooks_dim: codebooks per vector, and whether indices keep
            their last axis (default: when there are several).
        channel_first: input ``[B, dim, ...]`` (inputs of 4 or more axes always are).
        projection_has_bias, return_indices: as the anchor's.
        materialize_codebook: False leaves ``implicit_codebook`` None, as the anchor's.
        scale: kept as ``.scale``; the anchor does not use it either.

    ``forward(z)`` returns ``(quantized, indices)``: quantized in z's layout, indices int32
    ``[B, ...]`` (channels last; ``[..., num_codebooks]`` when kept), or None without
    ``return_indices``. ``indices_to_codes(indices)`` gives ``quantized`` back.
    """

    def __init__(
        self,
        levels: Sequence[int],
        dim: int | None = None,
        num_codebooks: int = 1,
        keep_num_codebooks_dim: bool | None = None,
        scale: float | None = None,
        channel_first: bool = False,
        projection_has_bias: bool = True,
        return_indices: bool = True,
        materialize_codebook: bool = True,
        **options,
    ):
        super().__init__()
        refuse("FSQ", options, FSQ_REFUSED)
        self.materialize_codebook = bool(materialize_codebook)
        self.levels = [int(v) for v in levels]
        keep = num_codebooks > 1 if keep_num_codebooks_dim is None else bool(keep_num_codebooks_dim)
        if num_codebooks > 1 and not keep:
            raise ValueError("FSQ: num_codebooks > 1 needs keep_num_codebooks_dim=True")
        self.codebook_dim, self.num_codebooks = len(self.levels), num_codebooks
        inner = self.codebook_dim * num_codebooks
        self.dim = inner if dim is None else dim
        self.keep_num_codebooks_dim, self.scale = keep, scale
        self.channel_first, self.return_indices = channel_first, return_indices
        self.project_in: nn.Linear | None = None  # when the layer does not project itself
        self.project_out: nn.Linear | None = None
        self.whole = num_codebooks == 1 and (projection_has_bias or self.dim == inner)
        if self.whole:
            self.layer = VQFSQ(self.levels, self.dim)
        else:
            if self.dim != inner:
                self.project_in = nn.Linear(self.dim, inner, bias=projection_has_bias)
                self.project_out = nn.Linear(inner, self.dim, bias=projection_has_bias)
            self.layer = VQFSQ(self.levels)
        self.codebook_size = self.layer.codebook_size

    @property
    def implicit_codebook(self) -> torch.Tensor | None:
        """Every code's grid point, float32 [K, len(levels)] (None with
        ``materialize_codebook=False``, as the anchor's)."""
        return self.layer.effective_codebooks()[0] if self.materialize_codebook else None

    def forward(self, z: torch.Tensor):
        """See the class docstring."""
        move = z.dim() >= 4 or self.channel_first
        rows = z.movedim(1, -1) if move else z
        if self.whole:
            out = self.layer(rows)
            quantized, codes = out.quantized, out.codes[..., None]
        else:
            h = rows if self.project_in is None else self.project_in(rows)
            lead = h.shape[:-1]
            out = self.layer(h.reshape(*lead, self.num_codebooks, self.codebook_dim))
            quantized, codes = out.quantized.reshape(*lead, -1), out.codes
            if self.project_out is not None:
                quantized = self.project_out(quantized)
        codes = (codes if self.keep_num_codebooks_dim else codes[..., 0]).int()
        if move:
            quantized = quantized.movedim(-1, 1)
        return quantized, codes if self.return_indices else None

    def indices_to_codes(self, indices: torch.Tensor) -> torch.Tensor:
        """The reconstruction of int ``indices`` (as ``forward`` returns them) → float32, in
        the layout ``forward`` gives (channels first for image or video indices)."""
        keep = self.keep_num_codebooks_dim
        image_like = indices.dim() >= 3 + int(keep)
        idx = (indices if keep else indices[..., None]).long()
        lead = idx.shape[:-1]
        codes = self.layer.static_decode(idx.reshape(-1))  # the grid (through its projection)
        codes = codes.reshape(*lead, -1)
        if self.project_out is not None:
            codes = self.project_out(codes)
        return codes.movedim(-1, 1) if image_like or self.channel_first else codes


class ResidualFSQ(nn.Module):
    """vector-quantize-pytorch's ``ResidualFSQ`` on :class:`vq.ResidualFSQ` (symmetric grids,
    the input soft-clamped to ±L/(L-1), stage m scaled by L^-m, each stage passing its
    residual's gradient).

    Args: levels, num_quantizers, dim, is_channel_first, quantize_dropout,
        quantize_dropout_cutoff_index (each training sample keeps n stages, n uniform in
        [cutoff + 1, Q], drawn per sample), bound_hard_clamp (only True),
        materialize_codebook (``codebooks`` is computed either way, as the anchor's).

    ``forward(x, return_all_codes=False)`` returns ``(quantized, indices)``, indices int32
    ``[..., Q]`` (``[B, Q, ...]`` channel-first, as the anchor's; -1 at dropped stages).
    """

    def __init__(
        self,
        *,
        levels: Sequence[int],
        num_quantizers: int,
        dim: int | None = None,
        is_channel_first: bool = False,
        quantize_dropout: bool = False,
        quantize_dropout_cutoff_index: int = 0,
        bound_hard_clamp: bool = True,
        materialize_codebook: bool = True,
        **options,
    ):
        super().__init__()
        refuse("ResidualFSQ", options, RESIDUAL_FSQ_REFUSED)
        if not bound_hard_clamp:
            raise ValueError(
                "ResidualFSQ: bound_hard_clamp=False is not supported by vq.compat (vq's stages "
                "clamp to their grid)"
            )
        self.levels, self.num_quantizers = [int(v) for v in levels], num_quantizers
        self.is_channel_first = is_channel_first
        self.layer = VQResidualFSQ(
            self.levels,
            num_quantizers,
            dim,
            per_stage_gradient=True,
            **dropout_options(quantize_dropout, quantize_dropout_cutoff_index, num_quantizers),
        )
        self.dim, self.codebook_size = self.layer.dim, self.layer.codebook_size

    @property
    def codebooks(self) -> torch.Tensor:
        """Every stage's scaled grid points, float32 [Q, K, len(levels)]."""
        return self.layer.effective_codebooks()

    def forward(
        self, x: torch.Tensor, return_all_codes: bool = False, rand_quantize_dropout_fixed_seed=None
    ):
        """See the class docstring."""
        refuse_call(
            "ResidualFSQ.forward",
            rand_quantize_dropout_fixed_seed=rand_quantize_dropout_fixed_seed,
        )
        rows = x.movedim(1, -1) if self.is_channel_first else x
        out = self.layer(rows)
        codes = drop_stages(out.codes.long(), out.num_stages)
        ret = [out.quantized, codes.int()]
        if return_all_codes:
            ret.append(self.get_codes_from_indices(codes))
        if self.is_channel_first:
            ret[0], ret[1] = ret[0].movedim(-1, 1), ret[1].movedim(-1, 1)
        return tuple(ret)

    def get_codes_from_indices(self, indices: torch.Tensor) -> torch.Tensor:
        """Every stage's scaled grid point of ``indices`` [..., q] → float32 [Q, ..., L]."""
        return residual_codes(self.codebooks, indices)

    def get_output_from_indices(self, indices: torch.Tensor) -> torch.Tensor:
        """The reconstruction of ``indices`` [..., q] → float32 [..., dim] (channels last)."""
        codes = self.get_codes_from_indices(indices).sum(0)
        project_out = self.layer.project_out
        return codes if project_out is None else project_out(codes)
