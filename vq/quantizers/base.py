"""What every quantizer shares: input handling, the trained flag, and the training forward."""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from vq._checks import as_codes, as_vectors, check_training_size, code_dtype, like_input

Metric = Literal["l2", "ip"]


class QuantizerOutput(NamedTuple):
    """What ``forward`` returns.

    Attributes:
        quantized: Tensor[..., dim], the reconstruction with a straight-through gradient
            (its gradient flows to the input unchanged).
        codes: integer Tensor[..., *code_shape].
        loss: scalar commitment loss, mean squared distance between the input and the
            (detached) reconstruction.
    """

    quantized: torch.Tensor
    codes: torch.Tensor
    loss: torch.Tensor


class Quantizer(nn.Module):
    """Base class: subclasses implement ``_fit``, ``_encode``, ``_decode`` and ``_tables`` on
    float32 ``[n, dim]`` tensors already on the module's device.

    Public methods accept numpy arrays or torch tensors (on any device) and give back the same
    kind (numpy, or a tensor on the input's device).
    """

    dim: int
    codebook_size: int
    code_shape: tuple[int, ...]

    def __init__(self, dim: int, codebook_size: int, code_shape: tuple[int, ...]):
        super().__init__()
        if dim <= 0:
            raise ValueError(f"dim must be positive, got {dim}")
        if codebook_size < 1:
            raise ValueError(f"codebook_size must be >= 1, got {codebook_size}")
        self.dim = int(dim)
        self.codebook_size = int(codebook_size)
        self.code_shape = code_shape
        self.register_buffer("trained", torch.zeros((), dtype=torch.bool))
        self._is_trained = False
        self.register_load_state_dict_post_hook(_sync_trained)

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
        """Train the codebooks on ``x`` (float [n, dim], numpy or torch); returns self."""
        t = as_vectors(x, self.dim, "x")
        check_training_size(t.shape[0], self._min_training_vectors(), f"{type(self).__name__}.fit")
        with torch.no_grad():
            self._fit(t.to(self.device))
        self.trained.fill_(True)
        self._is_trained = True
        return self

    def encode(self, x: Any) -> Any:
        """Codes of ``x`` (float [..., dim]) → integer [..., *code_shape] of ``code_dtype``."""
        self._require_trained("encode")
        t = as_vectors(x, self.dim, "x", matrix=False)
        lead = t.shape[:-1]
        with torch.no_grad():
            codes = self._encode(t.reshape(-1, self.dim).to(self.device))
        codes = codes.to(self.code_dtype).reshape(tuple(lead) + self.code_shape)
        return like_input(codes, x)

    def decode(self, codes: Any) -> Any:
        """Reconstructions of integer ``codes`` [..., *code_shape] → float [..., dim]."""
        self._require_trained("decode")
        n_tables = self.code_shape[0] if self.code_shape else None
        c = as_codes(codes, n_tables, self.codebook_size)
        lead = c.shape[: c.dim() - len(self.code_shape)]
        with torch.no_grad():
            x_hat = self._decode(c.reshape(-1, *self.code_shape).to(self.device))
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

    def forward(self, x: torch.Tensor) -> QuantizerOutput:
        """Quantize ``x`` [..., dim] for training: straight-through output, codes and
        commitment loss (no state changes; the VQ-VAE training behaviour comes later)."""
        self._require_trained("forward")
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"forward expects a torch tensor, got {type(x).__name__}")
        as_vectors(x.detach(), self.dim, "x", matrix=False)
        flat = x.reshape(-1, self.dim)
        with torch.no_grad():
            codes = self._encode(flat.detach().float())
            x_hat = self._decode(codes).to(x.dtype)
        quantized = flat + (x_hat - flat).detach()
        loss = F.mse_loss(flat, x_hat)
        lead = x.shape[:-1]
        return QuantizerOutput(
            quantized.reshape(x.shape),
            codes.to(self.code_dtype).reshape(tuple(lead) + self.code_shape),
            loss,
        )

    def _require_trained(self, what: str) -> None:
        if not self.is_trained:
            raise RuntimeError(
                f"{type(self).__name__}.{what}: the quantizer is not trained; call fit(x) first "
                "or load a trained state_dict"
            )

    def _mark_trained(self) -> None:
        self.trained.fill_(True)
        self._is_trained = True


def _sync_trained(module: Quantizer, incompatible_keys) -> None:
    module._is_trained = bool(module.trained)
