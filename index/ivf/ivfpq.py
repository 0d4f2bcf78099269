"""IVFADC: inverted lists of PQ codes of the residuals to the coarse centroids (faiss
``IndexIVFPQ``), searched with look-up tables.

For L2 and ``by_residual`` the tables use faiss's decomposition, with x the query, c the coarse
centroid and r the PQ reconstruction of the residual:

    ||x - c - r||² = ||x - c||²  +  (||r||² + 2⟨c, r⟩)  -  2⟨x, r⟩
                     coarse         precomputed per list    per query

so a probe costs one table addition (M × ksub) instead of a new table from the residual.
"""

from __future__ import annotations

import numpy as np
import torch

from vq import kernels
from vq._checks import check_flag
from vq.faiss_interop import pq_from_faiss
from vq.index.core import fastscan_codes as fastscan
from vq.index.core.faiss_build import (
    code_bytes,
    copy_codebooks,
    faiss_metric,
    fast_scan_M,
    import_faiss,
    keep_alive,
    pq_codes_from_faiss,
)
from vq.index.core.fastscan_codes import check_fast_scan
from vq.index.core.filters import block_bits, kernel_mask, row_bits
from vq.index.core.ranges import probed_hits
from vq.index.core.registry import register
from vq.index.core.searching import shape_problem
from vq.index.core.storage import move_lists, reserve, set_rows
from vq.index.flat.pq_index import codes_problem, pq_quantizer
from vq.index.ivf.ivf_faiss import lists_from_faiss
from vq.index.ivf.ivf_index import IVF_FACTORY, IVFIndex, ivf_arguments
from vq.index.ivf.ivfpq_search import IVFPQSearch, residual_terms
from vq.index.ivf.ivfpq_tables import ListTables, filled_table
from vq.kernels.common.bundles import (
    PackedLists,
    PQLists,
    Probes,
    RangeHits,
    ScaledTopK,
    Tables,
    TopK,
    plain,
)
from vq.kernels.fastscan import fastscan_scans as fastscan_kernels
from vq.kernels.fastscan.fastscan_ivf import ivf_fastscan_lean, ivf_fastscan_lists
from vq.quantizers.product import pq_decode

#: no list: ``_kernel_args`` fills no row of the precomputed table
_NO_LISTS = np.zeros(0, np.int64)


class IVFPQ(IVFIndex):
    """IVF with product-quantized residuals.

    Args:
        dim: vector dimension (a multiple of M).
        nlist: inverted lists.
        M: sub-quantizers (bytes per vector with nbits=8).
        nbits: bits per sub-code.
        by_residual: encode ``x - c`` (the residual to the list's centroid) rather than x.
        metric, k, nprobe, coarse_niter, coarse_init, seed, verbose, spill, soar_lambda,
            coarse_hnsw, spherical: as :class:`vq.index.IVFIndex` (spilled by residual: each
            copy encodes its residual to its own list's centroid).
        fast_scan: with nbits=4, scan with the 4-bit fast-scan kernel (faiss
            ``IndexIVFPQFastScan``, factory ``"IVF1024,PQ32x4fs"``); distances are approximate.
        **pq_options: passed to :class:`vq.ProductQuantizer` (niter, init,
            max_points_per_centroid).

    Submodules and buffers (beyond :class:`IVFIndex`'s):
        pq: the :class:`vq.ProductQuantizer`; codes: [n_rows, M] (uint8 for nbits <= 8), in
        list order; precomputed_table: float32 [nlist, M, 2**nbits] (not saved; the rows of
        the lists searches probe filled as they probe them, see :mod:`vq.index.ivf.ivfpq_tables`;
        started anew when the codebooks change). A fast-scan index holds its codes once, as
        faiss's blocks (:mod:`vq.index.core.fastscan_codes`): packed_codes: uint8 [blocks,
        M * 16], list l in blocks ``list_blocks[l]:list_blocks[l + 1]`` (``ceil(size / 32)``
        a list, derived from the offsets); ``codes`` is then a property that unpacks them (a
        new [n_rows, M] tensor per read, in list order; assigning it packs, by the offsets).
    """

    row_buffers = ("codes",)
    #: above this size the per-list term is not precomputed (faiss's limit, 2 GiB)
    precomputed_table_max_bytes = 1 << 31

    def __init__(
        self,
        dim: int,
        nlist: int,
        M: int,
        nbits: int = 8,
        by_residual: bool = True,
        metric: str = "l2",
        k: int = 10,
        nprobe: int = 1,
        *,
        coarse_niter: int = 10,
        coarse_init: str = "auto",
        seed: int = 1234,
        verbose: bool = False,
        fast_scan: bool = False,
        spill: bool = False,
        soar_lambda: float = 1.0,
        coarse_hnsw: int = 0,
        spherical: bool = False,
        **pq_options,
    ):
        super().__init__(
            dim,
            nlist,
            metric,
            k,
            nprobe,
            coarse_niter=coarse_niter,
            coarse_init=coarse_init,
            seed=seed,
            verbose=verbose,
            spill=spill,
            soar_lambda=soar_lambda,
            coarse_hnsw=coarse_hnsw,
            spherical=spherical,
        )
        self.pq = pq_quantizer(dim, M, nbits, seed=seed, **pq_options)
        self.fast_scan = check_fast_scan(fast_scan, M, nbits)
        self.by_residual = check_flag(by_residual, "by_residual")
        if self.fast_scan:  # the codes as blocks alone (see the class docstring)
            self.row_buffers, self.block_rows = (), ("codes",)
            self.register_buffer("packed_codes", torch.zeros(0, M * 16, dtype=torch.uint8))
        else:
            self.register_buffer("codes", torch.zeros(0, M, dtype=self.pq.code_dtype))
        self.register_buffer("precomputed_table", torch.zeros(0, M, self.pq.ksub), persistent=False)
        self._tables = ListTables()

    @property
    def is_trained(self) -> bool:
        return self.quantizer.is_trained and self.pq.is_trained

    def config(self) -> dict:
        pq = {k: v for k, v in self.pq.config().items() if k != "seed"}  # the index's seed
        config = {**super().config(), **pq, "by_residual": self.by_residual}
        return {**config, "fast_scan": True} if self.fast_scan else config

    def vector_ns(self) -> float:
        return self.pq.M / (64 if self.fast_scan else 4)

    @property
    def codes(self) -> torch.Tensor:
        """[n_rows, M]: the stored codes in list order (a fast-scan index's unpacked from its
        blocks: a new tensor, on the index's device)."""
        held = self.__dict__["_buffers"].get("codes")
        if held is not None:
            return held
        if not self.__dict__.get("fast_scan"):
            raise AttributeError("codes")
        every = fastscan.unpack_blocks(self.packed_codes, self.pq.M)
        return every[fastscan.row_slots(self.offsets, self.list_blocks)]

    @codes.setter
    def codes(self, value: torch.Tensor) -> None:  # (a fast-scan index: packed by the offsets)
        if not self.fast_scan:
            self._buffers["codes"] = value
            return
        if value.shape[0] != int(self.offsets[-1]):
            raise ValueError(
                f"codes of {value.shape[0]} rows for lists of {int(self.offsets[-1])}; set the "
                "offsets first"
            )
        self.packed_codes = fastscan.pack_rows(value, self.offsets)

    @property
    def list_blocks(self) -> torch.Tensor:
        """int64 [nlist + 1]: the first block of each list in ``packed_codes`` (fast-scan)."""
        return self.derived(
            "list_blocks", (self.offsets,), lambda: fastscan.list_blocks(self.offsets)
        )

    def growing_buffers(self) -> tuple[str, ...]:
        return (*super().growing_buffers(), *(("packed_codes",) if self.fast_scan else ()))

    def block_buffers(self) -> dict[str, torch.Tensor]:
        return {"packed_codes": self.packed_codes} if self.fast_scan else {}

    def _rows_problem(self) -> str | None:
        if not self.fast_scan:
            return codes_problem(self.codes, self.n_rows, self.pq)
        o = self.offsets
        if o.shape != (self.nlist + 1,) or bool((o.diff() < 0).any()):
            return None  # (the offsets' own problem, said next)
        blocks = int(fastscan.list_blocks(o)[-1])
        return shape_problem("packed_codes", self.packed_codes, (blocks, self.pq.M * 16))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        plain, offsets = state_dict.get(prefix + "codes"), state_dict.get(prefix + "offsets")
        if self.fast_scan and plain is not None and prefix + "packed_codes" not in state_dict:
            # a file of vq <= 0.x (format 2): the plain codes, packed as this index holds them
            del state_dict[prefix + "codes"]
            o = offsets if offsets is not None else torch.zeros(0, dtype=torch.int64)
            good = (
                plain.dim() == 2
                and plain.shape[1] == self.pq.M
                and o.shape == (self.nlist + 1,)
                and int(o[0]) == 0
                and int(o[-1]) == plain.shape[0]
                and not bool((o.diff() < 0).any())
                and (not plain.shape[0] or int(plain.max()) < 16)
            )
            if not good:  # (what consistency_problem would have said of them)
                raise RuntimeError(
                    f"codes of shape {tuple(plain.shape)} that do not fit the lists or [0, 16)"
                )
            state_dict[prefix + "packed_codes"] = fastscan.pack_rows(plain, o)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def faiss_counterpart(self):
        """faiss ``IndexIVFPQ`` (``IndexIVFPQFastScan`` for fast-scan; precomputed tables
        where vq uses them) with the same centroids, codebooks, lists, ids and nprobe."""
        out = super().faiss_counterpart()
        if self._uses_precomputed():
            out.use_precomputed_table = 1
            out.precompute_table()
        if not self.fast_scan:
            return out
        fast = keep_alive(import_faiss().IndexIVFPQFastScan(out), out)
        fast.nprobe = self.nprobe
        return fast

    def _empty_faiss(self, quantizer) -> tuple:
        faiss, M, nbits = import_faiss(), self.pq.M, self.pq.nbits
        out = faiss.IndexIVFPQ(quantizer, self.dim, self.nlist, M, nbits, faiss_metric(self.metric))
        out.by_residual = self.by_residual
        copy_codebooks(self.pq, out.pq)
        return out, code_bytes(self.codes, nbits).reshape(self.ntotal, out.code_size)

    @classmethod
    def from_faiss(cls, f, metric: str) -> IVFPQ:
        """The IVFPQ of a faiss ``IndexIVFPQ`` or ``IndexIVFPQFastScan`` ``f`` (even M): the
        same centroids (or graph), codebooks, lists, codes, ids and nprobe."""
        fast_scan = isinstance(f, import_faiss().IndexIVFPQFastScan)
        lists = lists_from_faiss(f, metric, fast_scan)
        fs = fast_scan and fast_scan_M(f.pq) > 0
        out = cls(
            f.d,
            f.nlist,
            f.pq.M,
            f.pq.nbits,
            f.by_residual,
            metric,
            nprobe=f.nprobe,
            fast_scan=fs,
            **lists.routed,
        )
        out.pq = pq_from_faiss(f.pq)
        if fast_scan:  # (packed by the lists: the offsets first)
            codes = torch.from_numpy(np.concatenate(lists.codes)[:, : f.pq.M])
            out = lists.fill(out)
            out.codes = codes
            return out
        out.codes = pq_codes_from_faiss(lists.joined(), f.pq)
        return lists.fill(out)

    @property
    def M(self) -> int:
        return self.pq.M

    @property
    def nbits(self) -> int:
        return self.pq.nbits

    # -- training and adding --------------------------------------------------------------
    def kernels_ahead(self) -> None:
        super().kernels_ahead()
        if self.device.type == "cpu":
            self.pq.kernels_ahead()
            if self.fast_scan:
                fastscan.write_rows_ahead()

    def learn(self, x: torch.Tensor) -> None:
        self._train_coarse(x)
        self.pq.fit(self._residuals(x, self._assign(x)) if self.by_residual else x)

    def _residuals(self, x: torch.Tensor, lists: torch.Tensor) -> torch.Tensor:
        return x - self.quantizer.codebook.float().index_select(0, lists)

    def _encode_rows(self, x: torch.Tensor, lists: torch.Tensor) -> dict[str, torch.Tensor]:
        target = self._residuals(x, lists) if self.by_residual else x
        return {"codes": self.pq.encode_rows(target)}

    def _grow_blocks(self, old: torch.Tensor, new: torch.Tensor):
        before, starts = self.packed_codes, fastscan.list_blocks(old)
        grown = fastscan.list_blocks(new)
        full = reserve(self, "packed_codes", int(grown[-1]))  # (room with spare capacity)
        move_lists(full, starts, grown)  # whole blocks: every list towards the end, in place
        counts, room = starts.diff(), grown.diff() - starts.diff()
        lists = torch.repeat_interleave(torch.arange(self.nlist, device=full.device), room)
        fresh = torch.arange(int(room.sum()), device=full.device)
        fresh = fresh - (torch.cumsum(room, 0) - room)[lists] + (grown[:-1] + counts)[lists]
        full[fresh] = 0  # the lists' new blocks (their padding is code 0)
        set_rows(self, "packed_codes", int(grown[-1]))

        def undo():
            move_lists(full, grown, starts)
            self._buffers["packed_codes"] = before
            if before.untyped_storage().data_ptr() != full.untyped_storage().data_ptr():
                return  # (grown into a new tensor: the old blocks were not written)
            o, b = old.cpu().numpy(), starts.cpu().numpy()  # the old last blocks' padding
            pad = [np.arange(b[i] * 32 + o[i + 1] - o[i], b[i + 1] * 32) for i in range(self.nlist)]
            slots = np.concatenate(pad).astype(np.int64)
            zeros = torch.zeros((slots.shape[0], self.pq.M), dtype=torch.uint8)
            fastscan.write_rows(before, slots, zeros)

        return undo

    def _write_blocks(self, encoded: dict, lists, slots: np.ndarray, offsets) -> None:
        offsets = offsets.cpu()
        starts = fastscan.list_blocks(offsets).numpy()
        lists = lists.cpu().numpy()
        at = slots - offsets.numpy()[lists] + starts[lists] * fastscan.BLOCK
        fastscan.write_rows(self.packed_codes, at, encoded["codes"])

    def _move_blocks(self, old: torch.Tensor, new: torch.Tensor, rowmap: np.ndarray) -> None:
        self.packed_codes = fastscan.moved_blocks(self.packed_codes, old, rowmap, new)

    def decode_rows(self, rows: torch.Tensor) -> torch.Tensor:
        rows = rows.to(self.device)
        if self.fast_scan:
            lists = self._row_lists(rows)
            slots = rows - self.offsets[lists] + self.list_blocks[lists] * fastscan.BLOCK
            codes = fastscan.codes_at(self.packed_codes, slots, self.pq.M)
        else:
            codes = self.codes[rows]
        x = pq_decode(codes, self.pq.codebooks.float())
        if self.by_residual:
            x = x + self.quantizer.codebook.float()[self._row_lists(rows)]
        return x

    # -- look-up tables -------------------------------------------------------------------
    def _uses_precomputed(self) -> bool:
        size = self.nlist * self.pq.M * self.pq.ksub * 4
        return self.metric == "l2" and self.by_residual and size <= self.precomputed_table_max_bytes

    def precompute_table(self) -> torch.Tensor:
        """float32 [nlist, M, ksub]: the per-list term ``||r||² + 2⟨c, r⟩`` of L2 search by
        residual (faiss's ``precompute_table``), held in the ``precomputed_table`` buffer,
        every row filled. Searches fill only the rows of the lists they probe (see
        :mod:`vq.index.ivf.ivfpq_tables`); call it to fill the whole table beforehand, as faiss
        does. The table starts anew whenever the coarse centroids or the PQ codebooks
        change (or move)."""
        return self._list_table(None)

    def _list_table(self, lists) -> torch.Tensor:
        """The ``precomputed_table`` buffer with the rows of ``lists`` (int64, any shape, -1
        ignored; None: all) filled (see :func:`vq.index.ivf.ivfpq_tables.filled_table`)."""
        return filled_table(self, self._tables, lists)

    def _table_inputs(self) -> tuple:
        """float32 numpy (centroids [nlist, dim], codebooks_t [M, dsub, ksub], norms [M,
        ksub]): what the table and the kernels are computed from, kept until they change."""
        c, cb = self.quantizer.codebook, self.pq.codebooks

        def compute():
            cbf = cb.detach().float().cpu()
            centroids = c.detach().float().cpu().contiguous().numpy()
            return centroids, cbf.transpose(1, 2).contiguous().numpy(), (cbf * cbf).sum(-1).numpy()

        return self.derived("table_inputs", (c, cb), compute)

    # -- the torch path: the static search ---------------------------------------------------
    def searcher(
        self, k=None, *, nprobe=None, capacity=None, code_dtype=None, copy=True
    ) -> IVFPQSearch:
        """The search as a static-shape graph over a snapshot of the lists (``copy=False``:
        over the index's own), padded to one ``capacity`` (see :class:`IVFPQSearch`; what
        :mod:`vq.export` writes out). Fast-scan indexes search by float tables here."""
        return IVFPQSearch(self, k, nprobe, capacity, code_dtype, copy)

    # -- scans ----------------------------------------------------------------------------
    def _kernel_args(self, lists=None) -> Tables:
        """The codebooks as the numba kernels take them (see ``kernels.ivfpq_scanner``): a
        :class:`vq.kernels.common.bundles.Tables` (codebooks_t [M, dsub, ksub], norms
        [M, ksub], centroids [nlist, dim], list_tables [nlist or 0, M * ksub], kind, alpha,
        and whether the coarse scores are the tables' base); kept until the codebooks change.
        ``list_tables`` (the precomputed table, where it is used) holds the rows of ``lists``
        (int64, any shape; None: of every list): a kernel given it must probe no other
        list."""
        c, cb = self.quantizer.codebook, self.pq.codebooks

        def compute():
            centroids, codebooks_t, norms = self._table_inputs()
            arrays = (codebooks_t, norms, centroids)
            if not self.by_residual:
                kind = kernels.IP_TABLE if self.metric == "ip" else kernels.L2_TABLE
                return arrays, False, kind, np.float32(-1.0), False
            if self.metric == "ip":
                return arrays, False, kernels.IP_TABLE, np.float32(-1.0), True
            if self._uses_precomputed():
                return arrays, True, kernels.IP_TABLE, np.float32(-2.0), True
            return arrays, False, kernels.RESIDUAL_L2_TABLE, np.float32(-1.0), False

        variant = f"kernel_args/{self.metric}/{self.by_residual}"  # attributes, not tensors
        arrays, precomputed, kind, alpha, coarse_base = self.derived(variant, (c, cb), compute)
        if precomputed:
            list_tables = self._list_table(lists).view(self.nlist, -1).numpy()
        else:
            list_tables = np.zeros((0, self.pq.M * self.pq.ksub), np.float32)
        return Tables(*arrays, list_tables, kind, alpha, coarse_base)

    def _scan_numba(self, q, coarse, lists, out_dist, out_rows, ranked, allowed, store) -> None:
        # the kernels build each query's tables themselves (from C-contiguous rows)
        q = q.contiguous()
        tables = self._kernel_args(lists.numpy())
        base = coarse.numpy() if tables.coarse_base else np.zeros(tuple(coarse.shape), np.float32)
        probes = Probes(lists.contiguous().numpy(), np.ascontiguousarray(base))
        if self.fast_scan:  # (store: this index, or the lists read from its file)
            starts = store.list_blocks.numpy()
            packed = store.packed_codes.numpy().reshape(-1, 32)
            packed_lists = PackedLists(starts, store.offsets.numpy(), packed)
            scale, offset = np.empty(q.shape[0], np.float32), np.empty(q.shape[0], np.float32)
            out = ScaledTopK(out_dist.numpy(), out_rows.numpy(), scale, offset)
            scan = ivf_fastscan_lists(self.pq.M // 2, self.pq.dsub, fastscan_kernels.best_isa())
            mask = block_bits(allowed, store.offsets, starts)
            scan(q.numpy(), tables, packed_lists, probes, mask, out, ranked)
            return
        codes, words = kernels.code_view(store.codes.contiguous().numpy(), self.pq.ksub)
        pq_lists = PQLists(codes, store.offsets.numpy())
        out = TopK(out_dist.numpy(), out_rows.numpy())
        scan = kernels.ivfpq_scanner(self.pq.M, words, self.pq.dsub)
        scan(q.numpy(), tables, pq_lists, probes, row_bits(allowed), out)

    def range_hits(self, q, radius: float, allowed=None, nprobe=None, max_codes=None) -> list:
        """The probed lists' hits by the ADC values of the top-k scan (fast-scan indexes too,
        with float tables: exact ADC distances, not the quantized ones), a block of queries
        at a time."""
        coarse, lists = self.nearest_lists(q, self.effective_nprobe(nprobe))
        tables = self._kernel_args(_NO_LISTS)
        terms = np.zeros(0, np.float32)
        if tables.list_tables.shape[0]:  # L2 by residual: a term per row, not a table per probe
            terms = self._row_terms()
            tables = Tables(*tables[:3], tables.list_tables[:0], *tables[4:])
        base = coarse.numpy() if tables.coarse_base else np.zeros(tuple(coarse.shape), np.float32)
        lists, qn, offsets = lists.numpy(), q.contiguous().numpy(), self.offsets.numpy()
        codes, words = kernels.code_view(self.codes.contiguous().numpy(), self.pq.ksub)
        pq_lists = PQLists(codes, offsets)
        hits, mask = kernels.ivfpq_hits(self.pq.M, words, self.pq.dsub), kernel_mask(self, allowed)

        def call(s, e, starts, t, rows, vals, counts):
            probes = Probes(np.ascontiguousarray(lists[s:e]), np.ascontiguousarray(base[s:e]))
            found = RangeHits(starts, t, rows, vals, counts)
            hits(qn[s:e], tables, pq_lists, probes, mask, found, terms)

        sizes = self.list_sizes().numpy()
        return probed_hits(radius, self.metric == "ip", lists, sizes, call, self._copy_ids())

    def _row_terms(self) -> np.ndarray:
        """float32 [n_rows]: :func:`residual_terms`, kept until the codes or codebooks change
        (range search reads a term per row instead of a list's table per probe: 4 bytes a
        vector, where the table of a probe is M * ksub floats read from nlist of them)."""
        codes = self.packed_codes if self.fast_scan else self.codes
        sources = (codes, self.offsets, self.quantizer.codebook, self.pq.codebooks)
        return self.derived("row_terms", sources, lambda: residual_terms(self).numpy())

    def _lean_kernel(self, store) -> tuple:
        tables = self._kernel_args(_NO_LISTS)  # the lean kernel probes by itself
        offsets = store.offsets.numpy()
        if self.fast_scan:
            isa = fastscan_kernels.best_isa()
            kernel = ivf_fastscan_lean(self.pq.M // 2, self.pq.dsub, isa)
            packed = store.packed_codes.numpy().reshape(-1, 32)
            lists = PackedLists(store.list_blocks.numpy(), offsets, packed)
        else:
            codes, words = kernels.code_view(store.codes.contiguous().numpy(), self.pq.ksub)
            kernel = kernels.ivfpq_lean(self.pq.M, words, self.pq.dsub)
            lists = PQLists(codes, offsets)
        args = (plain(tables), plain(lists))
        list_tables, state = tables.list_tables, self._tables
        if not (list_tables.shape[0] and state.missing):
            return kernel, args
        inputs = self._table_inputs()
        if store is not self:  # lists read from the file: it may probe no other
            state.fill(store.lists, list_tables, inputs)
            return kernel, args

        def lean(q, coarse, tables, lists, finish, ip, nprobe, *rest):  # the rows it may read first
            panels, c_norms = coarse[:2]  # (a Coarse, as a plain tuple)
            state.fill_near(q, panels, c_norms, nprobe, list_tables, inputs)
            return kernel(q, coarse, tables, lists, finish, ip, nprobe, *rest)

        return lean, args


def _from_description(match, dim: int, metric: str) -> IVFPQ:
    args, fs = ivf_arguments(match), match["fs"]
    M, nbits = int(match["M"]), int(match["nbits"] or 8)
    residual = fs != "fs"  # IndexIVFPQFastScan encodes residuals only with "x4fsr"
    return IVFPQ(
        dim, args.pop("nlist"), M, nbits, residual, metric=metric, fast_scan=bool(fs), **args
    )


register(
    IVFPQ,
    example="IVF16,PQ8",
    factory=IVF_FACTORY + r",PQ(?P<M>\d+)(?:x(?P<nbits>\d+)(?P<fs>fsr?)?)?(?:np)?",
    build=_from_description,
    syntax="IVF<nlist>,PQ<M>[x<nbits>|x4fs|x4fsr]",
    family=IVF_FACTORY,
    faiss=("IndexIVFPQ", "IndexIVFPQFastScan"),
)
