"""A graph index: Hierarchical Navigable Small World graphs over the full vectors (faiss
``IndexHNSWFlat``, hnswlib; Yu. A. Malkov, D. A. Yashunin, "Efficient and robust approximate
nearest neighbor search using Hierarchical Navigable Small World graphs", IEEE TPAMI 2018).

Each node has a random top level (faiss's distribution, 1 / ln M); level 0 links each node to
at most 2M others, the upper levels to M. A search descends greedily from the entry point
through the upper levels, then runs a beam of ``efSearch`` nodes on level 0
(:mod:`vq.kernels.graph.graph_search`). Nodes are inserted by batched, lock-free parallel insertion
(:mod:`vq.kernels.graph.graph_build`): the graph depends on the seed and the data, never on the
number of threads. Storage (buffers):

- ``vectors`` float32 [ntotal, dim];
- ``neighbors`` int32 [ntotal, 2M]: level-0 neighbour lists, -1 after the last;
- ``levels`` int32 [ntotal]: each node's top level (faiss stores it plus one);
- ``upper_offsets`` int64 [ntotal + 1], ``upper_neighbors`` int32 [rows, M]: node v's list at
  level l >= 1 is row ``upper_offsets[v] + l - 1``;
- ``entry_point`` int64 [1] (-1 while empty), a node of the top level;
- with ``traversal="int8"``: ``codes`` int8 [ntotal, dim] and ``code_factors`` float32
  [ntotal, 2], what the search walks the graph on before re-ranking the beam exactly;
- with ``traversal="rabitq"``: ``codes`` uint8 [ntotal, ceil(dim / 8)], RaBitQ's sign bits
  (J. Gao, C. Long, SIGMOD 2024; faiss ``IndexRaBitQ``'s codes), ``code_factors`` float32
  [ntotal, 3] (:data:`vq.quantizers.rabitq.FACTORS`), ``rotation`` float32 [dim, dim] (drawn
  from the seed) and ``center`` float32 [dim] (the mean of the first batch added): the beam
  ranks by exact distances, but reads a neighbour's vector only where its RaBitQ estimate
  (1 bit a dimension, a query of 4 bits) less the estimate's error bound is nearer than the
  beam's farthest node (:func:`vq.kernels.graph.graph_store.fresh_distances`).

A filtered search (``allowed=``) walks the graph through every node and keeps only allowed
ones (faiss's HNSW with an ``IDSelector``); few allowed rows, or a walk that met fewer than k
of them, are scanned exactly instead (:func:`vq.index.graph.hnsw_graph.filtered_search`), so that
k results come back wherever k ids are allowed. ``range_search`` is approximate, as faiss's:
the hits among the results of a wide beam. :class:`vq.index.HNSWSQ` keeps scalar-quantizer
codes instead of the vectors.

The torch path (CUDA tensors, ``vq._cpu.torch_only()``, ONNX export) is the static-shape search
:class:`vq.index.graph.hnsw_searcher.HNSWSearch`: fixed steps over a fixed beam, near the kernel's
results, not always equal; ``IVF…_HNSW<M>`` indexes route through :meth:`HNSW.route`.
"""

from __future__ import annotations

import numpy as np
import torch

from vq._checks import check_int, check_positive, check_seed
from vq.index.core.base import Index
from vq.index.core.faiss_build import import_faiss
from vq.index.core.filters import IdFilter
from vq.index.core.ranges import by_query
from vq.index.core.registry import register
from vq.index.core.searching import shape_problem
from vq.index.graph.hnsw_graph import (
    SeenPool,
    filtered_rows,
    graph_from_faiss,
    graph_problem,
    hnsw_flat_to_faiss,
    insertion_codes,
)
from vq.index.graph.hnsw_lean import hnsw_lean_search
from vq.index.graph.hnsw_searcher import HNSWSearch
from vq.kernels.common.bundles import Graph, TopK
from vq.kernels.common.threads import get_num_threads
from vq.kernels.graph import graph_build, graph_store
from vq.kernels.graph import graph_search as graph
from vq.kernels.rabitq.rabitq_scans import code_words
from vq.quantizers.rabitq import code_size, rabitq_encode, random_rotation

_TRAVERSALS = ("float", "int8", "rabitq")
#: the largest M (2M neighbours a node on level 0, int32 node numbers)
MAX_M = 1 << 15
#: the least beam of a range search (see ``HNSW.range_hits``)
RANGE_EF = 256


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
        traversal: what the search walks the graph on: "float" (the vectors), "int8"
            (int8 codes with a scale per vector, a quarter of the bytes per visit, the
            beam then re-ranked on the vectors: more queries per second at the same recall,
            for dim + 8 more bytes per vector; :func:`vq.kernels.graph.graph_store.int8_codes`)
            or "rabitq" (RaBitQ's 1-bit codes: the vectors read only of the neighbours
            whose estimate may put them in the beam; dim / 8 + 12 more bytes per vector).
            The torch path (:meth:`searcher`) walks the vectors whatever the traversal.
    """

    static_search = HNSWSearch  #: the class of :meth:`searcher`
    search_params = ("efSearch",)
    #: a filtered search runs the numba kernels (on CPU copies off the CPU), which scan the
    #: allowed rows where the walk meets too few: k results wherever k ids are allowed
    torch_filters = False

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
        self.M = check_int(M, "M", 2, MAX_M)
        self.efConstruction = check_int(efConstruction, "efConstruction", 1)
        self.efSearch = check_int(efSearch, "efSearch", 1)
        self.seed = check_seed(seed)
        self.register_buffer("vectors", torch.zeros(0, dim))
        self.register_buffer("neighbors", torch.zeros(0, 2 * self.M, dtype=torch.int32))
        self.register_buffer("levels", torch.zeros(0, dtype=torch.int32))
        self.register_buffer("upper_offsets", torch.zeros(1, dtype=torch.int64))
        self.register_buffer("upper_neighbors", torch.zeros(0, self.M, dtype=torch.int32))
        self.register_buffer("entry_point", torch.full((1,), -1, dtype=torch.int64))
        if traversal == "int8":
            self.register_buffer("codes", torch.zeros(0, dim, dtype=torch.int8))
            self.register_buffer("code_factors", torch.zeros(0, 2))
        if traversal == "rabitq":
            self.register_buffer("codes", torch.zeros(0, code_size(dim), dtype=torch.uint8))
            self.register_buffer("code_factors", torch.zeros(0, 3))
            self.register_buffer("rotation", random_rotation(dim, self.seed))
            self.register_buffer("center", torch.zeros(dim))
        self._seen_pool = SeenPool()

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
        graph = ("vectors", "neighbors", "levels", "upper_offsets", "upper_neighbors")
        codes = ("codes", "code_factors") if self.traversal != "float" else ()
        return (*super().growing_buffers(), *graph, *codes)

    def data_buffers(self) -> tuple[str, ...]:
        center = ("center",) if self.traversal == "rabitq" else ()  # (set by the first add)
        return (*super().data_buffers(), "entry_point", *center)  # (stored data, not training)

    def reset_rows(self) -> None:
        super().reset_rows()
        self.upper_offsets = self.upper_offsets.new_zeros(1)
        self.entry_point = torch.full_like(self.entry_point, -1)

    def decode_rows(self, rows: torch.Tensor) -> torch.Tensor:
        return self.vectors[rows.to(self.device)].float()

    def _stored_rows(self) -> dict[str, torch.Tensor]:
        """What ``encode_batch`` made of the stored vectors ([ntotal] rows each): what
        ``merge_from`` inserts into another graph."""
        return {"vectors": self.vectors}

    def merge_rows(self, other, shift: int) -> None:
        """``other``'s nodes inserted into this graph as an ``add`` of their stored vectors
        (codes) would insert them, ``add_batch_size`` at a time, with the ids they had there
        (``shift`` added: a wrapper's rows); the same graph as adding them here after the
        vectors stored already. On an error, the graph as it was."""
        ids = self._merged_ids(other, shift)
        rows, step = other._stored_rows(), self.add_batch_size
        before = {name: self._buffers[name] for name in self.data_buffers()}
        try:
            for s in range(0, other.ntotal, step):
                batch = {name: t[s : s + step].to(self.device) for name, t in rows.items()}
                self._store(batch, ids[s : s + step])
        except BaseException:
            self._buffers.update(before)
            raise

    # -- storage ------------------------------------------------------------------------------
    def encode_batch(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"vectors": x.float()}

    def _build_vectors(self, encoded: dict[str, torch.Tensor]) -> np.ndarray:
        """float32 [ntotal + b, dim]: every vector the insertion compares (the stored ones,
        then the batch's)."""
        return np.concatenate([self.vectors.cpu().numpy(), encoded["vectors"].cpu().numpy()])

    def _keep_batch(self, encoded: dict[str, torch.Tensor], data: np.ndarray) -> None:
        """Keep what the search reads of the batch: the vectors (``data``, all of them) and,
        for an int8 or RaBitQ traversal, the batch's codes (RaBitQ's about the mean of the
        first batch added to an empty index, kept as ``center``)."""
        device, first = self.neighbors.device, self.ntotal == 0
        self.vectors = torch.from_numpy(data).to(device)
        if self.traversal == "int8":
            codes, factors = graph_store.int8_codes(encoded["vectors"].cpu().numpy())
            codes, factors = torch.from_numpy(codes), torch.from_numpy(factors)
        elif self.traversal == "rabitq":
            batch = encoded["vectors"].cpu().float()
            if first:
                self.center = batch.mean(dim=0).to(device)
            codes, factors = self.rabitq_codes(batch)
        else:
            return
        self.codes = torch.cat([self.codes, codes.to(device)])
        self.code_factors = torch.cat([self.code_factors, factors.to(device)])

    def rabitq_codes(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """RaBitQ's codes of float32 CPU rows ``x`` [n, dim] about this graph's ``center``
        (``traversal="rabitq"``): sign bits uint8 [n, ceil(dim / 8)] and factors float32 [n,
        3] (:func:`vq.quantizers.rabitq.rabitq_encode`)."""
        rotation = self.rotation.cpu()
        return rabitq_encode(x @ rotation, self.center.cpu() @ rotation, self.metric)

    def kernels_ahead(self) -> None:
        """``Index.kernels_ahead``: the linking kernels of the insertion
        (:func:`vq.kernels.graph.graph_build.link_kernels_ahead`), so that a first build
        compiles them in the background while it compiles its insertion kernel here."""
        super().kernels_ahead()
        graph_build.link_kernels_ahead(self.metric == "ip")

    def _store(self, encoded: dict[str, torch.Tensor], ids: torch.Tensor) -> None:
        """Insert the batch into the graph (on CPU arrays) and keep it."""
        n0 = self.ntotal
        graph_build.link_kernels_ahead(self.metric == "ip")  # (before the vectors' preparation)
        data = self._build_vectors(encoded)
        b = data.shape[0] - n0
        rng = np.random.default_rng([self.seed, n0])
        new_levels = graph_build.random_levels(b, self.M, rng)
        levels = np.concatenate([self.levels.cpu().numpy(), new_levels])
        nbr0 = np.full((data.shape[0], 2 * self.M), -1, np.int32)
        nbr0[:n0] = self.neighbors.cpu().numpy()
        up_off = np.concatenate([[0], np.cumsum(levels, dtype=np.int64)])
        up_nbr = np.full((int(up_off[-1]), self.M), -1, np.int32)
        up_nbr[: self.upper_neighbors.shape[0]] = self.upper_neighbors.cpu().numpy()
        # faiss's order: highest level first, a seeded shuffle within a level
        perm = n0 + rng.permutation(b)
        order = perm[np.argsort(-new_levels[perm - n0], kind="stable")]
        stored = self._search_store()[1:] if self.traversal == "int8" else ()
        codes = insertion_codes(data, n0, stored)  # what the insertions walk (or None)
        arrays = Graph(nbr0, up_off, up_nbr, int(self.entry_point[0]), self.max_level)
        walk, ip = graph.traversal(data, codes), self.metric == "ip"
        entry, _ = graph_build.hnsw_insert(order, arrays, walk, ip, levels, self.efConstruction)
        self._append_ids(ids)
        self._set_graph(None, nbr0, levels, up_off, up_nbr, entry, self.neighbors.device)
        self._keep_batch(encoded, data)

    def _set_graph(self, data, nbr0, levels, up_off, up_nbr, entry, device) -> None:
        if data is not None:
            self.vectors = torch.from_numpy(data).to(device)
        self.neighbors = torch.from_numpy(nbr0).to(device)
        self.levels = torch.from_numpy(levels.astype(np.int32)).to(device)
        self.upper_offsets = torch.from_numpy(up_off.astype(np.int64)).to(device)
        self.upper_neighbors = torch.from_numpy(up_nbr).to(device)
        self.entry_point = torch.tensor([entry], dtype=torch.int64, device=device)

    def remove_stored(self, ids: torch.Tensor) -> int:
        """Not supported, as in faiss's HNSW: a ValueError saying to rebuild the index (before
        anything changes: a wrapper removing its own rows asks this index first)."""
        raise ValueError(
            "HNSW cannot remove vectors (a graph node's links would dangle); build a new "
            "index from the vectors you keep"
        )

    def consistency_problem(self) -> str | None:
        n, M = self.ntotal, self.M
        problem = super().consistency_problem() or self._storage_problem()
        for name, t, shape in (
            ("neighbors", self.neighbors, (n, 2 * M)),
            ("levels", self.levels, (n,)),
            ("upper_offsets", self.upper_offsets, (n + 1,)),
        ):
            problem = problem or shape_problem(name, t, shape)
        if problem:
            return problem
        return graph_problem(
            self.neighbors,
            self.levels,
            self.upper_offsets,
            self.upper_neighbors,
            int(self.entry_point[0]),
            M,
        )

    def _storage_problem(self) -> str | None:
        """``consistency_problem`` for what the search reads of the nodes."""
        n = self.ntotal
        checks = [("vectors", self.vectors, (n, self.dim))]
        if self.traversal != "float":
            int8 = self.traversal == "int8"
            checks += [
                ("codes", self.codes, (n, self.dim if int8 else code_size(self.dim))),
                ("code_factors", self.code_factors, (n, 2 if int8 else 3)),
            ]
        problems = (shape_problem(name, t, shape) for name, t, shape in checks)
        return next((p for p in problems if p), None)

    # -- search -------------------------------------------------------------------------------
    def search_work(self, nq: int, k: int, efSearch: int | None = None, **params) -> float:
        ef = max(self.efSearch if efSearch is None else efSearch, k)
        return nq * (ef * 2 * self.M * self.vector_ns() + 2000)

    def _arrays(self) -> tuple:
        """numpy views of the graph (CPU), kept until a buffer changes."""
        sources = tuple(self.buffers())

        def compute():
            graph_arrays = (self.neighbors, self.upper_offsets, self.upper_neighbors)
            data, *codes = self._search_store()
            return (data, *(t.cpu().contiguous().numpy() for t in graph_arrays), *codes)

        return self.derived("graph_arrays", sources, compute)

    def _search_store(self) -> tuple:
        """What :func:`vq.kernels.graph.graph_search.hnsw_search` reads of the nodes, numpy: the
        vectors, then the int8 codes and their factors for an int8 traversal, or the RaBitQ
        codes as 64-bit words, their factors and the query's transform (the rotation's rows,
        then the rotated centre) for a RaBitQ one."""
        codes = (self.codes, self.code_factors) if self.traversal != "float" else ()
        arrays = tuple(t.cpu().contiguous().numpy() for t in (self.vectors, *codes))
        if self.traversal != "rabitq":
            return arrays
        rotation = self.rotation.cpu()
        transform = torch.cat([rotation, (self.center.cpu() @ rotation)[None]]).contiguous()
        return arrays[0], code_words(arrays[1]), arrays[2], transform.numpy()

    def _rows_numba(self, q: np.ndarray, k: int, ef: int, slots: int, mask=graph.NO_FILTER):
        data, nbr0, up_off, up_nbr, *codes = self._arrays()
        out_dist = np.empty((q.shape[0], k), np.float32)
        out_rows = np.empty((q.shape[0], k), np.int64)
        seen = self._seen_pool.take(slots, self.ntotal)
        try:
            arrays = Graph(nbr0, up_off, up_nbr, int(self.entry_point[0]), self.max_level)
            walk, out = graph.traversal(data, tuple(codes) or None), TopK(out_dist, out_rows)
            graph.hnsw_search(q, arrays, walk, self.metric == "ip", ef, seen, out, mask)
        finally:
            self._seen_pool.give_back(seen)
        return out_dist, out_rows

    def searcher(self, k=None, *, efSearch=None, steps=None, width=1, upper_steps=4, copy=True):
        """The search as a static-shape graph over a snapshot of the graph (``copy=False``:
        over the index's own): fixed greedy steps per upper level, then ``steps`` expansions
        of ``width`` nodes of a beam of efSearch (see :class:`HNSWSearch`; what
        :mod:`vq.export` writes out)."""
        return self.static_search(self, k, efSearch, steps, width, upper_steps, copy)

    def torch_searcher(self) -> HNSWSearch:
        """The torch path (a re-ranking wrapper's too): the static search over the index's own
        graph (``searcher(copy=False)``), kept until a buffer changes; a beam of efSearch."""
        searcher = super().torch_searcher()
        searcher.efSearch = self.efSearch
        return searcher

    def search_rows(
        self, q: torch.Tensor, k: int, efSearch: int | None = None, allowed: IdFilter | None = None
    ):
        """The k nearest rows; under a filter (``allowed``), the graph walks every node and
        only allowed ones are returned (faiss's HNSW with an ``IDSelector``), and where
        few rows are allowed, or the walk met fewer than k of them, those rows are scanned
        exactly: k results wherever k rows are allowed."""
        ef = check_positive(self.efSearch if efSearch is None else efSearch, "efSearch")
        qn = q.detach().cpu().contiguous().numpy()
        slots = get_num_threads()
        if allowed is None:
            dist, rows = self._rows_numba(qn, k, ef, slots)
        else:
            dist, rows = filtered_rows(self, qn, k, ef, slots, allowed)
        return torch.from_numpy(dist).to(q.device), torch.from_numpy(rows).to(q.device)

    def range_hits(self, q: torch.Tensor, radius: float, allowed, efSearch: int | None = None):
        """Approximate, as faiss's HNSW range search: the results of a search with a beam of
        efSearch (default max(self.efSearch, :data:`RANGE_EF`)) that lie within the radius;
        a vector the beam does not reach is missed, and a query has at most efSearch hits
        (raise efSearch for a wide radius)."""
        ef = check_positive(
            max(self.efSearch, RANGE_EF) if efSearch is None else efSearch, "efSearch"
        )
        k, ip, parts = min(ef, self.ntotal), self.metric == "ip", []
        slots = get_num_threads()
        for s in range(0, q.shape[0], self.search_batch_size):
            qs = q[s : s + self.search_batch_size].contiguous().numpy()
            if allowed is None:
                dist, rows = self._rows_numba(qs, k, ef, slots)
            else:
                dist, rows = filtered_rows(self, qs, k, ef, slots, allowed)
            hit = (rows >= 0) & (dist < (-radius if ip else radius))
            parts.append(by_query(np.nonzero(hit)[0] + s, rows[hit], dist[hit]))
        return parts

    def route(self, x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``k`` nearest stored rows of float32 CPU rows ``x`` [n, dim], as a coarse
        quantizer routes (faiss's IVF over an ``IndexHNSWFlat`` quantizer): values float32
        [n, k], ascending (squared L2, or negated inner products) and rows int64 [n, k]; a
        beam of max(efSearch, k)."""
        return self.search_rows(x, min(k, self.ntotal))

    def build_lean_search(self):
        """A few queries: one kernel call on the calling thread, to ids (see
        :func:`vq.index.graph.hnsw_lean.hnsw_lean_search`)."""
        return hnsw_lean_search(self)

    # -- faiss ----------------------------------------------------------------------------------
    def faiss_counterpart(self):
        """faiss ``IndexHNSWFlat`` with the same graph, vectors, entry point and efSearch (in
        an ``IndexIDMap`` unless the ids are 0 … ntotal - 1): it returns the same ids."""
        return hnsw_flat_to_faiss(self)

    @classmethod
    def from_faiss(cls, f, metric: str) -> HNSW:
        """An HNSW with the graph, vectors, entry point, efConstruction and efSearch of the
        faiss ``IndexHNSWFlat`` ``f`` (its ``storage`` an ``IndexFlat``)."""
        faiss = import_faiss()
        storage = faiss.downcast_index(f.storage)
        if not isinstance(storage, faiss.IndexFlat):
            raise ValueError(f"only IndexHNSWFlat converts, got storage {type(storage).__name__}")
        M, nbr0, levels, up_off, up_nbr, entry = graph_from_faiss(faiss, f)
        h = f.hnsw
        out = cls(f.d, M, metric, efConstruction=int(h.efConstruction), efSearch=int(h.efSearch))
        data = storage.reconstruct_n(0, f.ntotal) if f.ntotal else np.zeros((0, f.d), np.float32)
        out._set_graph(data, nbr0, levels, up_off, up_nbr, entry, torch.device("cpu"))
        out.check_consistent()
        return out


register(
    HNSW,
    example="HNSW16",
    factory=r"HNSW(\d+)(?:,Flat)?",
    build=lambda m, dim, metric: HNSW(dim, int(m[1]), metric),
    syntax="HNSW<M>[,Flat]",
    faiss=("IndexHNSWFlat",),
)
