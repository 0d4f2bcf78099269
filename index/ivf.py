"""Inverted-file indexes: a coarse k-means quantizer routes each vector to one of ``nlist``
lists; a search scans only the ``nprobe`` lists nearest to the query.

Reference: J. Sivic, A. Zisserman, "Video Google", ICCV 2003; H. Jégou, M. Douze, C. Schmid,
"Product quantization for nearest neighbor search", IEEE TPAMI 2011 (IVFADC).

Storage is CSR: the rows of list l are ``offsets[l]:offsets[l + 1]`` of every stored buffer
(``ids``, and ``vectors`` or ``codes``), so a scan reads one contiguous range per probe.
"""

from __future__ import annotations

import numpy as np
import torch

from vq import _cpu, kernels
from vq._checks import check_training_size
from vq.clustering import kmeans
from vq.distances import nearest
from vq.index.base import _NO_IDS, Index
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
        if nlist <= 0:
            raise ValueError(f"nlist must be positive, got {nlist}")
        self.nlist = int(nlist)
        self.nprobe = _check_nprobe(nprobe)
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
        self.quantizer._mark_trained()

    def _coarse_scores(self, x: torch.Tensor) -> torch.Tensor:
        """float32 [n, nlist]: squared L2 distances to the centroids (l2) or negated inner
        products (ip); smaller is nearer."""
        c = self.quantizer.codebook.float()
        if self.metric == "ip":
            return -(x @ c.T)
        return torch.addmm((c * c).sum(1), x, c.T, alpha=-2.0).add_((x * x).sum(1, keepdim=True))

    def _assign(self, x: torch.Tensor) -> torch.Tensor:
        """int64 [n]: the list of each vector."""
        if self.metric == "l2":
            return self.quantizer._encode(x).long()
        return self._coarse_scores(x).argmin(dim=1)

    def _probe(self, q: torch.Tensor, nprobe: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``nprobe`` nearest lists of each query: coarse scores float32 [nq, nprobe]
        (as ``_coarse_scores``, clamped at 0 for l2) and list numbers int64 [nq, nprobe]."""
        if _cpu.fast_path(q):
            return self._probe_numba(q, nprobe)
        if nprobe == 1 and self.metric == "l2":  # a plain arg-min, no top-k
            nn = nearest(q, self.quantizer.codebook.float())
            return nn.distances[:, None], nn.indices[:, None]
        scores, lists = torch.topk(self._coarse_scores(q), nprobe, dim=1, largest=False)
        if self.metric == "l2":
            scores = scores.clamp_min(0.0)
        return scores, lists

    def _search_work(self, nq: int, k: int, nprobe: int | None = None, **params) -> float:
        nprobe = min(self.nprobe if nprobe is None else nprobe, self.nlist)
        scanned = nprobe * self.ntotal / self.nlist * self._vector_ns()
        return nq * (self.nlist * self.dim / 16 + scanned + 2000)

    def _centroid_norms(self) -> np.ndarray:
        """float32 [nlist]: the squared norms of the coarse centroids."""
        c = self.quantizer.codebook
        return self._derived("centroid_norms", (c,), lambda: (c.float() ** 2).sum(1).numpy())

    def _probe_numba(self, q: torch.Tensor, nprobe: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``_probe`` on CPU: BLAS inner products, then a numba kernel keeps each row's
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

    def _padded_lists(self) -> torch.Tensor:
        """int64 [nlist, capacity]: the rows of each list, padded with -1 to the longest list
        (the torch path's static layout)."""
        sizes = self.list_sizes()
        capacity = max(1, int(sizes.max()))
        slots = torch.arange(capacity, device=self.device)
        rows = self.offsets[:-1, None] + slots
        return torch.where(slots < sizes[:, None], rows, -1)

    # -- search ---------------------------------------------------------------------------
    def _search_rows(self, q: torch.Tensor, k: int, nprobe: int | None = None):
        return self._probe_and_scan(q, k, nprobe, ranked=True)

    def _candidate_ids(self, q: torch.Tensor, k: int, nprobe: int | None = None):
        if self.ntotal == 0:
            return super()._candidate_ids(q, k)
        dist, rows = self._probe_and_scan(q, min(k, self.ntotal), nprobe, ranked=False)
        return self._finish(dist, rows, k)[1]

    def _probe_and_scan(self, q: torch.Tensor, k: int, nprobe: int | None, ranked: bool):
        """Distances (smaller is nearer) and rows [nq, k] of the k nearest, ascending, or
        in any order where that is cheaper if not ``ranked``."""
        nprobe = min(_check_nprobe(self.nprobe if nprobe is None else nprobe), self.nlist)
        if _cpu.fast_path(q):
            coarse, lists = self._probe_numba(q, nprobe)
            dist = _cpu.empty((q.shape[0], k))
            rows = _cpu.empty((q.shape[0], k), torch.int64)
            self._scan_numba(q, coarse, lists, dist, rows, ranked)
        else:
            coarse, lists = self._probe(q, nprobe)
            dist, rows = self._scan_torch(q, coarse, lists, k)
        return (-dist if self.metric == "ip" else dist), rows

    def _scan_numba(self, q, coarse, lists, out_dist, out_rows, ranked=True) -> None:
        """The numba scan: the k nearest rows, ascending (in any order if not ``ranked``)."""
        raise NotImplementedError

    def _lean_search(self):
        """The whole search of a few queries as one kernel call on the calling thread (the
        coarse step, the scan of the probed lists, ids: the kind's ``_lean_kernel``); a call
        whose estimated work is not small returns None (the general, parallel path)."""
        kernel, args = self._lean_kernel()
        ip = self.metric == "ip"
        norms = _NO_NORMS if ip else self._centroid_norms()
        c = self.quantizer.codebook
        centroids_t = self._derived("centroids_t", (c,), lambda: c.float().T.contiguous().numpy())
        ids = self.ids.numpy() if self.ids.shape[0] == self.ntotal else _NO_IDS
        nlist = self.nlist
        # _search_work's estimate: fixed + nprobe * per_probe per query
        per_probe = self.ntotal / nlist * self._vector_ns()
        fixed = self._search_work(1, 1, nprobe=1) - per_probe
        serial_work = _cpu.SERIAL_WORK

        def search(q: np.ndarray, k: int, ranked: bool, params: dict):
            nprobe = params.get("nprobe")
            nprobe = min(self.nprobe if nprobe is None else _check_nprobe(nprobe), nlist)
            nq = q.shape[0]
            if nq * (fixed + nprobe * per_probe) >= serial_work:
                return None
            out_dist = np.empty((nq, k), np.float32)
            out_ids = np.empty((nq, k), np.int64)
            if not kernel(q, centroids_t, norms, nprobe, *args, ids, ip, out_dist, out_ids, ranked):
                return None  # a NaN or an infinity: the general path says so
            return out_dist, out_ids

        return search

    def _lean_kernel(self) -> tuple:
        """The kind's lean kernel and its stored arrays: ``kernel(q, centroids_t, c_norms,
        nprobe, *args, ids, inner_product, out_dist, out_ids, ranked)`` searches numpy arrays
        of at most 16 queries on the calling thread, from the coarse step to ids (see
        ``_lean_search``); it returns False, having done nothing, for a query that is not
        finite."""
        raise NotImplementedError

    @staticmethod
    def _top_candidates(scores: torch.Tensor, rows: torch.Tensor, k: int):
        """Top-k (smallest) of candidate ``scores`` [b, C] whose ``rows`` [b, C] are -1 for
        padding; fewer than k candidates are padded with +inf / -1."""
        scores = torch.where(rows < 0, float("inf"), scores)
        kk = min(k, scores.shape[1])
        val, pos = torch.topk(scores, kk, dim=1, largest=False, sorted=True)
        idx = torch.where(torch.isinf(val), -1, rows.gather(1, pos))
        if kk < k:
            val = torch.cat([val, val.new_full((val.shape[0], k - kk), float("inf"))], 1)
            idx = torch.cat([idx, idx.new_full((idx.shape[0], k - kk), -1)], 1)
        return val, idx


class IVFFlat(IVFIndex):
    """Inverted lists of full float32 vectors, scanned exactly (faiss ``IndexIVFFlat``).

    Args: those of :class:`IVFIndex`.

    Buffers (beyond :class:`IVFIndex`'s): vectors: float32 [ntotal, dim], in list order.
    """

    _row_buffers = ("vectors",)

    def __init__(
        self, dim: int, nlist: int, metric: str = "l2", k: int = 10, nprobe: int = 1, **options
    ):
        super().__init__(dim, nlist, metric, k, nprobe, **options)
        self.register_buffer("vectors", torch.zeros(0, dim))

    def _train(self, x: torch.Tensor) -> None:
        self._train_coarse(x)

    def _encode_batch(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"lists": self._assign(x), "vectors": x.float()}

    def _lean_kernel(self) -> tuple:
        x, offsets = self.vectors.contiguous().numpy(), self.offsets.numpy()
        return kernels.ivf_flat_lean, (x, offsets)

    def _scan_numba(self, q, coarse, lists, out_dist, out_rows, ranked=True) -> None:
        kernels.ivf_flat_scan(
            q.contiguous().numpy(),
            self.vectors.numpy(),
            lists.numpy(),
            self.offsets.numpy(),
            self.metric == "ip",
            out_dist.numpy(),
            out_rows.numpy(),
        )

    def _scan_torch(self, q, coarse, lists, k):
        padded = self._padded_lists()
        per_query = lists.shape[1] * padded.shape[1] * self.dim
        step = max(1, (1 << 25) // per_query)
        out = []
        for s in range(0, q.shape[0], step):
            rows = padded[lists[s : s + step]].flatten(1)  # [b, C]
            cand = self.vectors[rows.clamp_min(0)]  # [b, C, dim]
            qs = q[s : s + step, None, :]
            if self.metric == "ip":
                scores = -(cand * qs).sum(-1)
            else:
                scores = ((cand - qs) ** 2).sum(-1)
            out.append(self._top_candidates(scores, rows, k))
        return torch.cat([d for d, _ in out]), torch.cat([r for _, r in out])


def _check_nprobe(nprobe) -> int:
    if isinstance(nprobe, bool) or not isinstance(nprobe, int | np.integer) or nprobe <= 0:
        raise ValueError(f"nprobe must be a positive integer, got {nprobe!r}")
    return int(nprobe)
