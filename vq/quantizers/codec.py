"""The offline codec every quantizer is: ``fit``, then ``encode``, ``decode``, ``distance_tables``.

The public methods take numpy arrays or torch tensors (on any device), check them (dimension,
dtype, finiteness) and give back the same kind (numpy, or a tensor on the input's device).
Underneath, a subclass works on float32 rows already on the module's device, in the code space:
``_fit``, ``_encode``, ``_decode`` and :meth:`Codec.tables`. The row-level methods
(:meth:`Codec.encode_rows`, :meth:`Codec.tables`, :meth:`Codec.mark_trained`) are the contract
other packages use — an index encodes the vectors it adds and builds its search tables with
them, skipping the checks and conversions it has already done. ``encode`` and ``decode`` run in
steps of ``encode_batch_size`` rows, and an encode of a few float32 numpy rows takes a lean path
(one kernel call on the calling thread) where the subclass offers one.

The code space is the input space here: :class:`vq.quantizers.layer.TrainingLayer` overrides
``_code_space`` and ``_output_space`` with its projections and l2-normalisation, which ``fit``,
``encode`` and ``decode`` then apply too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from vq import _cpu
from vq._checks import (
    as_codes,
    as_vectors,
    check_training_size,
    check_vectors,
    code_dtype,
    in_chunks,
    like_input,
)
from vq._tree_cache import cached

Metric = Literal["l2", "ip"]
#: encodes of at most this many rows may take the lean path (``Codec._encode_small``)
SMALL_BATCH = 16
_FLOAT32 = np.dtype(np.float32)


class Codec(nn.Module):
    """Base of the offline codec: subclasses implement ``_fit``, ``_encode``, ``_decode`` (on
    float32 code-space rows on the module's device) and :meth:`tables`.

    Args:
        dim: input dimension d (> 0).
        codebook_size: codewords per codebook K (>= 1).
        code_shape: the shape of one vector's code: ``()`` for one integer, ``(M,)`` for M.

    Buffers:
        trained: bool scalar, whether the codebooks hold trained values (saved with the state,
        so that a loaded quantizer knows; :attr:`is_trained` reads a Python copy of it).
    """

    dim: int
    codebook_size: int
    code_shape: tuple[int, ...]
    #: rows per step of ``encode``/``decode``: memory beyond the result stays that of one step
    encode_batch_size = 1 << 15

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
        """Train the codebooks on float32 code-space rows [n, code_dim] on the device."""
        raise NotImplementedError

    def _encode(self, x: torch.Tensor) -> torch.Tensor:
        """Codes of float32 code-space rows [n, code_dim] on the device: integer
        [n, *code_shape] (int64, or ``code_dtype`` where a CPU kernel writes them)."""
        raise NotImplementedError

    def _decode(self, codes: torch.Tensor) -> torch.Tensor:
        """Code-space reconstructions float32 [n, code_dim] of integer codes
        [n, *code_shape] on the device."""
        raise NotImplementedError

    def _min_training_vectors(self) -> int:
        return self.codebook_size

    def _code_space(self, x: torch.Tensor) -> torch.Tensor:
        """Input rows [n, dim] → float32 code-space rows [n, code_dim] (here: the same)."""
        return x.float()

    def _output_space(self, z: torch.Tensor) -> torch.Tensor:
        """Code-space rows [n, code_dim] → float32 reconstructions [n, dim] (here: the same)."""
        return z

    def _identity_code_space(self) -> bool:
        """Whether ``_code_space`` leaves float32 rows as they are (the lean path skips it)."""
        return True

    def _after_fit(self, z: torch.Tensor) -> None:
        """Called by ``fit`` after ``_fit`` with its code-space rows (nothing to do here)."""

    def _lean_encoder(self) -> Callable[[np.ndarray], np.ndarray | None] | None:
        """A function ``codes = encoder(x)`` for C-contiguous float32 numpy rows [n <= 16,
        dim] → numpy codes [n, *code_shape] of ``code_dtype`` (the general path's), or None
        where a row is not finite; built for the quantizer as it is (``_encode_small``).
        None (the default): no lean path."""
        return None

    # -- the trained flag -------------------------------------------------------------------
    @property
    def is_trained(self) -> bool:
        return self._is_trained

    def mark_trained(self) -> None:
        """Declare the codebooks trained: sets the ``trained`` buffer and :attr:`is_trained`.

        ``fit`` does this itself; call it after writing codebooks by other means — an index
        that trains its coarse quantizer's ``codebook`` with :func:`vq.kmeans`, codebooks
        copied from faiss (:mod:`vq.faiss_interop`), a learning layer's first training step.
        """
        self.trained.fill_(True)
        self._is_trained = True

    def _require_trained(self, what: str, hint: str = "") -> None:
        if not self.is_trained:
            raise RuntimeError(
                f"{type(self).__name__}.{what}: the quantizer is not trained; call fit(x) first "
                f"or load a trained state_dict{hint}"
            )

    @property
    def device(self) -> torch.device:
        return self.trained.device

    @property
    def code_dtype(self) -> torch.dtype:
        """uint8 when a code fits in 8 bits, else int16/int32/int64."""
        return code_dtype(self.codebook_size)

    # -- the codec --------------------------------------------------------------------------
    def fit(self, x: Any) -> Codec:
        """Train the codebooks on ``x`` (float [n, dim], numpy or torch); returns self."""
        t = as_vectors(x, self.dim, "x")
        check_training_size(t.shape[0], self._min_training_vectors(), f"{type(self).__name__}.fit")
        with torch.no_grad():
            z = self._code_space(t.to(self.device))
            self._fit(z)
            self._after_fit(z)
        self.mark_trained()
        return self

    def encode(self, x: Any) -> Any:
        """Codes of ``x`` (float [..., dim]) → integer [..., *code_shape] of ``code_dtype``."""
        found = self._encode_small(x)
        if found is not None:
            return found
        self._require_trained("encode")
        t = check_vectors(x, self.dim, "x", matrix=False)
        lead = t.shape[:-1]

        def encode_chunk(rows: torch.Tensor) -> torch.Tensor:  # float32 on the device per chunk
            return self.encode_rows(rows.float().to(self.device).contiguous()).to(self.code_dtype)

        with torch.no_grad():
            codes = in_chunks(encode_chunk, t.reshape(-1, self.dim), self.encode_batch_size)
        codes = codes.reshape(tuple(lead) + self.code_shape)
        return like_input(codes, x)

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
            tables = self.tables(q.to(self.device), metric)
        return like_input(tables, queries)

    # -- the row-level contract (what indexes call) -----------------------------------------
    def encode_rows(self, x: torch.Tensor) -> torch.Tensor:
        """``encode`` without its checks, conversions and steps: what an index calls on the
        vectors it adds or routes.

        Args:
            x: float32 Tensor[n, dim] on the quantizer's device, finite; the quantizer trained.

        Returns:
            integer Tensor[n, *code_shape] on the same device: int64, or ``code_dtype`` where
            a CPU kernel writes the codes (cast if one dtype matters).
        """
        return self._encode(self._code_space(x))

    def tables(self, queries: torch.Tensor, metric: Metric) -> torch.Tensor:
        """``distance_tables`` without its checks and conversions: what an index calls to
        search.

        Args:
            queries: float32 Tensor[nq, dim] on the quantizer's device; the quantizer trained.
            metric: "l2" or "ip".

        Returns:
            float32 Tensor[nq, n_tables, codebook_size] on the same device.
        """
        raise NotImplementedError

    # -- the lean path ----------------------------------------------------------------------
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
        plain = self._identity_code_space() and self.device.type == "cpu"
        return self._lean_encoder() if plain and self.is_trained else None


def _sync_trained(module: Codec, incompatible_keys) -> None:
    module._is_trained = bool(module.trained)
