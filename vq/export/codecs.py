"""Static-shape encode and decode graphs of the quantizers.

Each module copies its constants from a trained quantizer: codebooks pre-transposed and scaled
by -2 (an exact scaling), squared codeword norms, the OPQ rotation. Encoding is
``argmin_j ||c_j||² - 2⟨x, c_j⟩`` from one matrix product per (sub-)quantizer, as the
quantizers' own torch path computes it, so codes agree exactly (lowest index among exact
ties); decoding gathers codewords from a flattened codebook.
"""

from __future__ import annotations

import torch

from vq.export.base import ExportModule, TensorSpec
from vq.quantizers import OPQ, ProductQuantizer, ResidualVQ, VectorQuantizer


def _codebook_constants(codebook: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(-2 cᵀ, ||c||²)`` of codebooks ``[..., K, d]``: ``[..., d, K]``, ``[..., K]``."""
    c = codebook.detach().float()
    return (-2.0 * c).transpose(-1, -2).contiguous(), (c * c).sum(-1)


class _Codec(ExportModule):
    def _set_specs(self, quantizer, what: str, code_dtype: torch.dtype | None) -> None:
        self.code_dtype = quantizer.code_dtype if code_dtype is None else code_dtype
        vectors = TensorSpec("vectors", torch.float32, (quantizer.dim,))
        codes = TensorSpec("codes", self.code_dtype, tuple(quantizer.code_shape))
        self.inputs, self.outputs = (
            ((vectors,), (codes,)) if what == "encode" else ((codes,), (vectors,))
        )
        self.metadata.update(
            dim=str(quantizer.dim),
            codebook_size=str(quantizer.codebook_size),
            code_shape=",".join(map(str, quantizer.code_shape)),
            code_dtype=str(self.code_dtype).removeprefix("torch."),
        )


class VectorEncoder(_Codec):
    """:class:`vq.VectorQuantizer` encoding: vectors float32 [B, d] → codes [B]."""

    def __init__(self, quantizer: VectorQuantizer, code_dtype: torch.dtype | None = None):
        super().__init__()
        self._set_specs(quantizer, "encode", code_dtype)
        neg2_t, norms = _codebook_constants(quantizer.codebook)
        self.register_buffer("neg2_codebook_t", neg2_t)  # [d, K]
        self.register_buffer("norms", norms)  # [K]

    def forward(self, vectors: torch.Tensor) -> torch.Tensor:
        scores = torch.addmm(self.norms, vectors, self.neg2_codebook_t)
        return scores.argmin(dim=1).to(self.code_dtype)


class VectorDecoder(_Codec):
    """:class:`vq.VectorQuantizer` decoding: codes [B] → vectors float32 [B, d]."""

    def __init__(self, quantizer: VectorQuantizer, code_dtype: torch.dtype | None = None):
        super().__init__()
        self._set_specs(quantizer, "decode", code_dtype)
        self.register_buffer("codebook", quantizer.codebook.detach().float().clone())

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        return self.codebook.index_select(0, codes.long())


class ProductEncoder(_Codec):
    """:class:`vq.ProductQuantizer` (or :class:`vq.OPQ`) encoding: vectors float32 [B, d] →
    codes [B, M]; with OPQ the rotation is applied first."""

    def __init__(self, quantizer: ProductQuantizer | OPQ, code_dtype: torch.dtype | None = None):
        super().__init__()
        self._set_specs(quantizer, "encode", code_dtype)
        pq = quantizer.pq if isinstance(quantizer, OPQ) else quantizer
        self.M, self.dsub = pq.M, pq.dsub
        self.rotate = isinstance(quantizer, OPQ)
        if self.rotate:
            self.register_buffer("rotation_t", quantizer.rotation.detach().float().T.contiguous())
        neg2_t, norms = _codebook_constants(pq.codebooks)
        self.register_buffer("neg2_codebooks_t", neg2_t)  # [M, dsub, ksub]
        self.register_buffer("norms", norms[:, None, :])  # [M, 1, ksub]

    def forward(self, vectors: torch.Tensor) -> torch.Tensor:
        if self.rotate:
            vectors = vectors @ self.rotation_t
        subs = vectors.reshape(-1, self.M, self.dsub).transpose(0, 1)  # [M, B, dsub]
        scores = torch.baddbmm(self.norms, subs, self.neg2_codebooks_t)  # [M, B, ksub]
        return scores.argmin(dim=2).T.to(self.code_dtype)


class ProductDecoder(_Codec):
    """:class:`vq.ProductQuantizer` (or :class:`vq.OPQ`) decoding: codes [B, M] → vectors
    float32 [B, d] (rotated back with OPQ)."""

    def __init__(self, quantizer: ProductQuantizer | OPQ, code_dtype: torch.dtype | None = None):
        super().__init__()
        self._set_specs(quantizer, "decode", code_dtype)
        pq = quantizer.pq if isinstance(quantizer, OPQ) else quantizer
        self.dim_pq = pq.dim
        self.rotate = isinstance(quantizer, OPQ)
        if self.rotate:
            self.register_buffer("rotation", quantizer.rotation.detach().float().clone())
        self.register_buffer("codewords", pq.codebooks.detach().float().reshape(-1, pq.dsub))
        self.register_buffer("offsets", torch.arange(pq.M) * pq.ksub)  # [M]

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        flat = (codes.long() + self.offsets).reshape(-1)
        x_hat = self.codewords.index_select(0, flat).reshape(-1, self.dim_pq)
        return x_hat @ self.rotation if self.rotate else x_hat


class ResidualEncoder(_Codec):
    """:class:`vq.ResidualVQ` encoding, greedy or beam search (the quantizer's ``beam_size``):
    vectors float32 [B, d] → codes [B, Q].

    Beam search keeps the ``beam_size`` best partial encodings per stage with a top-k over
    ``beam × K`` candidates; parents are followed with gathers from flattened rows.

    Buffers: codebooks [Q, K, d], neg2_codebooks_t [Q, d, K], norms [Q, K], and
    beam_parent / beam_code [beam × K] (a candidate's parent beam and codeword).
    """

    def __init__(self, quantizer: ResidualVQ, code_dtype: torch.dtype | None = None):
        super().__init__()
        self._set_specs(quantizer, "encode", code_dtype)
        self.beam_size = quantizer.beam_size
        self.num_quantizers, self.codebook_size = quantizer.num_quantizers, quantizer.codebook_size
        neg2_t, norms = _codebook_constants(quantizer.codebooks)
        self.register_buffer("codebooks", quantizer.codebooks.detach().float().clone())  # [Q, K, d]
        self.register_buffer("neg2_codebooks_t", neg2_t)  # [Q, d, K]
        self.register_buffer("norms", norms)  # [Q, K]
        # position p among beam × K candidates → (p // K, p % K), as look-ups (plain Gathers
        # in ONNX, where integer division exports as sign-handling arithmetic)
        flat = torch.arange(self.beam_size * self.codebook_size, device=norms.device)
        self.register_buffer("beam_parent", flat // self.codebook_size)
        self.register_buffer("beam_code", flat % self.codebook_size)
        self.metadata["beam_size"] = str(self.beam_size)

    def forward(self, vectors: torch.Tensor) -> torch.Tensor:
        if self.beam_size == 1:
            codes = self._greedy(vectors)
        else:
            codes = self._beam(vectors)
        return codes.to(self.code_dtype)

    def _greedy(self, x: torch.Tensor) -> torch.Tensor:
        residual, codes = x, []
        for m in range(self.num_quantizers):
            idx = torch.addmm(self.norms[m], residual, self.neg2_codebooks_t[m]).argmin(dim=1)
            residual = residual - self.codebooks[m].index_select(0, idx)
            codes.append(idx)
        return torch.stack(codes, dim=1)

    def _beam(self, x: torch.Tensor) -> torch.Tensor:
        n, d, K = x.shape[0], x.shape[1], self.codebook_size
        # per-row offsets turn [n, b] positions into rows of the flattened [n * b] tensors
        residuals, codes, b = x[:, None, :], None, 1
        for m in range(self.num_quantizers):
            r2 = (residuals * residuals).sum(-1, keepdim=True)  # [n, b, 1]
            dist = torch.addmm(self.norms[m], residuals.reshape(n * b, d), self.neg2_codebooks_t[m])
            dist = dist.reshape(n, b, K) + r2
            keep = min(self.beam_size, b * K)
            _, flat = torch.topk(dist.reshape(n, b * K), keep, dim=1, largest=False, sorted=True)
            parent = self.beam_parent.index_select(0, flat.reshape(-1)).reshape(n, keep)
            code = self.beam_code.index_select(0, flat.reshape(-1)).reshape(n, keep)
            rows = (parent + torch.arange(n, device=x.device)[:, None] * b).reshape(-1)
            words = self.codebooks[m].index_select(0, code.reshape(-1)).reshape(n, keep, d)
            residuals = (
                residuals.reshape(n * b, d).index_select(0, rows).reshape(n, keep, d) - words
            )
            if codes is None:
                codes = code[:, :, None]
            else:
                kept = codes.reshape(n * b, m).index_select(0, rows).reshape(n, keep, m)
                codes = torch.cat([kept, code[:, :, None]], dim=2)
            b = keep
        return codes[:, 0]


class ResidualDecoder(_Codec):
    """:class:`vq.ResidualVQ` decoding: codes [B, Q] → vectors float32 [B, d] (the sum of one
    codeword per stage)."""

    def __init__(self, quantizer: ResidualVQ, code_dtype: torch.dtype | None = None):
        super().__init__()
        self._set_specs(quantizer, "decode", code_dtype)
        self.num_quantizers, self.dim = quantizer.num_quantizers, quantizer.dim
        self.register_buffer(
            "codewords", quantizer.codebooks.detach().float().reshape(-1, quantizer.dim)
        )
        self.register_buffer(
            "offsets", torch.arange(quantizer.num_quantizers) * quantizer.codebook_size
        )

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        flat = (codes.long() + self.offsets).reshape(-1)
        words = self.codewords.index_select(0, flat).reshape(-1, self.num_quantizers, self.dim)
        return words.sum(dim=1)


def encoder(quantizer, code_dtype: torch.dtype | None = None) -> ExportModule:
    """The encode module of a trained quantizer (see the classes above)."""
    if isinstance(quantizer, VectorQuantizer):
        return VectorEncoder(quantizer, code_dtype)
    if isinstance(quantizer, ProductQuantizer | OPQ):
        return ProductEncoder(quantizer, code_dtype)
    if isinstance(quantizer, ResidualVQ):
        return ResidualEncoder(quantizer, code_dtype)
    raise TypeError(f"no encode graph for {type(quantizer).__name__}")


def decoder(quantizer, code_dtype: torch.dtype | None = None) -> ExportModule:
    """The decode module of a trained quantizer (see the classes above)."""
    if isinstance(quantizer, VectorQuantizer):
        return VectorDecoder(quantizer, code_dtype)
    if isinstance(quantizer, ProductQuantizer | OPQ):
        return ProductDecoder(quantizer, code_dtype)
    if isinstance(quantizer, ResidualVQ):
        return ResidualDecoder(quantizer, code_dtype)
    raise TypeError(f"no decode graph for {type(quantizer).__name__}")
