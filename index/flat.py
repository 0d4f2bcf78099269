"""Exact search: every stored vector, compared in full."""

from __future__ import annotations

import torch

from vq.index.base import Index


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
