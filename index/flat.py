"""Exact search: every stored vector, compared in full."""

from __future__ import annotations

import numpy as np
import torch

from vq import _cpu, kernels
from vq._cpu import empty, fast_path
from vq.index.base import _NO_IDS, Index
from vq.kernels import threads

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

    def __init__(self, dim: int, metric: str = "l2", k: int = 10, verbose: bool = False):
        super().__init__(dim, metric, k, verbose)
        self.register_buffer("vectors", torch.zeros(0, dim))

    def _encode_batch(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"vectors": x.float()}

    @property
    def ntotal(self) -> int:
        return int(self.vectors.shape[0])

    def _store(self, encoded: dict[str, torch.Tensor], ids: torch.Tensor) -> None:
        self._append_ids(ids)
        self.vectors = torch.cat([self.vectors, encoded["vectors"]])

    def _keep(self, rows: torch.Tensor) -> None:
        self.vectors = self.vectors[rows]

    def _search_rows(self, q: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        if fast_path(q):
            return self._search_numba(q, k)
        x = self.vectors.float()
        x_norms = (x * x).sum(dim=1) if self.metric == "l2" else None
        # memory bound: at most ~2^26 scores at a time
        rows_per_chunk = max(1, (1 << 26) // max(1, x.shape[0]))
        dists, rows = [], []
        for s in range(0, q.shape[0], rows_per_chunk):
            qc = q[s : s + rows_per_chunk]
            if self.metric == "l2":
                scores = torch.addmm(x_norms, qc, x.T, alpha=-2.0)
                val, idx = torch.topk(scores, k, dim=1, largest=False, sorted=True)
                val = (val + (qc * qc).sum(dim=1, keepdim=True)).clamp_min(0.0)
            else:
                val, idx = torch.topk(qc @ x.T, k, dim=1, largest=True, sorted=True)
            dists.append(val)
            rows.append(idx)
        return torch.cat(dists), torch.cat(rows)

    def _norms(self) -> np.ndarray:
        """float32 [ntotal]: the stored vectors' squared norms, kept until they change (each
        search recomputing them was half of a one-query search at 50,000 vectors)."""
        x = self.vectors
        return self._derived("norms", (x,), lambda: (x * x).sum(dim=1).numpy())

    def _lean_search(self):
        """One kernel call for a few queries on the calling thread (``flat_lean``), or, when
        one thread would take long, the rows split between the threads (``flat_parts``) and
        the parts merged by one more kernel."""
        ip = self.metric == "ip"
        x = self.vectors.contiguous().numpy()
        norms = _NO_NORMS if ip else self._norms()
        ids = self.ids.numpy() if self.ids.shape[0] == self.ntotal else _NO_IDS
        n = x.shape[0]
        work = self._search_work

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

    def _search_numba(self, q: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """BLAS inner products of a block of queries with a block of vectors (small enough to
        stay in cache), each block offered to per-query top-k heaps by a numba kernel, as
        faiss's IndexFlat does: about as fast as faiss, 2x the torch.topk path."""
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
                    inner_product,
                    heap_d[s : s + q_block],
                    heap_i[s : s + q_block],
                )
        dist, rows = empty((nq, k)), empty((nq, k), torch.int64)
        kernels.heaps_sorted(heap_d, heap_i, dist.numpy(), rows.numpy())
        if inner_product:
            return -dist, rows
        return (dist + (q * q).sum(dim=1, keepdim=True)).clamp_min(0.0), rows
