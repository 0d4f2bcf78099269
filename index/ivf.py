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
from vq.index.filters import allowed_per_list, kernel_mask, probe_further, torch_mask
from vq.index.ivfsearch import IVFSearch, padded_rows, probe  # noqa: F401 (re-exported)
from vq.index.searching import NO_IDS
from vq.index.static import search_in_chunks
from vq.index.storage import move_lists, reserve, set_rows
from vq.kernels import rows as row_kernels
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

    Submodules and buffers:
        quantizer: :class:`vq.VectorQuantizer` with ``codebook`` float32 [nlist, dim];
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
    ):
        super().__init__(dim, metric, k, verbose)
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

    def _assign(self, x: torch.Tensor) -> torch.Tensor:
        """int64 [n]: the list of each vector (nearest centroid, or largest inner product)."""
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

    # -- storage (in place: see vq.index.storage) -------------------------------------------
    def data_buffers(self) -> tuple[str, ...]:
        return (*super().data_buffers(), "offsets")

    def _encode_rows(self, x: torch.Tensor, lists: torch.Tensor) -> dict[str, torch.Tensor]:
        raise NotImplementedError  # x [b, dim] in lists [b] → the kind's _row_buffers, b rows

    def _add(self, x: torch.Tensor, ids, prepare: Callable | None = None) -> None:
        """Route every vector (int64 [n] lists, the only array of the whole call), make room
        at the ends of the lists, then encode a chunk at a time into its rows (``prepare``:
        a wrapper's transform, applied a chunk at a time, twice)."""
        self._require_trained("add")
        n, step = x.shape[0], self.add_batch_size
        lists = torch.empty(n, dtype=torch.int64, device=self.device)

        def chunk(s: int, e: int) -> torch.Tensor:
            part = x[s:e].to(self.device)
            return part if prepare is None else prepare(part)

        with torch.no_grad():
            for s in range(0, n, step):
                lists[s : s + step] = self._assign(chunk(s, s + step))
            self._insert(lists, lambda s, e: self._encode_rows(chunk(s, e), lists[s:e]), ids)

    def _merge(self, other, shift: int) -> None:
        ids = self._merged_ids(other, shift)
        sizes = other.list_sizes().to(self.device)
        lists = torch.repeat_interleave(torch.arange(self.nlist, device=self.device), sizes)
        buffers = {name: other._buffers[name] for name in self._row_buffers}
        self._insert(lists, lambda s, e: {k: v[s:e] for k, v in buffers.items()}, ids)

    def _insert(self, lists: torch.Tensor, rows: Callable, ids: torch.Tensor) -> None:
        """Store new rows at the ends of their ``lists`` (int64 [n]): every buffer grown in
        place (:func:`vq.index.storage.reserve`), the lists after the first that grows moved
        towards the end (last first), then ``rows(s, e)`` (the ``_row_buffers`` of new rows
        s..e) and ``ids`` written into their slots, ``add_batch_size`` at a time; on an error
        the lists move back (nothing half-added)."""
        n0, n = self.ntotal, lists.shape[0]
        old = self.offsets
        new = old.clone()
        new[1:] += torch.cumsum(torch.bincount(lists, minlength=self.nlist), 0)
        names = (*self._row_buffers, "ids")
        before = {name: self._buffers[name] for name in names}
        full = {name: reserve(self, name, n0 + n) for name in names}
        for name in names:
            move_lists(full[name], old, new)
        cursors = (new[:-1] + old.diff()).cpu().numpy()
        slots = np.empty(min(n, self.add_batch_size), np.int64)
        try:
            for s in range(0, n, self.add_batch_size):
                e = min(n, s + self.add_batch_size)
                row_kernels.list_slots(lists[s:e].cpu().numpy(), cursors, slots[: e - s])
                at = torch.from_numpy(slots[: e - s]).to(self.device)
                for name, t in {**rows(s, e), "ids": ids[s:e]}.items():
                    full[name][at] = t.to(full[name].device, full[name].dtype)
        except BaseException:
            for name in names:
                move_lists(full[name], new, old)
            self._buffers.update(before)
            raise
        for name in names:
            set_rows(self, name, n0 + n)
        self.offsets = new

    def _drop_rows(self, drop: np.ndarray, first: int, removed: int) -> None:
        rows = np.flatnonzero(drop[first:]) + first
        lists = np.searchsorted(self.offsets.cpu().numpy(), rows, side="right") - 1
        gone = torch.from_numpy(np.bincount(lists, minlength=self.nlist)).to(self.device)
        offsets = self.offsets.clone()
        offsets[1:] -= torch.cumsum(gone, 0)
        super()._drop_rows(drop, first, removed)
        self.offsets = offsets

    def _row_lists(self, rows: torch.Tensor) -> torch.Tensor:  # the list of each stored row
        return torch.searchsorted(self.offsets, rows.to(self.device), right=True) - 1

    # -- search ---------------------------------------------------------------------------
    def _torch_searcher(self) -> IVFSearch:
        """The torch path: the kind's static search over the index's own storage
        (``searcher(copy=False)``), kept until a buffer changes; it probes ``nprobe`` lists
        unless a search says otherwise."""
        shared = partial(self.searcher, copy=False)
        searcher = self._derived("searcher", tuple(self.buffers()), shared)
        searcher.nprobe = min(self.nprobe, self.nlist)
        return searcher

    def probes_lists(self) -> bool:
        return True

    def _search_ids(self, q, k, nprobe=None, max_codes=None, allowed=None, probed=None):
        """``Index._search_ids`` with the IVF options: ``nprobe`` lists at least; under a
        filter (``allowed``) further lists, nearest first, until k allowed vectors are among
        the probed ones, all lists are, or the next list would pass ``max_codes`` stored
        vectors in all (None: no cap); ``probed`` int64 [nq] receives how many lists each
        query probed."""
        if self.ntotal == 0 or _cpu.fast_path(q):
            options = {"max_codes": max_codes, "allowed": allowed, "probed": probed}
            return super()._search_ids(q, k, nprobe=nprobe, **options)
        nprobe = self._nprobe(nprobe)
        mask = torch_mask(self, allowed)
        limit = None
        if mask is not None:  # how many lists each query needs: then the widest, cut per query
            coarse, lists = self._torch_searcher().probe(q, nprobe)
            _, lists, need = self._probes(q, min(k, self.ntotal), coarse, lists, allowed,
                                          max_codes, torch_ranking=True)  # fmt: skip
            nprobe, limit = lists.shape[1], torch.from_numpy(need).to(q.device)
        if probed is not None:
            probed.copy_(torch.full_like(probed, nprobe) if limit is None else limit.cpu())
        searcher = self._torch_searcher()
        return search_in_chunks(searcher, q, k, nprobe=nprobe, allowed=mask, limit=limit)

    def _search_rows(self, q, k, nprobe=None, max_codes=None, allowed=None, probed=None):
        return self._probe_and_scan(q, k, nprobe, True, max_codes, allowed, probed)

    def _candidate_ids(self, q, k, nprobe=None, max_codes=None, allowed=None, probed=None):
        options = {"max_codes": max_codes, "allowed": allowed, "probed": probed}
        if self.ntotal == 0 or not _cpu.fast_path(q):
            return self._search_ids(q, k, nprobe, **options)
        dist, rows = self._probe_and_scan(q, min(k, self.ntotal), nprobe, False, **options)
        return self._finish(dist, rows, k)[1]

    def _nprobe(self, nprobe) -> int:
        return min(check_positive(self.nprobe if nprobe is None else nprobe, "nprobe"), self.nlist)

    def _probes(self, q, k, coarse, lists, allowed, max_codes, torch_ranking=False):
        """``probe_further`` (see :mod:`vq.index.filters`) for queries ``q``: coarse scores
        and lists (numpy; -1 past a query's last probe), and lists per query."""
        if max_codes is not None:
            max_codes = check_positive(max_codes, "max_codes")
        counts = allowed_per_list(allowed.row_mask(self), self.offsets.cpu().numpy())

        def rank_all(rows):
            if not torch_ranking:
                c, lst = self._probe_numba(q[torch.from_numpy(rows)], self.nlist)
                return c.numpy(), lst.numpy()
            picked = q[torch.from_numpy(rows).to(q.device)]
            c, lst = self._torch_searcher().probe(picked, self.nlist)
            return c.cpu().numpy(), lst.cpu().numpy()

        sizes = self.list_sizes().cpu().numpy()
        c, lst = coarse.cpu().numpy(), lists.cpu().numpy()
        return probe_further(c, lst, counts, sizes, k, max_codes, rank_all)

    def _probe_and_scan(self, q, k, nprobe, ranked, max_codes=None, allowed=None, probed=None):
        """Values (smaller is nearer: squared L2, or negated inner products) and rows [nq, k]
        of the k nearest, ascending, or in any order where that is cheaper if not ``ranked``
        (CPU tensors in eager mode: see ``_search_ids``)."""
        nprobe = self._nprobe(nprobe)
        coarse, lists = self._probe_numba(q, nprobe)
        if allowed is not None:
            c, lst, need = self._probes(q, k, coarse, lists, allowed, max_codes)
            coarse, lists = torch.from_numpy(c), torch.from_numpy(lst)
            if probed is not None:
                probed.copy_(torch.from_numpy(need))
        elif probed is not None:
            probed.fill_(nprobe)
        dist = _cpu.empty((q.shape[0], k))
        rows = _cpu.empty((q.shape[0], k), torch.int64)
        self._scan_numba(q, coarse, lists, dist, rows, ranked, kernel_mask(self, allowed))
        return dist, rows

    def _scan_numba(self, q, coarse, lists, out_dist, out_rows, ranked, allowed) -> None:
        """The numba scan: the k nearest rows, ascending (in any order if not ``ranked``),
        of those ``allowed`` (uint8 [ntotal], 0: skipped; or empty) lets through."""
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
