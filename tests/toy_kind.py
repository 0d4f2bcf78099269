"""A toy index kind registered from outside the library: brute force over float32 vectors in
plain torch (no kernel, no lean path, no faiss counterpart). Registering it is all it takes for
the factory, the loader and export to build it, and for the tests that run one behaviour over
every registered kind (tests/index_kinds.py) to cover it.

It is written as docs/architecture.md's checklist says: the class, its static search, and one
``register`` call.
"""

from __future__ import annotations

import torch

from vq.index import Index
from vq.index.core.filters import torch_mask
from vq.index.core.registry import register
from vq.index.core.searchers import Searcher, kept, top_rows
from vq.index.core.searching import shape_problem


class BruteForce(Index):
    """Every stored vector compared with every query, in torch.

    Buffers: vectors float32 [ntotal, dim]; ids int64 [ntotal] (empty while sequential).
    """

    row_buffers = ("vectors",)

    def __init__(self, dim: int, metric: str = "l2", k: int = 10, verbose: bool = False):
        super().__init__(dim, metric, k, verbose)
        self.register_buffer("vectors", torch.zeros(0, dim))

    @property
    def ntotal(self) -> int:
        return int(self.vectors.shape[0])

    def encode_batch(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"vectors": x.float()}

    def decode_rows(self, rows: torch.Tensor) -> torch.Tensor:
        return self.vectors[rows.to(self.device)].float()

    def growing_buffers(self) -> tuple[str, ...]:
        return (*super().growing_buffers(), "vectors")

    def consistency_problem(self) -> str | None:
        problem = super().consistency_problem()
        return problem or shape_problem("vectors", self.vectors, (self.ntotal, self.dim))

    def search_rows(self, q: torch.Tensor, k: int, allowed=None):
        return self.searcher(copy=False).rows(q, k, torch_mask(self, allowed))

    def searcher(self, k: int | None = None, *, copy: bool = True) -> BruteForceSearch:
        return BruteForceSearch(self, k, copy)


class BruteForceSearch(Searcher):
    """:class:`BruteForce`'s search as a static-shape graph: one matrix product, a top-k."""

    def __init__(self, index: BruteForce, k: int | None = None, copy: bool = True):
        super().__init__(index, k, copy)
        self.register_buffer("vectors", kept(index.vectors.float(), copy))

    def rows(self, queries: torch.Tensor, k: int, allowed: torch.Tensor | None = None):
        """Values (smaller is nearer) and rows [B, k] of the k nearest stored rows."""
        x = self.vectors
        if self.metric == "ip":
            scores = -(queries @ x.T)
        else:
            scores = ((queries * queries).sum(1, keepdim=True) - 2 * queries @ x.T
                      + (x * x).sum(1)).clamp_min(0.0)  # fmt: skip
        if allowed is not None:
            scores = scores + self.row_bias(allowed)
        return top_rows(scores, k)

    def search(self, queries: torch.Tensor, k: int, allowed: torch.Tensor | None = None):
        return self.results(*self.rows(queries, k, allowed), k)

    def chunk_rows(self, k: int) -> int:
        return max(1, (1 << 24) // max(1, self.ntotal))


register(
    BruteForce,
    example="Toy",
    factory=r"Toy",
    build=lambda match, dim, metric: BruteForce(dim, metric),
    syntax="Toy",
)
