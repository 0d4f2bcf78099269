"""Scalar quantization: each dimension on its own uniform grid over its trained range, or
stored as a 16-bit float.

A b-bit quantizer (b = 8, 6 or 4) learns one range per dimension, ``[vmin, vmin + vdiff]``
(the minimum and maximum of the training data), splits it into ``2**b - 1`` cells and stores
each component as the cell it falls in; it decodes to the cell's centre. ``"fp16"`` and
``"bf16"`` store each component as a 16-bit float and need no training. The codes are faiss's
bytes, so that the same ranges give the same codes on both sides: d, ``ceil(6 d / 8)``,
``ceil(d / 2)`` or ``2 d`` bytes per vector (see :mod:`vq.quantizers.scalar_codes`, the
static-shape graphs, for the rounding and the layouts).

faiss equivalent: ``faiss.ScalarQuantizer(d, QT_8bit | QT_6bit | QT_4bit | QT_fp16 |
QT_bf16)`` with ``rangestat = RS_minmax`` (``index_factory`` "SQ8", "SQ6", "SQ4", "SQfp16",
"SQbf16"); :func:`vq.faiss_interop.sq_from_faiss` / ``sq_to_faiss`` convert.

Reference: H. Jégou, M. Douze, C. Schmid, "Product quantization for nearest neighbor search",
IEEE TPAMI 2011 (scalar quantization as the baseline codec); faiss's ScalarQuantizer.
"""

from __future__ import annotations

import torch

from vq.quantizers.base import Quantizer
from vq.quantizers.codec import Metric
from vq.quantizers.scalar_codes import (
    KINDS,
    code_size,
    decode_levels,
    sq_decode,
    sq_encode,
    train_ranges,
)


class ScalarQuantizer(Quantizer):
    """Per-dimension uniform scalar quantizer (faiss ``ScalarQuantizer``, ``RS_minmax``).

    Args:
        dim: vector dimension d.
        bits: 8, 6 or 4 bits per dimension (trained ranges), or "fp16" / "bf16" (16-bit
            floats; nothing to train, trained from the start).
        margin: widen each trained range by ``margin * (vmax - vmin)`` on both sides (faiss's
            ``rangestat_arg``; 0, the default, keeps the data's own minimum and maximum).
        commitment_weight, rotation_trick, channel_first: layer options (see
            :class:`vq.Quantizer`; the grid does not learn in ``forward``: ``fit`` it).

    Buffers:
        vmin: float32 [d], the low end of each dimension's range; vdiff: float32 [d], its
        width (both zero, and unused, for fp16 / bf16).

    Codes are uint8 ``[..., code_size]`` (faiss's bytes: one per dimension at 8 bits, two
    dimensions per byte at 4 bits, four per three bytes at 6 bits, two bytes per dimension
    for fp16 / bf16); ``codebook_size`` is 256 (a byte). ``decode`` gives the centre of each
    component's cell, ``vmin + (level + 0.5) / (2**bits - 1) * vdiff``, so its error per
    component is at most half a cell, ``vdiff / (2 * (2**bits - 1))``, inside the range.
    ``distance_tables`` exist where each byte holds whole dimensions (8 and 4 bits):
    ``[nq, code_size, 256]``.
    """

    def __init__(
        self,
        dim: int,
        bits: int | str = 8,
        *,
        margin: float = 0.0,
        commitment_weight: float = 1.0,
        rotation_trick: bool = False,
        channel_first: bool = False,
    ):
        if isinstance(bits, bool) or bits not in KINDS:
            raise ValueError(f"bits must be one of 8, 6, 4, 'fp16', 'bf16'; got {bits!r}")
        if dim <= 0:
            raise ValueError(f"dim must be positive, got {dim}")
        if not 0.0 <= float(margin) < float("inf"):
            raise ValueError(f"margin must be a finite number >= 0, got {margin!r}")
        super().__init__(
            dim,
            256,
            (code_size(dim, bits),),
            commitment_weight=commitment_weight,
            rotation_trick=rotation_trick,
            channel_first=channel_first,
        )
        self.bits, self.margin = bits, float(margin)
        self.register_buffer("vmin", torch.zeros(dim))
        self.register_buffer("vdiff", torch.zeros(dim))
        if self.is_float:
            self.mark_trained()

    @property
    def is_float(self) -> bool:
        """Whether the codes are 16-bit floats (fp16 / bf16) rather than levels."""
        return self.bits in ("fp16", "bf16")

    @property
    def code_size(self) -> int:
        """Bytes per vector."""
        return self.code_shape[0]

    def config(self) -> dict:
        """The constructor arguments (JSON-serialisable), as indexes save them."""
        return {"bits": self.bits, "margin": self.margin}

    def cell_width(self) -> torch.Tensor:
        """float32 [d]: the width of one cell per dimension, ``vdiff / (2**bits - 1)`` (b-bit
        kinds; decode is within half of it of any input inside the range)."""
        if self.is_float:
            raise ValueError(f"a {self.bits} quantizer has no cells")
        return self.vdiff / float((1 << self.bits) - 1)

    # -- training and coding ------------------------------------------------------------------
    def _min_training_vectors(self) -> int:
        return 1

    def _fit(self, x: torch.Tensor) -> None:
        if self.is_float:
            return
        vmin, vdiff = train_ranges(x, self.margin)
        self.vmin.copy_(vmin)
        self.vdiff.copy_(vdiff)

    def _encode(self, x: torch.Tensor) -> torch.Tensor:
        return sq_encode(x, self.vmin, self.vdiff, self.bits)

    def _decode(self, codes: torch.Tensor) -> torch.Tensor:
        return sq_decode(codes, self.vmin, self.vdiff, self.bits)

    def static_encode(self, x: torch.Tensor) -> torch.Tensor:
        """``encode`` as one static-shape graph (its only path): float32 Tensor[n, dim] →
        uint8 Tensor[n, code_size] (:func:`vq.quantizers.scalar_codes.sq_encode`). What
        :mod:`vq.export` writes out (b-bit kinds; fp16 / bf16 encoding reinterprets float
        bits, which ONNX cannot express)."""
        return sq_encode(self._code_space(x), self.vmin, self.vdiff, self.bits)

    def static_decode(self, codes: torch.Tensor) -> torch.Tensor:
        """``decode`` as one static-shape graph: integer Tensor[n, code_size] → float32
        Tensor[n, dim] (:func:`vq.quantizers.scalar_codes.sq_decode`)."""
        return sq_decode(codes, self.vmin, self.vdiff, self.bits)

    # -- the layer --------------------------------------------------------------------------
    def _codebook_groups(self) -> torch.Tensor:
        """Each dimension's cell centres, [d, 2**bits, 1] (b-bit kinds)."""
        levels = torch.arange(1 << self.bits, device=self.vmin.device)[:, None]
        return decode_levels(levels, self.vmin, self.vdiff, self.bits).T[:, :, None]

    def tables(self, queries: torch.Tensor, metric: Metric) -> torch.Tensor:
        """float32 queries [nq, dim] → tables [nq, code_size, 256], one per byte: the sum of
        ``table[b, code_b]`` is ``||q - x̂||²`` (l2) or ``⟨q, x̂⟩`` (ip). 8 and 4 bits only."""
        if self.bits not in (8, 4):
            raise NotImplementedError(
                f"no per-byte distance tables for bits={self.bits!r}: its bytes do not hold "
                "whole dimensions; decode the codes, or use bits=8 or 4"
            )
        centres = self._codebook_groups()[:, :, 0]  # [d, L]
        q = queries[:, :, None]
        per_dim = q * centres if metric == "ip" else (q - centres) ** 2  # [nq, d, L]
        if self.bits == 8:
            return per_dim
        nq, d = queries.shape
        if d % 2:
            per_dim = torch.cat([per_dim, per_dim.new_zeros(nq, 1, 16)], dim=1)
        pairs = per_dim.reshape(nq, -1, 2, 16)
        byte = torch.arange(256, device=queries.device)
        low, high = pairs[:, :, 0, byte % 16], pairs[:, :, 1, byte // 16]
        return low + high
