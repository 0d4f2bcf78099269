"""How the IVF kinds search: the coarse step (the ``nprobe`` nearest lists, by the lean kernels'
coarse step on vq's threads, or the HNSW graph over the centroids), the scan of the probed lists
(each kind's ``_scan_numba``; lists read from the index file where they are mapped), a filter's
further probing, the torch engine's probe, and the lean search's pieces (each kind's
``_lean_kernel``, see :mod:`vq.index.ivf.ivf_lean`).

:class:`IVFProbing` is a mixin of :class:`vq.index.IVFIndex`, before :class:`vq.index.Index` in
its bases: it extends the base's engine switch (``search_ids``) with the IVF options.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from vq import _cpu, kernels
from vq._checks import check_positive
from vq.index.core.filters import kernel_mask, probes_for_filter, torch_mask
from vq.index.core.mapped import file_range
from vq.index.core.searchers import search_in_chunks
from vq.index.ivf.ivf_lean import NO_BOUND, coarse_arrays, ivf_lean_search
from vq.index.ivf.ivf_searchers import IVFSearch
from vq.kernels.common.bundles import Coarse
from vq.kernels.common.constants import metric as kernel_metric
from vq.kernels.common.threads import parallel_for
from vq.kernels.exact.coarse_probe import PROBE_QUERIES, column_panels, probe_few


class IVFProbing:
    """The searches of :class:`vq.index.IVFIndex` (see the module docstring)."""

    search_params = ("max_codes", "nprobe")

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
        """:func:`probe` on CPU, on vq's own threads: the lean kernels' coarse step
        (:func:`vq.kernels.exact.coarse_probe.probe_few`: products held in vector registers,
        the ``nprobe`` best kept, most centroids ruled out by a bound where the index has one)
        over blocks of queries split between the threads. No BLAS product: torch's OpenMP
        threads would spin after it on the cores the scan needs next, unless ``import vq``
        came before torch (see :mod:`vq._openmp`)."""
        if self.coarse_hnsw:  # the graph's search instead
            return self.coarse_graph.route(q, nprobe)
        ip = kernel_metric(self.metric == "ip")
        coarse = Coarse(*coarse_arrays(self, ip))
        x = np.ascontiguousarray(q.numpy(), dtype=np.float32)
        scores = np.empty((x.shape[0], nprobe), np.float32)
        lists = np.empty((x.shape[0], nprobe), np.int64)

        def block(start: int, stop: int) -> None:
            scores[start:stop], lists[start:stop] = probe_few(x[start:stop], coarse, nprobe, ip)

        parallel_for(block, x.shape[0], grain=PROBE_QUERIES)
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
            _, lists, need = probes_for_filter(
                self, q, min(k, self.ntotal), coarse, lists, allowed, max_codes, torch_ranking=True
            )
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
        (CPU tensors in eager mode: see ``search_ids``)."""
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
        ``store``: the index, or lists read from its file): ``kernel(q, coarse, *args, finish,
        inner_product, nprobe, k_candidates, (out_dist, out_ids), ranked)`` (``finish``: the
        ids and any re-ranking, a ``vq.kernels.common.bundles.Finish``: see
        ``vq.kernels.exact.exact_scans.finish_lean``) searches numpy arrays
        of at most 16 queries on the calling thread, from the coarse step to ids (see
        ``build_lean_search``); it returns False, having done nothing, for a query that is not
        finite."""
        raise NotImplementedError


#: the least share of the centroids' variance the bound's axes must hold: below it the bound
#: rules out too few centroids to pay for itself (docs/perf/kernels.md, the coarse step)
BOUND_SHARE = 0.9


def coarse_bound(centroids: np.ndarray, share: float = BOUND_SHARE) -> tuple:
    """The bound :func:`vq.kernels.exact.coarse_probe.probe_bounded` reads (the last four fields of
    a :class:`vq.kernels.common.bundles.Coarse`): ``(axes float32 [ceil(r / 16), d, 16], proj
    float32 [ceil(nlist / 16), r, 16], proj_norms float32 [nlist], rows float32 [nlist, d])``: the
    r principal axes of the centroids (float32 [nlist, d]; eigenvectors of their covariance, in
    float64) and the centroids' coordinates on them, each as column panels
    (:func:`vq.kernels.exact.coarse_probe.column_panels`), r a quarter of d rounded up to 8, the
    squared norms of those coordinates and the centroids. r = 0 (empty arrays: the
    full coarse step) where the bound would not pay: under 64 centroids, fewer than twice as many as
    r, or under 32 dimensions. NSynth embeddings (256 centroids of 128 dims): 32 axes hold 97% of
    the centroids' variance; also r = 0 where the r axes hold less than :data:`BOUND_SHARE` of
    it, ``share`` (then the bound rules out too few centroids, and a query pays for the bound and
    for the full step after it)."""
    nlist, d = centroids.shape
    r = 8 * -(-d // 32)
    if nlist < max(64, 2 * r) or d < 32:
        return NO_BOUND
    c = centroids.astype(np.float64)
    values, vectors = np.linalg.eigh(np.cov(c.T))
    if values[::-1][:r].sum() < share * values.sum():
        return NO_BOUND
    axes = vectors[:, ::-1][:, :r]  # (eigh: ascending eigenvalues)
    proj = (c @ axes).astype(np.float32)
    return (
        column_panels(axes.astype(np.float32)),
        column_panels(proj.T),
        (proj * proj).sum(1, dtype=np.float32),
        np.ascontiguousarray(centroids, np.float32),
    )
