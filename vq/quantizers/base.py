"""What every quantizer shares: input handling, the trained flag, and the training forward.

The forward is one pipeline for every quantizer: layout (``[..., dim]`` or channel-first
``[B, dim, ...]``) and padding mask → optional projection into a low-dimensional code space and
l2-normalisation (cosine codebooks) → the subclass's ``_quantize`` (codes, reconstruction, loss
parts, code counts; codebook learning when the layer trains) → gradient estimator
(straight-through or rotation trick) → projection out. Distances, losses and codebook updates
run in float32 with autocast disabled, whatever the input dtype.
"""

from __future__ import annotations

import math
from typing import Any, Literal, NamedTuple

import numpy as np
import torch
from torch import nn

from vq import _cpu
from vq._checks import (
    as_codes,
    as_vectors,
    check_finite,
    check_training_size,
    check_vectors,
    code_dtype,
    in_chunks,
    is_eager,
    like_input,
)
from vq._tree_cache import cached
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
from vq.quantizers.learning import CodebookLearner, Learning, as_learning, random_codebooks

Metric = Literal["l2", "ip"]
#: encodes of at most this many rows may take the lean path (``Quantizer._encode_small``)
SMALL_BATCH = 16
_FLOAT32 = np.dtype(np.float32)


class QuantizerOutput(NamedTuple):
    """What ``forward`` returns.

    Attributes:
        quantized: Tensor[..., dim] (or ``[B, dim, ...]`` for channel-first layers), the
            reconstruction, in the input's dtype; its gradient reaches the input through the
            straight-through estimator (or the rotation trick). Zero at masked positions.
        codes: integer Tensor[..., *code_shape] of ``code_dtype`` (masked positions hold the
            codes of whatever they contained).
        loss: scalar, ``commitment_weight · commitment + codebook_weight · codebook_loss``:
            what to add to the training loss.
        commitment: scalar, mean squared distance between the input (in code space) and its
            detached reconstruction (ResidualVQ: the mean over stages of the distance to each
            partial reconstruction).
        codebook_loss: scalar, the same distance with the input detached and the codebook
            learning (0 unless ``learning`` is gradient-based).
        perplexity: ``exp`` of the entropy of this batch's code distribution: scalar for a
            single codebook, Tensor[G] per codebook (PQ groups, RVQ stages).
        usage: fraction of the codes used at least once in this batch, same shape.
        num_stages: ResidualVQ only: int64 Tensor[B], the stages each sample used (fewer than
            ``num_quantizers`` under quantizer dropout); None otherwise.
    """

    quantized: torch.Tensor
    codes: torch.Tensor
    loss: torch.Tensor
    commitment: torch.Tensor | None = None
    codebook_loss: torch.Tensor | None = None
    perplexity: torch.Tensor | None = None
    usage: torch.Tensor | None = None
    num_stages: torch.Tensor | None = None


class Step(NamedTuple):
    """What a subclass's ``_quantize`` returns, for the rows of the batch in code space."""

    quantized: torch.Tensor  # float32 [n, code_dim], with the gradient path to the input
    codes: torch.Tensor  # int64 [n, *code_shape]
    commitment: torch.Tensor  # scalar
    codebook_loss: torch.Tensor  # scalar (0 unless the codebooks learn by gradient)
    counts: torch.Tensor  # float32 [G, K], code counts of the batch per codebook
    num_stages: torch.Tensor | None = None  # int64 [B] (ResidualVQ)


class Quantizer(nn.Module):
    """Base class: subclasses implement ``_fit``, ``_encode``, ``_decode`` and ``_tables`` on
    float32 ``[n, code_dim]`` tensors already on the module's device, and ``_quantize`` for the
    training forward.

    Public methods accept numpy arrays or torch tensors (on any device) and give back the same
    kind (numpy, or a tensor on the input's device).

    Layer options (keyword arguments of every subclass that trains as a layer):
        learning: None (codebooks come from ``fit`` and stay fixed in ``forward``), "ema",
            "grad", or a :class:`vq.EMA` / :class:`vq.Gradient` with its settings (k-means
            initialisation on the first training batch, dead-code restart): the codebooks then
            learn in ``forward`` and the layer needs no ``fit``.
        commitment_weight: β, the weight of the commitment loss in ``loss``.
        rotation_trick: pass gradients with the rotation trick instead of straight through.
        cosine: l2-normalise inputs and codewords (cosine-similarity codebooks).
        codebook_dim: quantize in a ``codebook_dim``-dimensional code space reached by a learned
            ``nn.Linear`` (``project_in``), and map back with ``project_out`` (factorized
            codes); None quantizes the input as it is.
        channel_first: ``forward`` takes ``[B, dim, ...]`` (conv feature maps) instead of
            ``[..., dim]``; ``encode``/``decode`` always use ``[..., dim]``.
    """

    dim: int
    codebook_size: int
    code_shape: tuple[int, ...]
    #: rows per step of ``encode``/``decode``: memory beyond the result stays that of one step
    encode_batch_size = 1 << 15

    def __init__(
        self,
        dim: int,
        codebook_size: int,
        code_shape: tuple[int, ...],
        *,
        commitment_weight: float = 1.0,
        rotation_trick: bool = False,
        cosine: bool = False,
        codebook_dim: int | None = None,
        channel_first: bool = False,
    ):
        super().__init__()
        if dim <= 0:
            raise ValueError(f"dim must be positive, got {dim}")
        if codebook_size < 1:
            raise ValueError(f"codebook_size must be >= 1, got {codebook_size}")
        if not commitment_weight >= 0:
            raise ValueError(f"commitment_weight must be >= 0, got {commitment_weight}")
        if codebook_dim is not None and codebook_dim <= 0:
            raise ValueError(f"codebook_dim must be positive or None, got {codebook_dim}")
        self.dim = int(dim)
        self.codebook_size = int(codebook_size)
        self.code_shape = code_shape
        self.commitment_weight = float(commitment_weight)
        self.rotation_trick, self.cosine, self.channel_first = rotation_trick, cosine, channel_first
        self.code_dim = self.dim if codebook_dim is None else int(codebook_dim)
        self.project_in: nn.Linear | None = None
        self.project_out: nn.Linear | None = None
        if self.code_dim != self.dim:
            self.project_in = nn.Linear(self.dim, self.code_dim)
            self.project_out = nn.Linear(self.code_dim, self.dim)
        self.learner: CodebookLearner | None = None
        self.register_buffer("trained", torch.zeros((), dtype=torch.bool))
        self._is_trained = False
        self.register_load_state_dict_post_hook(_sync_trained)

    def _init_codebooks(
        self, name: str, shape: tuple[int, ...], learning: str | Learning | None
    ) -> None:
        """Create the codebooks ``name`` (zeros until trained, random when a learning layer
        starts without k-means) — a parameter for gradient learning, else a buffer — and the
        learner that updates them. ``shape`` must reshape to ``[G, K, code_dim]``."""
        learning = as_learning(learning)
        init = torch.zeros(shape)
        if learning is not None and not learning.kmeans_init:
            groups = math.prod(shape) // (self.codebook_size * shape[-1])
            init = random_codebooks(groups, self.codebook_size, shape[-1], self.cosine)
            init = init.reshape(shape)
        if learning is not None and hasattr(learning, "codebook_weight"):
            setattr(self, name, nn.Parameter(init))
        else:
            self.register_buffer(name, init)
        if learning is not None:
            self.learner = CodebookLearner(learning, self._codebook_groups(), self.cosine)
            if not learning.kmeans_init:
                self._mark_trained()

    # -- subclass hooks -------------------------------------------------------------------
    def _fit(self, x: torch.Tensor) -> None:
        raise NotImplementedError

    def _encode(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _decode(self, codes: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _tables(self, queries: torch.Tensor, metric: Metric) -> torch.Tensor:
        raise NotImplementedError

    def _min_training_vectors(self) -> int:
        return self.codebook_size

    def _codebook_groups(self) -> torch.Tensor:
        """The codebooks as one ``[G, K, code_dim]`` view (the storage ``learner`` updates)."""
        raise NotImplementedError

    def _normalize(self, z: torch.Tensor) -> torch.Tensor:
        """l2-normalisation of code-space vectors for cosine codebooks (per codebook slice)."""
        return torch.nn.functional.normalize(z, dim=-1)

    # -- public API -----------------------------------------------------------------------
    @property
    def is_trained(self) -> bool:
        return self._is_trained

    @property
    def device(self) -> torch.device:
        return self.trained.device

    @property
    def code_dtype(self) -> torch.dtype:
        """uint8 when a code fits in 8 bits, else int16/int32/int64."""
        return code_dtype(self.codebook_size)

    def fit(self, x: Any) -> Quantizer:
        """Train the codebooks on ``x`` (float [n, dim], numpy or torch); returns self.

        A learning layer may be fit too (k-means initialisation from a data set rather than
        the first batch); its usage statistics then start from the code counts of ``x``.
        """
        t = as_vectors(x, self.dim, "x")
        check_training_size(t.shape[0], self._min_training_vectors(), f"{type(self).__name__}.fit")
        with torch.no_grad():
            z = self._code_space(t.to(self.device))
            self._fit(z)
            self._adopt_fit(z)
        self.trained.fill_(True)
        self._is_trained = True
        return self

    def _adopt_fit(self, z: torch.Tensor) -> None:
        """After ``_fit``: unit codewords for cosine codebooks, usage statistics for a learner."""
        if self.cosine:
            codebooks = self._codebook_groups().detach()
            codebooks.copy_(self._normalize(codebooks))
        if self.learner is not None:
            codes = self._codes_by_group(self._encode(z))
            counts = code_counts(codes, self.codebook_size)
            self.learner.reset_(self._codebook_groups().detach(), counts)

    def encode(self, x: Any) -> Any:
        """Codes of ``x`` (float [..., dim]) → integer [..., *code_shape] of ``code_dtype``."""
        found = self._encode_small(x)
        if found is not None:
            return found
        self._require_trained("encode")
        t = check_vectors(x, self.dim, "x", matrix=False)
        lead = t.shape[:-1]

        def encode_rows(rows: torch.Tensor) -> torch.Tensor:  # float32 on the device per chunk
            codes = self._encode(self._code_space(rows.float().to(self.device).contiguous()))
            return codes.to(self.code_dtype)

        with torch.no_grad():
            codes = in_chunks(encode_rows, t.reshape(-1, self.dim), self.encode_batch_size)
        codes = codes.reshape(tuple(lead) + self.code_shape)
        return like_input(codes, x)

    def _encode_small(self, x: Any) -> Any:
        """``encode`` of at most :data:`SMALL_BATCH` float32 rows given as a C-contiguous numpy
        array [n, dim], straight to numpy codes through one kernel call on the calling thread
        (the subclass's ``_lean_encoder``, built once per state of the module: see
        :mod:`vq._tree_cache`); None where that does not apply (the general path then serves
        the call, and raises any error)."""
        if (
            type(x) is not np.ndarray
            or x.dtype is not _FLOAT32
            or x.ndim != 2
            or not 0 < x.shape[0] <= SMALL_BATCH
            or x.shape[1] != self.dim
            or not x.flags.c_contiguous
            or not _cpu.numpy_path()
        ):
            return None
        encoder = cached(self, "_lean_encode_cache", self._build_lean_encoder)
        return None if encoder is None else encoder(x)

    def _build_lean_encoder(self):
        plain = self.project_in is None and not self.cosine and self.device.type == "cpu"
        return self._lean_encoder() if plain and self.is_trained else None

    def _lean_encoder(self):
        """A function ``codes = encoder(x)`` for C-contiguous float32 numpy rows [n <= 16,
        dim] → numpy codes [n, *code_shape] of ``code_dtype`` (the general path's), or None
        where a row is not finite; built for the quantizer as it is (``_encode_small``).
        None (the default): no lean path."""
        return None

    def decode(self, codes: Any) -> Any:
        """Reconstructions of integer ``codes`` [..., *code_shape] → float [..., dim]."""
        self._require_trained("decode")
        n_tables = self.code_shape[0] if self.code_shape else None
        c = as_codes(codes, n_tables, self.codebook_size)
        lead = c.shape[: c.dim() - len(self.code_shape)]

        def decode_rows(rows: torch.Tensor) -> torch.Tensor:
            return self._output_space(self._decode(rows.to(self.device)))

        with torch.no_grad():
            flat = c.reshape(-1, *self.code_shape)
            x_hat = in_chunks(decode_rows, flat, self.encode_batch_size)
        return like_input(x_hat.reshape(*lead, self.dim), codes)

    def distance_tables(self, queries: Any, metric: Metric = "l2") -> Any:
        """ADC look-up tables: float32 [nq, n_tables, codebook_size].

        For ``metric="ip"`` the sum over tables of ``table[t, code_t]`` is ⟨q, x̂⟩; for
        ``metric="l2"`` it is ``||q - x̂||²`` (see the subclass for exceptions).
        """
        self._require_trained("distance_tables")
        if metric not in ("l2", "ip"):
            raise ValueError(f"metric must be 'l2' or 'ip', got {metric!r}")
        q = as_vectors(queries, self.dim, "queries")
        with torch.no_grad():
            tables = self._tables(q.to(self.device), metric)
        return like_input(tables, queries)

    # -- the layer --------------------------------------------------------------------------
    def updates_state(self) -> bool:
        """Whether ``forward`` learns now: a learning layer in training mode with gradients
        enabled. Otherwise ``forward`` changes nothing (and never communicates)."""
        return self.learner is not None and self.training and torch.is_grad_enabled()

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
            self._require_trained("forward")
        rows, weight, lead = self._rows(x, mask)
        z = rows if self.project_in is None else self.project_in(rows)
        with torch.autocast(z.device.type, enabled=False):
            z32 = z.float()
            if self.cosine:
                z32 = self._normalize(z32)
            step = self._quantize(z32, weight, lead, update)
            loss = self.commitment_weight * step.commitment
            if self.learner is not None and self.learner.by_gradient:
                loss = loss + self.learner.learning.codebook_weight * step.codebook_loss
            perplexity, usage = usage_statistics(step.counts)
        quantized = step.quantized.to(z.dtype)
        if self.project_out is not None:
            quantized = self.project_out(quantized)
        if weight is not None:
            quantized = quantized * weight[:, None].to(quantized.dtype)
        if update:
            self._mark_trained()
        quantized = quantized.reshape(*lead, self.dim)
        if self.channel_first:
            quantized = quantized.movedim(-1, 1)
        if not self.code_shape:
            perplexity, usage = perplexity[0], usage[0]
        return QuantizerOutput(
            quantized,
            step.codes.to(self.code_dtype).reshape(tuple(lead) + self.code_shape),
            loss,
            step.commitment,
            step.codebook_loss,
            perplexity,
            usage,
            step.num_stages,
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

    def _output_codebooks(self) -> torch.Tensor:
        """Every codebook in the input space, float32 [G, K, dim]: ``project_out`` applied to
        the codewords, its bias added to the first codebook only (so that sums of one codeword
        per codebook are reconstructions, for additive quantizers)."""
        cb = self._codebook_groups().detach().float()
        if self.project_out is None:
            return cb
        out = cb @ self.project_out.weight.detach().float().T
        bias = self.project_out.bias.detach().float()
        return torch.cat([out[:1] + bias, out[1:]])

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
        flat = codebooks.float().reshape(groups * size, d)
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

    def _training_codes(self, z: torch.Tensor) -> torch.Tensor:
        """Codes of code-space rows in a training step (``_encode``, unless a subclass has a
        faster way for large batches)."""
        return self._encode(z)

    def _group_rows(self, z: torch.Tensor) -> torch.Tensor:
        """Code-space rows [n, code_dim] → the slice each codebook quantizes, [G, n, d]."""
        raise NotImplementedError

    def _ungroup(self, slices: torch.Tensor) -> torch.Tensor:
        """Inverse of :meth:`_group_rows`: [G, n, d] → [n, code_dim]."""
        raise NotImplementedError

    def _require_trained(self, what: str) -> None:
        if not self.is_trained:
            hint = ""
            if what == "forward" and self.learner is None:
                hint = ", or build it with learning='ema' (or 'grad') to train it as a layer"
            elif what == "forward":
                hint = " (a learning layer initialises in training mode with gradients enabled)"
            raise RuntimeError(
                f"{type(self).__name__}.{what}: the quantizer is not trained; call fit(x) first "
                f"or load a trained state_dict{hint}"
            )

    def _mark_trained(self) -> None:
        self.trained.fill_(True)
        self._is_trained = True


def _sync_trained(module: Quantizer, incompatible_keys) -> None:
    module._is_trained = bool(module.trained)
