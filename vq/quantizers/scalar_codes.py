"""The scalar quantizer's static-shape graphs: ranges, encode, decode, and faiss's code layouts.

One function per step, each the only torch implementation of it: :class:`vq.ScalarQuantizer`'s
``encode`` / ``decode`` run them (chunk by chunk), its indexes' static searches decode with
them, :mod:`vq.export` writes them out, and the numba kernels (:mod:`vq.kernels.sq.sq_scans`) are
tested against them. Everything follows faiss's ``ScalarQuantizer`` (faiss/impl/ScalarQuantizer.cpp,
scalar_quantizer/codecs.h, quantizers.h, training.cpp) so that the same ranges give the same
bytes:

- ranges (``RS_minmax``): ``vmin`` the per-dimension minimum, ``vdiff = vmax - vmin``, both
  widened by ``margin * (vmax - vmin)`` on each side (faiss's ``rangestat_arg``, 0 by default);
- encode, b bits (L = 2**b - 1): ``xi = clip((x - vmin) / vdiff, 0, 1)`` (0 where vdiff is 0),
  then ``level = floor(L * xi)`` — in float32 for 8 bits (faiss's ``(int)(255 * x)``), in float64
  for 4 and 6 bits (``(int)(x * 15.0)``: a double product);
- decode: ``vmin + ((level + 0.5) / L) * vdiff``, the centre of the cell;
- layouts: 8 bits one byte per dimension; 4 bits two per byte, the even dimension in the low
  nibble; 6 bits four dimensions in three bytes, a little-endian 24-bit word
  ``l0 | l1 << 6 | l2 << 12 | l3 << 18`` (bytes past ``ceil(6 d / 8)`` dropped); fp16 two
  little-endian bytes of IEEE half (round to nearest even); bf16 the high 16 bits of the float32
  rounded half away from zero (faiss's ``(bits + 0x8000) >> 16``, not torch's round to even);
  fp16 rounds as faiss's portable ``encode_fp16`` does (not always to nearest even either).

Decoding uses integer division and remainder, powers of two and selects only (Div, Mod, Pow,
Where in ONNX); encoding fp16 / bf16 reinterprets float bits, which exports to no ONNX opset
here (their encode graphs are refused).
"""

from __future__ import annotations

import torch

#: the storage kinds: bits per dimension, or a 16-bit float format
KINDS = (8, 6, 4, "fp16", "bf16")


def code_size(dim: int, bits: int | str) -> int:
    """Bytes per vector of ``dim`` dimensions (faiss's ``code_size``)."""
    if bits in ("fp16", "bf16"):
        return 2 * dim
    return (dim * int(bits) + 7) // 8


def train_ranges(x: torch.Tensor, margin: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """faiss's ``RS_minmax`` ranges of float32 rows ``x`` [n >= 1, d]: ``vmin`` and ``vdiff``,
    float32 [d] (``vexp = (vmax - vmin) * margin`` widens both ends, in float32 as faiss)."""
    vmin, vmax = x.min(dim=0).values, x.max(dim=0).values
    if margin:
        vexp = (vmax - vmin) * vmin.new_tensor(float(margin))
        vmin, vmax = vmin - vexp, vmax + vexp
    return vmin, vmax - vmin


def encode_levels(x: torch.Tensor, vmin: torch.Tensor, vdiff: torch.Tensor, bits: int):
    """The level of each component, int64 [n, d] in ``[0, 2**bits)``: float32 rows ``x``
    [n, d] against ranges ``vmin``, ``vdiff`` [d] (see the module docstring)."""
    zero = vdiff == 0
    xi = ((x - vmin) / torch.where(zero, torch.ones_like(vdiff), vdiff)).clamp(0.0, 1.0)
    xi = torch.where(zero, torch.zeros_like(xi), xi)
    top = (1 << bits) - 1
    scaled = xi * float(top) if bits == 8 else xi.double() * float(top)
    return torch.floor(scaled).long()


def decode_levels(levels: torch.Tensor, vmin: torch.Tensor, vdiff: torch.Tensor, bits: int):
    """Reconstructions float32 [..., d] of levels (any integer or float dtype) [..., d]: the
    centre of each cell, ``vmin + ((level + 0.5) / L) * vdiff``."""
    top = float((1 << bits) - 1)
    return vmin + ((levels.float() + 0.5) / top) * vdiff


def pack_levels(levels: torch.Tensor, bits: int) -> torch.Tensor:
    """int64 levels [n, d] → faiss's bytes uint8 [n, code_size(d, bits)]."""
    n, d = levels.shape
    if bits == 8:
        return levels.to(torch.uint8)
    per = 2 if bits == 4 else 4  # dimensions per group (a byte, or three bytes)
    pad = -d % per
    if pad:
        levels = torch.cat([levels, levels.new_zeros(n, pad)], dim=1)
    groups = levels.reshape(n, -1, per)
    if bits == 4:
        return (groups * groups.new_tensor([1, 16])).sum(-1).to(torch.uint8)
    word = (groups * groups.new_tensor([1, 1 << 6, 1 << 12, 1 << 18])).sum(-1, keepdim=True)
    shifted = torch.div(word, word.new_tensor([1, 256, 65536]), rounding_mode="trunc")
    out = torch.remainder(shifted, 256)
    return out.reshape(n, -1)[:, : code_size(d, bits)].to(torch.uint8)


def unpack_levels(codes: torch.Tensor, dim: int, bits: int) -> torch.Tensor:
    """faiss's bytes [n, code_size(dim, bits)] (any integer dtype) → int64 levels [n, dim]."""
    n = codes.shape[0]
    c = codes.long()
    if bits == 8:
        return c
    if bits == 4:
        pairs = torch.stack([torch.remainder(c, 16), torch.div(c, 16, rounding_mode="trunc")], 2)
        return pairs.reshape(n, -1)[:, :dim]
    pad = -c.shape[1] % 3
    if pad:
        c = torch.cat([c, c.new_zeros(n, pad)], dim=1)
    triples = c.reshape(n, -1, 3)
    word = (triples * triples.new_tensor([1, 256, 65536])).sum(-1, keepdim=True)
    shifts = word.new_tensor([1, 1 << 6, 1 << 12, 1 << 18])
    levels = torch.remainder(torch.div(word, shifts, rounding_mode="trunc"), 64)
    return levels.reshape(n, -1)[:, :dim]


def encode_float16(x: torch.Tensor, kind: str) -> torch.Tensor:
    """float32 rows [n, d] → faiss's fp16 or bf16 bytes uint8 [n, 2 d] (little-endian)."""
    n = x.shape[0]
    bits = x.contiguous().view(torch.int32).long() & 0xFFFFFFFF
    if kind == "fp16":
        half = _fp16_bits(bits)
    else:
        half = torch.div(bits + 0x8000, 65536, rounding_mode="trunc")
    pair = torch.stack([torch.remainder(half, 256), torch.remainder(half // 256, 256)], dim=2)
    return pair.reshape(n, -1).to(torch.uint8)


def _fp16_bits(bits: torch.Tensor) -> torch.Tensor:
    """faiss's ``encode_fp16`` (F. Giesen's float_to_half_fast3, the portable build's): int64
    float32 bit patterns [...] → int64 half-float bit patterns. Its rounding differs from IEEE
    round-to-nearest-even on a few values (halves away from zero, by a float32 product)."""
    sign = bits & 0x80000000
    magnitude = bits - sign
    truncated = (magnitude & 0x7FFFF000).to(torch.int32).view(torch.float32)
    ceiling = (31 << 23) - 0x1000  # the largest finite half, as float32 bits after the product
    scaled = torch.minimum(truncated * 2.0**-112, _float_of_bits(ceiling, truncated))
    regular = torch.div(
        (scaled.view(torch.int32).long() & 0xFFFFFFFF) + 0x1000, 1 << 13, rounding_mode="trunc"
    )
    infinity = 255 << 23
    special = torch.where(magnitude > infinity, 0x7E00, 0x7C00)
    return torch.where(magnitude < infinity, regular, special) + torch.div(
        sign, 1 << 16, rounding_mode="trunc"
    )


def _float_of_bits(bits: int, like: torch.Tensor) -> torch.Tensor:
    """The float32 scalar whose bit pattern is ``bits``, on ``like``'s device."""
    return like.new_tensor([bits], dtype=torch.int32).view(torch.float32)[0]


def float16_values(codes: torch.Tensor, kind: str) -> torch.Tensor:
    """faiss's fp16 or bf16 bytes [n, 2 d] (any integer dtype) → float32 [n, d], exactly,
    by arithmetic on the 16-bit words (so that it exports to ONNX: no bit reinterpretation)."""
    c = codes.long().reshape(codes.shape[0], -1, 2)
    word = c[..., 0] + 256 * c[..., 1]
    mant_bits, exp_bits = (10, 5) if kind == "fp16" else (7, 8)
    bias = (1 << (exp_bits - 1)) - 1
    sign = 1.0 - 2.0 * torch.div(word, 1 << 15, rounding_mode="trunc").float()
    high = torch.div(word, 1 << mant_bits, rounding_mode="trunc")
    exponent = torch.remainder(high, 1 << exp_bits)
    mantissa = torch.remainder(word, 1 << mant_bits).float()
    subnormal = exponent == 0
    special = exponent == (1 << exp_bits) - 1
    power = torch.where(subnormal, 1 - bias - mant_bits, exponent - bias - mant_bits).float()
    significand = torch.where(subnormal, mantissa, mantissa + float(1 << mant_bits))
    # 2**power in two steps: bf16's smallest, 2**-133, is a float32 subnormal
    value = significand * torch.pow(2.0, torch.div(power, 2, rounding_mode="floor"))
    value = value * torch.pow(2.0, power - torch.div(power, 2, rounding_mode="floor"))
    value = torch.where(special, torch.where(mantissa == 0, float("inf"), float("nan")), value)
    return sign * value


def sq_encode(x: torch.Tensor, vmin: torch.Tensor, vdiff: torch.Tensor, bits: int | str):
    """Scalar-quantizer codes as one static-shape graph: float32 rows ``x`` [n, d] → faiss's
    bytes uint8 [n, code_size(d, bits)] (``vmin``, ``vdiff`` float32 [d]; unused for
    fp16 / bf16)."""
    if bits in ("fp16", "bf16"):
        return encode_float16(x, bits)
    return pack_levels(encode_levels(x, vmin, vdiff, bits), bits)


def sq_decode(codes: torch.Tensor, vmin: torch.Tensor, vdiff: torch.Tensor, bits: int | str):
    """Reconstructions as one static-shape graph: faiss's bytes [n, code_size(d, bits)] →
    float32 [n, d] (d = ``vmin.shape[0]``)."""
    dim = vmin.shape[0]
    if bits in ("fp16", "bf16"):
        return float16_values(codes, bits)
    return decode_levels(unpack_levels(codes, dim, bits), vmin, vdiff, bits)


def stored_values(codes: torch.Tensor, dim: int, bits: int | str) -> torch.Tensor:
    """What a static search holds per stored vector: the levels uint8 [n, dim] (b-bit kinds),
    or the values as float16 / bfloat16 [n, dim] (a Cast to float32 decodes them exactly)."""
    if bits == "fp16":
        return float16_values(codes, bits).half()
    if bits == "bf16":
        return float16_values(codes, bits).bfloat16()
    return unpack_levels(codes, dim, bits).to(torch.uint8)


def decode_stored(values: torch.Tensor, vmin: torch.Tensor, vdiff: torch.Tensor, bits):
    """Reconstructions float32 [..., d] of :func:`stored_values` [..., d]."""
    if bits in ("fp16", "bf16"):
        return values.float()
    return decode_levels(values, vmin, vdiff, bits)
