"""Plain vector quantization: one k-means codebook."""

from __future__ import annotations

import torch

from vq.clustering import kmeans
from vq.distances import nearest
from vq.quantizers.base import Metric, Quantizer


class VectorQuantizer(Quantizer):
    """One codebook of ``codebook_size`` centroids, trained with :func:`vq.kmeans`.

    Args:
        dim: vector dimension d.
        codebook_size: number of centroids K.
        niter, init, seed, max_points_per_centroid: k-means settings (see :func:`vq.kmeans`).

    Buffers:
        codebook: float32 [K, d].

    Codes are ``[...]`` (one integer per vector); ``distance_tables`` is ``[nq, 1, K]``.
    """

    def __init__(
        self,
        dim: int,
        codebook_size: int,
        *,
        niter: int = 25,
        init: str = "k-means++",
        seed: int = 1234,
        max_points_per_centroid: int = 256,
    ):
        super().__init__(dim, codebook_size, ())
        self.niter, self.init, self.seed = niter, init, seed
        self.max_points_per_centroid = max_points_per_centroid
        self.register_buffer("codebook", torch.zeros(codebook_size, dim))

    def _fit(self, x: torch.Tensor) -> None:
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
        return nearest(x, self.codebook.float()).indices

    def _decode(self, codes: torch.Tensor) -> torch.Tensor:
        return self.codebook.float().index_select(0, codes.reshape(-1).long())

    def _tables(self, queries: torch.Tensor, metric: Metric) -> torch.Tensor:
        c = self.codebook.float()
        dots = queries @ c.T
        if metric == "ip":
            return dots[:, None, :]
        sq = (queries * queries).sum(1, keepdim=True) - 2.0 * dots + (c * c).sum(1)
        return sq.clamp_min(0.0)[:, None, :]
