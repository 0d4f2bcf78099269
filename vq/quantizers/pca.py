"""Principal component analysis as a learned pre-transform: faiss's ``PCAMatrix`` (eigen power 0,
no random rotation), ``"PCA64,IVF1024,PQ16"`` in :func:`vq.index_factory`.

``rotate(x) = (x - mean) Rᵀ``, where the rows of R [dim_out, dim] are the eigenvectors of the
training data's covariance, by decreasing eigenvalue. R's rows are orthonormal, so for
``dim_out == dim`` the transform keeps squared L2 distances (up to float rounding) and only
moves most of each distance into the first dimensions: the exact scans of an IVF-Flat index
behind it then skip most rows after their first dimensions (:mod:`vq.kernels.common.rowdist`). With
``dim_out < dim`` it drops the directions of least variance (distances in the kept subspace,
usually re-ranked on the full vectors: ``"PCA64,IVF1024,Flat,RFlat"``).

Reference: I. T. Jolliffe, "Principal Component Analysis", Springer 2002.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from vq.clustering.seeding import generator
from vq.parallel import Shards


class PCA(nn.Module):
    """An orthonormal projection onto the principal axes of the training data.

    Args:
        dim: input dimension d.
        dim_out: output dimension (default d: a rotation, distances kept).
        seed: seeds the sample the covariance is estimated from.
        max_train_points: the covariance is estimated on at most this many vectors.

    Buffers:
        mean: float32 [dim], the training data's mean.
        rotation: float32 [dim_out, dim], orthonormal rows, the principal axes by decreasing
            eigenvalue.
        eigenvalues: float32 [dim_out], the variance along each of them.
        trained: bool scalar.
    """

    def __init__(
        self,
        dim: int,
        dim_out: int | None = None,
        *,
        seed: int = 1234,
        max_train_points: int = 65536,
    ):
        super().__init__()
        dim_out = dim if dim_out is None else dim_out
        if dim <= 0:
            raise ValueError(f"dim must be positive, got {dim}")
        if not 0 < dim_out <= dim:
            raise ValueError(f"dim_out must lie in [1, dim={dim}], got {dim_out}")
        if max_train_points < 2:
            raise ValueError(f"max_train_points must be at least 2, got {max_train_points}")
        self.dim, self.dim_out = int(dim), int(dim_out)
        self.seed, self.max_train_points = seed, max_train_points
        # not torch.eye: on the meta device (where load_index checks shapes) it imports sympy
        rotation = torch.zeros(dim_out, dim)
        rotation.diagonal().fill_(1.0)
        self.register_buffer("mean", torch.zeros(dim))
        self.register_buffer("rotation", rotation)
        self.register_buffer("eigenvalues", torch.zeros(dim_out))
        self.register_buffer("trained", torch.zeros((), dtype=torch.bool))

    @property
    def is_trained(self) -> bool:
        return bool(self.trained)

    def fit(self, x: Any) -> PCA:
        """Learn the mean and the principal axes from ``x`` float [n >= 2, dim] (numpy or a
        tensor; under torch.distributed this process's rows, the sample gathered)."""
        x = torch.as_tensor(x)
        if x.ndim != 2 or x.shape[1] != self.dim:
            raise ValueError(
                f"PCA.fit: expected vectors of shape [n, {self.dim}], got {tuple(x.shape)}"
            )
        data = Shards.of(x)
        if data.n < 2:
            raise ValueError(f"PCA.fit: needs at least 2 training vectors, got {data.n}")
        train = data.sample(self.max_train_points, generator(self.seed)).double()
        if not bool(torch.isfinite(train).all()):
            raise ValueError("PCA.fit: the training vectors hold NaN or infinite values")
        mean = train.mean(dim=0)
        centred = train - mean
        evals, evecs = torch.linalg.eigh(centred.T @ centred / (train.shape[0] - 1))
        order = torch.argsort(evals, descending=True, stable=True)[: self.dim_out]
        axes = evecs[:, order].T
        # a sign per axis fixed by its largest component (eigh's signs are arbitrary)
        largest = axes.abs().argmax(dim=1, keepdim=True)
        axes = axes * torch.sign(axes.gather(1, largest))
        device = self.rotation.device
        self.mean.copy_(data.broadcast(mean.float()).to(device))
        self.rotation.copy_(data.broadcast(axes.float().contiguous()).to(device))
        self.eigenvalues.copy_(data.broadcast(evals[order].clamp_min(0).float()).to(device))
        self.trained.fill_(True)
        return self

    def rotate(self, x: torch.Tensor) -> torch.Tensor:
        """``(x - mean) Rᵀ``: float32 Tensor[n, dim] on the module's device → float32
        Tensor[n, dim_out] (the pre-transform of :class:`vq.PreTransform`)."""
        return (x.float() - self.mean) @ self.rotation.T

    def unrotate(self, y: torch.Tensor) -> torch.Tensor:
        """``y R + mean``: rotated rows [n, dim_out] back to [n, dim] (for ``dim_out < dim``
        the projection onto the kept axes)."""
        return y.float() @ self.rotation + self.mean

    def config(self) -> dict:
        """The constructor arguments (what an index's ``config`` records)."""
        return {
            "kind": "pca",
            "dim": self.dim,
            "dim_out": self.dim_out,
            "seed": self.seed,
            "max_train_points": self.max_train_points,
        }

    def to_faiss(self):
        """An equivalent trained ``faiss.PCAMatrix`` (eigen power 0, no random rotation)."""
        import faiss

        matrix = faiss.PCAMatrix(self.dim, self.dim_out, 0.0, False)
        rotation = self.rotation.float().cpu().numpy()
        faiss.copy_array_to_vector(self.mean.float().cpu().numpy(), matrix.mean)
        faiss.copy_array_to_vector(self.eigenvalues.float().cpu().numpy(), matrix.eigenvalues)
        faiss.copy_array_to_vector(rotation.ravel(), matrix.PCAMat)
        faiss.copy_array_to_vector(rotation.ravel(), matrix.A)
        faiss.copy_array_to_vector(-(rotation @ self.mean.float().cpu().numpy()), matrix.b)
        matrix.is_trained = True
        matrix.is_orthonormal = True
        return matrix

    @classmethod
    def from_faiss(cls, matrix) -> PCA:
        """A trained :class:`PCA` from a trained ``faiss.PCAMatrix`` without whitening (its
        ``A`` rows orthonormal; with ``random_rotation`` too)."""
        import faiss

        if not matrix.is_trained:
            raise ValueError("PCA.from_faiss: the PCAMatrix is not trained; train it first")
        if matrix.eigen_power != 0:
            raise ValueError(
                f"PCA.from_faiss: a whitening PCAMatrix (eigen_power {matrix.eigen_power}) does "
                "not keep distances; only eigen_power 0 converts"
            )
        out = cls(matrix.d_in, matrix.d_out)
        a = faiss.vector_to_array(matrix.A).reshape(matrix.d_out, matrix.d_in)
        mean = faiss.vector_to_array(matrix.mean)
        evals = faiss.vector_to_array(matrix.eigenvalues)[: matrix.d_out]
        with torch.no_grad():
            out.rotation.copy_(torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)))
            out.mean.copy_(torch.from_numpy(mean.astype(np.float32)))
            out.eigenvalues[: evals.shape[0]] = torch.from_numpy(evals.astype(np.float32))
            out.trained.fill_(True)
        return out

    def extra_repr(self) -> str:
        return f"dim={self.dim}, dim_out={self.dim_out}"
