"""Exact re-ranking: faiss's ``IndexRefineFlat`` (``",RFlat"`` / ``"Refine(Flat)"``), or on
vectors kept in fp16 (faiss's ``IndexRefine`` around an ``SQfp16`` index,
``",Refine(SQfp16)"``: half the bytes, distances from the fp16 values)."""

from __future__ import annotations

import numpy as np
import torch

from vq import kernels
from vq._checks import check_positive
from vq._cpu import empty
from vq.index.core.base import Index
from vq.index.core.faiss_build import import_faiss, keep_alive, with_id_map
from vq.index.core.filters import IdFilter, torch_mask
from vq.index.core.lean import SMALL_BATCH
from vq.index.core.ranges import by_query, query_numbers
from vq.index.core.registry import register
from vq.index.core.searchers import INF, Searcher, kept, search_in_chunks, top_rows
from vq.index.core.searching import NO_IDS, shape_problem
from vq.index.core.storage import IdRange, append_rows, reserve
from vq.index.wrappers.wrapper import Wrapper
from vq.kernels.common.constants import metric as kernel_metric
from vq.kernels.common.threads import parallel_for


class Refine(Wrapper):
    """Asks the wrapped (approximate) index for ``k * k_factor`` candidates, then ranks them by
    their exact distance to the query, computed from the full vectors it keeps.

    Args:
        index: the approximate index (trained or not). It stores row numbers of this index as
            its ids; ``Refine`` maps them back to the caller's ids.
        k_factor: candidates per result (faiss's default is 1, which only re-sorts; 4–16 is
            what recall needs). ``search(..., k_factor=)`` overrides it per call.
        k: neighbours ``forward`` returns (default: the wrapped index's).
        storage: how the vectors are kept: "float32" (``IndexRefineFlat``), or "fp16" (IEEE
            half precision, rounded to nearest: 2 bytes a dimension, the distances of the
            re-ranking those of the fp16 values; faiss's ``IndexRefine`` with an ``SQfp16``
            refine index holds the same values).

    Off the CPU (CUDA tensors, ``vq._cpu.torch_only()``) the candidates come from the wrapped
    index's static search (``_torch_searcher()``: IVF's probed lists, Flat's scan, HNSW's
    fixed-step beam of :mod:`vq.index.graph.hnsw_searcher`) and are re-ranked by :func:`rerank`; the
    results are the exact re-ranking of those candidates. A filter masks the wrapped index's
    static search (no further probing, no exact fallback: fewer than k results can come back
    where the CPU path finds k).

    Submodules and buffers:
        index; vectors: float32 (or float16) [ntotal, dim]; ids: int64 [ntotal].
    """

    row_buffers = ("vectors",)
    search_params = ("k_factor",)

    def __init__(
        self, index: Index, k_factor: int = 1, k: int | None = None, storage: str = "float32"
    ):
        if not isinstance(index, Index):
            raise TypeError(f"index must be a vq index to re-rank, got {type(index).__name__}")
        super().__init__(index.dim, index.metric, index.k if k is None else k, index.verbose)
        if storage not in _STORAGE:
            raise ValueError(f"storage must be one of {tuple(_STORAGE)}, got {storage!r}")
        self.index, self.storage = index, storage
        self.normalize = index.normalize  # (metric "cosine": the wrapped index's)
        self.k_factor = _check_k_factor(k_factor)
        self.register_buffer("vectors", torch.zeros(0, index.dim, dtype=_STORAGE[storage]))

    @property
    def is_trained(self) -> bool:
        return self.index.is_trained

    @property
    def ntotal(self) -> int:
        return int(self.vectors.shape[0])

    def config(self) -> dict:
        return {
            "k": self.k,
            "k_factor": self.k_factor,
            "storage": self.storage,
            **({"normalize": True} if self.normalize and not self.index.normalize else {}),
            "index": {"class": type(self.index).__name__, **self.index.config()},
        }

    def growing_buffers(self) -> tuple[str, ...]:
        return (*super().growing_buffers(), "vectors")

    def consistency_problem(self) -> str | None:
        n = self.ntotal
        problem = super().consistency_problem()
        problem = problem or shape_problem("vectors", self.vectors, (n, self.dim))
        if problem is None and self.vectors.dtype != _STORAGE[self.storage]:
            problem = f"vectors of dtype {self.vectors.dtype}, expected {_STORAGE[self.storage]}"
        inner = self.index.stored_ids()  # the wrapped index stores this one's rows as its ids
        if problem is None and (
            self.index.ntotal != n or (n and not 0 <= int(inner.min()) <= int(inner.max()) < n)
        ):
            problem = "a wrapped index whose rows do not match the stored vectors"
        return problem

    def faiss_counterpart(self):
        """faiss ``IndexRefineFlat`` (fp16 storage: ``IndexRefine`` around an ``SQfp16``
        index holding the same bytes) around the wrapped index's ``to_faiss()``, with the same
        vectors and k_factor, in an ``IndexIDMap`` unless the ids are 0 … ntotal - 1."""
        base = self.index.faiss_counterpart()
        faiss = import_faiss()
        if self.storage == "fp16":
            metric = faiss.METRIC_INNER_PRODUCT if self.metric == "ip" else faiss.METRIC_L2
            refine = faiss.IndexScalarQuantizer(self.dim, faiss.ScalarQuantizer.QT_fp16, metric)
            codes = self.vectors.cpu().contiguous().view(torch.uint8).numpy().reshape(-1)
            faiss.copy_array_to_vector(codes, refine.codes)
            refine.ntotal = self.ntotal
            out = keep_alive(faiss.IndexRefine(base, refine), base, refine)
        else:
            vectors = np.ascontiguousarray(self.vectors.float().cpu().numpy())
            out = keep_alive(faiss.IndexRefineFlat(base, faiss.swig_ptr(vectors)), base)
        out.k_factor = self.k_factor
        return with_id_map(out, self.stored_ids())

    def learn(self, x: torch.Tensor) -> None:
        self.index.train(x)

    def learns(self) -> bool:
        return self.index.learns()

    def reset_rows(self) -> None:
        super().reset_rows()
        self.index.reset_rows()

    def add_rows(self, x: torch.Tensor, ids, prepare=None) -> None:
        self._require_trained("add")
        n0, step = self.ntotal, self.add_batch_size
        self.index.add_rows(x, IdRange(n0, x.shape[0], self.device), prepare)  # ids: our rows
        self._append_ids(ids if isinstance(ids, IdRange) else ids.to(self.device))
        reserve(self, "vectors", n0 + x.shape[0])
        for s in range(0, x.shape[0], step):
            chunk = x[s : s + step].to(self.device)
            append_rows(self, "vectors", chunk if prepare is None else prepare(chunk))

    def merge_rows(self, other, shift: int) -> None:
        ids = self._merged_ids(other, shift)
        self.index.merge_rows(other.index, self.ntotal)  # its ids: this index's new rows
        self._append_ids(ids)
        append_rows(self, "vectors", other.vectors.to(self.device))

    def _drop_rows(self, drop: np.ndarray, first: int, removed: int) -> None:
        self.index.remove_stored(torch.from_numpy(np.flatnonzero(drop)).to(self.device))
        keep = torch.from_numpy(drop == 0).to(self.device)
        self.index.renumber(torch.cumsum(keep, 0) - 1)  # old row -> new row
        super()._drop_rows(drop, first, removed)

    def range_hits(self, q, radius: float, allowed=None, k_factor=None, **params) -> list:
        """The wrapped index's hits at the same radius (its approximate distances), kept where
        the exact distance is within it too, with the exact distances (faiss's
        ``IndexRefineFlat`` has no range search): a vector whose approximate distance is past
        the radius is not found, however near it is."""
        ip = self.metric == "ip"
        inner_filter = None if allowed is None else IdFilter(allowed.row_mask(self).view(bool))
        mine_of = self.index.stored_ids().cpu()  # the wrapped index's ids are this one's rows
        parts, step = [], 1 << 16
        for inner in self.index.range_hits(q, radius, inner_filter, **params):
            qs_all = query_numbers(inner)
            for s in range(0, qs_all.shape[0], step):  # [hits, dim] temporaries, bounded
                qi = torch.from_numpy(qs_all[s : s + step])
                mine = mine_of[inner.rows[s : s + step]]
                qv, xv = q[qi], self.vectors[mine.to(self.device)].float().cpu()
                d = -(qv * xv).sum(1) if ip else ((qv - xv) ** 2).sum(1)
                keep = (d < (-radius if ip else radius)).numpy()
                parts.append(by_query(qi.numpy()[keep], mine.numpy()[keep], d.numpy()[keep]))
        return parts

    def decode_rows(self, rows: torch.Tensor) -> torch.Tensor:
        return self.vectors[rows.to(self.device)].float()

    def kernel_vectors(self) -> np.ndarray:
        """The stored vectors as the re-ranking kernels read them (CPU): float32 [ntotal,
        dim], or their fp16 bits, uint16 [ntotal, dim] (see :mod:`vq.kernels.common.halves`)."""
        x = self.vectors.contiguous()
        if self.storage == "float32":
            return x.numpy()
        return x.view(torch.int16).numpy().view(np.uint16)

    def search_work(self, nq: int, k: int, k_factor: int | None = None, **params) -> float:
        candidates = k * (self.k_factor if k_factor is None else k_factor)
        inner = self.index.search_work(nq, candidates, **params)
        return inner + nq * candidates * (self.dim / 16 + 50)  # a cache miss per candidate

    def searcher(self, k: int | None = None, *, k_factor: int | None = None, **options):
        """The search as a static-shape graph: the wrapped index's ``searcher(k * k_factor,
        **options)`` for candidates, re-ranked on a snapshot of the vectors (see
        :class:`RefineSearch`)."""
        k = self.k if k is None else k
        k_factor = self.k_factor if k_factor is None else _check_k_factor(k_factor)
        return RefineSearch(self, self.index.searcher(k * k_factor, **options), k, k_factor)

    def torch_search(self, q: torch.Tensor, k: int, k_factor: int | None = None, **params):
        """The torch engine: the wrapped index's static search over its own tensors for the
        candidates (a filter masks its probed lists: no probing further here), re-ranked."""
        k_factor = _check_k_factor(self.k_factor if k_factor is None else k_factor)
        probed, _ = params.pop("probed", None), params.pop("max_codes", None)
        if probed is not None:
            probed.fill_(self.index.effective_nprobe(params.get("nprobe")))
        params["allowed"] = torch_mask(self, params.get("allowed"))
        return search_in_chunks(self.torch_searcher(), q, k, k_factor=k_factor, **params)

    def torch_searcher(self) -> RefineSearch:
        """The re-ranking over the wrapped index's own static search (its torch engine)."""
        return RefineSearch(self, self.index.torch_searcher(), copy=False)

    def search_rows(self, q: torch.Tensor, k: int, k_factor: int | None = None, **params):
        """The numba engine: the wrapped index's ``k * k_factor`` candidates, re-ranked by
        their exact distances (``refine_scan``)."""
        k_factor = _check_k_factor(self.k_factor if k_factor is None else k_factor)
        allowed = params.get("allowed")
        if allowed is not None:  # the wrapped index's ids are this index's rows
            params["allowed"] = IdFilter(allowed.row_mask(self).view(bool))
        cand = self.index.candidate_ids(q, k * k_factor, **params)  # [nq, k * k_factor]
        kk = min(k, cand.shape[1])
        dist, rows = empty((q.shape[0], kk)), empty((q.shape[0], kk), torch.int64)
        kernels.refine_scan(
            q.contiguous().numpy(),
            self.kernel_vectors(),
            cand.contiguous().numpy(),
            self.metric == "ip",
            dist.numpy(),
            rows.numpy(),
        )
        return dist, rows

    def build_lean_search(self):
        """The wrapped index's lean search for ``k * k_factor`` candidates, re-ranked and
        mapped to ids in one more kernel call — or in the wrapped index's own kernel call where
        it can re-rank (``build_refined_lean_search``); None where the wrapped index has none."""
        ip = kernel_metric(self.metric == "ip")
        x = self.kernel_vectors()
        ids = self.ids.numpy() if self.ids.shape[0] == self.ntotal else NO_IDS
        fused = self.index.build_refined_lean_search(x, ids, lambda: self.k_factor)
        if fused is not None:
            return fused
        candidates = self.index.lean_search()
        if candidates is None:
            return None

        def search(q: np.ndarray, k: int, ranked: bool, params: dict):
            k_factor = params.get("k_factor")
            k_factor = self.k_factor if k_factor is None else k_factor
            if type(k_factor) is not int or k_factor < 1:
                return None  # the general path says what is wrong
            found = candidates(q, k * k_factor, False, params)
            if found is None:
                return None
            # the wrapped index stores this index's rows as its ids
            nq = q.shape[0]
            out_dist = np.empty((nq, k), np.float32)
            out_ids = np.empty((nq, k), np.int64)
            if nq <= SMALL_BATCH:
                kernels.refine_lean(q, x, found[1], ids, ip, out_dist, out_ids)
            else:  # a batch the wrapped search split: the re-ranking split by query as well

                def body(q0: int, q1: int) -> None:
                    kernels.refine_lean(
                        q[q0:q1], x, found[1][q0:q1], ids, ip, out_dist[q0:q1], out_ids[q0:q1]
                    )

                parallel_for(body, nq, grain=SMALL_BATCH)
            return out_dist, out_ids

        search.splits = getattr(candidates, "splits", False)  # (batches the wrapped search splits)
        return search


def rerank(queries, vectors, candidates, k: int, metric: str):
    """Candidates re-ranked by their exact distances, as one static-shape graph.

    Args:
        queries: float32 [B, dim]; vectors: float32 or float16 [ntotal, dim], the stored
        vectors (only the candidates' rows are widened to float32); candidates: int64 [B, C],
        rows of ``vectors`` (-1 for none); k: results kept; metric: "l2" or "ip".

    Returns:
        values float32 [B, min(k, C)], ascending (squared L2 or negated inner products; +inf
        where there is no candidate), and their rows int64 (-1 there).
    """
    n, c = candidates.shape
    cand = vectors.index_select(0, candidates.clamp_min(0).reshape(-1)).reshape(n, c, -1).float()
    q = queries[:, None, :]
    scores = -(cand * q).sum(-1) if metric == "ip" else ((cand - q) ** 2).sum(-1)
    return top_rows(torch.where(candidates < 0, INF, scores), k, candidates)


class RefineSearch(Searcher):
    """:class:`Refine`'s search as a static-shape graph: the wrapped index's static search
    (``inner``) for ``k * k_factor`` candidates (its ids are this index's rows), re-ranked by
    :func:`rerank`.

    Buffers: vectors: float32 [ntotal, dim] (float16 with fp16 storage: no float copy of
    them, only the candidates' rows widened); id_table: int64 [ntotal] unless the ids are the
    row numbers (and ``inner``'s).
    """

    def __init__(self, index: Refine, inner: Searcher, k=None, k_factor=None, copy=True):
        super().__init__(index, k, copy)
        self.inner = inner
        self.k_factor = index.k_factor if k_factor is None else int(k_factor)
        self.register_buffer("vectors", kept(index.vectors, copy))

    def search(self, queries, k: int, k_factor=None, allowed=None, **options):
        wanted = k * (self.k_factor if k_factor is None else k_factor)
        if allowed is not None:  # over this index's rows: the inner search's ids
            allowed = allowed if self.inner.sequential else allowed[self.inner.id_table]
        _, candidates = self.inner.search(queries, wanted, allowed=allowed, **options)
        return self.results(*rerank(queries, self.vectors, candidates, k, self.metric), k)

    def chunk_rows(self, k: int, k_factor: int | None = None, **options) -> int:
        wanted = k * (self.k_factor if k_factor is None else k_factor)
        own = max(1, (1 << 24) // (wanted * self.dim))  # the [B, wanted, dim] candidates
        return min(self.inner.chunk_rows(wanted, **options), own)


#: the ``storage`` values and the dtype each keeps the vectors in
_STORAGE = {"float32": torch.float32, "fp16": torch.float16}


def _check_k_factor(k_factor) -> int:
    return check_positive(k_factor, "k_factor", "an integer >= 1")


def _from_config(args: dict, build) -> Refine:
    """The Refine of a saved configuration (files before fp16 storage: float32)."""
    inner = build(args["index"])
    storage = args.get("storage", "float32")
    return Refine(inner, args["k_factor"], k=args.get("k"), storage=storage)


register(Refine, example="HNSW16,RFlat", from_config=_from_config, wrapper=True)
