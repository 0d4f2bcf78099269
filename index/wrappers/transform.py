"""An index behind a learned linear map: faiss's ``IndexPreTransform`` with an ``OPQMatrix`` or a
``PCAMatrix``."""

from __future__ import annotations

import numpy as np
import torch

from vq.index.core.base import Index
from vq.index.core.faiss_build import import_faiss, keep_alive
from vq.index.core.lean import SMALL_BATCH
from vq.index.core.registry import register
from vq.index.core.searchers import Searcher, kept
from vq.index.wrappers.wrapper import Wrapper
from vq.kernels.common.threads import parallel_for
from vq.kernels.exact.coarse_probe import column_panels
from vq.kernels.exact.lean_scans import project_range
from vq.quantizers import OPQ
from vq.quantizers.opq import rotate
from vq.quantizers.pca import PCA


class PreTransform(Wrapper):
    """Applies an OPQ rotation or a PCA to every vector and query before the wrapped index sees
    it (``"OPQ16,IVF1024,PQ16"``, ``"PCA128,IVF1024,Flat"`` in :func:`vq.index_factory`).

    Args:
        transform: a :class:`vq.OPQ` (its ``rotation`` [dim_out, dim] is applied; its own PQ
            only serves to learn the rotation) or a :class:`vq.PCA` (``(x - mean) Rᵀ``).
        index: the index over rotated vectors, of dimension ``transform.dim_out``.
        k: neighbours ``forward`` returns (default: the wrapped index's).

    Submodules: transform, index. Stored vectors, ids and search options (``nprobe``) live in
    ``index``; ``nprobe`` is forwarded.

    ``normalize`` (metric "cosine" of the wrapped index, or ``"L2norm,PCA64,…"``) scales
    vectors and queries to unit norm before the transform: an OPQ rotation keeps them unit
    vectors, so a "cosine" index behind one returns cosine similarities; a PCA subtracts its
    mean and drops dimensions, so the scores are inner products of the centred projections
    (what faiss's ``"L2norm,PCA64,…"`` with inner products computes), not cosines.
    """

    def __init__(self, transform: OPQ | PCA, index: Index, k: int | None = None):
        if not isinstance(transform, (OPQ, PCA)):
            raise TypeError(
                f"transform must be a vq.OPQ or a vq.PCA, got {type(transform).__name__}"
            )
        if not isinstance(index, Index):
            raise TypeError(f"index must be a vq index, got {type(index).__name__}")
        if index.dim != transform.dim_out:
            raise ValueError(
                f"the index has dim {index.dim} but the transform outputs {transform.dim_out} "
                "dimensions; build the index with dim=transform.dim_out"
            )
        k = index.k if k is None else k
        super().__init__(transform.dim, index.metric, k, index.verbose, store_ids=False)
        self.transform = transform
        self.index = index
        self.normalize = index.normalize  # (metric "cosine": before the transform)
        if isinstance(transform, OPQ):
            # search needs the rotation only: the PQ that learned it is not saved (as faiss's
            # OPQMatrix keeps no codebooks), which saves M·ksub·dsub floats per index
            transform.register_state_dict_post_hook(_drop_training_pq)
            transform.register_load_state_dict_pre_hook(_keep_training_pq)

    @property
    def is_trained(self) -> bool:
        return bool(self.transform.trained) and self.index.is_trained

    @property
    def ntotal(self) -> int:
        return self.index.ntotal

    def stored_ids(self) -> torch.Tensor:
        return self.index.stored_ids()

    def has_sequential_ids(self) -> bool:
        return self.index.has_sequential_ids()

    def faiss_counterpart(self):
        """faiss ``IndexPreTransform`` of an ``OPQMatrix`` holding the rotation (or the PCA's
        ``PCAMatrix``), in front of the wrapped index's ``to_faiss()``."""
        faiss, t = import_faiss(), self.transform
        if isinstance(t, PCA):
            matrix = t.to_faiss()
        else:
            matrix = faiss.OPQMatrix(t.dim, t.M, t.dim_out)
            faiss.copy_array_to_vector(t.rotation.float().cpu().numpy().ravel(), matrix.A)
            matrix.is_trained = True
            matrix.is_orthonormal = True
        inner = self.index.faiss_counterpart()
        return keep_alive(faiss.IndexPreTransform(matrix, inner), matrix, inner)

    def config(self) -> dict:
        t = self.transform
        inner = {"class": type(self.index).__name__, **self.index.config()}
        own = {"normalize": True} if self.normalize and not self.index.normalize else {}
        if isinstance(t, PCA):
            return {"k": self.k, **own, "transform": t.config(), "index": inner}
        return {
            "k": self.k,
            **own,
            "transform": {
                "dim": t.dim,
                "M": t.M,
                "nbits": t.nbits,
                "dim_out": t.dim_out,
                "niter": t.niter,
                "niter_pq": t.niter_pq,
                "niter_pq_0": t.niter_pq_0,
                "pq_niter": t.pq.niter,
                "init": t.pq.init,
                "seed": t.seed,
                "max_train_points": t.max_train_points,
            },
            "index": inner,
        }

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """Transformed vectors: float32 [n, dim] → [n, dim_out] (``x Rᵀ`` for OPQ,
        ``(x - mean) Rᵀ`` for PCA)."""
        return self.transform.rotate(x.float())

    def mean(self) -> torch.Tensor:
        """float32 [dim]: ``apply(x) = (x - mean()) Rᵀ`` (zeros for OPQ)."""
        t = self.transform
        return t.mean if isinstance(t, PCA) else torch.zeros(t.dim, device=t.rotation.device)

    def searcher(self, k: int | None = None, **options) -> PreTransformSearch:
        """The search as a static-shape graph: the rotation, then the wrapped index's
        ``searcher(k, **options)`` (see :class:`PreTransformSearch`)."""
        return PreTransformSearch(self, self.index.searcher(self.k if k is None else k, **options))

    def learn(self, x: torch.Tensor) -> None:
        if not bool(self.transform.trained):
            self.transform.fit(x)
        self.index.train(self.apply(x))

    def learns(self) -> bool:
        return not bool(self.transform.trained) or self.index.learns()

    def reset_rows(self) -> None:
        self.index.reset_rows()

    def add_rows(self, x: torch.Tensor, ids, prepare=None) -> None:
        self._require_trained("add")
        with torch.no_grad():
            rotate = self.apply if prepare is None else lambda c: self.apply(prepare(c))
            self.index.add_rows(x, ids, rotate)  # rotated a chunk at a time

    def remove_stored(self, ids: torch.Tensor) -> int:
        return self.index.remove_stored(ids)

    def merge_rows(self, other, shift: int) -> None:
        self.index.merge_rows(other.index, shift)

    def decode_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """The wrapped index's reconstructions mapped back, ``x̂ R`` (R orthonormal; plus the
        mean for PCA)."""
        back = self.index.decode_rows(rows) @ self.transform.rotation.float()
        return back + self.transform.mean if isinstance(self.transform, PCA) else back

    def renumber(self, mapping: torch.Tensor) -> None:
        self.index.renumber(mapping)

    def search_work(self, nq: int, k: int, **params) -> float:
        return self.index.search_work(nq, k, **params) + nq * self.dim * self.index.dim / 16

    def search_ids(self, q: torch.Tensor, k: int, **params):
        return self.index.search_ids(self.apply(q), k, **params)  # (its torch path too)

    def range_hits(self, q: torch.Tensor, radius: float, allowed, **params) -> list:
        return self.index.range_hits(self.apply(q), radius, allowed, **params)

    def torch_searcher(self) -> PreTransformSearch:
        """The torch path: the rotation, then the wrapped index's static search, over the
        index's own tensors."""
        return PreTransformSearch(self, self.index.torch_searcher(), copy=False)

    def build_lean_search(self):
        inner = self.index.lean_search()
        if inner is None:
            return None
        rt = column_panels(self.transform.rotation.float().T.numpy())
        d_out = self.transform.rotation.shape[0]
        mean = self.mean().float().contiguous().numpy()

        def search(q: np.ndarray, k: int, ranked: bool, params: dict):
            y = np.empty((q.shape[0], d_out), np.float32)
            if q.shape[0] <= SMALL_BATCH:
                project_range(0, q.shape[0], q, rt, mean, y)
            else:  # (split as the inner search splits: by query)
                parallel_for(project_range, q.shape[0], q, rt, mean, y, grain=SMALL_BATCH)
            return inner(y, k, ranked, params)

        search.splits = getattr(inner, "splits", False)  # (batches the inner search splits)

        return search

    def candidate_ids(self, q: torch.Tensor, k: int, **params) -> torch.Tensor:
        return self.index.candidate_ids(self.apply(q), k, **params)


def _drop_training_pq(module, state_dict, prefix, local_metadata) -> None:
    for key in [k for k in state_dict if k.startswith(prefix + "pq.")]:
        del state_dict[key]


def _keep_training_pq(module, state_dict, prefix, *args) -> None:
    # a saved PreTransform has no "pq." entries: the module keeps its own (untrained) PQ
    for name, t in module.pq.state_dict().items():
        state_dict.setdefault(prefix + "pq." + name, t)


class PreTransformSearch(Searcher):
    """:class:`PreTransform`'s search as a static-shape graph: the linear map ``(q - mean) Rᵀ``
    (OPQ's rotation with a zero mean, or a PCA), then the wrapped index's static search
    (``inner``), which maps rows to ids.

    Buffers: rotation: float32 [dim_out, dim], mean: float32 [dim] (and ``inner``'s).
    """

    def __init__(self, index: PreTransform, inner: Searcher, copy: bool = True):
        super().__init__(index, inner.k, copy, ids=False)
        self.inner = inner
        self.sequential = inner.sequential  # the rows and ids are ``inner``'s
        self.register_buffer("rotation", kept(index.transform.rotation.float(), copy))
        self.register_buffer("mean", kept(index.mean().float(), copy))

    @property
    def id_table(self) -> torch.Tensor:
        """int64 [ntotal]: the id of each stored row (``inner``'s table)."""
        return self.inner.id_table

    def search(self, queries: torch.Tensor, k: int, **options):
        return self.inner.search(rotate(queries - self.mean, self.rotation), k, **options)

    def chunk_rows(self, k: int, **options) -> int:
        return self.inner.chunk_rows(k, **options)


def _from_config(args: dict, build) -> PreTransform:
    """The PreTransform of a saved configuration: its OPQ or PCA, then the wrapped index."""
    t = dict(args["transform"])
    if t.pop("kind", "opq") == "pca":
        transform: OPQ | PCA = PCA(t.pop("dim"), **t)
    else:
        transform = OPQ(t.pop("dim"), t.pop("M"), t.pop("nbits"), **t)
    return PreTransform(transform, build(args["index"]), k=args.get("k"))


register(PreTransform, example="PCA32,IVF16,Flat", from_config=_from_config, wrapper=True)
