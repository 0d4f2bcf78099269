""":class:`vq.HNSW`'s search as a static-shape graph: a fixed number of greedy steps per upper
level, then a fixed number of expansion steps of a fixed beam on level 0 (the shape GPU graph
searches such as CAGRA use), so that it exports (ONNX) and compiles with no shape computed
from data.

Each level-0 step picks the ``width`` nearest beam entries not yet expanded (top-k over the
beam with +inf on expanded ones), gathers their 2M neighbours (-1 padding masked to +inf),
scores them, and merges them into the beam: candidates sorted by id, a candidate equal to its
predecessor (a node already in the beam, or seen twice) masked to +inf, then a top-k of the
beam size. The expanded flags travel with the entries. With enough steps (each expands
``width`` nodes; the kernel's beam expands at most a few times efSearch nodes) it finds what
the CPU search finds; :func:`recall_by_steps` says how recall grows with the step count.
"""

from __future__ import annotations

import torch

from vq._checks import check_positive
from vq.index.static import INF, Searcher, kept


class HNSWSearch(Searcher):
    """Static HNSW search (see the module docstring).

    Args:
        index: the :class:`vq.HNSW`; k: neighbours ``forward`` returns.
        efSearch: the beam (at least k; default the index's efSearch).
        steps: level-0 expansion steps (default 2 * efSearch / width).
        width: nodes expanded per step.
        upper_steps: greedy steps per upper level.
        copy: hold a snapshot of the graph (True) or the index's own buffers.

    Buffers:
        vectors float32 [n, dim] (``index.search_vectors()``: decoded codes for
        :class:`vq.index.HNSWSQ`); neighbors int64 [n, 2M]; upper_offsets int64 [n + 1];
        upper_neighbors int64 [rows, M]; entry int64 [1].
    """

    def __init__(self, index, k=None, efSearch=None, steps=None, width=1, upper_steps=4,
                 copy=True):  # fmt: skip
        super().__init__(index, k, copy)
        ef = check_positive(index.efSearch if efSearch is None else efSearch, "efSearch")
        self.width = check_positive(width, "width")
        self.beam = max(ef, self.k, self.width)
        self.steps = check_positive(-(-2 * self.beam // self.width) if steps is None else steps,
                                    "steps")  # fmt: skip
        self.upper_steps = check_positive(upper_steps, "upper_steps")
        self.max_level = index.max_level
        self.register_buffer("vectors", kept(index.search_vectors(), copy))
        self.register_buffer("neighbors", index.neighbors.long())
        self.register_buffer("upper_offsets", kept(index.upper_offsets, copy))
        self.register_buffer("upper_neighbors", index.upper_neighbors.long())
        self.register_buffer("entry", kept(index.entry_point, copy))

    def distances(self, queries: torch.Tensor, nodes: torch.Tensor) -> torch.Tensor:
        """float32 [B, C]: the distance of each query to nodes int64 [B, C] (+inf for -1)."""
        x = self.vectors.index_select(0, nodes.clamp_min(0).reshape(-1))
        x = x.reshape(*nodes.shape, -1)
        q = queries[:, None, :]
        d = -(x * q).sum(-1) if self.metric == "ip" else ((x - q) ** 2).sum(-1)
        return torch.where(nodes < 0, INF, d)

    def descend(self, queries: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Greedy steps on the upper levels: the node [B, 1] reached and its distance."""
        node = self.entry.expand(queries.shape[0])[:, None]
        dist = self.distances(queries, node)
        for level in range(self.max_level, 0, -1):
            for _ in range(self.upper_steps):
                rows = self.upper_offsets.index_select(0, node.reshape(-1)) + (level - 1)
                cand = self.upper_neighbors.index_select(0, rows)  # [B, M]
                d = self.distances(queries, cand)
                best, pos = d.min(dim=1, keepdim=True)
                better = best < dist
                node = torch.where(better, cand.gather(1, pos), node)
                dist = torch.where(better, best, dist)
        return node, dist

    def step(self, queries, ids, dist, done):
        """One level-0 expansion step of the beam (ids, dist, done: [B, beam])."""
        pick = torch.where(done > 0, INF, dist)
        val, pos = torch.topk(pick, self.width, dim=1, largest=False)
        nodes = torch.where(torch.isinf(val), -1, ids.gather(1, pos))
        done = done.scatter(1, pos, torch.ones_like(val))
        cand = self.neighbors.index_select(0, nodes.clamp_min(0).reshape(-1))
        cand = cand.reshape(nodes.shape[0], -1)
        valid = (nodes >= 0).repeat_interleave(self.neighbors.shape[1], dim=1)
        cand = torch.where(valid, cand, -1)
        all_ids = torch.cat([ids, cand], dim=1)
        all_dist = torch.cat([dist, self.distances(queries, cand)], dim=1)
        all_done = torch.cat([done, torch.zeros_like(cand, dtype=done.dtype)], dim=1)
        # duplicates: sorted by id (beam entries first among equals), later copies masked
        key = all_ids * 2 + (torch.arange(all_ids.shape[1], device=ids.device) >= ids.shape[1])
        order = torch.sort(key, dim=1).indices
        s_ids = all_ids.gather(1, order)
        dup = torch.cat([torch.zeros_like(s_ids[:, :1], dtype=torch.bool),
                         s_ids[:, 1:] == s_ids[:, :-1]], dim=1)  # fmt: skip
        s_dist = torch.where(dup | (s_ids < 0), INF, all_dist.gather(1, order))
        val, keep = torch.topk(s_dist, self.beam, dim=1, largest=False)
        new_ids = torch.where(torch.isinf(val), -1, s_ids.gather(1, keep))
        return new_ids, val, all_done.gather(1, order).gather(1, keep)

    def search(self, queries: torch.Tensor, k: int, steps: int | None = None):
        b = queries.shape[0]
        node, d0 = self.descend(queries)
        ids = torch.cat([node, node.new_full((b, self.beam - 1), -1)], dim=1)
        dist = torch.cat([d0, d0.new_full((b, self.beam - 1), INF)], dim=1)
        done = torch.zeros_like(dist)
        for _ in range(self.steps if steps is None else steps):
            ids, dist, done = self.step(queries, ids, dist, done)
        kk = min(k, self.beam)
        val, rows = dist[:, :kk], ids[:, :kk]
        return self.results(val, torch.where(torch.isinf(val), -1, rows), k)

    def chunk_rows(self, k: int, **options) -> int:
        cands = self.beam + self.width * self.neighbors.shape[1]
        return max(1, (1 << 25) // (cands * self.dim))


def recall_by_steps(index, queries, k: int, steps: tuple[int, ...], **options) -> dict[int, float]:
    """Recall@k of the static search after each number of ``steps``, against the index's own
    (CPU) search at the same efSearch: {steps: recall}."""
    searcher = HNSWSearch(index, k, copy=False, **options)
    q = torch.as_tensor(queries, dtype=torch.float32)
    _, ref = index.search(q, k, efSearch=searcher.beam)
    out = {}
    with torch.no_grad():
        for s in steps:
            _, found = searcher.search(q, k, steps=s)
            pairs = zip(found.tolist(), ref.tolist(), strict=True)
            hits = [len(set(a) & set(b) - {-1}) for a, b in pairs]
            out[s] = sum(hits) / (k * q.shape[0])
    return out
