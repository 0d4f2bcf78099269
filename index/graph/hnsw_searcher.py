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

This is what the torch path of :class:`vq.HNSW` and :class:`vq.HNSWSQ` returns (CUDA tensors,
``vq._cpu.torch_only()``), and the candidates a :class:`vq.index.Refine` around them re-ranks
there: the k nearest nodes of the final beam (a beam of max(efSearch, k), efSearch settable per
call), with the distances the graph is walked on. It follows the numba kernel's walk (nearest
unexpanded entry first; for efSearch < k, faiss's stop: an entry with efSearch beam entries
nearer is not expanded, nor anything after it), within a fixed step budget; it can differ from
the kernel where that budget ends first (fewer steps than the kernel's expansions), with
``width`` > 1, and where a node the kernel marked seen and dropped re-enters the beam here.
"""

from __future__ import annotations

import torch

from vq._checks import check_positive
from vq.index.core.searchers import INF, Searcher, kept


class HNSWSearch(Searcher):
    """Static HNSW search (see the module docstring).

    Args:
        index: the :class:`vq.HNSW`; k: neighbours ``forward`` returns.
        efSearch: the beam (at least k; default the index's efSearch).
        steps: level-0 expansion steps (default 2 * beam / width).
        width: nodes expanded per step.
        upper_steps: greedy steps per upper level.
        copy: hold a snapshot of the graph (True) or the index's own buffers.

    Buffers:
        vectors float32 [n, dim] (:meth:`node_vectors` reads them; see
        :class:`vq.index.graph.hnsw_sq.HNSWSQSearch` for codes); neighbors int64 [n, 2M];
        upper_offsets int64 [n + 1]; upper_neighbors int64 [rows, M]; entry int64 [1].
    """

    #: :mod:`vq.export` refuses ``filtered=True`` for this graph: its filter (the torch path of
    #: a Refine around it) has no exact fallback, which the index's own filtered search has
    filter_export = False

    def __init__(self, index, k=None, efSearch=None, steps=None, width=1, upper_steps=4, copy=True):
        super().__init__(index, k, copy)
        self.efSearch = check_positive(index.efSearch if efSearch is None else efSearch, "efSearch")
        self.width = check_positive(width, "width")
        self.fixed_steps = None if steps is None else check_positive(steps, "steps")
        self.beam = self.beam_for(self.k)
        self.steps = self.steps_for(self.beam)
        self.upper_steps = check_positive(upper_steps, "upper_steps")
        self.max_level = index.max_level
        self.register_nodes(index, copy)
        self.register_buffer("neighbors", index.neighbors.long())
        self.register_buffer("upper_offsets", kept(index.upper_offsets, copy))
        self.register_buffer("upper_neighbors", index.upper_neighbors.long())
        self.register_buffer("entry", kept(index.entry_point, copy))

    def register_nodes(self, index, copy: bool) -> None:
        """Hold what :meth:`node_vectors` reads: here the float32 vectors [n, dim]."""
        self.register_buffer("vectors", kept(index.vectors.float(), copy))

    def node_vectors(self, rows: torch.Tensor) -> torch.Tensor:
        """float32 [len(rows), dim]: the vectors of stored rows int64 [len(rows)] (>= 0), as
        the search compares them."""
        return self.vectors.index_select(0, rows)

    def beam_for(self, k: int, efSearch: int | None = None) -> int:
        """The beam of a search for k results: efSearch (default this searcher's), at least
        k and ``width`` (as the kernel's beam holds at least k nodes)."""
        ef = self.efSearch if efSearch is None else check_positive(efSearch, "efSearch")
        return max(ef, k, self.width)

    def steps_for(self, beam: int) -> int:
        """Level-0 steps of a search with this beam: ``steps`` if given, else 2 * beam /
        width."""
        return -(-2 * beam // self.width) if self.fixed_steps is None else self.fixed_steps

    def distances(self, queries: torch.Tensor, nodes: torch.Tensor) -> torch.Tensor:
        """float32 [B, C]: the distance of each query to nodes int64 [B, C] (+inf for -1)."""
        x = self.node_vectors(nodes.clamp_min(0).reshape(-1)).reshape(*nodes.shape, -1)
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

    def expand(self, queries, ids, dist, done, stopped=None, stop: int | None = None):
        """The ``width`` nearest beam entries not yet expanded (ids, dist, done: [B, beam]):
        their neighbours int64 [B, width * 2M] (-1 padding), their distances, and ``done``
        with those entries flagged. ``stop``: faiss's stop for efSearch < k (the kernel's):
        an entry with ``stop`` beam entries nearer than it is not expanded, and the query
        (``stopped`` bool [B, 1], updated in place) expands nothing more."""
        pick = torch.where(done > 0, INF, dist)
        val, pos = torch.topk(pick, self.width, dim=1, largest=False)
        if stop is not None:
            late = (dist[:, None, :] < val[:, :, None]).sum(-1) >= stop  # [B, width]
            stopped |= late.any(dim=1, keepdim=True)
            val = torch.where(stopped | late, INF, val)
        nodes = torch.where(torch.isinf(val), -1, ids.gather(1, pos))
        done = done.scatter(1, pos, torch.ones_like(val))
        cand = self.neighbors.index_select(0, nodes.clamp_min(0).reshape(-1))
        cand = cand.reshape(nodes.shape[0], -1)
        valid = (nodes >= 0).repeat_interleave(self.neighbors.shape[1], dim=1)
        cand = torch.where(valid, cand, -1)
        return cand, self.distances(queries, cand), done

    def step(self, queries, ids, dist, done, stopped=None, stop=None):
        """One level-0 expansion step of the beam (ids, dist, done: [B, beam]; ``stopped``,
        ``stop``: see :meth:`expand`); also the candidates it scored."""
        cand, cand_dist, done = self.expand(queries, ids, dist, done, stopped, stop)
        all_done = torch.cat([done, torch.zeros_like(cand, dtype=done.dtype)], dim=1)
        ids, dist, done = merge_distinct(
            torch.cat([ids, cand], dim=1),
            torch.cat([dist, cand_dist], dim=1),
            ids.shape[1],
            ids.shape[1],
            all_done,
        )
        return ids, dist, done, cand, cand_dist

    def search(
        self,
        queries: torch.Tensor,
        k: int,
        steps: int | None = None,
        efSearch: int | None = None,
        allowed: torch.Tensor | None = None,
    ):
        """Distances float32 [B, k] and ids int64 [B, k] of queries float32 [B, dim]: the k
        nearest nodes of the beam (a beam of :meth:`beam_for` ``(k, efSearch)`` nodes,
        :meth:`steps_for` expansion steps unless ``steps``; where efSearch < k, faiss's stop).
        ``allowed``: bool [ntotal], False for stored rows a filtered search skips: the walk
        goes through every node (as faiss's HNSW with an ``IDSelector``) and the k nearest
        allowed nodes it scored are returned (fewer where it scored fewer: the kernel path
        then scans the allowed rows, this one does not)."""
        b, ef = queries.shape[0], self.efSearch if efSearch is None else efSearch
        beam = self.beam_for(k, efSearch)
        node, d0 = self.descend(queries)
        ids = torch.cat([node, node.new_full((b, beam - 1), -1)], dim=1)
        dist = torch.cat([d0, d0.new_full((b, beam - 1), INF)], dim=1)
        done = torch.zeros_like(dist)
        stop = ef if ef < beam else None
        stopped = torch.zeros_like(node, dtype=torch.bool) if stop else None
        if allowed is not None:  # the k nearest allowed nodes scored so far
            bias = self.row_bias(allowed)
            found = self.allowed_only(ids, dist, bias)
        for _ in range(self.steps_for(beam) if steps is None else steps):
            ids, dist, done, cand, cand_dist = self.step(queries, ids, dist, done, stopped, stop)
            if allowed is not None:
                cand_dist = self.allowed_only(cand, cand_dist, bias)[1]
                found = merge_distinct(
                    torch.cat([found[0], cand], dim=1),
                    torch.cat([found[1], cand_dist], dim=1),
                    k,
                    found[0].shape[1],
                )
        rows, val = (ids, dist) if allowed is None else found
        kk = min(k, val.shape[1])
        val, rows = val[:, :kk], rows[:, :kk]
        return self.results(val, torch.where(torch.isinf(val), -1, rows), k)

    @staticmethod
    def allowed_only(nodes, dist, bias):
        """nodes int64 [B, C] and their distances, +inf (node -1) where ``bias`` (float32
        [ntotal], +inf for rows a filter skips) excludes them."""
        d = dist + bias.index_select(0, nodes.clamp_min(0).reshape(-1)).reshape(nodes.shape)
        return torch.where(torch.isinf(d), -1, nodes), d

    def chunk_rows(self, k: int, efSearch: int | None = None, **options) -> int:
        cands = self.beam_for(k, efSearch) + k + self.width * self.neighbors.shape[1]
        return max(1, (1 << 25) // (cands * self.dim))


def merge_distinct(ids, dist, size: int, first: int, *extra):
    """The ``size`` nearest distinct nodes of candidates ids int64 [B, C] (-1: none) and their
    distances float32 [B, C] (size <= C): sorted by id, the later copies of an id masked to
    +inf (the first ``first`` columns come first among equals: the beam's entries, with their
    flags), then a top-k. Returns ids [B, size] (-1 where +inf), distances, and each of
    ``extra`` [B, C] taken along."""
    key = ids * 2 + (torch.arange(ids.shape[1], device=ids.device) >= first)
    order = torch.sort(key, dim=1).indices
    s_ids = ids.gather(1, order)
    dup = torch.cat(
        [torch.zeros_like(s_ids[:, :1], dtype=torch.bool), s_ids[:, 1:] == s_ids[:, :-1]], dim=1
    )
    s_dist = torch.where(dup | (s_ids < 0), INF, dist.gather(1, order))
    val, keep = torch.topk(s_dist, size, dim=1, largest=False)
    new_ids = torch.where(torch.isinf(val), -1, s_ids.gather(1, keep))
    return (new_ids, val, *(e.gather(1, order).gather(1, keep) for e in extra))


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
