"""Inverted-file indexes: a coarse k-means quantizer routes each vector to one of ``nlist``
lists; a search scans only the ``nprobe`` lists nearest to the query.

Reference: J. Sivic, A. Zisserman, "Video Google", ICCV 2003; H. Jégou, M. Douze, C. Schmid,
"Product quantization for nearest neighbor search", IEEE TPAMI 2011 (IVFADC).

Storage is CSR: the rows of list l are ``offsets[l]:offsets[l + 1]`` of every stored buffer
(``ids``, and ``vectors`` or ``codes``), so a scan reads one contiguous range per probe.

This module holds what the IVF kinds share (:class:`IVFIndex`, the static-shape probe and
:class:`IVFSearch`); the kinds sit beside it: :class:`vq.index.IVFFlat` in ivfflat.py,
:class:`vq.index.IVFPQ` in ivfpq.py.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np
import torch

from vq import _cpu, kernels
from vq._checks import check_int, check_positive, check_training_size
from vq.clustering import kmeans
from vq.index.base import Index
from vq.index.faiss_build import faiss_metric, fill_inverted_lists, import_faiss, keep_alive
from vq.index.hnsw import HNSW
from vq.index.searching import NO_IDS
from vq.index.static import INF, Searcher, kept, search_in_chunks
from vq.quantizers import VectorQuantizer

_NO_NORMS = np.zeros(0, np.float32)


class IVFIndex(Index):
    """Shared by :class:`IVFFlat` and :class:`IVFPQ`: the coarse quantizer, the CSR inverted
    lists and the probe step. Subclasses name their per-vector buffers in ``_row_buffers``.

    Args:
        dim: vector dimension.
        nlist: number of inverted lists (coarse centroids).
        metric: "l2" or "ip" (lists are probed by the same metric, as faiss does).
        k: neighbours ``forward`` returns.
        nprobe: lists scanned per query (``search(..., nprobe=)`` overrides it per call).
        coarse_niter: k-means iterations of the coarse quantizer (faiss's IVF default, 10).
        seed: seeds the coarse k-means.
        verbose: progress bars for train and add.
        coarse_hnsw: M of an HNSW graph over the centroids that routes vectors and queries
            instead of a scan of all nlist (faiss's ``IVF65536_HNSW32``); 0: the scan.

    Submodules and buffers:
        quantizer: :class:`vq.VectorQuantizer` with ``codebook`` float32 [nlist, dim];
        coarse_graph: :class:`vq.HNSW` over the centroids (with ``coarse_hnsw``);
        offsets: int64 [nlist + 1]; ids: int64 [ntotal], in list order.
    """

    _row_buffers: tuple[str, ...] = ()

    def __init__(
        self,
        dim: int,
        nlist: int,
        metric: str = "l2",
        k: int = 10,
        nprobe: int = 1,
        *,
        coarse_niter: int = 10,
        seed: int = 1234,
        verbose: bool = False,
        coarse_hnsw: int = 0,
    ):
        super().__init__(dim, metric, k, verbose)
        self.coarse_hnsw = check_int(coarse_hnsw, "coarse_hnsw", 0)
        if self.coarse_hnsw:
            self.coarse_graph = HNSW(dim, self.coarse_hnsw, metric)
        self.nlist = check_int(nlist, "nlist", 1)
        self.nprobe = check_positive(nprobe, "nprobe")
        self.coarse_niter, self.seed = coarse_niter, seed
        self.quantizer = VectorQuantizer(dim, nlist, niter=coarse_niter, seed=seed)
        self.register_buffer("offsets", torch.zeros(nlist + 1, dtype=torch.int64))

    @property
    def is_trained(self) -> bool:
        return self.quantizer.is_trained

    def config(self) -> dict:
        return {
            **super().config(),
            "nlist": self.nlist,
            "nprobe": self.nprobe,
            "coarse_niter": self.coarse_niter,
            "seed": self.seed,
            **({"coarse_hnsw": self.coarse_hnsw} if self.coarse_hnsw else {}),
        }

    def list_sizes(self) -> torch.Tensor:
        """int64 [nlist]: vectors stored in each inverted list."""
        return self.offsets.diff()

    def growing_buffers(self) -> tuple[str, ...]:
        return (*super().growing_buffers(), *self._row_buffers)

    def consistency_problem(self) -> str | None:
        problem = super().consistency_problem() or self._rows_problem()
        o, n = self.offsets, self.ntotal
        if problem is None and (
            o.shape != (self.nlist + 1,) or o[0] != 0 or o[-1] != n or bool((o.diff() < 0).any())
        ):
            problem = "inverted-list offsets that do not match the stored vectors"
        return problem

    def _rows_problem(self) -> str | None:
        """``consistency_problem`` of the kind's per-vector buffers (``_row_buffers``)."""
        return None

    def to_faiss(self):
        """The faiss IVF index of this kind (flat coarse quantizer, the same centroids, lists,
        ids and nprobe): the kind's ``_empty_faiss`` filled with its inverted lists."""
        quantizer = import_faiss().IndexFlat(self.dim, faiss_metric(self.metric))
        quantizer.add(self.quantizer.codebook.float().cpu().numpy())
        quantizer = self.coarse_graph.to_faiss() if self.coarse_hnsw else quantizer
        out, data = self._empty_faiss(quantizer)
        keep_alive(out, quantizer)
        out.is_trained = True
        out.nprobe = self.nprobe
        fill_inverted_lists(out, data, self.offsets.cpu().numpy(), self.ids.cpu().numpy())
        out.ntotal = self.ntotal
        return out

    def _empty_faiss(self, quantizer) -> tuple:
        """The kind's empty faiss ``IndexIVF`` around the coarse ``quantizer``, and what its
        lists store per vector: uint8 [ntotal, code_size], in list order."""
        raise NotImplementedError

    # -- training and routing -------------------------------------------------------------
    def _train_coarse(self, x: torch.Tensor) -> None:
        check_training_size(x.shape[0], self.nlist, f"{type(self).__name__}.train")
        # k-means++ rather than faiss's random start: recall at equal nprobe is what the
        # partition buys, worth the seeding's cost at training time
        result = kmeans(
            x,
            self.nlist,
            niter=self.coarse_niter,
            init="k-means++",
            seed=self.seed,
            verbose=self.verbose,
        )
        self.quantizer.codebook.copy_(result.centroids)
        self.quantizer.mark_trained()
        if self.coarse_hnsw:
            self.coarse_graph = HNSW(self.dim, self.coarse_hnsw, self.metric)
            self.coarse_graph.add(result.centroids)

    def _assign(self, x: torch.Tensor) -> torch.Tensor:
        """int64 [n]: the list of each vector (nearest centroid, or largest inner product)."""
        if self.coarse_hnsw:
            return self.coarse_graph.route(x.float().cpu(), 1)[1][:, 0].to(x.device)
        if self.metric == "l2":
            return self.quantizer.encode_rows(x).long()
        return (x @ self.quantizer.codebook.float().T).argmax(dim=1)

    def _search_work(self, nq: int, k: int, nprobe: int | None = None, **params) -> float:
        nprobe = min(self.nprobe if nprobe is None else nprobe, self.nlist)
        scanned = nprobe * self.ntotal / self.nlist * self._vector_ns()
        return nq * (self.nlist * self.dim / 16 + scanned + 2000)

    def _centroid_norms(self) -> np.ndarray:
        """float32 [nlist]: the squared norms of the coarse centroids."""
        c = self.quantizer.codebook
        return self._derived("centroid_norms", (c,), lambda: (c.float() ** 2).sum(1).numpy())

    def _probe_numba(self, q: torch.Tensor, nprobe: int) -> tuple[torch.Tensor, torch.Tensor]:
        """:func:`probe` on CPU: BLAS inner products, then a numba kernel keeps each row's
        ``nprobe`` best (faster than ``torch.topk`` for the small k of an nprobe)."""
        if self.coarse_hnsw:  # the graph's search instead
            return self.coarse_graph.route(q, nprobe)
        c = self.quantizer.codebook.float()
        ip = self.metric == "ip"
        norms = np.zeros(0, np.float32) if ip else self._centroid_norms()
        scores = np.empty((q.shape[0], nprobe), np.float32)
        lists = np.empty((q.shape[0], nprobe), np.int64)
        step = max(1, (1 << 22) // self.nlist)  # at most 16 MiB of products at a time
        for s in range(0, q.shape[0], step):
            chunk = q[s : s + step]
            products = torch.mm(chunk, c.T).numpy()
            kernels.smallest_k_rows(
                products, chunk.numpy(), norms, ip, scores[s : s + step], lists[s : s + step]
            )
        return torch.from_numpy(scores), torch.from_numpy(lists)

    # -- storage --------------------------------------------------------------------------
    def _store(self, encoded: dict[str, torch.Tensor], ids: torch.Tensor) -> None:
        """Insert the new rows at the end of their lists (CSR merge, O(ntotal))."""
        lists = encoded.pop("lists")
        old_sizes = self.list_sizes()
        new_sizes = torch.bincount(lists, minlength=self.nlist)
        order = torch.argsort(lists, stable=True)
        sorted_lists = lists[order]
        new_offsets = self.offsets.clone()
        new_offsets[1:] += torch.cumsum(new_sizes, 0)
        # old row r of list l moves by the new rows inserted in lists before l; the j-th new row
        # (sorted by list) lands after the old rows of its list: j + old offsets[l + 1]
        arange_lists = torch.arange(self.nlist, device=self.device)
        old_lists = torch.repeat_interleave(arange_lists, old_sizes)
        old_pos = torch.arange(self.ntotal, device=self.device) + (
            new_offsets[:-1] - self.offsets[:-1]
        ).index_select(0, old_lists)
        new_pos = torch.arange(lists.shape[0], device=self.device) + self.offsets[1:].index_select(
            0, sorted_lists
        )
        total = self.ntotal + lists.shape[0]
        encoded["ids"] = ids
        for name in (*self._row_buffers, "ids"):
            old, new = getattr(self, name), encoded[name].to(getattr(self, name).dtype)
            merged = old.new_empty((total, *old.shape[1:]))
            merged[old_pos] = old
            merged[new_pos] = new[order]
            setattr(self, name, merged)
        self.offsets = new_offsets

    def _keep(self, rows: torch.Tensor) -> None:
        lists = torch.repeat_interleave(
            torch.arange(self.nlist, device=self.device), self.list_sizes()
        )
        sizes = torch.bincount(lists[rows], minlength=self.nlist)
        self.offsets = torch.cat([self.offsets[:1], torch.cumsum(sizes, 0)])
        for name in self._row_buffers:
            setattr(self, name, getattr(self, name)[rows])

    # -- search ---------------------------------------------------------------------------
    def _torch_searcher(self) -> IVFSearch:
        """The torch path: the kind's static search over the index's own storage
        (``searcher(copy=False)``), kept until a buffer changes; it probes ``nprobe`` lists
        unless a search says otherwise."""
        shared = partial(self.searcher, copy=False)
        searcher = self._derived("searcher", tuple(self.buffers()), shared)
        searcher.nprobe = min(self.nprobe, self.nlist)
        return searcher

    def _search_ids(self, q: torch.Tensor, k: int, nprobe: int | None = None):
        if self.ntotal == 0 or _cpu.fast_path(q):
            return super()._search_ids(q, k, nprobe=nprobe)
        return search_in_chunks(self._torch_searcher(), q, k, nprobe=nprobe)

    def _search_rows(self, q: torch.Tensor, k: int, nprobe: int | None = None):
        return self._probe_and_scan(q, k, nprobe, ranked=True)

    def _candidate_ids(self, q: torch.Tensor, k: int, nprobe: int | None = None):
        if self.ntotal == 0 or not _cpu.fast_path(q):
            return self._search_ids(q, k, nprobe)[1]
        dist, rows = self._probe_and_scan(q, min(k, self.ntotal), nprobe, ranked=False)
        return self._finish(dist, rows, k)[1]

    def _probe_and_scan(self, q: torch.Tensor, k: int, nprobe: int | None, ranked: bool):
        """Values (smaller is nearer: squared L2, or negated inner products) and rows [nq, k]
        of the k nearest, ascending, or in any order where that is cheaper if not ``ranked``
        (CPU tensors in eager mode: see ``_search_ids``)."""
        nprobe = check_positive(self.nprobe if nprobe is None else nprobe, "nprobe")
        nprobe = min(nprobe, self.nlist)
        coarse, lists = self._probe_numba(q, nprobe)
        dist = _cpu.empty((q.shape[0], k))
        rows = _cpu.empty((q.shape[0], k), torch.int64)
        self._scan_numba(q, coarse, lists, dist, rows, ranked)
        return dist, rows

    def _scan_numba(self, q, coarse, lists, out_dist, out_rows, ranked=True) -> None:
        """The numba scan: the k nearest rows, ascending (in any order if not ``ranked``)."""
        raise NotImplementedError

    def _lean_search(self):
        """The whole search of a few queries as one kernel call on the calling thread (the
        coarse step, the scan of the probed lists, ids: the kind's ``_lean_kernel``); a call
        whose estimated work is not small returns None (the general, parallel path)."""
        return self._lean_closure(None)

    def _lean_search_refined(self, vectors: np.ndarray, ids: np.ndarray, k_factor: Callable):
        return self._lean_closure((vectors, ids, k_factor))

    def _lean_closure(self, refine: tuple | None):
        """The lean search, and with ``refine`` = (vectors, ids, k_factor) that of a
        re-ranking wrapper, in the same kernel call (see ``Index._lean_search_refined``)."""
        if self.coarse_hnsw:  # none: the lean kernels scan the centroids
            return None
        kernel, args = self._lean_kernel()
        ip = self.metric == "ip"
        norms = _NO_NORMS if ip else self._centroid_norms()
        c = self.quantizer.codebook
        centroids_t = self._derived("centroids_t", (c,), lambda: c.float().T.contiguous().numpy())
        ids = self.ids.numpy() if self.ids.shape[0] == self.ntotal else NO_IDS
        ref_x, ref_ids, k_factor = refine or (np.zeros((0, self.dim), np.float32), NO_IDS, None)
        nlist = self.nlist
        # _search_work's estimate: fixed + nprobe * per_probe per query
        per_probe = self.ntotal / nlist * self._vector_ns()
        fixed = self._search_work(1, 1, nprobe=1) - per_probe
        serial_work = _cpu.SERIAL_WORK

        def search(q: np.ndarray, k: int, ranked: bool, params: dict):
            nprobe = params.get("nprobe")
            nprobe = min(self.nprobe if nprobe is None else check_positive(nprobe, "nprobe"), nlist)
            nq = q.shape[0]
            kc = k
            if k_factor is not None:  # candidates for the re-ranking
                factor = params.get("k_factor")
                factor = k_factor() if factor is None else factor
                if type(factor) is not int or factor < 1:
                    return None  # the general path says what is wrong
                kc = k * factor
            if nq * (fixed + nprobe * per_probe) >= serial_work:
                return None
            out_dist = np.empty((nq, k), np.float32)
            out_ids = np.empty((nq, k), np.int64)
            if not kernel(q, centroids_t, norms, nprobe, *args, ids, ip, ref_x, ref_ids, kc,
                          out_dist, out_ids, ranked):  # fmt: skip
                return None  # a NaN or an infinity: the general path says so
            return out_dist, out_ids

        return search

    def _lean_kernel(self) -> tuple:
        """The kind's lean kernel and its stored arrays: ``kernel(q, centroids_t, c_norms,
        nprobe, *args, ids, inner_product, ref_vectors, ref_ids, k_candidates, out_dist,
        out_ids, ranked)`` searches numpy arrays
        of at most 16 queries on the calling thread, from the coarse step to ids (see
        ``_lean_search``); it returns False, having done nothing, for a query that is not
        finite."""
        raise NotImplementedError


# -- the static-shape search --------------------------------------------------------------------
def probe(queries, centroids, centroid_norms, nprobe: int, metric: str):
    """The ``nprobe`` (<= nlist) nearest lists of each query, as one static-shape graph:
    queries float32 [B, dim], centroids float32 [nlist, dim] and their squared norms [nlist],
    metric "l2" or "ip" (lists are probed by the index's metric, as faiss does) → coarse scores
    float32 [B, nprobe], ascending (squared L2 clamped at 0, or negated inner products), and
    lists int64 [B, nprobe]."""
    if metric == "ip":
        return torch.topk(-(queries @ centroids.T), nprobe, dim=1, largest=False, sorted=True)
    scores = torch.addmm(centroid_norms, queries, centroids.T, alpha=-2.0)
    q2 = (queries * queries).sum(dim=1, keepdim=True)
    if nprobe == 1:  # ranked before adding ||q||², as the nearest-centroid assignment
        val, lists = torch.topk(scores, 1, dim=1, largest=False, sorted=True)
        return (val + q2).clamp_min(0.0), lists
    val, lists = torch.topk(scores + q2, nprobe, dim=1, largest=False, sorted=True)
    return val.clamp_min(0.0), lists


def padded_rows(offsets: torch.Tensor, capacity: int) -> torch.Tensor:
    """int64 [nlist, capacity]: the storage rows of each CSR inverted list, -1 past its end."""
    slots = torch.arange(capacity, device=offsets.device)
    return torch.where(slots < offsets.diff()[:, None], offsets[:-1, None] + slots, -1)


class IVFSearch(Searcher):
    """Shared by the IVF searches (see :class:`vq.index.static.Searcher`): coarse probing, and
    the inverted lists padded to one ``capacity`` (a probe reads that many slots).

    Args:
        index: the IVF index; k: neighbours ``forward`` returns (default the index's).
        nprobe: lists ``forward`` probes (default the index's, at most nlist).
        capacity: slots per list (default and minimum: the longest list).
        copy: hold a snapshot (True) or the index's own storage (the torch path).

    Buffers:
        centroids: float32 [nlist, dim]; centroid_norms: float32 [nlist];
        list_rows: int64 [nlist, capacity], the storage row of each slot (-1 for padding);
        slot_bias: float32 [nlist, capacity], added to every slot's score: +inf for padding.
    """

    def __init__(self, index: IVFIndex, k, nprobe, capacity, copy: bool):
        super().__init__(index, k, copy)
        longest = max(1, int(index.list_sizes().max()))
        capacity = longest if capacity is None else int(capacity)
        if capacity < longest:
            raise ValueError(
                f"capacity={capacity} is shorter than the longest inverted list ({longest} "
                f"vectors); pass capacity >= {longest} or leave it to the default"
            )
        self.nlist, self.capacity = index.nlist, capacity
        self.nprobe = min(index.nprobe if nprobe is None else int(nprobe), index.nlist)
        c = index.quantizer.codebook.detach().float()
        self.register_buffer("centroids", kept(c, copy))
        self.register_buffer("centroid_norms", (c * c).sum(dim=1))
        rows = padded_rows(index.offsets, capacity)
        self.register_buffer("list_rows", rows)
        self.register_buffer("slot_bias", torch.where(rows < 0, INF, 0.0))

    def probe(self, queries: torch.Tensor, nprobe: int) -> tuple[torch.Tensor, torch.Tensor]:
        return probe(queries, self.centroids, self.centroid_norms, nprobe, self.metric)

    def lists_probed(self, nprobe: int | None) -> int:
        """``nprobe`` checked and capped at nlist (default: the one fixed at construction)."""
        return self.nprobe if nprobe is None else min(check_positive(nprobe, "nprobe"), self.nlist)

    @staticmethod
    def gather_lists(table: torch.Tensor, lists: torch.Tensor) -> torch.Tensor:
        """Rows [B, nprobe * capacity, …] of a padded ``table`` [nlist, capacity, …]."""
        picked = table.index_select(0, lists.reshape(-1))
        return picked.reshape(lists.shape[0], -1, *table.shape[2:])
