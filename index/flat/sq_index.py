"""Scalar-quantized index: every stored vector as faiss's ``ScalarQuantizer`` bytes (8, 6 or
4 bits per dimension, or fp16 / bf16), scanned with distances computed on the codes (faiss
``IndexScalarQuantizer``, factory ``"SQ8"``, ``"SQ6"``, ``"SQ4"``, ``"SQfp16"``,
``"SQbf16"``). The inverted-file kind, :class:`vq.index.IVFSQ`, is in ivfsq.py.

On CPU the scan is a numba kernel (:mod:`vq.kernels.sq.sq_scans`) fused with the top-k; elsewhere
(CUDA, tracing, export) it is :class:`SQSearch`, which decodes the codes with
:func:`vq.quantizers.scalar_codes.decode_stored` and ranks them with one matrix product.
"""

from __future__ import annotations

import numpy as np
import torch

from vq import _cpu
from vq._checks import check_real, is_integer
from vq.faiss_interop import SQ_TYPES, sq_from_faiss
from vq.index.core.base import Index
from vq.index.core.faiss_build import faiss_metric, import_faiss, with_id_map
from vq.index.core.filters import IdFilter, kernel_mask
from vq.index.core.mapped import read_chunks
from vq.index.core.ranges import probed_hits
from vq.index.core.registry import register
from vq.index.core.searchers import Searcher, kept
from vq.index.core.searching import NO_IDS, shape_problem
from vq.kernels.common.bundles import RangeHits, SQCodes, SQLists, TopK, plain
from vq.kernels.common.constants import metric as kernel_metric
from vq.kernels.exact.range_scans import sq_hits
from vq.kernels.sq import sq_scans as sq_kernels
from vq.quantizers import ScalarQuantizer
from vq.quantizers.scalar_codes import decode_stored, stored_values

#: the scalar-quantizer part of a factory description ("SQ8", "SQfp16"): the bits in group "bits"
SQ_FACTORY = r"SQ(?P<bits>8|6|4|fp16|bf16)"


def sq_bits(name: str) -> int | str:
    """The ``bits`` argument of a factory description's "8", "6", "4", "fp16" or "bf16"."""
    return name if name.startswith(("fp", "bf")) else int(name)


def sq_faiss_type(sq: ScalarQuantizer) -> int:
    """faiss's ``ScalarQuantizer.QuantizerType`` constant of ``sq``'s kind."""
    return getattr(import_faiss().ScalarQuantizer, SQ_TYPES[sq.bits])


def copy_ranges(sq: ScalarQuantizer, fsq) -> None:
    """``sq``'s ranges into a ``faiss.ScalarQuantizer`` (b-bit kinds; fp16 / bf16 have none)."""
    if not sq.is_float:
        ranges = torch.stack([sq.vmin, sq.vdiff]).float().cpu().numpy().ravel()
        import_faiss().copy_array_to_vector(ranges, fsq.trained)


def kernel_arrays(index: Index, sq: ScalarQuantizer) -> tuple:
    """``(offset, scale, kind)`` as :mod:`vq.kernels.sq.sq_scans` reads them, kept on ``index``
    until the ranges change: offset, scale float32 [d]; kind one of ``SQ8``, ``SQ6``, ``SQ4``,
    ``SQ_FP16``, ``SQ_BF16`` (as :func:`vq.kernels.sq.sq_scans.sq_kind` gives it)."""

    def compute():
        if sq.is_float:
            ones, zeros = np.ones(sq.dim, np.float32), np.zeros(sq.dim, np.float32)
            kind = sq_kernels.SQ_FP16 if sq.bits == "fp16" else sq_kernels.SQ_BF16
            return zeros, ones, sq_kernels.sq_kind(kind)
        scale = sq.cell_width().float()
        offset = (sq.vmin.float() + 0.5 * scale).numpy()
        kind = {8: sq_kernels.SQ8, 6: sq_kernels.SQ6, 4: sq_kernels.SQ4}[sq.bits]
        return offset, scale.numpy(), sq_kernels.sq_kind(kind)

    return index.derived(f"sq_arrays/{sq.bits}", (sq.vmin, sq.vdiff), compute)


def sq_quantizer(dim: int, bits, margin) -> ScalarQuantizer:
    """The :class:`vq.ScalarQuantizer` of an SQ index (SQIndex, IVFSQ, HNSWSQ), its arguments
    checked first: ``bits`` an integer or a name (8, 6, 4, "fp16", "bf16"; ``8.0`` or True
    is a TypeError), ``margin`` a finite number >= 0."""
    if not (isinstance(bits, str) or is_integer(bits)):
        raise TypeError(
            f"bits must be one of 8, 6, 4, 'fp16', 'bf16'; got {bits!r} ({type(bits).__name__})"
        )
    return ScalarQuantizer(
        dim, bits if isinstance(bits, str) else int(bits), margin=check_real(margin, "margin")
    )


def codes_problem(codes: torch.Tensor, n: int, sq: ScalarQuantizer) -> str | None:
    """``consistency_problem``'s words for stored codes that are not uint8 [n, code_size], or
    (fp16 / bf16) hold NaN/Inf bit patterns: a pass over those, read with ``pread`` where they
    are mapped from an index file (nothing mapped in)."""
    problem = shape_problem("codes", codes, (n, sq.code_size))
    if problem is None and codes.dtype != torch.uint8:
        problem = f"codes of dtype {codes.dtype}, expected torch.uint8"
    if problem is None and sq.is_float:  # (all exponent bits set: NaN or Inf)
        exponent = np.uint16(0x7C00 if sq.bits == "fp16" else 0x7F80)
        bad = sum(
            np.count_nonzero(np.bitwise_and(c.cpu().numpy().view(np.uint16), exponent) == exponent)
            for c in read_chunks(codes)
        )
        problem = f"{bad} {sq.bits} codes that are NaN/Inf" if bad else None
    return problem


class SQIndex(Index):
    """Stores scalar-quantizer codes; search computes distances on the codes (faiss
    ``IndexScalarQuantizer``).

    Args:
        dim: vector dimension.
        bits: 8, 6, 4, "fp16" or "bf16" (see :class:`vq.ScalarQuantizer`).
        metric: "l2" or "ip".
        k: neighbours ``forward`` returns.
        verbose: progress bars for train and add.
        margin: widen the trained ranges (see :class:`vq.ScalarQuantizer`).

    Submodules and buffers:
        sq: the :class:`vq.ScalarQuantizer`; codes: uint8 [ntotal, code_size]; ids: int64
        [ntotal].
    """

    def __init__(
        self,
        dim: int,
        bits: int | str = 8,
        metric: str = "l2",
        k: int = 10,
        verbose: bool = False,
        *,
        margin: float = 0.0,
    ):
        super().__init__(dim, metric, k, verbose)
        self.sq = sq_quantizer(dim, bits, margin)
        self.register_buffer("codes", torch.zeros(0, self.sq.code_size, dtype=torch.uint8))

    @property
    def is_trained(self) -> bool:
        return self.sq.is_trained

    @property
    def bits(self) -> int | str:
        return self.sq.bits

    def config(self) -> dict:
        return {**super().config(), **self.sq.config()}

    row_buffers = ("codes",)

    def learn(self, x: torch.Tensor) -> None:
        self.sq.fit(x)

    def encode_batch(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"codes": self.sq.encode_rows(x)}

    @property
    def ntotal(self) -> int:
        return int(self.codes.shape[0])

    def decode_rows(self, rows: torch.Tensor) -> torch.Tensor:
        return self.sq.decode(self.codes[rows.to(self.device)])

    def growing_buffers(self) -> tuple[str, ...]:
        return (*super().growing_buffers(), "codes")

    def consistency_problem(self) -> str | None:
        return super().consistency_problem() or codes_problem(self.codes, self.ntotal, self.sq)

    def faiss_counterpart(self):
        """faiss ``IndexScalarQuantizer`` with the same ranges and codes, in an
        ``IndexIDMap`` unless the ids are 0 … ntotal - 1."""
        faiss = import_faiss()
        qtype, metric = sq_faiss_type(self.sq), faiss_metric(self.metric)
        out = faiss.IndexScalarQuantizer(self.dim, qtype, metric)
        copy_ranges(self.sq, out.sq)
        out.is_trained = True
        faiss.copy_array_to_vector(self.codes.cpu().numpy().ravel(), out.codes)
        out.ntotal = self.ntotal
        return with_id_map(out, self.stored_ids())

    @classmethod
    def from_faiss(cls, f, metric: str) -> SQIndex:
        """The SQIndex of a faiss ``IndexScalarQuantizer`` ``f``: the same ranges and codes."""
        out = cls(f.d, 8, metric)
        out.sq = sq_from_faiss(f.sq)
        codes = import_faiss().vector_to_array(f.codes).reshape(-1, f.code_size)
        out.codes = torch.from_numpy(codes)
        return out

    def vector_ns(self) -> float:
        return self.dim / (8 if self.bits == 8 else 3)

    # -- search -------------------------------------------------------------------------------
    def searcher(self, k: int | None = None, *, copy: bool = True) -> SQSearch:
        """The search as a static-shape graph over a snapshot of the codes (see
        :class:`SQSearch`; what :mod:`vq.export` writes out; ``copy=False``: over the index's
        own ranges, its torch engine)."""
        return SQSearch(self, k, copy)

    def search_rows(self, q: torch.Tensor, k: int, allowed: IdFilter | None = None):
        dist = _cpu.empty((q.shape[0], k))
        rows = _cpu.empty((q.shape[0], k), torch.int64)
        offset, scale, kind = kernel_arrays(self, self.sq)
        codes = SQCodes(self.codes.numpy(), offset, scale)
        mask, ip = kernel_mask(self, allowed), self.metric == "ip"
        out = TopK(dist.numpy(), rows.numpy())
        sq_kernels.sq_flat_scan(q.contiguous().numpy(), codes, kind, mask, ip, out)
        return dist, rows

    def range_hits(self, q: torch.Tensor, radius: float, allowed: IdFilter | None = None):
        """The hits by the scan's distances on the codes
        (:func:`vq.kernels.exact.range_scans.sq_hits`, the code array as one list), a block of
        queries at a time."""
        ip, n = self.metric == "ip", self.ntotal
        lists, offsets = np.zeros((q.shape[0], 1), np.int64), np.array([0, n], np.int64)
        qn, codes, mask = q.contiguous().numpy(), self.codes.numpy(), kernel_mask(self, allowed)
        offset, scale, kind = kernel_arrays(self, self.sq)
        one_list = SQLists(
            offsets, codes, np.zeros((0, self.dim), np.float32), False, offset, scale
        )

        def call(s, e, starts, t, rows, vals, counts):
            hits = RangeHits(starts, t, rows, vals, counts)
            sq_hits(qn[s:e], one_list, kind, lists[s:e], mask, ip, hits)

        return probed_hits(radius, ip, lists, np.array([n], np.int64), call)

    def build_lean_search(self):
        """A few queries on the calling thread: the scan, then ids (``sq_flat_lean``)."""
        ip = kernel_metric(self.metric == "ip")
        offset, scale, kind = kernel_arrays(self, self.sq)
        codes = plain(SQCodes(self.codes.numpy(), offset, scale))
        ids = self.ids.numpy() if self.ids.shape[0] == self.ntotal else NO_IDS
        work, n = self.search_work, self.ntotal

        def search(q: np.ndarray, k: int, ranked: bool, params: dict):
            nq = q.shape[0]
            if work(nq, min(k, n)) >= _cpu.SERIAL_WORK:
                return None  # the general path: threads
            out_dist, out_ids = np.empty((nq, k), np.float32), np.empty((nq, k), np.int64)
            if not sq_kernels.sq_flat_lean(q, codes, kind, ids, ip, (out_dist, out_ids)):
                return None  # the general path: the error a query deserves
            return out_dist, out_ids

        return search


class SQSearch(Searcher):
    """:class:`SQIndex`'s search as a static-shape graph: the stored values decoded
    (:func:`vq.quantizers.scalar_codes.decode_stored`), scores from one matrix product, then
    a top-k (see :class:`vq.index.core.searchers.Searcher`).

    Args:
        index: the SQIndex; k: neighbours ``forward`` returns (default the index's).
        copy: hold a snapshot of the ranges (True) or the index's own (the torch path).

    Buffers:
        values: [ntotal, dim], the levels as uint8 (b-bit kinds) or the values as float16 /
        bfloat16; vmin, vdiff: float32 [dim]; id_table: int64 [ntotal] unless the ids are the
        row numbers.
    """

    def __init__(self, index: SQIndex, k: int | None = None, copy: bool = True):
        super().__init__(index, k, copy)
        self.bits = index.sq.bits
        self.register_buffer("values", stored_values(index.codes, index.dim, self.bits))
        self.register_buffer("vmin", kept(index.sq.vmin.float(), copy))
        self.register_buffer("vdiff", kept(index.sq.vdiff.float(), copy))

    def search(self, queries: torch.Tensor, k: int, allowed: torch.Tensor | None = None):
        """``allowed``: bool [ntotal], False for stored rows a filtered search skips."""
        x = decode_stored(self.values, self.vmin, self.vdiff, self.bits)
        return self.exhaustive(queries, k, x, (x * x).sum(dim=1), allowed)

    def chunk_rows(self, k: int) -> int:
        return max(1, (1 << 26) // max(1, self.ntotal))


register(
    SQIndex,
    example="SQ8",
    factory=SQ_FACTORY,
    build=lambda m, dim, metric: SQIndex(dim, sq_bits(m["bits"]), metric),
    syntax="SQ8|SQ6|SQ4|SQfp16|SQbf16",
    faiss=("IndexScalarQuantizer",),
)
