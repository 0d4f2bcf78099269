"""The training layer every quantizer is: ``forward`` as a layer of a network (VQ-VAE, codec).

The forward is one pipeline for every quantizer: layout (``[..., dim]`` or channel-first
``[B, dim, ...]``) and padding mask → optional projection into a low-dimensional code space and
l2-normalisation (cosine codebooks) → the subclass's ``_quantize`` (codes, reconstruction, loss
parts, code counts; codebook learning when the layer trains) → gradient estimator
(straight-through or rotation trick) → projection out. Distances, losses and codebook updates
run in float32 with autocast disabled, whatever the input dtype. The projections and the
normalisation are the code space of the codec too (``_code_space``, ``_output_space``), so
``fit``, ``encode`` and ``decode`` go through them as well.

:class:`TrainingLayer` is the layer half of :class:`vq.Quantizer`, mixed in over the codec half
(:class:`vq.quantizers.codec.Codec`) whose ``_encode``, ``_decode`` and trained flag it uses.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from vq._checks import check_finite, is_eager
from vq.parallel import sync
from vq.quantizers.functional import (
    code_counts,
    masked_mse,
    rotation_trick,
    row_norms,
    straight_through,
    straight_through_loss,
    usage_statistics,
)
from vq.quantizers.learning import (
    CodebookLearner,
    Learning,
    SimVQ,
    as_learning,
    random_codebooks,
    simvq_init,
    transformed_codebooks,
)
from vq.quantizers.outputs import QuantizerOutput, Step

_UNTRAINED_FIXED = ", or build it with learning='ema' (or 'grad') to train it as a layer"
_UNTRAINED_LEARNING = " (a learning layer initialises in training mode with gradients enabled)"


class TrainingLayer:
    """The layer half of :class:`vq.Quantizer`: ``forward``, the code space (projections,
    cosine normalisation) and the codebook learner. The layer options are documented there.

    Subclasses implement ``_codebook_groups`` and either ``_quantize`` or, when each of their
    G codebooks quantizes its own slice of the code space, ``_group_rows`` and ``_ungroup``
    (then ``_quantize`` is :meth:`_quantize_groups`).
    """

    def _init_layer(
        self,
        *,
        commitment_weight: float,
        rotation_trick: bool,
        cosine: bool,
        codebook_dim: int | None,
        channel_first: bool,
    ) -> None:
        """Check and set the layer options; create ``project_in``/``project_out`` when
        ``codebook_dim`` differs from ``dim``."""
        if not commitment_weight >= 0:
            raise ValueError(f"commitment_weight must be >= 0, got {commitment_weight}")
        if codebook_dim is not None and codebook_dim <= 0:
            raise ValueError(f"codebook_dim must be positive or None, got {codebook_dim}")
        self.commitment_weight = float(commitment_weight)
        self.rotation_trick, self.cosine, self.channel_first = rotation_trick, cosine, channel_first
        self.code_dim = self.dim if codebook_dim is None else int(codebook_dim)
        self.project_in: nn.Linear | None = None
        self.project_out: nn.Linear | None = None
        if self.code_dim != self.dim:
            self.project_in = nn.Linear(self.dim, self.code_dim)
            self.project_out = nn.Linear(self.code_dim, self.dim)
        self.learner: CodebookLearner | None = None
        self.register_parameter("codebook_transform", None)  # SimVQ's W

    def _init_codebooks(
        self, name: str, shape: tuple[int, ...], learning: str | Learning | None
    ) -> None:
        """Create the codebooks ``name`` (zeros until trained, random when a learning layer
        starts without k-means) — a parameter for gradient learning, else a buffer — and the
        learner that updates them. ``shape`` must reshape to ``[G, K, code_dim]``."""
        learning = as_learning(learning)
        init = torch.zeros(shape)
        groups = math.prod(shape) // (self.codebook_size * shape[-1])
        if learning is not None and not learning.kmeans_init and not isinstance(learning, SimVQ):
            init = random_codebooks(groups, self.codebook_size, shape[-1], self.cosine)
            init = init.reshape(shape)
        if isinstance(learning, SimVQ):
            if not self.simvq_learning:
                raise ValueError(
                    f"{type(self).__name__} does not learn by SimVQ; use learning='ema' or "
                    "'grad', or a vq.VectorQuantizer / vq.ResidualVQ"
                )
            init, transform = simvq_init(groups, self.codebook_size, shape[-1])
            self.register_buffer(name, init.reshape(shape))  # frozen: C
            self.codebook_transform = nn.Parameter(transform)
        elif learning is not None and hasattr(learning, "codebook_weight"):
            setattr(self, name, nn.Parameter(init))
        else:
            self.register_buffer(name, init)
        if learning is not None:
            self.learner = CodebookLearner(learning, self._codebook_groups(), self.cosine)
            if not learning.kmeans_init:
                self.mark_trained()

    #: whether ``learning=vq.SimVQ(...)`` applies (the layer codes with effective_codebooks)
    simvq_learning = False

    def effective_codebooks(self) -> torch.Tensor:
        """The codewords the layer codes with, float32 Tensor[G, K, code_dim]: the codebooks,
        or under :class:`vq.SimVQ` the frozen ones mapped by the learned ``codebook_transform``
        (``W_g c_k``, l2-normalised for cosine codebooks), with the gradient to ``W``. What
        encode, decode, distance tables, the training forward and the export graphs read."""
        codebooks = self._codebook_groups()
        if self.codebook_transform is None:
            return codebooks.float()
        words = transformed_codebooks(codebooks, self.codebook_transform)
        return self._normalize(words) if self.cosine else words

    # -- subclass hooks -------------------------------------------------------------------
    def _codebook_groups(self) -> torch.Tensor:
        """The codebooks as one ``[G, K, code_dim]`` view (the storage ``learner`` updates)."""
        raise NotImplementedError

    def _group_rows(self, z: torch.Tensor) -> torch.Tensor:
        """Code-space rows [n, code_dim] → the slice each codebook quantizes, [G, n, d]."""
        raise NotImplementedError

    def _ungroup(self, slices: torch.Tensor) -> torch.Tensor:
        """Inverse of :meth:`_group_rows`: [G, n, d] → [n, code_dim]."""
        raise NotImplementedError

    def _normalize(self, z: torch.Tensor) -> torch.Tensor:
        """l2-normalisation of code-space vectors for cosine codebooks (per codebook slice)."""
        return torch.nn.functional.normalize(z, dim=-1)

    def _training_codes(self, z: torch.Tensor) -> torch.Tensor:
        """Codes of code-space rows in a training step (``_encode``, unless a subclass has a
        faster way for large batches)."""
        return self._encode(z)

    # -- the forward pipeline ---------------------------------------------------------------
    def learns(self) -> bool:
        """Whether the layer has codebooks that learn in ``forward`` (``learning`` given)."""
        return self.learner is not None

    def codebook_loss_weight(self) -> float:
        """The weight of ``codebook_loss`` in ``loss``: 0 unless codebooks learn by gradient."""
        learner = self.learner
        return learner.learning.codebook_weight if learner and learner.by_gradient else 0.0

    def updates_state(self) -> bool:
        """Whether ``forward`` learns now: a learning layer in training mode with gradients
        enabled. Otherwise ``forward`` changes nothing (and never communicates)."""
        return self.learns() and self.training and torch.is_grad_enabled()

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> QuantizerOutput:
        """Quantize ``x`` for training: reconstruction with a gradient path, codes, losses and
        usage statistics; a learning layer in training mode also updates its codebooks.

        Args:
            x: float Tensor[..., dim] (any float dtype, autocast included), or
                ``[B, dim, ...]`` when the layer is ``channel_first``.
            mask: optional bool Tensor of x's shape without the channel axis, True for real
                vectors and False for padding: padding is left out of losses, statistics and
                codebook updates, and comes back as zeros.

        Returns:
            :class:`QuantizerOutput`.
        """
        update = self.updates_state()
        if not update:
            fixed = not self.learns()
            self._require_trained("forward", _UNTRAINED_FIXED if fixed else _UNTRAINED_LEARNING)
        rows, weight, lead = self._rows(x, mask)
        z = rows if self.project_in is None else self.project_in(rows)
        with torch.autocast(z.device.type, enabled=False):
            z32 = z.float()
            if self.cosine:
                z32 = self._normalize(z32)
            step = self._quantize(z32, weight, lead, update)
            loss = self.commitment_weight * step.commitment
            if self.codebook_loss_weight():
                loss = loss + self.codebook_loss_weight() * step.codebook_loss
            if step.aux_loss is not None:
                loss = loss + step.aux_loss
            perplexity, usage = usage_statistics(step.counts)
        quantized = step.quantized.to(z.dtype)
        if self.project_out is not None:
            quantized = self.project_out(quantized)
        if weight is not None:
            quantized = quantized * weight[:, None].to(quantized.dtype)
        if update:
            self.mark_trained()
        quantized = quantized.reshape(*lead, self.dim)
        if self.channel_first:
            quantized = quantized.movedim(-1, 1)
        if not self.code_shape:
            perplexity, usage = perplexity[0], usage[0]
        entropies = (None, None) if step.entropies is None else step.entropies
        return QuantizerOutput(
            quantized,
            step.codes.to(self.code_dtype).reshape(tuple(lead) + self.code_shape),
            loss,
            step.commitment,
            step.codebook_loss,
            perplexity,
            usage,
            step.num_stages,
            *entropies,
            step.stage_commitment,
        )

    def _rows(
        self, x: torch.Tensor, mask: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None, tuple[int, ...]]:
        """Check ``x`` and ``mask``; return rows [n, dim], weights [n] (or None), lead shape."""
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"forward expects a torch tensor, got {type(x).__name__}")
        if not x.is_floating_point():
            raise TypeError(
                f"x: expected floating-point vectors, got {str(x.dtype).replace('torch.', '')}"
            )
        if self.channel_first:
            if x.dim() < 2 or x.shape[1] != self.dim:
                raise ValueError(
                    f"x: expected channel-first input [B, {self.dim}, ...], got shape "
                    f"{tuple(x.shape)}"
                )
            x = x.movedim(1, -1)
        elif x.dim() == 0 or x.shape[-1] != self.dim:
            got = "a scalar" if x.dim() == 0 else x.shape[-1]
            raise ValueError(f"x: expected vectors of dim {self.dim}, got {got}")
        if is_eager():
            check_finite(x.detach(), "x")
        lead = tuple(x.shape[:-1])
        weight = None
        if mask is not None:
            if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
                got = mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__
                raise TypeError(
                    f"mask: expected a bool tensor (True = vector, False = padding), got {got}"
                )
            if tuple(mask.shape) != lead:
                raise ValueError(
                    f"mask: expected shape {lead} (the input without its channel axis), got "
                    f"{tuple(mask.shape)}"
                )
            weight = mask.reshape(-1).to(device=x.device, dtype=torch.float32)
        return x.reshape(-1, self.dim), weight, lead

    # -- the code space (the codec's too) ---------------------------------------------------
    def _code_space(self, x: torch.Tensor) -> torch.Tensor:
        """Input vectors [n, dim] → code-space vectors [n, code_dim] (float32)."""
        if self.project_in is not None:
            x = self.project_in(x.to(self.project_in.weight.dtype))
        x = x.float()
        return self._normalize(x) if self.cosine else x

    def _output_space(self, z: torch.Tensor) -> torch.Tensor:
        """Code-space vectors [n, code_dim] → reconstructions [n, dim] (float32)."""
        if self.project_out is None:
            return z
        return self.project_out(z.to(self.project_out.weight.dtype)).float()

    def _identity_code_space(self) -> bool:
        return self.project_in is None and not self.cosine

    def _output_codebooks(self) -> torch.Tensor:
        """Every codebook in the input space, float32 [G, K, dim]: ``project_out`` applied to
        the codewords, its bias added to the first codebook only (so that sums of one codeword
        per codebook are reconstructions, for additive quantizers)."""
        cb = self.effective_codebooks().detach()
        if self.project_out is None:
            return cb
        out = cb @ self.project_out.weight.detach().float().T
        bias = self.project_out.bias.detach().float()
        return torch.cat([out[:1] + bias, out[1:]])

    def _after_fit(self, z: torch.Tensor) -> None:
        """After ``fit``'s ``_fit`` on code-space rows ``z``: unit codewords for cosine
        codebooks; a learning layer's usage statistics start from the code counts of ``z``."""
        if self.cosine:
            codebooks = self._codebook_groups().detach()
            codebooks.copy_(self._normalize(codebooks))
        if self.learner is not None:
            codes = self._codes_by_group(self._encode(z))
            counts = code_counts(codes, self.codebook_size)
            self.learner.reset_(self._codebook_groups().detach(), counts)

    # -- quantization steps, losses and gradient estimators ---------------------------------
    def _codes_by_group(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes [n, *code_shape] → [G, n]."""
        return codes.reshape(codes.shape[0], -1).T

    def _estimate(self, z: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """The output: ``q`` in value, with the configured gradient path to ``z``."""
        return rotation_trick(z, q) if self.rotation_trick else straight_through(z, q)

    def _quantize(
        self, z: torch.Tensor, weight: torch.Tensor | None, lead: tuple[int, ...], update: bool
    ) -> Step:
        """Fixed codebooks: ``_encode`` then ``_decode`` (subclasses that learn override this).

        Args:
            z: float32 Tensor[n, code_dim] (with gradient); weight: float Tensor[n] or None;
            lead: the batch shape of the rows; update: whether to learn (see updates_state).
        """
        with torch.no_grad():
            codes = self._encode(z.detach()).long()
            q = self._decode(codes)
        counts = code_counts(self._codes_by_group(codes), self.codebook_size, weight)
        return Step(self._estimate(z, q), codes, masked_mse(z, q, weight), z.new_zeros(()), counts)

    def _quantize_groups(self, z: torch.Tensor, weight: torch.Tensor | None, update: bool) -> Step:
        """``_quantize`` of quantizers whose G codebooks each quantize their own slice of the
        code space (one codebook; product quantization), learning when ``update``."""
        learner, size = self.learner, self.codebook_size
        synced = update and sync.active()
        zd = z.detach()
        slices = self._group_rows(zd)  # [G, n, d]
        codebooks = self._codebook_groups()  # [G, K, d], a parameter under gradient learning
        if update:
            learner.initialize(codebooks.detach(), slices, weight, slice(None), synced)
        with torch.no_grad():
            codes = self._training_codes(zd).long()  # [n, *code_shape]
        by_group = self._codes_by_group(codes)  # [G, n]
        groups, n, d = slices.shape
        offsets = torch.arange(groups, device=z.device)[:, None] * size
        flat = self.effective_codebooks().reshape(groups * size, d)  # read after initialize
        q = flat.index_select(0, (by_group + offsets).reshape(-1)).reshape(groups, n, d)
        q_detached = q.detach()
        if learner is not None and learner.by_gradient:
            codebook_loss = masked_mse(slices, q, weight)
        else:
            codebook_loss = z.new_zeros(())
        counts = code_counts(by_group, size, weight)
        if update:
            learner.update(codebooks.detach(), slices, by_group, weight, slice(None), synced)
        # commitment Σ w ||z - sg(q)||² / N: value and gradient (2 / N) w (z - q) from one residual
        residual = slices - q_detached
        if weight is None:
            squares = torch.dot(residual.reshape(-1), residual.reshape(-1))
            denom = z.new_tensor(float(max(n * groups * d, 1)))
        else:
            squares = (row_norms(residual) * weight).sum()
            denom = (weight.sum() * groups * d).clamp_min(1.0)
            residual.mul_(weight[:, None])
        quantized, commitment = self._output(z, q_detached, squares / denom, residual, 2 / denom)
        return Step(quantized, codes, commitment, codebook_loss, counts)

    def _output(self, z, q, commitment, direction, scale) -> tuple[torch.Tensor, torch.Tensor]:
        """Quantized rows [n, code_dim] and commitment with their gradients to ``z``, from
        grouped ``q`` and ``direction`` [G, n, d] (∂commitment/∂z = scale · direction)."""
        q_rows, direction = self._ungroup(q), self._ungroup(direction)
        quantized, commitment = straight_through_loss(z, q_rows, commitment, direction, scale)
        if self.rotation_trick:
            quantized = self._ungroup(rotation_trick(self._group_rows(z), q))
        return quantized, commitment
