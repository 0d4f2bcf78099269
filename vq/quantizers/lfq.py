"""Lookup-free quantization: one bit per code dimension, and the entropy loss that spreads codes.

Each of the ``num_bits`` code dimensions is quantized to its sign, ``±scale``; the code is the
binary number of the signs (the first dimension is the most significant bit, as in
vector-quantize-pytorch), so the implicit codebook is the 2^bits corners of a cube and needs no
lookup. What keeps the codes in use is MAGVIT-v2's entropy loss: with the soft assignment
``p(c | z) ∝ exp(-τ ||z - c||²)`` over the corners,

    entropy_loss = E_z[H(p(· | z))] - γ · H(E_z[p(· | z)])

(confident per-vector assignments, a uniform batch distribution). Both terms are computed
without the ``[n, 2^bits]`` table of probabilities: ``p(c | z)`` factorizes over bits
(``p(bit i = 1 | z) = σ(4 τ scale z_i)``), so the per-vector entropy is a sum of binary
entropies, and the batch mean ``E_z[p(c | z)]`` is the product of two ``[n, 2^(bits/2)]`` tables
(high and low bits) contracted over the batch: ``2^bits`` values, never ``n × 2^bits``.

Under torch.distributed the batch mean is over every process's vectors (one all-reduce, in
training only); the gradient reaches each process's own vectors.

References:
    L. Yu et al., "Language model beats diffusion — tokenizer is key to visual generation"
    (MAGVIT-v2), ICLR 2024.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vq.parallel import sync
from vq.quantizers.base import Quantizer
from vq.quantizers.codec import Metric
from vq.quantizers.functional import code_counts, codeword_tables, masked_mse
from vq.quantizers.layer import Step

#: the most bits an LFQ codebook may have (its batch distribution holds 2^bits floats)
MAX_BITS = 24


def bit_table(bits: int) -> torch.Tensor:
    """The bits of every code, most significant first: float32 Tensor[2^bits, bits] of 0/1."""
    codes = torch.arange(1 << bits)[:, None]
    weights = 1 << torch.arange(bits - 1, -1, -1)
    return ((codes // weights) % 2).float()


def lfq_entropies(
    z: torch.Tensor,
    scale: float,
    inv_temperature: float,
    weight: torch.Tensor | None,
    tables: tuple[torch.Tensor, torch.Tensor],
    synced: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """MAGVIT-v2's two entropy terms of sign codes ``±scale`` at ``inv_temperature`` τ.

    Args:
        z: float32 Tensor[n, bits] (with gradient); weight: float Tensor[n] (0 = padding) or
            None; tables: :func:`bit_table` of the high and the low half of the bits (the
            first ``h`` and the last ``bits - h``); synced: the batch mean over every
            process's vectors.

    Returns:
        ``(per_sample, codebook)``, scalars: the mean over vectors of ``H(p(· | z))`` and
        ``H(E_z[p(· | z)])``, in nats.
    """
    logits = (4.0 * inv_temperature * scale) * z  # log-odds of bit = 1 (the +scale corner)
    ones = torch.ones(z.shape[0], device=z.device) if weight is None else weight.float()
    total = ones.sum()
    # H(Bernoulli(σ(a))) = softplus(a) - a σ(a), summed over bits
    binary = (F.softplus(logits) - logits * torch.sigmoid(logits)).sum(-1)
    per_sample = (binary * ones).sum() / total.clamp_min(1.0)
    # log p(c | z) = Σ_i log σ(-a_i) + Σ_i b_i a_i, split into high and low bits
    high_bits, low_bits = tables
    h = high_bits.shape[1]
    base = F.logsigmoid(-logits)
    high = torch.exp(base[:, :h].sum(-1, keepdim=True) + logits[:, :h] @ high_bits.T)
    low = torch.exp(base[:, h:].sum(-1, keepdim=True) + logits[:, h:] @ low_bits.T)
    mass = ((high * ones[:, None]).T @ low).reshape(-1)  # Σ_n w_n p(c | z_n), [2^bits]
    if synced:  # every process's sum; the gradient reaches this process's own vectors
        packed = torch.cat([mass.detach(), total[None]])
        everyone = sync.all_reduce_sum(packed)
        mass = mass + (everyone[:-1] - mass.detach())
        total = everyone[-1]
    mean = mass / total.clamp_min(1.0)
    codebook = -(mean * torch.log(mean.clamp_min(1e-12))).sum()
    return per_sample, codebook


class LFQ(Quantizer):
    """Lookup-free quantizer of ``num_bits`` sign bits (``codebook_size = 2^num_bits`` codes).

    Args:
        dim: input dimension; when it differs from ``num_bits``, learned ``nn.Linear``
            projections map into and out of the code space (default: ``num_bits``).
        codebook_size: 2^bits codes (a power of two); or give ``num_bits``.
        num_bits: bits per code, 1 to 24.
        entropy_loss_weight: weight of the entropy loss in ``loss`` (0.1 in MAGVIT-v2 and
            vector-quantize-pytorch).
        commitment_weight: β, weight of the commitment loss ``||z - sg(q)||²``.
        diversity_gamma: γ, the weight of the codebook entropy inside the entropy loss.
        inv_temperature: τ of the soft assignment (100, as vector-quantize-pytorch).
        scale: the codeword values ``±scale``.
        rotation_trick, channel_first: layer options (see :class:`vq.Quantizer`).

    Codes are ``[...]``, one integer in ``[0, 2^bits)``; ``decode`` gives the corner (``±scale``
    per code dimension) through ``project_out``. ``fit`` has nothing to train; the layer needs
    no ``fit``. In training mode ``loss`` is ``β · commitment + entropy_loss_weight ·
    (per_sample_entropy - γ · codebook_entropy)`` and the output carries both entropies; in eval
    mode the entropy terms are not computed.
    """

    def __init__(
        self,
        dim: int | None = None,
        codebook_size: int | None = None,
        *,
        num_bits: int | None = None,
        entropy_loss_weight: float = 0.1,
        commitment_weight: float = 0.25,
        diversity_gamma: float = 1.0,
        inv_temperature: float = 100.0,
        scale: float = 1.0,
        rotation_trick: bool = False,
        channel_first: bool = False,
    ):
        bits = lfq_bits(codebook_size, num_bits, dim)
        check_entropy_options(entropy_loss_weight, diversity_gamma, inv_temperature, scale)
        super().__init__(
            bits if dim is None else dim,
            1 << bits,
            (),
            commitment_weight=commitment_weight,
            rotation_trick=rotation_trick,
            codebook_dim=bits,
            channel_first=channel_first,
        )
        self.num_bits, self.scale = bits, float(scale)
        self.entropy_loss_weight, self.diversity_gamma = entropy_loss_weight, diversity_gamma
        self.inv_temperature = float(inv_temperature)
        register_bit_tables(self, bits)
        self.mark_trained()

    def _min_training_vectors(self) -> int:
        return 1

    def _fit(self, x: torch.Tensor) -> None:
        pass

    def _encode(self, x: torch.Tensor) -> torch.Tensor:
        return ((x > 0).long() * self._bit_weights).sum(-1)

    def _decode(self, codes: torch.Tensor) -> torch.Tensor:
        return sign_values(codes.reshape(-1), self._bit_weights, self.scale)

    def static_encode(self, x: torch.Tensor) -> torch.Tensor:
        """``encode`` as one static-shape graph, float32 Tensor[n, dim] → int64 Tensor[n]:
        ``project_in`` when there is one, the sign bits, their binary number."""
        return self._encode(self._code_space(x))

    def static_decode(self, codes: torch.Tensor) -> torch.Tensor:
        """``decode`` as one static-shape graph: integer codes Tensor[n] → float32 Tensor[n,
        dim] (the corner ``±scale``, then ``project_out``)."""
        return self._output_space(self._decode(codes))

    def _codebook_groups(self) -> torch.Tensor:
        grid = torch.arange(self.codebook_size, device=self._bit_weights.device)
        return self._decode(grid)[None]

    def _quantize(self, z, weight, lead, update) -> Step:
        zd = z.detach()
        codes = self._encode(zd)
        q = torch.where(zd > 0, self.scale, -self.scale)
        counts = code_counts(codes[None], self.codebook_size, weight)
        aux, entropies = None, None
        if self.training:
            synced = torch.is_grad_enabled() and sync.active()
            tables = (self._high_bits, self._low_bits)
            entropies = lfq_entropies(z, self.scale, self.inv_temperature, weight, tables, synced)
            aux = self.entropy_loss_weight * (entropies[0] - self.diversity_gamma * entropies[1])
        commitment = masked_mse(z, q, weight)
        zero = z.new_zeros(())
        return Step(self._estimate(z, q), codes, commitment, zero, counts, None, aux, entropies)

    def tables(self, queries: torch.Tensor, metric: Metric) -> torch.Tensor:
        """float32 queries [nq, dim] → tables [nq, 1, 2^bits] over the corners."""
        return codeword_tables(queries, self._output_codebooks()[0], metric)


# -- what LFQ and ResidualLFQ share ---------------------------------------------------------------
def lfq_bits(codebook_size: int | None, num_bits: int | None, dim: int | None) -> int:
    """The number of bits from ``codebook_size`` (a power of two) or ``num_bits`` (default:
    ``dim``); ValueError for anything else."""
    if codebook_size is not None and num_bits is not None:
        if codebook_size != 1 << num_bits:
            raise ValueError(
                f"codebook_size={codebook_size} and num_bits={num_bits} disagree; give one"
            )
    if codebook_size is not None:
        if codebook_size < 2 or codebook_size & (codebook_size - 1):
            raise ValueError(
                f"codebook_size must be a power of two >= 2 for lookup-free quantization, got "
                f"{codebook_size} (try {1 << max(1, (codebook_size - 1).bit_length())})"
            )
        num_bits = codebook_size.bit_length() - 1
    if num_bits is None:
        if dim is None:
            raise ValueError("give codebook_size or num_bits (or dim: one bit per dimension)")
        num_bits = dim
    if not 1 <= num_bits <= MAX_BITS:
        raise ValueError(f"num_bits must lie in [1, {MAX_BITS}], got {num_bits}")
    return int(num_bits)


def check_entropy_options(weight: float, gamma: float, inv_temperature: float, scale) -> None:
    if not weight >= 0:
        raise ValueError(f"entropy_loss_weight must be >= 0, got {weight}")
    if not gamma >= 0:
        raise ValueError(f"diversity_gamma must be >= 0, got {gamma}")
    if not inv_temperature > 0:
        raise ValueError(f"inv_temperature must be positive, got {inv_temperature}")
    if not scale > 0:
        raise ValueError(f"scale must be positive, got {scale}")


def register_bit_tables(module: torch.nn.Module, bits: int) -> None:
    """Non-persistent buffers: ``_bit_weights`` int64 [bits] (2^(bits-1) … 1) and the bit
    tables of the high and low halves, ``_high_bits`` [2^h, h] and ``_low_bits``."""
    high = bits // 2
    weights = 1 << torch.arange(bits - 1, -1, -1)
    module.register_buffer("_bit_weights", weights, persistent=False)
    module.register_buffer("_high_bits", bit_table(high), persistent=False)
    module.register_buffer("_low_bits", bit_table(bits - high), persistent=False)


def sign_values(codes: torch.Tensor, bit_weights: torch.Tensor, scale) -> torch.Tensor:
    """Integer codes Tensor[n] → float32 Tensor[n, bits] of ``±scale`` (``scale`` a float or
    a Tensor[bits]); codes are non-negative, so truncating division is floor division."""
    bits = torch.remainder(torch.div(codes.long()[:, None], bit_weights, rounding_mode="trunc"), 2)
    return (2.0 * bits.float() - 1.0) * scale
