"""Plain vector quantization: one codebook, trained with k-means or as a layer."""

from __future__ import annotations

import numpy as np
import torch

from vq import _cpu, kernels
from vq._checks import in_chunks
from vq.clustering import kmeans
from vq.distances import chunk_rows, nearest
from vq.quantizers.base import Quantizer
from vq.quantizers.codec import Metric
from vq.quantizers.functional import codeword_tables, row_norms, training_rows
from vq.quantizers.layer import Step
from vq.quantizers.learning import Learning, check_fittable


def nearest_codeword(x: torch.Tensor, codebook: torch.Tensor) -> torch.Tensor:
    """The nearest codeword of every row, as one static-shape graph: ``argmin_j ||c_j||² -
    2⟨x, c_j⟩`` from one matrix product (Gemm and ArgMin in ONNX); ties go to the lowest index.

    Args:
        x: float32 Tensor[n, d]; codebook: float32 Tensor[K, d].

    Returns:
        int64 Tensor[n].
    """
    norms = (codebook * codebook).sum(1)
    return torch.addmm(norms, x, codebook.T, alpha=-2.0).argmin(dim=1)


class VectorQuantizer(Quantizer):
    """One codebook of ``codebook_size`` centroids, trained with :func:`vq.kmeans` (``fit``)
    or, as a VQ-VAE layer, in ``forward`` (``learning="ema"``, ``"grad"`` or ``"simvq"``).

    Args:
        dim: vector dimension d.
        codebook_size: number of centroids K.
        niter, init, seed, max_points_per_centroid: k-means settings of ``fit`` (see
            :func:`vq.kmeans`).
        learning, commitment_weight, rotation_trick, cosine, codebook_dim, channel_first:
            layer options (see :class:`vq.Quantizer`).

    Buffers:
        codebook: float32 [K, code_dim] (an ``nn.Parameter`` under gradient learning; the
        frozen random ``C`` under :class:`vq.SimVQ`, whose codewords are then
        ``C Wᵀ`` with ``codebook_transform`` W, a parameter [1, code_dim, code_dim]), where
        code_dim is ``codebook_dim`` or d.

    Codes are ``[...]`` (one integer per vector); ``distance_tables`` is ``[nq, 1, K]``.

    Example (a VQ-VAE bottleneck: EMA codebook, k-means on the first batch, dead-code
    restart)::

        vq_layer = vq.VectorQuantizer(256, 1024, learning=vq.EMA(dead_code_threshold=2.0))
        out = vq_layer(z)  # z [B, T, 256] → out.quantized, out.codes [B, T], out.loss

    SimVQ (Zhu et al. 2024): ``vq.VectorQuantizer(256, 1024, learning="simvq",
    commitment_weight=0.25)``.
    """

    simvq_learning = True

    def __init__(
        self,
        dim: int,
        codebook_size: int,
        *,
        niter: int = 25,
        init: str = "k-means++",
        seed: int = 1234,
        max_points_per_centroid: int = 256,
        learning: str | Learning | None = None,
        commitment_weight: float = 1.0,
        rotation_trick: bool = False,
        cosine: bool = False,
        codebook_dim: int | None = None,
        channel_first: bool = False,
    ):
        super().__init__(
            dim,
            codebook_size,
            (),
            commitment_weight=commitment_weight,
            rotation_trick=rotation_trick,
            cosine=cosine,
            codebook_dim=codebook_dim,
            channel_first=channel_first,
        )
        self.niter, self.init, self.seed = niter, init, seed
        self.max_points_per_centroid = max_points_per_centroid
        self._init_codebooks("codebook", (codebook_size, self.code_dim), learning)

    def _codewords(self) -> torch.Tensor:
        """The codewords coded with, float32 [K, code_dim] (see ``effective_codebooks``)."""
        return self.effective_codebooks()[0].detach()

    def _fit(self, x: torch.Tensor) -> None:
        check_fittable(self)
        result = kmeans(
            x,
            self.codebook_size,
            niter=self.niter,
            init=self.init,
            seed=self.seed,
            max_points_per_centroid=self.max_points_per_centroid,
        )
        self.codebook.copy_(result.centroids)

    def _encode(self, x: torch.Tensor) -> torch.Tensor:
        cb = self._codewords()
        if _cpu.fast_path(x):  # BLAS products, numba arg-min
            return nearest(x, cb, x_norms=row_norms(x)).indices
        rows = chunk_rows(self.codebook_size, x.device)
        return in_chunks(lambda chunk: nearest_codeword(chunk, cb), x, rows)

    def static_encode(self, x: torch.Tensor) -> torch.Tensor:
        """``encode`` as one static-shape graph: the code space (``project_in``, cosine
        normalisation), then :func:`nearest_codeword`. What ``encode`` runs (chunk by chunk)
        for CUDA tensors, under ``vq._cpu.torch_only()`` and in compiled graphs, and what
        :mod:`vq.export` writes out.

        Args:
            x: float32 Tensor[n, dim].

        Returns:
            int64 Tensor[n].
        """
        return nearest_codeword(self._code_space(x), self._codewords())

    def static_decode(self, codes: torch.Tensor) -> torch.Tensor:
        """``decode`` as one static-shape graph: integer codes Tensor[n] → float32 Tensor[n,
        dim] (a gather, then ``project_out``)."""
        return self._output_space(self._decode(codes))

    def _lean_encoder(self):
        c = self._codewords()
        panels = kernels.column_panels(c.T.numpy())
        norms = (c * c).sum(1).numpy()
        dtype = _cpu.numpy_dtype(self.code_dtype)

        def encode(x: np.ndarray):
            codes = np.empty(x.shape[0], dtype)
            return codes if kernels.nearest_lean(x, panels, norms, codes) else None

        return encode

    def _training_codes(self, z: torch.Tensor) -> torch.Tensor:
        rows = training_rows(self.codebook_size)
        return nearest(z, self._codewords(), rows, x_norms=row_norms(z)).indices

    def _decode(self, codes: torch.Tensor) -> torch.Tensor:
        return self._codewords().index_select(0, codes.reshape(-1).long())

    def _codebook_groups(self) -> torch.Tensor:
        return self.codebook[None]

    def _group_rows(self, z: torch.Tensor) -> torch.Tensor:
        return z[None]

    def _ungroup(self, slices: torch.Tensor) -> torch.Tensor:
        return slices[0]

    def _quantize(self, z, weight, lead, update) -> Step:
        return self._quantize_groups(z, weight, update)

    def tables(self, queries: torch.Tensor, metric: Metric) -> torch.Tensor:
        """float32 queries [nq, dim] → tables [nq, 1, K] (see :meth:`Quantizer.tables`)."""
        return codeword_tables(queries, self._output_codebooks()[0], metric)
