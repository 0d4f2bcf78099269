"""Product-quantized index: codes scanned with asymmetric distance tables (ADC)."""

from __future__ import annotations

import numpy as np
import torch

from vq import _cpu, kernels
from vq._checks import check_int, check_seed
from vq.faiss_interop import pq_from_faiss
from vq.index.core import fastscan_codes as fastscan
from vq.index.core.base import Index
from vq.index.core.faiss_build import (
    code_bytes,
    copy_codebooks,
    faiss_metric,
    fast_scan_M,
    import_faiss,
    keep_alive,
    pq_codes_from_faiss,
    with_id_map,
)
from vq.index.core.fastscan_codes import check_fast_scan
from vq.index.core.filters import IdFilter, kernel_mask
from vq.index.core.ranges import probed_hits
from vq.index.core.registry import register
from vq.index.core.searchers import Searcher, kept, top_rows
from vq.index.core.searching import NO_IDS, shape_problem
from vq.index.core.storage import explicit_ids, remove_rows, reserve, set_rows
from vq.kernels.common.bundles import PQLists, Probes, RangeHits, Tables
from vq.kernels.common.constants import metric as kernel_metric
from vq.kernels.fastscan import fastscan_scans as packed4
from vq.quantizers import ProductQuantizer
from vq.quantizers.product import lookup_tables, pq_decode


class PQIndex(Index):
    """Stores M-byte PQ codes; search sums per-query look-up tables over the codes (faiss
    ``IndexPQ``). On CPU the scan is a numba kernel specialised per M and fused with the top-k
    selection; elsewhere (CUDA, tracing) it is a gather + sum + topk in torch.

    Args:
        dim: vector dimension (a multiple of M).
        M: sub-quantizers (bytes per vector with nbits=8).
        nbits: bits per sub-code.
        metric: "l2" or "ip".
        k: neighbours ``forward`` returns.
        verbose: progress bars for train and add.
        fast_scan: with nbits=4, search with the 4-bit fast-scan kernel (faiss
            ``IndexPQFastScan``, factory ``"PQ32x4fs"``): tables quantized to uint8, codes
            scanned 32 at a time with byte shuffles; distances are approximate.
        **pq_options: passed to :class:`vq.ProductQuantizer` (niter, seed, …).

    Submodules and buffers:
        pq: the :class:`vq.ProductQuantizer`; codes: [ntotal, M] (uint8 for nbits <= 8);
        ids: int64 [ntotal]. A fast-scan index holds its codes once, as faiss's blocks
        (:mod:`vq.index.core.fastscan_codes`): packed_codes: uint8 [ceil(ntotal / 32), M * 16]
        and code_rows: uint8 [ntotal, 0] (no bytes: its length is the number of codes the
        blocks hold); ``codes`` is then a property that unpacks them (a new [ntotal, M]
        tensor per read; assigning it packs).
    """

    row_buffers = ("codes",)

    def __init__(
        self,
        dim: int,
        M: int,
        nbits: int = 8,
        metric: str = "l2",
        k: int = 10,
        verbose: bool = False,
        *,
        fast_scan: bool = False,
        **pq_options,
    ):
        super().__init__(dim, metric, k, verbose)
        self.pq = pq_quantizer(dim, M, nbits, **pq_options)
        self.fast_scan = check_fast_scan(fast_scan, M, nbits)
        if self.fast_scan:  # the codes as blocks alone (see the class docstring)
            self.row_buffers = ()
            self.register_buffer("packed_codes", torch.zeros(0, M * 16, dtype=torch.uint8))
            self.register_buffer("code_rows", torch.zeros(0, 0, dtype=torch.uint8))
        else:
            self.register_buffer("codes", torch.zeros(0, M, dtype=self.pq.code_dtype))

    @property
    def codes(self) -> torch.Tensor:
        """[ntotal, M]: the stored codes (a fast-scan index's unpacked from its blocks: a new
        tensor, on the index's device)."""
        held = self.__dict__["_buffers"].get("codes")
        if held is not None:
            return held
        if not self.__dict__.get("fast_scan"):
            raise AttributeError("codes")
        return fastscan.unpack_blocks(self.packed_codes, self.pq.M)[: self.ntotal]

    @codes.setter
    def codes(self, value: torch.Tensor) -> None:  # (a fast-scan index: packed)
        if not self.fast_scan:
            self._buffers["codes"] = value
            return
        self.packed_codes = fastscan.pack_rows(value)
        self.code_rows = value.new_zeros((value.shape[0], 0), dtype=torch.uint8)

    @property
    def is_trained(self) -> bool:
        return self.pq.is_trained

    def config(self) -> dict:
        config = {**super().config(), **self.pq.config()}
        return {**config, "fast_scan": True} if self.fast_scan else config

    def learn(self, x: torch.Tensor) -> None:
        self.pq.fit(x)

    def encode_batch(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"codes": self.pq.encode_rows(x)}

    @property
    def ntotal(self) -> int:
        return int((self.code_rows if self.fast_scan else self.codes).shape[0])

    def decode_rows(self, rows: torch.Tensor) -> torch.Tensor:
        rows = rows.to(self.device)
        if self.fast_scan:
            codes = fastscan.codes_at(self.packed_codes, rows, self.pq.M)
        else:
            codes = self.codes[rows]
        return pq_decode(codes, self.pq.codebooks.float())

    def growing_buffers(self) -> tuple[str, ...]:
        if self.fast_scan:
            return (*super().growing_buffers(), "packed_codes", "code_rows")
        return (*super().growing_buffers(), "codes")

    def consistency_problem(self) -> str | None:
        problem = super().consistency_problem()
        if problem is not None or not self.fast_scan:
            return problem or codes_problem(self.codes, self.ntotal, self.pq)
        blocks = fastscan.blocks_for(self.ntotal)
        return shape_problem("packed_codes", self.packed_codes, (blocks, self.pq.M * 16))

    # -- a fast-scan index's rows: written into its blocks -------------------------------------
    def add_rows(self, x: torch.Tensor, ids, prepare=None) -> None:
        if not self.fast_scan:
            return super().add_rows(x, ids, prepare)
        before = {k: self._buffers[k] for k in ("packed_codes", "code_rows", "ids")}
        n = self.ntotal
        reserve(self, "packed_codes", fastscan.blocks_for(n + x.shape[0]))  # room for all
        try:
            super().add_rows(x, ids, prepare)
        except BaseException:
            self._restore(before, n)
            raise

    def _restore(self, before: dict, n: int) -> None:
        """The buffers ``before`` back after a failed write of rows past ``n``: where the
        codes were written into the old blocks' room, the slots past row n back to code 0."""
        old = before["packed_codes"].untyped_storage().data_ptr()
        written = self.packed_codes.untyped_storage().data_ptr() == old
        self._buffers.update(before)
        if written and n % fastscan.BLOCK:
            slots = np.arange(n, fastscan.blocks_for(n) * fastscan.BLOCK, dtype=np.int64)
            zeros = torch.zeros((slots.shape[0], self.pq.M), dtype=torch.uint8)
            fastscan.write_rows(self.packed_codes, slots, zeros)

    def _store(self, encoded: dict[str, torch.Tensor], ids: torch.Tensor) -> None:
        if not self.fast_scan:
            return super()._store(encoded, ids)
        self._append_ids(ids)  # (first: ntotal counts the codes stored before)
        self._append_codes(encoded["codes"])

    def _append_codes(self, codes: torch.Tensor) -> None:
        """Write fast-scan ``codes`` [b, M] after the stored ones, into the blocks' room."""
        n0, b = self.ntotal, codes.shape[0]
        blocks = fastscan.blocks_for(n0 + b)
        full = reserve(self, "packed_codes", blocks)
        full[fastscan.blocks_for(n0) : blocks] = 0  # (room not written yet: its padding is 0)
        fastscan.write_rows(full, np.arange(n0, n0 + b, dtype=np.int64), codes)
        set_rows(self, "packed_codes", blocks)
        self.code_rows = self.code_rows.new_zeros((n0 + b, 0))

    def merge_rows(self, other, shift: int) -> None:
        if not self.fast_scan:
            return super().merge_rows(other, shift)
        ids = self._merged_ids(other, shift)
        before = {k: self._buffers[k] for k in ("packed_codes", "code_rows", "ids")}
        n = self.ntotal
        try:
            self._append_ids(ids)
            self._append_codes(other.codes.to(self.device))
        except BaseException:
            self._restore(before, n)
            raise

    def _drop_rows(self, drop: np.ndarray, first: int, removed: int) -> None:
        if not self.fast_scan:
            return super()._drop_rows(drop, first, removed)
        n = self.ntotal
        explicit_ids(self, n)
        rows = (np.flatnonzero(drop[first:]) + first).astype(np.int64, copy=False)
        keep = np.ones(n, dtype=bool)
        keep[rows] = False
        kept = np.flatnonzero(keep).astype(np.int64)
        old = self.packed_codes
        # the index's own tensor (compacted in place: each block's rows come from it or later
        # blocks), or a new one of the blocks kept (a loaded or assigned buffer, not written)
        full = reserve(self, "packed_codes", fastscan.blocks_for(kept.shape[0]), rows=0)
        source = full if full.data_ptr() == old.data_ptr() else old
        spans = torch.tensor([0, n]), torch.tensor([0, kept.shape[0]])
        fastscan.moved_blocks(source, spans[0], kept, spans[1], out=full)
        set_rows(self, "packed_codes", fastscan.blocks_for(kept.shape[0]))
        remove_rows(self, ("ids",), rows)
        self.code_rows = self.code_rows.new_zeros((kept.shape[0], 0))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        plain = state_dict.get(prefix + "codes")
        if self.fast_scan and plain is not None and prefix + "packed_codes" not in state_dict:
            # a file of vq <= 0.x (format 2): the plain codes, packed as this index holds them
            del state_dict[prefix + "codes"]
            if plain.dim() == 2 and plain.shape[1] == self.pq.M and plain.shape[0]:
                codes_ok = int(plain.max()) < 16
            else:
                codes_ok = plain.dim() == 2 and plain.shape[1] == self.pq.M
            if not codes_ok:  # (what consistency_problem would have said of them)
                raise RuntimeError(f"codes of shape {tuple(plain.shape)} or outside [0, 16)")
            state_dict[prefix + "packed_codes"] = fastscan.pack_rows(plain)
            state_dict[prefix + "code_rows"] = torch.zeros((plain.shape[0], 0), dtype=torch.uint8)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def faiss_counterpart(self):
        """faiss ``IndexPQ`` (``IndexPQFastScan`` for fast-scan) with the same codebooks and
        codes, in an ``IndexIDMap`` unless the ids are 0 … ntotal - 1."""
        faiss = import_faiss()
        out = faiss.IndexPQ(self.dim, self.pq.M, self.pq.nbits, faiss_metric(self.metric))
        copy_codebooks(self.pq, out.pq)
        out.is_trained = True
        faiss.copy_array_to_vector(code_bytes(self.codes, self.pq.nbits).ravel(), out.codes)
        out.ntotal = self.ntotal
        if self.fast_scan:
            out = keep_alive(faiss.IndexPQFastScan(out), out)
        return with_id_map(out, self.stored_ids())

    @classmethod
    def from_faiss(cls, f, metric: str) -> PQIndex:
        """The PQIndex of a faiss ``IndexPQ`` or ``IndexPQFastScan`` ``f`` (even M): the same
        codebooks and codes."""
        faiss = import_faiss()
        if isinstance(f, faiss.IndexPQFastScan):
            out = cls(f.d, f.pq.M, f.pq.nbits, metric, fast_scan=fast_scan_M(f.pq) > 0)
            raw = faiss.vector_to_array(f.codes).reshape(-1, f.M2 // 2, 32)
            codes = torch.from_numpy(packed4.unpack_codes(raw, f.ntotal))
        else:
            out = cls(f.d, f.pq.M, f.pq.nbits, metric)
            codes = pq_codes_from_faiss(faiss.vector_to_array(f.codes), f.pq)
        out.pq = pq_from_faiss(f.pq)
        out.codes = codes
        return out

    def vector_ns(self) -> float:
        return self.pq.M / (64 if self.fast_scan else 4)

    def searcher(self, k: int | None = None, *, code_dtype=None, copy: bool = True) -> PQSearch:
        """The search as a static-shape graph over a snapshot of the codes (see
        :class:`PQSearch`; what :mod:`vq.export` writes out; ``copy=False``: over the index's
        own codebooks, its torch engine, fast-scan indexes too with float tables)."""
        return PQSearch(self, k, code_dtype, copy)

    def search_rows(self, q: torch.Tensor, k: int, allowed: IdFilter | None = None):
        # CPU tensors in eager mode (see _search_ids)
        ip, mask = self.metric == "ip", kernel_mask(self, allowed)
        if self.fast_scan and _cpu.fast_path(q):  # tables built by the kernel
            packed = self.packed_codes.numpy()
            return fastscan.pq_search(
                q.contiguous().numpy(), self._codebook_arrays(), ip, packed, self.ntotal, k, mask
            )
        tables = self.pq.tables(q, self.metric)  # [nq, M, ksub]
        if ip:
            tables = -tables  # the scan keeps the smallest sums
        dist = _cpu.empty((q.shape[0], k))
        rows = _cpu.empty((q.shape[0], k), torch.int64)
        codes, words = kernels.code_view(self.codes.contiguous().numpy(), self.pq.ksub)
        flat = tables.reshape(q.shape[0], -1).contiguous().numpy()
        kernels.adc_scanner(self.pq.M, words)(flat, codes, mask, dist.numpy(), rows.numpy())
        return dist, rows

    def range_hits(self, q: torch.Tensor, radius: float, allowed: IdFilter | None = None):
        """The hits by ADC values (fast-scan indexes too, with float tables: exact ADC
        distances, not the quantized ones): the IVF-PQ hits kernel over one list of every
        code, a block of queries at a time."""
        ip, n, pq = self.metric == "ip", self.ntotal, self.pq
        kind = kernels.IP_TABLE if ip else kernels.L2_TABLE
        no_lists = np.zeros((0, pq.M * pq.ksub), np.float32)
        no_centroids = np.zeros((0, self.dim), np.float32)
        tables = Tables(
            *self._codebook_arrays(), no_centroids, no_lists, kind, np.float32(-1.0), False
        )
        lists, offsets = np.zeros((q.shape[0], 1), np.int64), np.array([0, n], np.int64)
        codes, words = kernels.code_view(self.codes.contiguous().numpy(), pq.ksub)
        one_list = PQLists(codes, offsets)
        hits, mask, qn = (
            kernels.ivfpq_hits(pq.M, words, pq.dsub),
            kernel_mask(self, allowed),
            q.numpy(),
        )

        def call(s, e, starts, t, rows, vals, counts):
            probes = Probes(lists[s:e], np.zeros((e - s, 1), np.float32))
            hits(qn[s:e], tables, one_list, probes, mask, RangeHits(starts, t, rows, vals, counts))

        return probed_hits(radius, ip, lists, np.array([n], np.int64), call)

    def build_lean_search(self):
        """One kernel call for a few queries on the calling thread: tables, scan, ids (the
        fast-scan layout: see :func:`vq.index.core.fastscan_codes.pq_lean_search`)."""
        ip = kernel_metric(self.metric == "ip")
        codebooks_t, norms = self._codebook_arrays()
        ids = self.ids.numpy() if self.ids.shape[0] == self.ntotal else NO_IDS
        work, n = self.search_work, self.ntotal
        if self.fast_scan:
            packed = self.packed_codes.numpy()
            return fastscan.pq_lean_search(codebooks_t, norms, packed, n, ids, ip, work)
        codes, words = kernels.code_view(self.codes.contiguous().numpy(), self.pq.ksub)
        kernel = kernels.pq_lean(self.pq.M, words)

        def search(q: np.ndarray, k: int, ranked: bool, params: dict):
            nq = q.shape[0]
            if work(nq, min(k, n)) >= _cpu.SERIAL_WORK:
                return None  # the general path shares the scan between the threads
            out_dist = np.empty((nq, k), np.float32)
            out_ids = np.empty((nq, k), np.int64)
            if not kernel(q, codebooks_t, norms, codes, ids, ip, out_dist, out_ids):
                return None  # a NaN or an infinity: the general path says so
            return out_dist, out_ids

        return search

    def _codebook_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """The PQ codebooks transposed [M, dsub, ksub] and their squared norms [M, ksub], as
        the numba kernels read them; kept until the codebooks change."""
        cb = self.pq.codebooks

        def compute():
            cbf = cb.float()
            return cbf.transpose(1, 2).contiguous().numpy(), (cbf * cbf).sum(-1).numpy()

        return self.derived("codebook_arrays", (cb,), compute)


def pq_quantizer(dim: int, M: int, nbits: int, **options) -> ProductQuantizer:
    """The :class:`vq.ProductQuantizer` of a PQ index (PQIndex, IVFPQ), its arguments checked
    first by name and range: M and nbits integers (1 <= nbits <= 16), and of the k-means
    options ``niter`` an integer >= 0, ``max_points_per_centroid`` >= 1, ``seed`` a seed."""
    M, nbits = check_int(M, "M", 1), check_int(nbits, "nbits", 1, 16)
    for name, minimum in (("niter", 0), ("max_points_per_centroid", 1)):
        if name in options:
            options[name] = check_int(options[name], name, minimum)
    if "seed" in options:
        options["seed"] = check_seed(options["seed"])
    return ProductQuantizer(dim, M, nbits, **options)


def codes_problem(codes: torch.Tensor, n: int, pq) -> str | None:
    """``consistency_problem``'s words for stored PQ codes that are not [n, M] or not all in
    ``[0, ksub)`` of the :class:`vq.ProductQuantizer` ``pq`` (PQIndex and IVFPQ)."""
    problem = shape_problem("codes", codes, (n, pq.M))
    if codes.dtype == torch.uint8 and pq.ksub == 256:  # every byte is a code: no pass
        return problem
    if problem is None and n and not 0 <= int(codes.min()) <= int(codes.max()) < pq.ksub:
        problem = f"codes outside [0, {pq.ksub})"
    return problem


def stored_codes(index, code_dtype: torch.dtype | None) -> torch.Tensor:
    """The codes [ntotal, M] a PQIndex or IVFPQ stores (one per sub-quantizer), as
    ``code_dtype`` (default: as stored)."""
    codes, pq = index.codes.detach(), index.pq
    if codes.dim() != 2 or codes.shape[1] != pq.M:
        raise NotImplementedError(
            f"{type(index).__name__} stores codes of shape {tuple(codes.shape)}; its static "
            f"search reads one code per sub-quantizer, [ntotal, {pq.M}]"
        )
    return codes.to(code_dtype or codes.dtype)


def adc_scores(tables: torch.Tensor, codes_t: torch.Tensor) -> torch.Tensor:
    """Sums of look-up table entries over the codes, as one static-shape graph.

    Args:
        tables: float32 [M, B, ksub] (:func:`vq.quantizers.product.lookup_tables`).
        codes_t: integer [M, n], the codes transposed.

    Returns:
        float32 [B, n]: ``Σ_m tables[m, b, codes_t[m, i]]``, summed in the order of m.
    """
    n = tables.shape[1]
    if isinstance(n, int) and n == 1:
        # one query: element-wise gathers (GatherElements, ~10x a Gather in ONNX Runtime)
        scores = torch.gather(tables[0], 1, codes_t[:1].long())  # [1, n]
        for m in range(1, codes_t.shape[0]):
            scores = scores + torch.gather(tables[m], 1, codes_t[m : m + 1].long())
        return scores
    # a batch: rows of the transposed tables, B contiguous values per code (~4x faster)
    tables = tables.transpose(1, 2)  # [M, ksub, B]
    scores = tables[0].index_select(0, codes_t[0].long())  # [n, B]
    for m in range(1, codes_t.shape[0]):
        scores = scores + tables[m].index_select(0, codes_t[m].long())
    return scores.T


class PQSearch(Searcher):
    """:class:`PQIndex`'s search as a static-shape graph (fast-scan indexes too, with float
    tables): a look-up table per query from one batched matrix product, summed over the codes
    with gathers, then a top-k (see :class:`vq.index.core.searchers.Searcher`).

    Args:
        index: the PQIndex; k: neighbours ``forward`` returns (default the index's).
        code_dtype: integer dtype of the codes held (default as stored).
        copy: hold a snapshot (True) or the index's own codebooks (the torch path).

    Buffers:
        codebooks: float32 [M, ksub, dsub]; codes_t: [M, ntotal], the codes transposed;
        id_table: int64 [ntotal] unless the ids are the row numbers.
    """

    def __init__(self, index: PQIndex, k=None, code_dtype=None, copy: bool = True):
        super().__init__(index, k, copy)
        self.register_buffer("codebooks", kept(index.pq.codebooks.float(), copy))
        codes = stored_codes(index, code_dtype)
        self.code_dtype = codes.dtype
        self.register_buffer("codes_t", codes.T.contiguous())

    def search(self, queries: torch.Tensor, k: int, allowed: torch.Tensor | None = None):
        tables = lookup_tables(queries, self.codebooks, self.metric)  # [M, B, ksub]
        if self.metric == "ip":
            tables = -tables  # smaller is nearer
        scores = adc_scores(tables, self.codes_t)
        if allowed is not None:
            scores = scores + self.row_bias(allowed)
        return self.results(*top_rows(scores, k), k)

    def chunk_rows(self, k: int) -> int:
        return max(1, (1 << 26) // max(1, self.ntotal))


register(
    PQIndex,
    example="PQ8",
    factory=r"PQ(\d+)(?:x(\d+)(fs)?)?(?:np)?",
    build=lambda m, dim, metric: PQIndex(
        dim, int(m[1]), int(m[2] or 8), metric, fast_scan=bool(m[3])
    ),
    syntax="PQ<M>[x<nbits>] | PQ<M>x4fs",
    faiss=("IndexPQ", "IndexPQFastScan"),
)
