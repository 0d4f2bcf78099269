"""Optimized product quantization: an orthogonal rotation learned jointly with the PQ codebooks.

Reference: T. Ge, K. He, Q. Ke, J. Sun, "Optimized product quantization", IEEE TPAMI 2014
(parametric initialisation by eigenvalue allocation, then the non-parametric alternation of PQ
training and an orthogonal Procrustes update).
"""

from __future__ import annotations

import numpy as np
import torch

from vq.clustering.seeding import generator, kmeans_plus_plus
from vq.parallel import Shards
from vq.quantizers.base import Quantizer
from vq.quantizers.codec import Metric
from vq.quantizers.product import ProductQuantizer


def eigenvalue_allocation(x: torch.Tensor, M: int, dim_out: int) -> torch.Tensor:
    """Parametric OPQ rotation: PCA directions dealt to M subspaces so that the products of their
    eigenvalues are balanced (largest eigenvalue first, to the open subspace whose product is
    smallest).

    Args:
        x: float Tensor[n, d].
        M: number of subspaces; dim_out: output dimension (a multiple of M, <= d).

    Returns:
        float32 Tensor[dim_out, d] with orthonormal rows, grouped by subspace.
    """
    xc = x.double() - x.double().mean(dim=0)
    evals, evecs = torch.linalg.eigh(xc.T @ xc / max(1, x.shape[0] - 1))
    evals, evecs = evals.flip(0), evecs.flip(1)  # descending
    per_bucket = dim_out // M
    # balance sums of log-eigenvalues shifted to be >= 1, so every allocation grows its bucket
    # (as in the authors' reference code); full buckets drop out
    logs = torch.log(evals[:dim_out].clamp_min(float(evals[0].clamp_min(1e-30)) * 1e-12))
    weights = (logs - logs.min() + 1.0).tolist()
    buckets: list[list[int]] = [[] for _ in range(M)]
    sums = [0.0] * M
    for i in range(dim_out):
        b = min((j for j in range(M) if len(buckets[j]) < per_bucket), key=lambda j: sums[j])
        buckets[b].append(i)
        sums[b] += weights[i]
    order = [i for bucket in buckets for i in bucket]
    return evecs[:, order].T.float().contiguous()


def rotate(x: torch.Tensor, rotation: torch.Tensor) -> torch.Tensor:
    """``x Rᵀ``: float32 Tensor[n, d], rotation float32 Tensor[d_out, d] → Tensor[n, d_out] (the
    OPQ pre-transform of encoding and of :class:`vq.PreTransform` search)."""
    return x @ rotation.T


def procrustes(x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Orthogonal R [d_out, d] minimising ``||x Rᵀ - target||_F`` (x [n, d], target [n, d_out])."""
    u, _, vh = torch.linalg.svd(x.double().T @ target.double(), full_matrices=False)
    return (u @ vh).T.float().contiguous()


class OPQ(Quantizer):
    """Rotation R followed by product quantization: ``encode(x) = PQ(x Rᵀ)``.

    Args:
        dim: input dimension d.
        M: number of sub-quantizers.
        nbits: bits per sub-code (1–16).
        niter: alternations of PQ training and Procrustes rotation updates.
        niter_pq: Lloyd iterations per alternation (warm-started); ``niter_pq_0`` for the first.
        dim_out: rotated dimension (default d; smaller values also reduce dimension, "OPQ16_64").
        pq_niter: Lloyd iterations of the final PQ on the rotated data.
        seed: seeds sampling and k-means.
        max_train_points: the rotation is learned on at most this many vectors.

    Buffers:
        rotation: float32 [dim_out, d] with orthonormal rows (``opq.rotation``); the PQ is the
        submodule ``opq.pq`` (its ``codebooks`` [M, 2**nbits, dim_out / M]).

    Codes ``[..., M]``; ``distance_tables`` are the PQ tables of the rotated queries (exact for
    dim_out = d; with dim_out < d the l2 tables measure distance within the rotated subspace).
    """

    def __init__(
        self,
        dim: int,
        M: int,
        nbits: int = 8,
        *,
        niter: int = 20,
        niter_pq: int = 4,
        niter_pq_0: int = 20,
        dim_out: int | None = None,
        pq_niter: int = 25,
        init: str = "k-means++",
        seed: int = 1234,
        max_train_points: int = 65536,
    ):
        dim_out = dim if dim_out is None else dim_out
        if not 0 < dim_out <= dim:
            raise ValueError(f"dim_out must lie in [1, dim={dim}], got {dim_out}")
        if niter < 0 or niter_pq < 0 or niter_pq_0 < 0:
            raise ValueError("niter, niter_pq and niter_pq_0 must be >= 0")
        pq = ProductQuantizer(dim_out, M, nbits, niter=pq_niter, init=init, seed=seed)
        super().__init__(dim, pq.codebook_size, (M,))
        self.pq = pq
        self.M, self.nbits, self.dim_out = M, nbits, dim_out
        self.niter, self.niter_pq, self.niter_pq_0 = niter, niter_pq, niter_pq_0
        self.seed, self.max_train_points = seed, max_train_points
        # not torch.eye: on the meta device (where load_index checks shapes) it imports sympy
        rotation = torch.zeros(dim_out, dim)
        rotation.diagonal().fill_(1.0)
        self.register_buffer("rotation", rotation)

    def _fit(self, x: torch.Tensor) -> None:
        gen = generator(self.seed)
        # under torch.distributed x is this process's shard: the rotation's (bounded) sample is
        # gathered, and rank 0 runs the alternations below on it as one process would (the
        # others would only repeat its work); every process gets its rotation and codebooks
        data = Shards.of(x)
        train = data.sample(self.max_train_points, gen).float()
        rotation = eigenvalue_allocation(train, self.M, self.dim_out).to(x.device)
        pq = self.pq
        alternations = self.niter if data.is_root else 0
        for it in range(alternations):
            y = train @ rotation.T
            if it == 0:
                subs = y.reshape(-1, self.M, pq.dsub)
                for m in range(self.M):
                    pq.codebooks[m].copy_(kmeans_plus_plus(subs[:, m], pq.ksub, gen))
                pq.lloyd(y, self.niter_pq_0, gen)
            else:
                pq.lloyd(y, self.niter_pq, gen)
            y_hat = pq._decode(pq._assign(y)[0].long())
            rotation = procrustes(train, y_hat)
        rotation = data.broadcast(rotation)
        pq.codebooks.copy_(data.broadcast(pq.codebooks))
        gen.set_state(data.broadcast(gen.get_state()))
        self.rotation.copy_(rotation)
        # final PQ on (a PQ-sized sample of) the rotated data, warm-started when possible
        pq_train = data.subsample(pq.ksub * pq.max_points_per_centroid, gen).float()
        pq_train = pq_train.with_local(pq_train.local @ rotation.T)
        if self.niter == 0:
            pq._fit(pq_train.local)
        else:
            pq.lloyd(pq_train, pq.niter, gen)
        pq.mark_trained()

    @property
    def is_trained(self) -> bool:
        # the rotation alone may be loaded (an index's pre-transform): coding needs the PQ too
        return self._is_trained and self.pq.is_trained

    def _min_training_vectors(self) -> int:
        return self.pq.ksub

    def rotate(self, x: torch.Tensor) -> torch.Tensor:
        """The pre-transform of encoding and of :class:`vq.PreTransform` search, ``x Rᵀ``:
        float32 Tensor[n, dim] on the quantizer's device → float32 Tensor[n, dim_out] (the
        module function :func:`rotate`; needs only the rotation trained)."""
        return rotate(x, self.rotation.float())

    def _encode(self, x: torch.Tensor) -> torch.Tensor:
        return self.pq._encode(self.rotate(x))

    def static_encode(self, x: torch.Tensor) -> torch.Tensor:
        """``encode`` as one static-shape graph: :func:`rotate`, then the PQ's
        :meth:`~vq.ProductQuantizer.static_encode`. What ``encode`` runs off the numba path and
        what :mod:`vq.export` writes out: float32 Tensor[n, dim] → int64 Tensor[n, M]."""
        return self.pq.static_encode(self.rotate(x))

    def static_decode(self, codes: torch.Tensor) -> torch.Tensor:
        """``decode`` as one static-shape graph: integer codes Tensor[n, M] → float32
        Tensor[n, dim] (the PQ's reconstruction rotated back)."""
        return self.pq.static_decode(codes) @ self.rotation.float()

    def _lean_encoder(self):
        inner = self.pq._lean_encoder()
        rt = self.rotation.detach().float().T.contiguous().numpy()

        def encode(x: np.ndarray):
            return inner(np.ascontiguousarray(x @ rt, dtype=np.float32))

        return encode

    def _decode(self, codes: torch.Tensor) -> torch.Tensor:
        return self.pq._decode(codes) @ self.rotation.float()

    def tables(self, queries: torch.Tensor, metric: Metric) -> torch.Tensor:
        """float32 queries [nq, dim] → the PQ's tables [nq, M, ksub] of the rotated queries."""
        return self.pq.tables(self.rotate(queries), metric)
