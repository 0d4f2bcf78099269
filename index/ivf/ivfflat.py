"""Inverted lists of full vectors, scanned exactly (faiss ``IndexIVFFlat``): the coarse step,
lists and probing are :class:`vq.index.ivf.ivf_index.IVFIndex`'s; this kind stores the vectors
themselves.
"""

from __future__ import annotations

import numpy as np
import torch

from vq import kernels
from vq._checks import check_flag
from vq.index.core.faiss_build import faiss_metric, import_faiss
from vq.index.core.filters import kernel_mask
from vq.index.core.mapped import file_range
from vq.index.core.ranges import probed_hits
from vq.index.core.registry import register
from vq.index.core.searchers import kept
from vq.index.core.searching import shape_problem
from vq.index.ivf.ivf_faiss import lists_from_faiss
from vq.index.ivf.ivf_index import IVF_FACTORY, IVFIndex, IVFSearch, ivf_arguments
from vq.index.ivf.sketches import sketch_ranges, sketch_rows
from vq.kernels.common.bundles import FlatLists, RangeHits, TopK, plain
from vq.kernels.common.rowdist import MIN_SPLIT, head_dims
from vq.kernels.exact.ivf_flat import NO_ROW_IDS, NO_SKETCH
from vq.kernels.exact.sketch import FACTORS, sketch_width

#: IVFFlat.prunes: the least share of the centroids' variance in a row's head that pays
PRUNE_SHARE = 0.4


def head_share(x: torch.Tensor) -> float:
    """The share of the variance of the rows of ``x`` [n, d] in their first
    :func:`vq.kernels.common.rowdist.head_dims` dimensions (0 for fewer than 2 rows)."""
    if x.shape[0] < 2:
        return 0.0
    var = x.double().var(dim=0)
    total = float(var.sum())
    return float(var[: head_dims(x.shape[1])].sum()) / total if total > 0 else 0.0


class IVFFlat(IVFIndex):
    """Inverted lists of full float32 vectors, scanned exactly (faiss ``IndexIVFFlat``).

    Args: those of :class:`IVFIndex`, and
        sketch: keep a 7-bit sketch of each row (d rounded up to 32 bytes, plus 16 bytes of
            factors) whose bound on the row's distance lets the CPU scans skip the exact
            distance of rows that cannot enter the top k (:mod:`vq.kernels.exact.sketch`; factory
            ``"IVF1024,Flat(sketch)"``): the same results with fewer exact distances (on
            NSynth's 128 dimensions about a quarter of the probed rows needed one), used
            where the rows' heads do not prune already (:meth:`scans_sketches`; measurements:
            docs/perf/indexes.md). No faiss counterpart (``to_faiss`` writes
            the vectors alone).

    Buffers (beyond :class:`IVFIndex`'s): vectors: float32 [n_rows, dim], in list order; with
    ``sketch``: sketch_low, sketch_step float32 [dim] (the codes' ranges, set by ``train``),
    sketches uint8 [n_rows, width], sketch_factors float32 [n_rows, 4].
    """

    row_buffers = ("vectors",)

    def __init__(
        self,
        dim: int,
        nlist: int,
        metric: str = "l2",
        k: int = 10,
        nprobe: int = 1,
        *,
        sketch: bool = False,
        **options,
    ):
        super().__init__(dim, nlist, metric, k, nprobe, **options)
        self.register_buffer("vectors", torch.zeros(0, dim))
        self.sketch = check_flag(sketch, "sketch")
        if self.sketch:
            self.row_buffers = ("vectors", "sketches", "sketch_factors")
            self.register_buffer("sketch_low", torch.zeros(dim))
            self.register_buffer("sketch_step", torch.ones(dim))
            self.register_buffer("sketches", torch.zeros(0, sketch_width(dim), dtype=torch.uint8))
            self.register_buffer("sketch_factors", torch.zeros(0, FACTORS))

    def config(self) -> dict:
        return {**super().config(), **({"sketch": True} if self.sketch else {})}

    def learn(self, x: torch.Tensor) -> None:
        self._train_coarse(x)
        if self.sketch:
            low, step = sketch_ranges(x)
            self.sketch_low.copy_(low)
            self.sketch_step.copy_(step)

    def prunes(self) -> bool:
        """Whether the CPU scans compute each row's head first and skip its tail once the head
        reaches the heap's threshold (:mod:`vq.kernels.common.rowdist`; the same results either
        way): for L2, where the head's dimensions hold at least :data:`PRUNE_SHARE` of the
        centroids' variance (vectors rotated into their principal axes, ``"PCA128,IVF…"``,
        hold most of it there; isotropic ones a quarter, where the tests cost more than
        they save)."""
        if self.metric != "l2" or self.dim < MIN_SPLIT:
            return False
        c = self.quantizer.codebook
        return self.derived("prunes", (c,), lambda: head_share(c) >= PRUNE_SHARE)

    def _encode_rows(self, x: torch.Tensor, lists: torch.Tensor) -> dict[str, torch.Tensor]:
        if not self.sketch:
            return {"vectors": x}
        centroids = self.quantizer.codebook.to(x.device)[lists]
        codes, factors = sketch_rows(x, centroids, self.sketch_low, self.sketch_step)
        return {"vectors": x, "sketches": codes, "sketch_factors": factors}

    def decode_rows(self, rows: torch.Tensor) -> torch.Tensor:
        return self.vectors[rows.to(self.device)].float()

    def _rows_problem(self) -> str | None:
        problem = shape_problem("vectors", self.vectors, (self.n_rows, self.dim))
        if self.sketch and problem is None:
            width = sketch_width(self.dim)
            problem = shape_problem("sketches", self.sketches, (self.n_rows, width))
            problem = problem or shape_problem(
                "sketch_factors", self.sketch_factors, (self.n_rows, FACTORS)
            )
        return problem

    def _empty_faiss(self, quantizer) -> tuple:
        faiss = import_faiss()
        out = faiss.IndexIVFFlat(quantizer, self.dim, self.nlist, faiss_metric(self.metric))
        data = self.vectors.float().cpu().numpy().view(np.uint8).reshape(self.ntotal, -1)
        return out, data

    @classmethod
    def from_faiss(cls, f, metric: str) -> IVFFlat:
        """The IVFFlat of a faiss ``IndexIVFFlat`` ``f``: the same centroids (or graph),
        lists, vectors, ids and nprobe."""
        lists = lists_from_faiss(f, metric)
        out = cls(f.d, f.nlist, metric, nprobe=f.nprobe, **lists.routed)
        out.vectors = torch.from_numpy(lists.joined().view(np.float32).reshape(-1, f.d))
        return lists.fill(out)

    def searcher(self, k=None, *, nprobe=None, capacity=None, copy=True) -> IVFFlatSearch:
        """The search as a static-shape graph over a snapshot of the lists (``copy=False``:
        over the index's own), padded to one ``capacity`` (see :class:`IVFFlatSearch`; what
        :mod:`vq.export` writes out)."""
        return IVFFlatSearch(self, k, nprobe, capacity, copy)

    def scans_distinct_ids(self) -> bool:
        """Spilled lists held in memory (rows and ids: none read from the index file): the
        scans keep each id once (both copies of a vector hold the same floats, so the first
        one scanned stands for both)."""
        return self.spill and file_range(self.ids) is None and not self.rows_mapped()

    def _row_ids(self, store) -> np.ndarray:
        """The scans' ``row_ids`` over ``store``: each row's id where they keep ids distinct
        (:meth:`scans_distinct_ids`, the index's own lists), else none."""
        return self.ids.numpy() if store is self and self.scans_distinct_ids() else NO_ROW_IDS

    def scans_sketches(self) -> bool:
        """Whether the CPU scans test the rows' sketches: kept (``sketch=True``) and the rows'
        heads do not prune already (:meth:`prunes`: where they do, testing the heads is the
        cheaper test; docs/perf/indexes.md)."""
        return self.sketch and not self.prunes()

    def _sketch(self, store) -> tuple:
        """The scans' ``sketch`` over ``store``: its rows' sketches, the ranges and centroids
        where :meth:`scans_sketches` (else :data:`vq.kernels.exact.ivf_flat.NO_SKETCH`)."""
        if not self.scans_sketches():
            return NO_SKETCH
        return (
            store.sketches.contiguous().numpy(),
            store.sketch_factors.contiguous().numpy(),
            self.sketch_low.numpy(),
            self.sketch_step.numpy(),
            self._centroid_array(),
        )

    def _lean_kernel(self, store) -> tuple:
        x, offsets = store.vectors.contiguous().numpy(), store.offsets.numpy()
        lists = FlatLists(x, offsets, self.prunes(), self._row_ids(store), self._sketch(store))
        return kernels.ivf_flat_lean, (plain(lists),)

    def range_hits(self, q, radius: float, allowed=None, nprobe=None, max_codes=None) -> list:
        """The probed lists' hits, a block of queries (bounded probed rows) at a time."""
        ip, mask = self.metric == "ip", kernel_mask(self, allowed)
        lists = self.nearest_lists(q, self.effective_nprobe(nprobe))[1].numpy()
        x, offsets, qn = self.vectors.numpy(), self.offsets.numpy(), q.contiguous().numpy()

        def call(s, e, starts, t, rows, vals, counts):
            hits = RangeHits(starts, t, rows, vals, counts)
            kernels.ivf_flat_range_search(qn[s:e], x, offsets, lists[s:e], mask, ip, hits)

        return probed_hits(radius, ip, lists, self.list_sizes().numpy(), call, self._copy_ids())

    def _scan_numba(self, q, coarse, lists, out_dist, out_rows, ranked, allowed, store) -> None:
        flat_lists = FlatLists(
            store.vectors.numpy(),
            store.offsets.numpy(),
            self.prunes(),
            self._row_ids(store),
            self._sketch(store),
        )
        probes, ip = lists.contiguous().numpy(), self.metric == "ip"
        out = TopK(out_dist.numpy(), out_rows.numpy())
        kernels.ivf_flat_scan(q.contiguous().numpy(), flat_lists, probes, allowed, ip, out)


class IVFFlatSearch(IVFSearch):
    """:class:`IVFFlat`'s search as a static-shape graph: exact scores against the stored
    vectors in the probed lists' slots, plus the slot bias, then a top-k.

    Buffers (beyond :class:`IVFSearch`'s): vectors: float32 [n_rows, dim], in list order.
    """

    def __init__(self, index: IVFFlat, k=None, nprobe=None, capacity=None, copy: bool = True):
        super().__init__(index, k, nprobe, capacity, copy)
        self.register_buffer("vectors", kept(index.vectors.float(), copy))

    def search(self, queries: torch.Tensor, k: int, nprobe=None, allowed=None, limit=None):
        """``limit``: int64 [B], the lists each query probes (<= nprobe; default all)."""
        _, lists = self.probe(queries, self.lists_probed(nprobe))
        rows = self.gather_lists(self.list_rows, lists)  # [B, C]
        cand = self.vectors.index_select(0, rows.clamp_min(0).reshape(-1)).reshape(*rows.shape, -1)
        q = queries[:, None, :]
        scores = -(cand * q).sum(-1) if self.metric == "ip" else ((cand - q) ** 2).sum(-1)
        scores = scores + self.gather_lists(self.slot_bias, lists)
        bias = self.candidate_bias(lists, allowed, limit)
        scores = scores if bias is None else scores + bias
        return self.results(*self.top(scores, k, rows), k)

    def chunk_rows(self, k: int, nprobe: int | None = None) -> int:
        return max(1, (1 << 25) // (self.lists_probed(nprobe) * self.capacity * self.dim))


def _from_description(match, dim: int, metric: str) -> IVFFlat:
    args = ivf_arguments(match)
    return IVFFlat(dim, args.pop("nlist"), metric, sketch=bool(match["sketch"]), **args)


register(
    IVFFlat,
    example="IVF16,Flat",
    factory=IVF_FACTORY + r",Flat(?P<sketch>\(sketch\))?",
    build=_from_description,
    syntax="IVF<nlist>,Flat[(sketch)]",
    family=IVF_FACTORY,
    faiss=("IndexIVFFlat",),
)
