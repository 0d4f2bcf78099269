"""A graph index: Hierarchical Navigable Small World graphs over the full vectors (faiss
``IndexHNSWFlat``, hnswlib).

Reference: Yu. A. Malkov, D. A. Yashunin, "Efficient and robust approximate nearest neighbor
search using Hierarchical Navigable Small World graphs", IEEE TPAMI 2018.

Each node has a random top level (faiss's distribution, 1 / ln M); level 0 links each node to
at most 2M others, the upper levels to M. A search descends greedily from the entry point
through the upper levels, then runs a beam of ``efSearch`` nodes on level 0
(:mod:`vq.kernels.graph`). Nodes are inserted by batched, lock-free parallel insertion
(:mod:`vq.kernels.graph_build`): the graph depends on the seed and the data, never on the
number of threads. Storage (buffers):

- ``vectors`` float32 [ntotal, dim];
- ``neighbors`` int32 [ntotal, 2M]: level-0 neighbour lists, -1 after the last;
- ``levels`` int32 [ntotal]: each node's top level (faiss stores it plus one);
- ``upper_offsets`` int64 [ntotal + 1], ``upper_neighbors`` int32 [rows, M]: node v's list at
  level l >= 1 is row ``upper_offsets[v] + l - 1``;
- ``entry_point`` int64 [1] (-1 while empty), a node of the top level;
- with ``traversal="int8"``: ``codes`` int8 [ntotal, dim] and ``code_factors`` float32
  [ntotal, 2], what the search walks the graph on before re-ranking the beam exactly.

The static-shape search (ONNX export, the torch path off the CPU) is
:class:`vq.index.hnsw_static.HNSWSearch`; ``IVF…_HNSW<M>`` indexes route through
:meth:`HNSW.route`.
"""

from __future__ import annotations

import threading

import numpy as np
import torch

from vq import _cpu, kernels
from vq._checks import check_int, check_positive
from vq.index.base import Index
from vq.index.faiss_build import faiss_metric, import_faiss, with_id_map
from vq.index.hnsw_static import HNSWSearch
from vq.index.searching import NO_IDS, shape_problem
from vq.index.static import search_in_chunks
from vq.kernels import graph, graph_build

_MAX_LEVEL = 32
_TRAVERSALS = ("float", "int8")


class HNSW(Index):
    """HNSW graph over float32 vectors (faiss ``IndexHNSWFlat``; factory ``"HNSW32"``).

    Args:
        dim: vector dimension.
        M: neighbours per node on the upper levels (2M on level 0).
        metric: "l2" or "ip".
        k: neighbours ``forward`` returns.
        efConstruction: the beam of the insertion searches (faiss's default, 40).
        efSearch: the beam of a search (``search(..., efSearch=)`` overrides it per call;
            faiss's default, 16; at least k nodes are kept).
        seed: seeds the levels and the insertion order.
        verbose: unused (kept for the common signature).
        traversal: what the search walks the graph on: "float" (the vectors) or "int8"
            (int8 codes with a scale per vector, a quarter of the bytes per visit, the
            beam then re-ranked on the vectors: more queries per second at the same recall,
            for dim + 8 more bytes per vector; :func:`vq.kernels.graph.int8_codes`).
    """

    def __init__(
        self,
        dim: int,
        M: int = 32,
        metric: str = "l2",
        k: int = 10,
        efConstruction: int = 40,
        efSearch: int = 16,
        seed: int = 12345,
        verbose: bool = False,
        traversal: str = "float",
    ):
        super().__init__(dim, metric, k, verbose)
        if traversal not in _TRAVERSALS:
            raise ValueError(f"traversal must be one of {_TRAVERSALS}, got {traversal!r}")
        self.traversal = traversal
        self.M = check_int(M, "M", 2)
        self.efConstruction = check_int(efConstruction, "efConstruction", 1)
        self.efSearch = check_int(efSearch, "efSearch", 1)
        self.seed = check_int(seed, "seed", 0)
        self.register_buffer("vectors", torch.zeros(0, dim))
        self.register_buffer("neighbors", torch.zeros(0, 2 * self.M, dtype=torch.int32))
        self.register_buffer("levels", torch.zeros(0, dtype=torch.int32))
        self.register_buffer("upper_offsets", torch.zeros(1, dtype=torch.int64))
        self.register_buffer("upper_neighbors", torch.zeros(0, self.M, dtype=torch.int32))
        self.register_buffer("entry_point", torch.full((1,), -1, dtype=torch.int64))
        if traversal == "int8":
            self.register_buffer("codes", torch.zeros(0, dim, dtype=torch.int8))
            self.register_buffer("code_factors", torch.zeros(0, 2))
        self._seen_pool = _SeenPool()

    def config(self) -> dict:
        return {
            **super().config(),
            "M": self.M,
            "efConstruction": self.efConstruction,
            "efSearch": self.efSearch,
            "seed": self.seed,
            "traversal": self.traversal,
        }

    @property
    def ntotal(self) -> int:
        return int(self.vectors.shape[0])

    @property
    def max_level(self) -> int:
        """The top level of the graph (-1 while empty)."""
        e = int(self.entry_point[0])
        return -1 if e < 0 else int(self.levels[e])

    def growing_buffers(self) -> tuple[str, ...]:
        return (
            *super().growing_buffers(),
            "vectors",
            "neighbors",
            "levels",
            "upper_offsets",
            "upper_neighbors",
            *(("codes", "code_factors") if self.traversal == "int8" else ()),
        )

    # -- storage ------------------------------------------------------------------------------
    def _encode_batch(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"vectors": x.float()}

    def _store(self, encoded: dict[str, torch.Tensor], ids: torch.Tensor) -> None:
        """Append the vectors and insert them into the graph (on CPU arrays)."""
        device = self.vectors.device
        n0, new = self.ntotal, encoded["vectors"].cpu().numpy()
        rng = np.random.default_rng([self.seed, n0])
        new_levels = graph_build.random_levels(new.shape[0], self.M, rng)
        data = np.concatenate([self.vectors.cpu().numpy(), new])
        levels = np.concatenate([self.levels.cpu().numpy(), new_levels])
        nbr0 = np.full((data.shape[0], 2 * self.M), -1, np.int32)
        nbr0[:n0] = self.neighbors.cpu().numpy()
        up_off = np.concatenate([[0], np.cumsum(levels, dtype=np.int64)])
        up_nbr = np.full((int(up_off[-1]), self.M), -1, np.int32)
        up_nbr[: self.upper_neighbors.shape[0]] = self.upper_neighbors.cpu().numpy()
        # faiss's order: highest level first, a seeded shuffle within a level
        perm = n0 + rng.permutation(new.shape[0])
        order = perm[np.argsort(-new_levels[perm - n0], kind="stable")]
        entry, _ = graph_build.hnsw_insert(order, data, self.metric == "ip", levels, nbr0, up_off,
                                           up_nbr, int(self.entry_point[0]), self.max_level,
                                           self.efConstruction)  # fmt: skip
        self._append_ids(ids)
        self._set_graph(data, nbr0, levels, up_off, up_nbr, entry, device)
        if self.traversal == "int8":
            codes, factors = graph.int8_codes(new)
            self.codes = torch.cat([self.codes, torch.from_numpy(codes).to(device)])
            self.code_factors = torch.cat([self.code_factors, torch.from_numpy(factors).to(device)])

    def _set_graph(self, data, nbr0, levels, up_off, up_nbr, entry, device) -> None:
        self.vectors = torch.from_numpy(data).to(device)
        self.neighbors = torch.from_numpy(nbr0).to(device)
        self.levels = torch.from_numpy(levels.astype(np.int32)).to(device)
        self.upper_offsets = torch.from_numpy(up_off.astype(np.int64)).to(device)
        self.upper_neighbors = torch.from_numpy(up_nbr).to(device)
        self.entry_point = torch.tensor([entry], dtype=torch.int64, device=device)

    def remove_ids(self, ids) -> int:
        """Not supported, as in faiss's HNSW: a ValueError saying to rebuild the index."""
        raise ValueError(
            "HNSW cannot remove vectors (a graph node's links would dangle); build a new "
            "index from the vectors you keep"
        )

    def _keep(self, rows: torch.Tensor) -> None:  # pragma: no cover - remove_ids refuses
        raise ValueError("HNSW cannot remove vectors")

    def consistency_problem(self) -> str | None:
        problem = super().consistency_problem()
        n, M = self.ntotal, self.M
        for name, t, shape in (
            ("vectors", self.vectors, (n, self.dim)),
            ("neighbors", self.neighbors, (n, 2 * M)),
            ("levels", self.levels, (n,)),
            ("upper_offsets", self.upper_offsets, (n + 1,)),
            *(
                (("codes", self.codes, (n, self.dim)), ("code_factors", self.code_factors, (n, 2)))
                if self.traversal == "int8"
                else ()
            ),
        ):
            problem = problem or shape_problem(name, t, shape)
        if problem:
            return problem
        return graph_problem(
            self.neighbors, self.levels, self.upper_offsets, self.upper_neighbors,
            int(self.entry_point[0]), M,
        )  # fmt: skip

    # -- search -------------------------------------------------------------------------------
    def _search_work(self, nq: int, k: int, efSearch: int | None = None, **params) -> float:
        ef = max(self.efSearch if efSearch is None else efSearch, k)
        return nq * (ef * 2 * self.M * self._vector_ns() + 2000)

    def _arrays(self) -> tuple:
        """numpy views of the graph (CPU), kept until a buffer changes."""
        sources = tuple(self.buffers())

        def compute():
            arrays = (self.vectors, self.neighbors, self.upper_offsets, self.upper_neighbors)
            codes = (self.codes, self.code_factors) if self.traversal == "int8" else ()
            return tuple(t.cpu().contiguous().numpy() for t in (*arrays, *codes))

        return self._derived("graph_arrays", sources, compute)

    def _rows_numba(self, q: np.ndarray, k: int, ef: int, slots: int):
        data, nbr0, up_off, up_nbr, *codes = self._arrays()
        out_dist = np.empty((q.shape[0], k), np.float32)
        out_rows = np.empty((q.shape[0], k), np.int64)
        seen = self._seen_pool.take(slots, self.ntotal)
        try:
            graph.hnsw_search(q, data, self.metric == "ip", nbr0, up_off, up_nbr,
                              int(self.entry_point[0]), self.max_level, ef, seen, out_dist,
                              out_rows, tuple(codes) or None)  # fmt: skip
        finally:
            self._seen_pool.give_back(seen)
        return out_dist, out_rows

    def searcher(self, k=None, *, efSearch=None, steps=None, width=1, upper_steps=4, copy=True):
        """The search as a static-shape graph over a snapshot of the graph (``copy=False``:
        over the index's own): fixed greedy steps per upper level, then ``steps`` expansions
        of ``width`` nodes of a beam of efSearch (see :class:`HNSWSearch`; what
        :mod:`vq.export` writes out)."""
        return HNSWSearch(self, k, efSearch, steps, width, upper_steps, copy)

    def _search_ids(self, q: torch.Tensor, k: int, efSearch: int | None = None, allowed=None):
        if allowed is not None:
            raise NotImplementedError(
                "HNSW has no filtered search yet (allowed=): filter with a FlatIndex or an IVF "
                "index, or search HNSW with a larger k and drop the ids you do not want"
            )
        if self.ntotal == 0 or _cpu.fast_path(q):
            return super()._search_ids(q, k, efSearch=efSearch)
        return search_in_chunks(HNSWSearch(self, k, efSearch, copy=False), q, k)

    def _search_rows(self, q: torch.Tensor, k: int, efSearch: int | None = None):
        ef = check_positive(self.efSearch if efSearch is None else efSearch, "efSearch")
        qn = q.detach().cpu().contiguous().numpy()
        slots = kernels.threads.get_num_threads()
        dist, rows = self._rows_numba(qn, k, ef, slots)
        return torch.from_numpy(dist).to(q.device), torch.from_numpy(rows).to(q.device)

    def route(self, x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``k`` nearest stored rows of float32 CPU rows ``x`` [n, dim], as a coarse
        quantizer routes (faiss's IVF over an ``IndexHNSWFlat`` quantizer): values float32
        [n, k], ascending (squared L2, or negated inner products) and rows int64 [n, k]; a
        beam of max(efSearch, k)."""
        return self._search_rows(x, min(k, self.ntotal))

    def _lean_search(self):
        """A few queries: one kernel call on the calling thread, then ids."""
        ip = self.metric == "ip"
        ids = self.ids.numpy() if self.ids.shape[0] == self.ntotal else NO_IDS
        fill = np.float32(-np.inf if ip else np.inf)

        def search(q: np.ndarray, k: int, ranked: bool, params: dict):
            ef = params.get("efSearch")
            ef = self.efSearch if ef is None else check_positive(ef, "efSearch")
            if not kernels.all_finite(q):
                return None  # the general path says what is wrong
            kk = min(k, self.ntotal)
            dist, rows = self._rows_numba(q, kk, ef, 1)
            out_dist = np.empty((q.shape[0], k), np.float32)
            out_ids = np.empty((q.shape[0], k), np.int64)
            kernels.rows_to_ids(dist, rows, ids, ip, fill, out_dist, out_ids)
            return out_dist, out_ids

        return search

    # -- faiss ----------------------------------------------------------------------------------
    def to_faiss(self):
        """faiss ``IndexHNSWFlat`` with the same graph, vectors, entry point and efSearch (in
        an ``IndexIDMap`` unless the ids are 0 … ntotal - 1): it returns the same ids."""
        faiss = import_faiss()
        out = faiss.IndexHNSWFlat(self.dim, self.M, faiss_metric(self.metric))
        h = out.hnsw
        h.efConstruction, h.efSearch = self.efConstruction, self.efSearch
        levels = self.levels.cpu().numpy().astype(np.int64)
        cum = faiss.vector_to_array(h.cum_nneighbor_per_level).astype(np.int64)
        if self.ntotal and levels.max() + 1 >= len(cum):
            raise ValueError(f"faiss's HNSW{self.M} has no level {levels.max()}")
        nbr0, up_nbr = self.neighbors.cpu().numpy(), self.upper_neighbors.cpu().numpy()
        flat = faiss_neighbors(nbr0, levels, up_nbr)
        offsets = np.concatenate([[0], np.cumsum(cum[levels + 1])]).astype(np.uint64)
        faiss.copy_array_to_vector((levels + 1).astype(np.int32), h.levels)
        faiss.copy_array_to_vector(offsets, h.offsets)
        faiss.copy_array_to_vector(flat, h.neighbors)
        h.entry_point, h.max_level = int(self.entry_point[0]), self.max_level
        out.storage.add(self.vectors.float().cpu().numpy())
        out.ntotal = self.ntotal
        return with_id_map(out, self.stored_ids())


class _SeenPool:
    """Visit stamps (:func:`vq.kernels.graph.new_seen`) reused from search to search; each
    search takes its own, so that searches may run from many threads at once."""

    def __init__(self):
        self.lock = threading.Lock()
        self.free: list[np.ndarray] = []

    def take(self, slots: int, n: int) -> np.ndarray:
        with self.lock:
            for j, s in enumerate(self.free):
                if s.shape == (slots, n + 1):
                    return self.free.pop(j)
        return graph.new_seen(slots, n)

    def give_back(self, seen: np.ndarray) -> None:
        with self.lock:
            self.free = [s for s in self.free if s.shape[1] == seen.shape[1]][-7:] + [seen]

    def __reduce__(self):  # copies get an empty pool
        return (type(self), ())


def hnsw_from_faiss(f, metric: str) -> HNSW:
    """An :class:`HNSW` with the graph, vectors, entry point, efConstruction and efSearch of
    the faiss ``IndexHNSWFlat`` ``f`` (its ``storage`` an ``IndexFlat``)."""
    faiss = import_faiss()
    h = f.hnsw
    M = int(h.nb_neighbors(1))
    cum = faiss.vector_to_array(h.cum_nneighbor_per_level).astype(np.int64)
    if len(cum) < 2 or cum[1] != 2 * M or np.any(np.diff(cum[1:]) != M):
        raise ValueError("only faiss HNSW graphs with 2M level-0 and M upper links convert")
    storage = faiss.downcast_index(f.storage)
    if not isinstance(storage, faiss.IndexFlat):
        raise ValueError(f"only IndexHNSWFlat converts, got storage {type(storage).__name__}")
    out = HNSW(f.d, M, metric, efConstruction=int(h.efConstruction), efSearch=int(h.efSearch))
    n = f.ntotal
    levels = faiss.vector_to_array(h.levels).astype(np.int64) - 1
    offsets = faiss.vector_to_array(h.offsets).astype(np.int64)
    flat = faiss.vector_to_array(h.neighbors).astype(np.int32)
    if levels.shape != (n,) or offsets.shape != (n + 1,) or (n and levels.min() < 0):
        raise ValueError("the faiss HNSW graph does not match its ntotal")
    nbr0 = flat[offsets[:-1, None] + np.arange(2 * M)] if n else np.zeros((0, 2 * M), np.int32)
    up_off = np.concatenate([[0], np.cumsum(levels)]).astype(np.int64)
    owner = np.repeat(np.arange(n), levels)
    within = np.arange(int(up_off[-1])) - up_off[owner]
    starts = offsets[owner] + 2 * M + within * M
    up_nbr = flat[starts[:, None] + np.arange(M)].reshape(-1, M)
    data = storage.reconstruct_n(0, n) if n else np.zeros((0, f.d), np.float32)
    entry = int(h.entry_point) if n else -1
    out._set_graph(data, nbr0, levels, up_off, up_nbr, entry, torch.device("cpu"))
    out.check_consistent()
    return out


def faiss_neighbors(nbr0: np.ndarray, levels: np.ndarray, up_nbr: np.ndarray) -> np.ndarray:
    """faiss's flat neighbour array (per node: 2M level-0 slots, then M per upper level)."""
    n, M = nbr0.shape[0], up_nbr.shape[1]
    sizes = 2 * M + levels * M
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    flat = np.full(int(offsets[-1]), -1, np.int32)
    flat[offsets[:-1, None] + np.arange(2 * M)] = nbr0
    owner = np.repeat(np.arange(n), levels)
    within = np.arange(owner.shape[0]) - np.repeat(np.cumsum(levels) - levels, levels)
    flat[(offsets[owner] + 2 * M + within * M)[:, None] + np.arange(M)] = up_nbr
    return flat


def graph_problem(nbr0, levels, up_off, up_nbr, entry: int, M: int) -> str | None:
    """What makes these graph arrays unsafe to search (a neighbour out of range, an upper
    link to a node without that level, offsets that do not follow the levels, a bad entry
    point), in words, or None."""
    n = nbr0.shape[0]
    if n and (int(levels.min()) < 0 or int(levels.max()) > _MAX_LEVEL):
        return f"node levels outside [0, {_MAX_LEVEL}]"
    if int(up_off[0]) != 0 or not torch.equal(up_off.diff(), levels.long()):
        return "upper-level offsets that do not follow the node levels"
    problem = shape_problem("upper_neighbors", up_nbr, (int(up_off[-1]), M))
    if problem:
        return problem
    for name, t in (("neighbors", nbr0), ("upper_neighbors", up_nbr)):
        if t.numel() and (int(t.min()) < -1 or int(t.max()) >= n):
            return f"{name} ids outside [-1, {n})"
    if up_nbr.numel():
        row_level = torch.arange(up_nbr.shape[0]) - torch.repeat_interleave(
            up_off[:-1], levels.long()
        )
        row_level = row_level + 1
        target = levels.long()[up_nbr.long().clamp_min(0)]
        if bool(((up_nbr >= 0) & (target < row_level[:, None])).any()):
            return "upper-level links to nodes without that level"
    if n == 0:
        return None if entry == -1 else f"entry point {entry} in an empty graph"
    if not 0 <= entry < n or int(levels[entry]) != int(levels.max()):
        return f"entry point {entry} that is not a node of the top level"
    return None
