"""Exact search: every stored vector, compared in full."""

from __future__ import annotations

import numpy as np
import torch

from vq import _cpu, kernels
from vq._cpu import empty
from vq.index.core.base import Index
from vq.index.core.faiss_build import faiss_metric, import_faiss, with_id_map
from vq.index.core.filters import IdFilter, kernel_mask
from vq.index.core.ranges import RANGE_SLOTS, counted
from vq.index.core.registry import register
from vq.index.core.searchers import Searcher, kept
from vq.index.core.searching import NO_IDS, shape_problem
from vq.kernels.common import threads
from vq.kernels.common.bundles import RangeHits
from vq.kernels.common.constants import metric as kernel_metric

_NO_NORMS = np.zeros(0, np.float32)


class FlatIndex(Index):
    """Brute-force index (faiss ``IndexFlatL2`` / ``IndexFlatIP``).

    Args:
        dim: vector dimension.
        metric: "l2" or "ip".
        k: neighbours ``forward`` returns.

    Buffers:
        vectors: float32 [ntotal, dim]; ids: int64 [ntotal].
    """

    row_buffers = ("vectors",)

    def __init__(self, dim: int, metric: str = "l2", k: int = 10, verbose: bool = False):
        super().__init__(dim, metric, k, verbose)
        self.register_buffer("vectors", torch.zeros(0, dim))

    def encode_batch(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"vectors": x.float()}

    @property
    def ntotal(self) -> int:
        return int(self.vectors.shape[0])

    def decode_rows(self, rows: torch.Tensor) -> torch.Tensor:
        return self.vectors[rows.to(self.device)].float()

    def growing_buffers(self) -> tuple[str, ...]:
        return (*super().growing_buffers(), "vectors")

    def consistency_problem(self) -> str | None:
        problem = super().consistency_problem()
        return problem or shape_problem("vectors", self.vectors, (self.ntotal, self.dim))

    def faiss_counterpart(self):
        """faiss ``IndexFlat`` (L2 or IP) holding the same vectors, in an ``IndexIDMap`` unless
        the ids are 0 … ntotal - 1."""
        out = import_faiss().IndexFlat(self.dim, faiss_metric(self.metric))
        out.add(self.vectors.float().cpu().numpy())
        return with_id_map(out, self.stored_ids())

    @classmethod
    def from_faiss(cls, f, metric: str) -> FlatIndex:
        """The FlatIndex of a faiss ``IndexFlat`` ``f``: the same vectors (``metric``, "l2" or
        "ip", is ``f``'s)."""
        out = cls(f.d, metric)
        data = f.reconstruct_n(0, f.ntotal) if f.ntotal else np.zeros((0, f.d), np.float32)
        out.vectors = torch.from_numpy(data)
        return out

    def searcher(self, k: int | None = None, *, copy: bool = True) -> FlatSearch:
        """The search as a static-shape graph over a snapshot of the stored vectors (see
        :class:`FlatSearch`; what :mod:`vq.export` writes out; ``copy=False``: over the
        index's own, its torch engine)."""
        return FlatSearch(self, k, copy)

    def search_rows(self, q: torch.Tensor, k: int, allowed: IdFilter | None = None):
        # (CPU tensors in eager mode: see _search_ids)
        return self._search_numba(q, k, kernel_mask(self, allowed))

    def _norms(self) -> np.ndarray:
        """float32 [ntotal]: the stored vectors' squared norms, kept until they change (each
        search recomputing them was half of a one-query search at 50,000 vectors)."""
        x = self.vectors
        return self.derived("norms", (x,), lambda: (x * x).sum(dim=1).numpy())

    def build_lean_search(self):
        """One kernel call for a few queries on the calling thread (``flat_lean``), or, when
        one thread would take long, the rows split between the threads (``flat_parts``) and
        the parts merged by one more kernel."""
        ip = kernel_metric(self.metric == "ip")
        x = self.vectors.contiguous().numpy()
        norms = _NO_NORMS if ip else self._norms()
        ids = self.ids.numpy() if self.ids.shape[0] == self.ntotal else NO_IDS
        n = x.shape[0]
        work = self.search_work

        def search(q: np.ndarray, k: int, ranked: bool, params: dict):
            nq = q.shape[0]
            out_dist = np.empty((nq, k), np.float32)
            out_ids = np.empty((nq, k), np.int64)
            parts = 1
            if work(nq, k) >= _cpu.SERIAL_WORK:
                parts = min(threads.get_num_threads(), max(1, n // 4096))
            if parts == 1:
                if not kernels.flat_lean(q, x, norms, ids, ip, out_dist, out_ids):
                    return None  # a NaN or an infinity: the general path says so
                return out_dist, out_ids
            if not kernels.all_finite(q):
                return None
            heap_d = np.full((parts, nq, k), np.inf, np.float32)
            heap_i = np.full((parts, nq, k), -1, np.int64)
            kernels.flat_parts(q, x, norms, ip, heap_d, heap_i)
            kernels.flat_finish(heap_d, heap_i, q, ids, ip, out_dist, out_ids)
            return out_dist, out_ids

        return search

    def range_hits(self, q: torch.Tensor, radius: float, allowed: IdFilter | None) -> list:
        """BLAS blocks, as ``_search_numba``, whose hits a kernel keeps."""
        ip, x, mask = self.metric == "ip", self.vectors, kernel_mask(self, allowed)
        norms = _NO_NORMS if ip else self._norms()
        q_norms = (q * q).sum(1).numpy()
        parts, xb = [], 1 << 14
        qb = max(1, RANGE_SLOTS // xb)
        for s in range(0, q.shape[0], qb):
            qs = q[s : s + qb]
            t = np.full(qs.shape[0], -radius, np.float32) if ip else radius - q_norms[s : s + qb]
            for j in range(0, x.shape[0], xb):
                scores = torch.mm(qs, x[j : j + xb].T).numpy()
                rows, vals = np.empty(scores.shape, np.int64), np.empty(scores.shape, np.float32)
                counts = np.empty(scores.shape[0], np.int64)
                starts = np.arange(scores.shape[0]) * scores.shape[1]
                found = RangeHits(
                    starts, t.astype(np.float32), rows.reshape(-1), vals.reshape(-1), counts
                )
                kernels.flat_range_block(scores, norms[j : j + xb], j, mask[j : j + xb], ip, found)
                hits = counted(counts, starts, rows.reshape(-1), vals.reshape(-1), s)
                del rows, vals
                if not ip:  # ‖q‖² back, as faiss adds it
                    back = np.repeat(q_norms[s : s + qs.shape[0]], hits.counts)
                    hits = hits._replace(values=np.maximum(hits.values + back, 0))
                parts.append(hits)
        return parts

    def _search_numba(self, q: torch.Tensor, k: int, allowed: np.ndarray):
        """BLAS inner products of a block of queries with a block of vectors (small enough to
        stay in cache), each block offered to per-query top-k heaps by a numba kernel, as
        faiss's IndexFlat does: about as fast as faiss, 2x the torch.topk path. Returns
        ``search_rows``'s values (smaller is nearer) and rows; ``allowed`` uint8 [ntotal]
        (0: skipped) or empty."""
        x = self.vectors
        nq, n = q.shape[0], x.shape[0]
        inner_product = self.metric == "ip"
        x_norms = np.zeros(0, np.float32) if inner_product else self._norms()
        heap_d = np.full((nq, k), np.inf, dtype=np.float32)
        heap_i = np.full((nq, k), -1, dtype=np.int64)
        q_block, x_block = 1024, 4096
        buffer = torch.empty(min(nq, q_block) * min(n, x_block))
        for s in range(0, nq, q_block):
            qs = q[s : s + q_block]
            for j in range(0, n, x_block):
                xs = x[j : j + x_block]
                scores = buffer[: qs.shape[0] * xs.shape[0]].view(qs.shape[0], xs.shape[0])
                torch.mm(qs, xs.T, out=scores)
                kernels.heap_push_block(
                    scores.numpy(),
                    x_norms[j : j + x_block],
                    j,
                    allowed[j : j + x_block],
                    inner_product,
                    heap_d[s : s + q_block],
                    heap_i[s : s + q_block],
                )
        dist, rows = empty((nq, k)), empty((nq, k), torch.int64)
        kernels.heaps_sorted(heap_d, heap_i, dist.numpy(), rows.numpy())
        if inner_product:
            return dist, rows  # negated inner products, as the heaps ranked them
        return (dist + (q * q).sum(dim=1, keepdim=True)).clamp_min(0.0), rows


class FlatSearch(Searcher):
    """:class:`FlatIndex`'s search as a static-shape graph: scores against every stored vector
    from one matrix product, then a top-k (see :class:`vq.index.core.searchers.Searcher`).

    Args:
        index: the FlatIndex; k: neighbours ``forward`` returns (default the index's).
        copy: hold a snapshot of the vectors (True) or the index's own (the torch path).

    Buffers:
        vectors: float32 [ntotal, dim]; norms: float32 [ntotal], their squared norms;
        id_table: int64 [ntotal] unless the ids are the row numbers.
    """

    def __init__(self, index: FlatIndex, k: int | None = None, copy: bool = True):
        super().__init__(index, k, copy)
        x = index.vectors.detach().float()
        self.register_buffer("vectors", kept(x, copy))
        self.register_buffer("norms", (x * x).sum(dim=1))

    def search(self, queries: torch.Tensor, k: int, allowed: torch.Tensor | None = None):
        """``allowed``: bool [ntotal], False for stored rows a filtered search skips."""
        return self.exhaustive(queries, k, self.vectors, self.norms, allowed)

    def chunk_rows(self, k: int) -> int:
        return max(1, (1 << 26) // max(1, self.ntotal))


register(
    FlatIndex,
    example="Flat",
    factory=r"Flat",
    build=lambda match, dim, metric: FlatIndex(dim, metric),
    syntax="Flat",
    faiss=("IndexFlat",),
)
