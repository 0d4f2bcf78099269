"""Inverted-file indexes: a coarse k-means quantizer routes each vector to one of ``nlist``
lists; a search scans only the ``nprobe`` lists nearest to the query.

Reference: J. Sivic, A. Zisserman, "Video Google", ICCV 2003; H. Jégou, M. Douze, C. Schmid,
"Product quantization for nearest neighbor search", IEEE TPAMI 2011 (IVFADC).

Storage is CSR: the rows of list l are ``offsets[l]:offsets[l + 1]`` of every stored buffer
(``ids``, and ``vectors`` or ``codes``), so a scan reads one contiguous range per probe.

This module holds what the IVF kinds share (:class:`IVFIndex`); the static-shape probe and
:class:`IVFSearch` are in ivfsearch.py, spilling's pieces in spill.py; the kinds sit beside it
(ivfflat.py, ivfpq.py, ivfsq.py).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from vq import _cpu, kernels
from vq._checks import (
    check_flag,
    check_int,
    check_positive,
    check_real,
    check_seed,
    check_training_size,
)
from vq.clustering import kmeans
from vq.index.core.base import Index, ids_problem
from vq.index.core.filters import kernel_mask, probes_for_filter, torch_mask
from vq.index.core.mapped import file_range
from vq.index.core.registry import FactoryRefusal
from vq.index.core.searchers import search_in_chunks
from vq.index.core.searching import results_by_id
from vq.index.graph.hnsw import HNSW, MAX_M
from vq.index.ivf.ivf_faiss import ivf_to_faiss
from vq.index.ivf.ivf_lean import ivf_lean_search
from vq.index.ivf.ivf_lists import IVFStorage
from vq.index.ivf.ivf_searchers import IVFSearch, padded_rows, probe
from vq.index.ivf.spill import SPILL_COPIES
from vq.quantizers import VectorQuantizer

_NO_NORMS = np.zeros(0, np.float32)


#: the coarse k-means starts from k-means++ seeds up to this many lists, from random rows above
KMEANSPP_MAX_NLIST = 2048
#: the most inverted lists (list numbers are int32 nodes in a graph-routed coarse quantizer)
MAX_NLIST = (1 << 31) - 1
#: the IVF part of a factory description (the kinds' patterns go on from it): "IVF1024";
#: "IVF1024(soar)" / "IVF1024(soar=0.5)" spilled lists (SOAR, λ 1 unless given);
#: "IVF65536_HNSW32" the coarse quantizer routed by an HNSW graph over the centroids
IVF_FACTORY = (
    r"IVF(?P<nlist>\d+)(?:_HNSW(?P<graph>\d+))?(?:\((?P<soar>soar)(?:=(?P<lam>\d+(?:\.\d*)?))?\))?"
)


def ivf_arguments(match) -> dict:
    """``nlist`` and the IVF options (``coarse_hnsw``, ``spill``, ``soar_lambda``) of a
    description's IVF part (:data:`IVF_FACTORY`)."""
    graph = match["graph"]
    if graph is not None and int(graph) < 2:
        raise FactoryRefusal(f"_HNSW{graph}: the graph's M must be >= 2")
    extra = {"coarse_hnsw": int(graph)} if graph else {}
    if match["soar"]:
        extra.update(spill=True, soar_lambda=float(match["lam"] or 1.0))
    return {"nlist": int(match["nlist"]), **extra}


class IVFIndex(IVFStorage, Index):
    """Shared by :class:`IVFFlat`, :class:`IVFPQ` and :class:`IVFSQ`: the coarse quantizer, the
    CSR inverted lists, spilling and the probe step. Subclasses name their per-row buffers in
    ``_row_buffers`` and fill them in ``_encode_rows``.

    Args:
        dim: vector dimension.
        nlist: number of inverted lists (coarse centroids).
        metric: "l2" or "ip" (lists are probed by the same metric, as faiss does).
        k: neighbours ``forward`` returns.
        nprobe: lists scanned per query (``search(..., nprobe=)`` overrides it per call).
        coarse_niter: k-means iterations of the coarse quantizer (faiss's IVF default, 10).
        seed: seeds the coarse k-means.
        verbose: progress bars for train and add.
        spill: store each vector in its nearest list and in a second one chosen by SOAR
            (:mod:`vq.index.ivf.spill`; factory ``"IVF1024(soar),Flat"``): more recall at equal
            nprobe, twice the rows to store and scan. Searches return each id once;
            ``ntotal`` counts vectors, not copies. No faiss counterpart. Needs nlist >= 2.
        soar_lambda: λ of the SOAR spill assignment (>= 0; 0 spills to the second-nearest
            list).
        coarse_hnsw: M of an HNSW graph over the centroids that routes vectors and queries
            instead of a scan of all nlist (faiss's ``IVF65536_HNSW32``); 0: the scan.

    Submodules and buffers:
        quantizer: :class:`vq.VectorQuantizer` with ``codebook`` float32 [nlist, dim];
        coarse_graph: :class:`vq.HNSW` over the centroids (with ``coarse_hnsw``);
        offsets: int64 [nlist + 1]; ids: int64 [n_rows], in list order (n_rows = ntotal, or
        2 ntotal when spilled: a copy's id is its vector's).
    """

    row_buffers: tuple[str, ...] = ()
    search_params = ("max_codes", "nprobe")

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
        spill: bool = False,
        soar_lambda: float = 1.0,
        coarse_hnsw: int = 0,
    ):
        super().__init__(dim, metric, k, verbose)
        self.nlist = check_int(nlist, "nlist", 1, MAX_NLIST)
        self.coarse_hnsw = check_int(coarse_hnsw, "coarse_hnsw", 0, MAX_M)
        if self.coarse_hnsw == 1:
            raise ValueError("coarse_hnsw must be 0 (no graph) or the graph's M >= 2, got 1")
        self.spill = check_flag(spill, "spill")
        self.soar_lambda = check_real(soar_lambda, "soar_lambda")
        if self.spill and self.nlist < 2:
            raise ValueError("spill=True needs nlist >= 2 (a second list to spill to)")
        self.nprobe = check_positive(nprobe, "nprobe")
        self.coarse_niter = check_int(coarse_niter, "coarse_niter", 0)
        self.seed = check_seed(seed)
        try:
            self.quantizer = VectorQuantizer(dim, self.nlist, niter=self.coarse_niter, seed=seed)
        except RuntimeError as err:  # (the allocator's words: "can't allocate memory")
            gib = self.nlist * dim * 4 / 2**30
            raise MemoryError(
                f"nlist={self.nlist}: the coarse centroids, float32 [nlist, {dim}], would take "
                f"{gib:.4g} GiB; choose fewer lists (faiss's advice: 4 to 16 times the square "
                "root of the number of vectors)"
            ) from err
        if self.coarse_hnsw:
            self.coarse_graph = HNSW(dim, self.coarse_hnsw, self.metric)
        self.register_buffer("offsets", torch.zeros(self.nlist + 1, dtype=torch.int64))

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
            **({"spill": True, "soar_lambda": self.soar_lambda} if self.spill else {}),
            **({"coarse_hnsw": self.coarse_hnsw} if self.coarse_hnsw else {}),
        }

    # -- rows and copies: a spilled vector is stored twice, under one id ------------------------
    @property
    def copies(self) -> int:
        """Rows stored per vector: 2 when spilled, else 1."""
        return SPILL_COPIES if self.spill else 1

    @property
    def ntotal(self) -> int:
        """Vectors stored (not copies)."""
        return self.n_rows // self.copies

    @property
    def n_rows(self) -> int:
        """Rows stored: ``ntotal * copies``."""
        return int(self.ids.shape[0])

    def stored_ids(self) -> torch.Tensor:
        """int64 [n_rows]: the id of every stored row, in storage order (copies included)."""
        return self.ids

    def has_sequential_ids(self) -> bool:
        return False  # ids in list order, always held

    def _finish(self, val: torch.Tensor, rows: torch.Tensor, k: int):
        if file_range(self.ids) is None or not _cpu.fast_path(rows):
            return results_by_id(val, rows, k, self.metric, self.ids)
        at, stored = self._ids_of(rows.contiguous().numpy())
        return results_by_id(val, torch.from_numpy(at), k, self.metric, torch.from_numpy(stored))

    def remove_stored(self, ids: torch.Tensor) -> int:
        return super().remove_stored(ids) // self.copies  # vectors removed, not rows

    def reset_rows(self) -> None:
        super().reset_rows()
        self.offsets = torch.zeros_like(self.offsets)
        self.__dict__.pop("_id_lists", None)  # (the id → list map of remove_ids)

    def _copy_ids(self) -> np.ndarray | None:
        """int64 [n_rows]: the id of each stored row where a vector is stored twice (spilled
        lists: a range search keeps each query's nearer copy), else None."""
        return self.ids.cpu().numpy() if self.spill else None

    def list_sizes(self) -> torch.Tensor:
        """int64 [nlist]: vectors stored in each inverted list."""
        return self.offsets.diff()

    def growing_buffers(self) -> tuple[str, ...]:
        return (*super().growing_buffers(), *self.row_buffers)

    def consistency_problem(self) -> str | None:
        problem = ids_problem(self.ids)
        n = int(self.ids.shape[0])
        if problem is None and n and not self.is_trained:
            problem = f"{self.ntotal} vectors but no trained parameters"
        if problem is None and n % self.copies:
            problem = f"{n} rows, not a multiple of {self.copies}"
        problem = problem or self._rows_problem()
        o = self.offsets
        if problem is None and (
            o.shape != (self.nlist + 1,) or o[0] != 0 or o[-1] != n or bool((o.diff() < 0).any())
        ):
            problem = "inverted-list offsets that do not match the stored vectors"
        return problem

    def _rows_problem(self) -> str | None:
        """``consistency_problem`` of the kind's per-vector buffers (``_row_buffers``)."""
        return None

    def faiss_counterpart(self):
        """The faiss IVF index of this kind (see :func:`vq.index.ivf.ivf_faiss.ivf_to_faiss`)."""
        return ivf_to_faiss(self)

    def _empty_faiss(self, quantizer) -> tuple:
        """The kind's empty faiss ``IndexIVF`` around the coarse ``quantizer``, and what its
        lists store per row: uint8 [n_rows, code_size], in list order."""
        raise NotImplementedError

    # -- training and routing -------------------------------------------------------------
    def _train_coarse(self, x: torch.Tensor) -> None:
        check_training_size(x.shape[0], self.nlist, f"{type(self).__name__}.train")
        # k-means++ rather than faiss's random start up to KMEANSPP_MAX_NLIST lists: recall at
        # equal nprobe is what the partition buys. The seeding's cost is quadratic in nlist,
        # and at 4,096 lists it no longer bought recall: on 300k sentence embeddings (100k
        # training rows, 10 iterations, Zen 3) it doubled the training (53.8 s against 26.7 s)
        # for recall@10 0.888 / 0.951 against random rows' 0.894 / 0.956 at nprobe 32 / 128,
        # and on 1M synthetic vectors 20.0 s against 10.3 s for 0.586 / 0.866 against 0.597
        # / 0.875 at nprobe 16 / 64; at 2,048 lists it still gave +0.0003 to +0.006 for
        # 18.2 s against 12.1 s, at 1,024 -0.004 to +0.006 for 7.1 s against 6.1 s
        result = kmeans(
            x,
            self.nlist,
            niter=self.coarse_niter,
            init="k-means++" if self.nlist <= KMEANSPP_MAX_NLIST else "random",
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

    def search_work(self, nq: int, k: int, nprobe: int | None = None, **params) -> float:
        nprobe = min(self.nprobe if nprobe is None else nprobe, self.nlist)
        scanned = nprobe * self.ntotal / self.nlist * self.vector_ns()
        return nq * (self.nlist * self.dim / 16 + scanned + 2000)

    def _centroid_norms(self) -> np.ndarray:
        """float32 [nlist]: the squared norms of the coarse centroids."""
        c = self.quantizer.codebook
        return self.derived("centroid_norms", (c,), lambda: (c.float() ** 2).sum(1).numpy())

    def _centroid_array(self) -> np.ndarray:
        """float32 [nlist, dim], C-contiguous: the coarse centroids as the kernels read them."""
        c = self.quantizer.codebook
        return self.derived("centroids", (c,), lambda: c.float().contiguous().numpy())

    def _coarse_bound(self) -> tuple:
        """The lean coarse step's bound (:func:`coarse_bound` of the centroids, L2), kept
        until the centroids change."""
        c = self.quantizer.codebook
        return self.derived("coarse_bound", (c,), lambda: coarse_bound(c.float().numpy()))

    def nearest_lists(self, q: torch.Tensor, nprobe: int) -> tuple[torch.Tensor, torch.Tensor]:
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

    # -- search ---------------------------------------------------------------------------
    def torch_searcher(self) -> IVFSearch:
        """The torch path: the kind's static search over the index's own storage
        (``searcher(copy=False)``), kept until a buffer changes; it probes ``nprobe`` lists
        unless a search says otherwise."""
        searcher = super().torch_searcher()
        searcher.nprobe = min(self.nprobe, self.nlist)
        return searcher

    def probes_lists(self) -> bool:
        return True

    def search_ids(self, q, k, nprobe=None, max_codes=None, allowed=None, probed=None):
        """``Index.search_ids`` with the IVF options: ``nprobe`` lists at least; under a
        filter (``allowed``) further lists, nearest first, until k allowed vectors are among
        the probed ones, all lists are, or the next list would pass ``max_codes`` stored
        vectors in all (None: no cap); ``probed`` int64 [nq] receives how many lists each
        query probed."""
        if max_codes is not None:
            check_positive(max_codes, "max_codes")
        options = {"max_codes": max_codes, "allowed": allowed, "probed": probed}
        return super().search_ids(q, k, nprobe=nprobe, **options)

    def torch_search(self, q, k, nprobe=None, max_codes=None, allowed=None, probed=None):
        """The torch engine (see ``search_ids``): under a filter, as many lists as the query
        that needs most, each query's cut to its own (``limit``)."""
        nprobe = self.effective_nprobe(nprobe)
        mask = torch_mask(self, allowed)
        limit = None
        if mask is not None:  # how many lists each query needs: then the widest, cut per query
            coarse, lists = self.torch_searcher().probe(q, nprobe)
            _, lists, need = probes_for_filter(self, q, min(k, self.ntotal), coarse, lists,
                                              allowed, max_codes, torch_ranking=True)  # fmt: skip
            nprobe, limit = lists.shape[1], torch.from_numpy(need).to(q.device)
        if probed is not None:
            probed.copy_(torch.full_like(probed, nprobe) if limit is None else limit.cpu())
        searcher = self.torch_searcher()
        return search_in_chunks(searcher, q, k, nprobe=nprobe, allowed=mask, limit=limit)

    def search_rows(self, q, k, nprobe=None, max_codes=None, allowed=None, probed=None):
        return self._probe_and_scan(q, k, nprobe, True, max_codes, allowed, probed)

    def candidate_ids(self, q, k, nprobe=None, max_codes=None, allowed=None, probed=None):
        options = {"max_codes": max_codes, "allowed": allowed, "probed": probed}
        if self.ntotal == 0 or not _cpu.fast_path(q):
            return self.search_ids(q, k, nprobe, **options)
        dist, rows = self._probe_and_scan(q, min(k, self.ntotal), nprobe, False, **options)
        return self._finish(dist, rows, k)[1]

    def effective_nprobe(self, nprobe) -> int:
        return min(check_positive(self.nprobe if nprobe is None else nprobe, "nprobe"), self.nlist)

    def _probe_and_scan(self, q, k, nprobe, ranked, max_codes=None, allowed=None, probed=None):
        """Values (smaller is nearer: squared L2, or negated inner products) and rows [nq, k]
        of the k nearest, ascending, or in any order where that is cheaper if not ``ranked``
        (CPU tensors in eager mode: see ``_search_ids``)."""
        nprobe = self.effective_nprobe(nprobe)
        coarse, lists = self.nearest_lists(q, nprobe)
        if allowed is not None:
            c, lst, need = probes_for_filter(self, q, k, coarse, lists, allowed, max_codes)
            coarse, lists = torch.from_numpy(c), torch.from_numpy(lst)
            if probed is not None:
                probed.copy_(torch.from_numpy(need))
        elif probed is not None:
            probed.fill_(nprobe)
        # spilled: the k distinct ids among the best 2 k rows, made unique below, unless the
        # scan keeps each id once itself
        repeats = self.spill and not self.scans_distinct_ids()
        kc = min(k * self.copies if repeats else k, int(self.ids.shape[0]))
        dist = _cpu.empty((q.shape[0], kc))
        rows = _cpu.empty((q.shape[0], kc), torch.int64)
        mask = kernel_mask(self, allowed)
        if not self._scan_from_file(q, coarse, lists, dist, rows, ranked or repeats, mask):
            self._scan_numba(q, coarse, lists, dist, rows, ranked or repeats, mask, self)
        if not repeats:
            return dist, rows
        out_dist, out_rows = _cpu.empty((q.shape[0], k)), _cpu.empty((q.shape[0], k), torch.int64)
        at, stored = self._ids_of(rows.numpy())
        kernels.unique_rows(dist.numpy(), at, stored, out_dist.numpy(), out_rows.numpy())
        if file_range(self.ids) is not None:  # (positions in rows: back to stored rows)
            out = out_rows.numpy()
            out[...] = np.where(out >= 0, rows.numpy().reshape(-1)[np.maximum(out, 0)], -1)
        return out_dist, out_rows

    def scans_distinct_ids(self) -> bool:
        """Whether the CPU scan of this index's spilled lists keeps each id once as it goes
        (the k rows it finds are k distinct vectors, so neither the general path nor the
        lean one scans for 2 k rows and drops repeats after): the kinds whose two copies of
        a vector score the same (IVF-Flat) say so where the ids are held in memory (not
        read from the index file). False for lists that are not spilled."""
        return False

    def _scan_numba(self, q, coarse, lists, out_dist, out_rows, ranked, allowed, store) -> None:
        """The numba scan: the k nearest rows, ascending (in any order if not ``ranked``),
        of those ``allowed`` (uint8 [rows], 0: skipped; or empty) lets through, in the row
        buffers and ``offsets`` of ``store`` (the index itself, or a
        :class:`vq.index.core.mapped.LocalLists` of rows read from its file)."""
        raise NotImplementedError

    def build_lean_search(self):
        """The whole search of a few queries as one kernel call on the calling thread (the
        coarse step, the scan of the probed lists, ids: the kind's ``_lean_kernel``); a call
        whose estimated work is not small returns None (the general, parallel path). Spilled
        lists: the best ``2 k`` rows, each id's first kept (as the general path keeps them),
        or the k rows of a scan that keeps ids distinct (:meth:`scans_distinct_ids`)."""
        return self._lean_closure(None)

    def build_refined_lean_search(self, vectors: np.ndarray, ids: np.ndarray, k_factor: Callable):
        """None when spilled (a re-ranking of spilled lists runs the general path, which
        keeps each id once before re-ranking)."""
        return None if self.spill else self._lean_closure((vectors, ids, k_factor))

    def _lean_closure(self, refine: tuple | None):
        """The lean search, and with ``refine`` = (vectors, ids, k_factor) that of a
        re-ranking wrapper, in the same kernel call (see
        :func:`vq.index.ivf.ivf_lean.ivf_lean_search`); none with a graph-routed coarse
        quantizer (the lean kernels scan the centroids) or, re-ranked, with rows mapped from
        the index file (the lean kernels would read them through the mapping: see
        ``_scan_from_file``)."""
        if self.coarse_hnsw or (refine is not None and self.rows_mapped()):
            return None
        return ivf_lean_search(self, refine)

    def _lean_kernel(self, store) -> tuple:
        """The kind's lean kernel and its stored arrays (the row buffers and ``offsets`` of
        ``store``: the index, or lists read from its file): ``kernel(q, centroids_t, c_norms,
        nprobe, *args, ids, inner_product, ref_vectors, ref_ids, k_candidates, out_dist,
        out_ids, ranked)`` (``ref_vectors``/``ref_ids`` None without re-ranking: see
        ``vq.kernels.exact.exact_scans.finish_lean``) searches numpy arrays
        of at most 16 queries on the calling thread, from the coarse step to ids (see
        ``_lean_search``); it returns False, having done nothing, for a query that is not
        finite."""
        raise NotImplementedError


__all__ = ["IVFIndex", "IVFSearch", "padded_rows", "probe"]


def coarse_bound(centroids: np.ndarray) -> tuple:
    """What :func:`vq.kernels.exact.lean_scans.probe_bounded` takes besides the queries: ``(axes_t
    float32 [d, r], proj_t float32 [r, nlist], proj_norms float32 [nlist], rows float32
    [nlist, d])``: the r principal axes of the centroids (float32 [nlist, d]; eigenvectors of
    their covariance, in float64), r a quarter of d rounded up to 8, the centroids'
    coordinates on them and the centroids. r = 0 (empty arrays: the full coarse step) where
    the bound would not pay: under 64 centroids, fewer than twice as many as r, or under 32
    dimensions. NSynth embeddings (256 centroids of 128 dims): 32 axes hold 97% of the
    centroids' variance."""
    nlist, d = centroids.shape
    r = 8 * -(-d // 32)
    if nlist < max(64, 2 * r) or d < 32:
        empty = np.zeros((0, 0), np.float32)
        return np.zeros((d, 0), np.float32), empty, np.zeros(0, np.float32), empty
    c = centroids.astype(np.float64)
    _, vectors = np.linalg.eigh(np.cov(c.T))
    axes = vectors[:, ::-1][:, :r]  # (eigh: ascending eigenvalues)
    proj = (c @ axes).astype(np.float32)
    return (
        np.ascontiguousarray(axes, np.float32),
        np.ascontiguousarray(proj.T),
        (proj * proj).sum(1, dtype=np.float32),
        np.ascontiguousarray(centroids, np.float32),
    )
