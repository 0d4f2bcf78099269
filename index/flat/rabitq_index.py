"""RaBitQ index: every stored vector as 1-bit RaBitQ codes and three factors, scanned with the
RaBitQ distance estimate (faiss ``IndexRaBitQ`` behind a random rotation, ``"RR,RaBitQ"``;
vq's factory string ``"RaBitQ"`` includes the rotation). Best behind an exact re-ranking,
``"RaBitQ,RFlat"`` (:class:`vq.Refine`), the estimate picking the candidates.

On CPU the scan is a numba kernel (:mod:`vq.kernels.rabitq.rabitq_scans`: byte tables for float
queries, bit planes and popcounts for quantized ones) fused with the top-k, the queries rotated
and centred by :func:`vq.quantizers.rabitq.prepare_queries`; elsewhere (CUDA, tracing,
export) it is :class:`RaBitQSearch`, that preparation and the per-byte tables summed with
gathers (:func:`vq.quantizers.rabitq.sign_dots`), then a top-k.

faiss: :meth:`RaBitQIndex.faiss_counterpart` gives an ``IndexRaBitQ`` with the same centre and
codes (the factors as faiss's 8-byte ``SignBitFactors``), inside an ``IndexPreTransform`` with
the rotation as a ``LinearTransform`` unless it is the identity; ``from_faiss`` converts a bare
``IndexRaBitQ`` (identity rotation) and, through :func:`vq.index.from_faiss`, one behind a
``RandomRotationMatrix`` (faiss's rotation copied).
"""

from __future__ import annotations

import numpy as np
import torch

from vq import _cpu
from vq._checks import check_int
from vq.index.core.base import Index
from vq.index.core.faiss_build import faiss_metric, import_faiss, keep_alive, with_id_map
from vq.index.core.filters import IdFilter, kernel_mask
from vq.index.core.registry import FactoryRefusal, register
from vq.index.core.searchers import Searcher, kept, top_rows
from vq.index.core.searching import shape_problem
from vq.kernels.common.bundles import TopK
from vq.kernels.rabitq.rabitq_scans import code_words, rabitq_flat_scan
from vq.quantizers.rabitq import (
    FACTORS,
    RaBitQ,
    check_qb,
    errors_of_factors,
    estimates,
    prepare_queries,
    rabitq_decode,
    sign_dots,
)

_NO_WORDS = np.zeros((0, 1), np.uint64)


class RaBitQIndex(Index):
    """Stores RaBitQ codes; search ranks the stored vectors by the RaBitQ estimate of their
    distance (faiss ``IndexRaBitQ``, 1 bit per dimension).

    Args:
        dim: vector dimension.
        metric: "l2", "ip" or "cosine".
        nbits: bits per dimension: 1 (extended RaBitQ is not implemented).
        k: neighbours ``forward`` returns.
        verbose: progress bars for train and add.
        qb: bits of the query's scalar quantization in searches (faiss's ``qb``; 0, the
            default, keeps queries float: the estimate of a stored vector's distance to
            itself is then exactly 0). faiss defaults to 4. The CPU scan reads per-byte
            tables for ``qb = 0`` and, for ``qb`` 1..8, ANDs the codes with the query's bit
            planes and counts bits (``ceil(dim / 64) (qb + 1)`` popcounts a vector; two to
            three times as fast as ``qb = 0`` at ``qb = 4``, 128 dimensions).
            ``search(..., qb=)`` overrides it per call; ``to_faiss`` sets faiss's.
        seed: the random rotation's seed; rotate: False for no rotation (faiss's bare
            ``IndexRaBitQ``; see :class:`vq.RaBitQ`).

    Submodules and buffers:
        rabitq: the :class:`vq.RaBitQ` (rotation, centre); codes: uint8 [ntotal,
        ceil(dim/8)]; factors: float32 [ntotal, 3] (:data:`vq.quantizers.rabitq.FACTORS`);
        ids: int64 [ntotal]. Memory: ``ceil(dim/8) + 12`` bytes a vector (faiss's 1-bit codes
        take 8 bytes of factors: vq keeps the error bound's factor too).
    """

    row_buffers = ("codes", "factors")
    search_params = ("qb",)

    def __init__(
        self,
        dim: int,
        metric: str = "l2",
        nbits: int = 1,
        k: int = 10,
        verbose: bool = False,
        *,
        qb: int = 0,
        seed: int = 1234,
        rotate: bool = True,
    ):
        super().__init__(dim, metric, k, verbose)
        self.rabitq = RaBitQ(self.dim, nbits, seed, self.metric, rotate=rotate)
        self.qb = check_qb(qb)
        self.register_buffer("codes", torch.zeros(0, self.rabitq.code_size, dtype=torch.uint8))
        self.register_buffer("factors", torch.zeros(0, len(FACTORS)))

    @property
    def is_trained(self) -> bool:
        return self.rabitq.is_trained

    def config(self) -> dict:
        return {**super().config(), **self.rabitq.config(), "qb": self.qb}

    def learn(self, x: torch.Tensor) -> None:
        self.rabitq.fit(x)

    def encode_batch(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        codes, factors = self.rabitq.encode_rows(x)
        return {"codes": codes, "factors": factors}

    @property
    def ntotal(self) -> int:
        return int(self.codes.shape[0])

    def decode_rows(self, rows: torch.Tensor) -> torch.Tensor:
        rows = rows.to(self.device)
        rq = self.rabitq
        return rabitq_decode(self.codes[rows], self.factors[rows], rq.center) @ rq.rotation.T

    def growing_buffers(self) -> tuple[str, ...]:
        return (*super().growing_buffers(), "codes", "factors")

    def consistency_problem(self) -> str | None:
        n = self.ntotal
        problem = super().consistency_problem()
        problem = problem or shape_problem("codes", self.codes, (n, self.rabitq.code_size))
        problem = problem or shape_problem("factors", self.factors, (n, len(FACTORS)))
        if problem is None and self.codes.dtype != torch.uint8:
            problem = f"codes of dtype {self.codes.dtype}, expected torch.uint8"
        if problem is None and self.factors.dtype != torch.float32:
            problem = f"factors of dtype {self.factors.dtype}, expected torch.float32"
        return problem

    # -- faiss ----------------------------------------------------------------------------------
    def faiss_counterpart(self):
        """faiss ``IndexRaBitQ`` (the same centre, codes, first two factors and ``qb``), behind
        an ``IndexPreTransform`` holding the rotation as a ``LinearTransform`` (``A`` =
        ``rotation.T``) unless it is the identity, in an ``IndexIDMap`` unless the ids are
        0 … ntotal - 1."""
        faiss = import_faiss()
        rq = self.rabitq
        out = faiss.IndexRaBitQ(self.dim, faiss_metric(self.metric))
        faiss.copy_array_to_vector(rq.center.float().cpu().numpy(), out.center)
        out.is_trained, out.qb = True, self.qb
        factors = self.factors[:, :2].float().cpu().contiguous().numpy().view(np.uint8)
        raw = np.ascontiguousarray(np.concatenate([self.codes.cpu().numpy(), factors], axis=1))
        faiss.copy_array_to_vector(raw.ravel(), out.codes)
        out.ntotal = self.ntotal
        rotation = rq.rotation.float().cpu()
        if not torch.equal(rotation, torch.eye(self.dim)):
            transform = faiss.LinearTransform(self.dim, self.dim, False)
            faiss.copy_array_to_vector(rotation.T.contiguous().numpy().ravel(), transform.A)
            transform.is_orthonormal, transform.is_trained = True, True
            out = keep_alive(faiss.IndexPreTransform(transform, out), transform, out)
        return with_id_map(out, self.stored_ids())

    @classmethod
    def from_faiss(cls, f, metric: str) -> RaBitQIndex:
        """The RaBitQIndex of a faiss ``IndexRaBitQ`` ``f`` (1 bit, not ``centered``): its
        centre, codes and ``qb``, no rotation (``rotate=False``; a rotation in front converts
        through :func:`vq.index.from_faiss`, then :meth:`take_rotation`). The third factor is
        recomputed from the first two (+inf for inner products: see
        :func:`vq.quantizers.rabitq.errors_of_factors`)."""
        faiss = import_faiss()
        if int(f.rabitq.nb_bits) != 1:
            raise ValueError(
                f"only 1-bit faiss IndexRaBitQ converts, this one has nb_bits={f.rabitq.nb_bits}"
            )
        if bool(f.centered):
            raise ValueError("faiss IndexRaBitQ with centered=True does not convert; set it False")
        out = cls(f.d, metric, qb=int(f.qb), rotate=False)
        out.rabitq.set_state(None, torch.from_numpy(faiss.vector_to_array(f.center).copy()))
        size = out.rabitq.code_size
        raw = faiss.vector_to_array(f.codes).reshape(-1, f.code_size)
        first = torch.from_numpy(np.ascontiguousarray(raw[:, size : size + 8]).view(np.float32))
        error = errors_of_factors(first, f.d, out.metric)
        out.codes = torch.from_numpy(np.ascontiguousarray(raw[:, :size]))
        out.factors = torch.cat([first, error[:, None]], dim=1).contiguous()
        return out

    def take_rotation(self, rotation: torch.Tensor) -> None:
        """Put the orthogonal ``rotation`` (float [d, d], ``x_r = x @ rotation``) in front of
        the stored codes, whose centre and codes are those of vectors already rotated by it
        (faiss's ``RandomRotationMatrix`` before an ``IndexRaBitQ``: its ``A.T``); the
        quantizer then rotates (``rotate=True``; retraining draws vq's own rotation)."""
        self.rabitq.set_state(rotation, self.rabitq.center)
        self.rabitq.rotate = True

    def vector_ns(self) -> float:
        return self.rabitq.code_size / 3 + 2

    def code_words(self) -> np.ndarray:
        """uint64 [ntotal, ceil(dim / 64)]: the codes as the bit-plane scan reads them (a view
        where ``dim`` is a multiple of 64, else a padded copy kept until the codes change: see
        :func:`vq.kernels.rabitq.rabitq_scans.code_words`)."""
        codes = self.codes
        return self.derived("code_words", (codes,), lambda: code_words(codes.numpy()))

    # -- search -------------------------------------------------------------------------------
    def searcher(self, k: int | None = None, *, qb: int | None = None, copy: bool = True):
        """The search as a static-shape graph over a snapshot of the codes (see
        :class:`RaBitQSearch`; ``copy=False``: over the index's own, its torch engine)."""
        return RaBitQSearch(self, k, qb, copy)

    def search_rows(
        self, q: torch.Tensor, k: int, allowed: IdFilter | None = None, qb: int | None = None
    ):
        qb = self.qb if qb is None else check_qb(qb)
        rq = self.rabitq
        q_c, constants = prepare_queries(q, rq.rotation, rq.center, 0)  # quantized in the kernel
        dist = _cpu.empty((q.shape[0], k))
        rows = _cpu.empty((q.shape[0], k), torch.int64)
        codes = self.codes.numpy()
        rabitq_flat_scan(
            q_c.contiguous().numpy(),
            constants.contiguous().numpy(),
            qb,
            codes,
            self.code_words() if qb else _NO_WORDS,
            self.factors.numpy(),
            kernel_mask(self, allowed),
            self.metric == "ip",
            TopK(dist.numpy(), rows.numpy()),
        )
        return dist, rows


class RaBitQSearch(Searcher):
    """:class:`RaBitQIndex`'s search as a static-shape graph: the queries prepared
    (:func:`vq.quantizers.rabitq.prepare_queries`), the sign dots from per-byte tables and
    gathers (:func:`vq.quantizers.rabitq.sign_dots`), the estimates, then a top-k (see
    :class:`vq.index.core.searchers.Searcher`).

    Args:
        index: the RaBitQIndex; k: neighbours ``forward`` returns (default the index's).
        qb: the query bits ``forward`` uses (default the index's).
        copy: hold a snapshot (True) or the index's own tensors (the torch path).

    Buffers:
        rotation float32 [d, d]; center float32 [d]; codes_t uint8 [ceil(d/8), ntotal], the
        codes transposed; factors float32 [ntotal, 3]; id_table int64 [ntotal] unless the
        ids are the row numbers.
    """

    def __init__(self, index: RaBitQIndex, k=None, qb: int | None = None, copy: bool = True):
        super().__init__(index, k, copy)
        self.qb = index.qb if qb is None else check_qb(qb)
        self.register_buffer("rotation", kept(index.rabitq.rotation.float(), copy))
        self.register_buffer("center", kept(index.rabitq.center.float(), copy))
        self.register_buffer("codes_t", index.codes.detach().T.contiguous())
        self.register_buffer("factors", kept(index.factors.float(), copy))

    def forward(self, queries: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.search(self.prepared(queries), self.k, qb=self.qb)

    def search(
        self,
        queries: torch.Tensor,
        k: int,
        qb: int | None = None,
        allowed: torch.Tensor | None = None,
    ):
        """``qb``: the query bits (default this search's); ``allowed``: bool [ntotal], False
        for stored rows a filtered search skips."""
        qb = self.qb if qb is None else qb
        q_hat, constants = prepare_queries(queries, self.rotation, self.center, qb)
        est = estimates(sign_dots(q_hat, self.codes_t), self.factors, constants, self.metric)
        scores = -est if self.metric == "ip" else est
        if allowed is not None:
            scores = scores + self.row_bias(allowed)
        return self.results(*top_rows(scores, k), k)

    def chunk_rows(self, k: int, **options) -> int:
        return max(1, (1 << 25) // max(1, self.ntotal))


def _build(match, dim: int, metric: str) -> RaBitQIndex:
    nbits = int(match["bits"] or 1)
    if nbits != 1:
        raise FactoryRefusal(f"RaBitQ{nbits}: only 1-bit RaBitQ ('RaBitQ') is implemented")
    return RaBitQIndex(dim, metric, check_int(nbits, "nbits", 1))


register(
    RaBitQIndex,
    example="RaBitQ",
    factory=r"RaBitQ(?P<bits>[1-9])?",
    build=_build,
    syntax="RaBitQ",
    faiss=("IndexRaBitQ",),
)
