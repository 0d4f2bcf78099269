"""Inverted lists of RaBitQ codes (faiss ``IndexIVFRaBitQ``, factory ``"IVF1024,RaBitQ"``; best
behind an exact re-ranking, ``"IVF1024,RaBitQ,RFlat"``): the coarse step, lists and probing are
:class:`vq.index.ivf.ivf_index.IVFIndex`'s; each list stores the 1-bit RaBitQ codes and factors
of its vectors' residuals to its centroid, the centroid being the list's RaBitQ centre (as faiss
does), after a random rotation.

Reference: J. Gao, C. Long, "RaBitQ: Quantizing High-Dimensional Vectors with a Theoretical
Error Bound for Approximate Nearest Neighbor Search", SIGMOD 2024 (the estimator:
:mod:`vq.quantizers.rabitq`).

The rotation ``R`` (the :class:`vq.RaBitQ`'s, float32 [d, d]) is vq's own part of the kind:
faiss's ``IndexIVFRaBitQ`` has none and takes it from an ``IndexPreTransform`` in front
(``"RR<d>,IVF1024,RaBitQ"``). The coarse centroids ``C`` stay in the input space (routing is
the same either way: R is orthogonal); a vector ``x`` of list l is coded as
``rabitq_encode(x R, C_l R)`` and a query ``q`` probing list l is estimated from ``q R - C_l R``
(quantized to ``qb`` bits per list, as faiss's scanner does). faiss: :meth:`IVFRaBitQ.to_faiss`
writes an ``IndexIVFRaBitQ`` over the rotated centroids ``C R`` with the same codes, first two
factors, ids and ``qb``, behind a ``LinearTransform`` holding ``R`` (none for the identity);
:meth:`IVFRaBitQ.from_faiss` converts a bare one (identity rotation) and, through
:func:`vq.index.from_faiss`, one behind a ``RandomRotationMatrix`` (``take_rotation``).

On CPU the scan is :func:`vq.kernels.rabitq.rabitq_scans.rabitq_ivf_scan` (byte tables for
float queries, bit planes and popcounts for quantized ones) fused with the top-k; elsewhere
(CUDA, tracing, export) :class:`IVFRaBitQSearch`.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from vq.index.core.faiss_build import faiss_metric, import_faiss, keep_alive
from vq.index.core.registry import FactoryRefusal, register
from vq.index.core.searchers import kept
from vq.index.core.searching import shape_problem
from vq.index.ivf.ivf_faiss import ivf_to_faiss, lists_from_faiss
from vq.index.ivf.ivf_index import IVF_FACTORY, IVFIndex, IVFSearch, ivf_arguments
from vq.kernels.common.bundles import TopK
from vq.kernels.rabitq.rabitq_scans import code_words, rabitq_ivf_scan
from vq.quantizers.rabitq import (
    FACTORS,
    RaBitQ,
    check_qb,
    errors_of_factors,
    quantized_queries,
    rabitq_decode,
    rabitq_encode,
    unpack_bits,
)

_NO_WORDS = np.zeros((0, 1), np.uint64)


class IVFRaBitQ(IVFIndex):
    """IVF with 1-bit RaBitQ codes of the residuals to the list centroids (faiss
    ``IndexIVFRaBitQ``).

    Args:
        dim: vector dimension.
        nlist: inverted lists.
        metric, k, nprobe, coarse_niter, seed, verbose, spill, soar_lambda, coarse_hnsw,
            spherical: as :class:`vq.index.IVFIndex` (spilled: each copy codes its residual
            to its own list's centroid).
        qb: bits of the query's scalar quantization (faiss's ``qb``; 0, the default as in
            :class:`vq.RaBitQIndex`, keeps queries float).
            An attribute: set ``index.qb`` to search at other bits (no per-call option). The
            CPU scan reads byte tables for 0 and bit planes (``ceil(dim / 64) (qb + 1)``
            popcounts a vector) for 1..8.
        rotation_seed: the random rotation's seed; rotate: False for no rotation (faiss's
            bare ``IndexIVFRaBitQ``; see :class:`vq.RaBitQ`).

    Submodules and buffers (beyond :class:`IVFIndex`'s):
        rabitq: the :class:`vq.RaBitQ` (its rotation; its centre unused: each list's is its
        centroid); codes: uint8 [n_rows, ceil(dim / 8)]; factors: float32 [n_rows, 3]
        (:data:`vq.quantizers.rabitq.FACTORS`), in list order. Memory: ``ceil(dim / 8) + 12``
        bytes a vector and its id.
    """

    row_buffers = ("codes", "factors")

    def __init__(
        self,
        dim: int,
        nlist: int,
        metric: str = "l2",
        k: int = 10,
        nprobe: int = 1,
        *,
        qb: int = 0,
        rotation_seed: int = 1234,
        rotate: bool = True,
        coarse_niter: int = 10,
        seed: int = 1234,
        verbose: bool = False,
        spill: bool = False,
        soar_lambda: float = 1.0,
        coarse_hnsw: int = 0,
        spherical: bool = False,
    ):
        super().__init__(
            dim,
            nlist,
            metric,
            k,
            nprobe,
            coarse_niter=coarse_niter,
            seed=seed,
            verbose=verbose,
            spill=spill,
            soar_lambda=soar_lambda,
            coarse_hnsw=coarse_hnsw,
            spherical=spherical,
        )
        self.rabitq = RaBitQ(self.dim, 1, rotation_seed, self.metric, rotate=rotate)
        self.qb = check_qb(qb)
        self.register_buffer("codes", torch.zeros(0, self.rabitq.code_size, dtype=torch.uint8))
        self.register_buffer("factors", torch.zeros(0, len(FACTORS)))

    @property
    def is_trained(self) -> bool:
        return self.quantizer.is_trained and self.rabitq.is_trained

    def config(self) -> dict:
        rq = self.rabitq
        return {
            **super().config(),
            "qb": self.qb,
            "rotation_seed": rq.seed,
            "rotate": rq.rotate,
        }

    def vector_ns(self) -> float:
        return self.rabitq.code_size / 3 + 2

    def _rows_problem(self) -> str | None:
        n, size = self.n_rows, self.rabitq.code_size
        problem = shape_problem("codes", self.codes, (n, size))
        problem = problem or shape_problem("factors", self.factors, (n, len(FACTORS)))
        if problem is None and self.codes.dtype != torch.uint8:
            problem = f"codes of dtype {self.codes.dtype}, expected torch.uint8"
        if problem is None and self.factors.dtype != torch.float32:
            problem = f"factors of dtype {self.factors.dtype}, expected torch.float32"
        return problem

    # -- training and coding --------------------------------------------------------------
    def learn(self, x: torch.Tensor) -> None:
        self._train_coarse(x)
        self.rabitq.fit(x[:1])  # the rotation (the centre is each list's centroid)
        self.rabitq.center.zero_()

    def rotated_centroids(self) -> torch.Tensor:
        """float32 [nlist, dim]: the coarse centroids rotated, ``C R``: each list's RaBitQ
        centre (kept until the centroids or the rotation change)."""
        c, r = self.quantizer.codebook, self.rabitq.rotation
        return self.derived("rotated_centroids", (c, r), lambda: (c.float() @ r).contiguous())

    def _encode_rows(self, x: torch.Tensor, lists: torch.Tensor) -> dict[str, torch.Tensor]:
        centres = self.rotated_centroids().to(x.device).index_select(0, lists)
        codes, factors = rabitq_encode(x @ self.rabitq.rotation, centres, self.metric)
        return {"codes": codes, "factors": factors}

    def decode_rows(self, rows: torch.Tensor) -> torch.Tensor:
        rows = rows.to(self.device)
        centres = self.rotated_centroids().index_select(0, self._row_lists(rows))
        x_r = rabitq_decode(self.codes[rows], self.factors[rows], centres)
        return x_r @ self.rabitq.rotation.T

    def code_words(self, store=None) -> np.ndarray:
        """uint64 [n_rows, ceil(dim / 64)]: the codes of ``store`` (the index, default, or
        lists read from its file) as the bit-plane scan reads them (see
        :func:`vq.kernels.rabitq.rabitq_scans.code_words`; the index's kept until its codes
        change)."""
        if store is None or store is self:
            codes = self.codes
            return self.derived("code_words", (codes,), lambda: code_words(codes.numpy()))
        return code_words(store.codes.numpy())

    # -- faiss ----------------------------------------------------------------------------
    def _empty_faiss(self, quantizer) -> tuple:
        faiss = import_faiss()
        out = faiss.IndexIVFRaBitQ(quantizer, self.dim, self.nlist, faiss_metric(self.metric))
        out.qb = self.qb
        factors = self.factors[:, :2].float().cpu().contiguous().numpy().view(np.uint8)
        return out, np.concatenate([self.codes.cpu().numpy(), factors], axis=1)

    def faiss_counterpart(self):
        """faiss ``IndexIVFRaBitQ`` over the rotated centroids ``C R`` with the same lists,
        codes, first two factors, ids, nprobe and ``qb``, behind an ``IndexPreTransform``
        whose ``LinearTransform`` holds the rotation (``A = R.T``) unless it is the identity.
        A graph-routed coarse quantizer converts only without a rotation."""
        faiss = import_faiss()
        rotation = self.rabitq.rotation.float().cpu()
        if torch.equal(rotation, torch.eye(self.dim)):
            return ivf_to_faiss(self)
        if self.coarse_hnsw:
            raise ValueError(
                "an IVFRaBitQ with a rotation and an HNSW-routed coarse quantizer has no faiss "
                "counterpart; build it with coarse_hnsw=0 (or rotate=False) to convert"
            )
        out = ivf_to_faiss(self)
        flat = faiss.downcast_index(out.quantizer)
        flat.reset()
        flat.add(self.rotated_centroids().cpu().numpy())  # faiss routes in the rotated space
        transform = faiss.LinearTransform(self.dim, self.dim, False)
        faiss.copy_array_to_vector(rotation.T.contiguous().numpy().ravel(), transform.A)
        transform.is_orthonormal, transform.is_trained = True, True
        return keep_alive(faiss.IndexPreTransform(transform, out), transform, out)

    @classmethod
    def from_faiss(cls, f, metric: str) -> IVFRaBitQ:
        """The IVFRaBitQ of a faiss ``IndexIVFRaBitQ`` ``f`` (1 bit): its centroids (or
        graph), lists, codes, ids, nprobe and ``qb``, no rotation (``rotate=False``; a
        rotation in front converts through :func:`vq.index.from_faiss`, then
        :meth:`take_rotation`). The third factor is recomputed from the first two (+inf for
        inner products: see :func:`vq.quantizers.rabitq.errors_of_factors`)."""
        if int(f.rabitq.nb_bits) != 1:
            raise ValueError(
                f"only 1-bit faiss IndexIVFRaBitQ converts, this one has nb_bits={f.rabitq.nb_bits}"
            )
        lists = lists_from_faiss(f, metric)
        out = cls(f.d, f.nlist, metric, nprobe=f.nprobe, qb=int(f.qb), rotate=False, **lists.routed)
        out.rabitq.set_state(None, torch.zeros(f.d))
        size = out.rabitq.code_size
        raw = lists.joined().reshape(-1, f.code_size)
        first = np.frombuffer(raw[:, size : size + 8].tobytes(), np.float32).reshape(-1, 2)
        first = torch.from_numpy(first.copy())
        error = errors_of_factors(first, f.d, out.metric)
        out.codes = torch.from_numpy(np.ascontiguousarray(raw[:, :size]))
        out.factors = torch.cat([first, error[:, None]], dim=1).contiguous()
        return lists.fill(out)

    def take_rotation(self, rotation: torch.Tensor) -> None:
        """Put the orthogonal ``rotation`` (float [d, d], ``x_r = x @ rotation``) in front of
        lists whose centroids and codes are those of vectors already rotated by it (faiss's
        ``RandomRotationMatrix`` before an ``IndexIVFRaBitQ``: its ``A.T``): the centroids
        are rotated back into the input space (``C_r R.T``, in float64), the codes kept."""
        if self.coarse_hnsw:
            raise ValueError(
                "a rotation in front of an HNSW-routed IndexIVFRaBitQ does not convert; use a "
                "flat coarse quantizer"
            )
        r = torch.as_tensor(rotation).float()
        self.rabitq.set_state(r, torch.zeros(self.dim))
        self.rabitq.rotate = True
        c = self.quantizer.codebook
        c.copy_((c.double() @ r.double().T).float())

    # -- search ---------------------------------------------------------------------------
    def build_lean_search(self):
        """None: every search takes the general path (no lean kernel for this kind)."""
        return None

    def build_refined_lean_search(self, vectors, ids, k_factor):
        return None

    def searcher(self, k=None, *, nprobe=None, capacity=None, qb=None, copy=True):
        """The search as a static-shape graph over a snapshot of the lists (``copy=False``:
        over the index's own), padded to one ``capacity`` (see :class:`IVFRaBitQSearch`)."""
        return IVFRaBitQSearch(self, k, nprobe, capacity, qb, copy)

    def torch_searcher(self) -> IVFRaBitQSearch:
        """The torch path's search (see :meth:`vq.index.IVFIndex.torch_searcher`), at the
        index's ``qb``."""
        searcher = super().torch_searcher()
        searcher.qb = check_qb(self.qb)
        return searcher

    def _scan_numba(self, q, coarse, lists, out_dist, out_rows, ranked, allowed, store) -> None:
        qb = check_qb(self.qb)
        codes = store.codes.numpy()
        rabitq_ivf_scan(
            (q @ self.rabitq.rotation).contiguous().numpy(),
            self.rotated_centroids().numpy(),
            store.offsets.numpy(),
            lists.contiguous().numpy(),
            qb,
            codes,
            self.code_words(store) if qb else _NO_WORDS,
            store.factors.numpy(),
            allowed,
            self.metric == "ip",
            TopK(out_dist.numpy(), out_rows.numpy()),
        )


class IVFRaBitQSearch(IVFSearch):
    """:class:`IVFRaBitQ`'s search as a static-shape graph: the queries rotated, centred on
    each probed list's rotated centroid and quantized to ``qb`` bits
    (:func:`vq.quantizers.rabitq.quantized_queries`), the sign bits of the probed slots
    unpacked, the RaBitQ estimates, plus the slot bias, then a top-k.

    Buffers (beyond :class:`IVFSearch`'s): rotation float32 [d, d]; centroids_r float32
    [nlist, d] (``C R``); codes uint8 [n_rows, ceil(d / 8)]; factors float32 [n_rows, 3].
    """

    def __init__(self, index: IVFRaBitQ, k=None, nprobe=None, capacity=None, qb=None, copy=True):
        super().__init__(index, k, nprobe, capacity, copy)
        self.qb = index.qb if qb is None else check_qb(qb)
        self.register_buffer("rotation", kept(index.rabitq.rotation.float(), copy))
        self.register_buffer("centroids_r", index.rotated_centroids().clone())
        self.register_buffer("codes", kept(index.codes, copy))
        self.register_buffer("factors", kept(index.factors.float(), copy))

    def forward(self, queries: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.search(self.prepared(queries), self.k, qb=self.qb)

    def search(self, queries, k: int, nprobe=None, allowed=None, limit=None, qb=None):
        """``qb``: the query bits (default this search's); ``allowed``: bool [ntotal]
        (False: skipped); ``limit``: int64 [B], the lists each query probes (<= nprobe;
        default all)."""
        nprobe = self.lists_probed(nprobe)
        qb = self.qb if qb is None else qb
        _, lists = self.probe(queries, nprobe)
        rows = self.gather_lists(self.list_rows, lists)  # [B, P * C]
        flat = rows.clamp_min(0).reshape(-1)
        b, d, c = queries.shape[0], self.dim, self.capacity
        bits = unpack_bits(self.codes.index_select(0, flat), d).reshape(b, nprobe, c, d)
        f = self.factors.index_select(0, flat).reshape(b, nprobe, c, len(FACTORS))
        q_r = queries @ self.rotation
        centres = self.centroids_r.index_select(0, lists.reshape(-1)).reshape(b, nprobe, d)
        q_c = q_r[:, None, :] - centres
        q_hat = quantized_queries(q_c, qb)
        dots = torch.matmul(bits, q_hat[..., None])[..., 0]  # [B, P, C]: <bits, q_hat>
        dots = (2.0 * dots - q_hat.sum(-1, keepdim=True)) / math.sqrt(d)  # <ō, q_hat>
        pre = f[..., 0] + (q_c * q_c).sum(-1, keepdim=True) - 2.0 * f[..., 1] * dots
        if self.metric == "ip":  # the negated estimated inner product
            scores = 0.5 * (pre - (q_r * q_r).sum(-1)[:, None, None])
        else:
            scores = pre.clamp_min(0.0)
        scores = scores.reshape(b, -1) + self.gather_lists(self.slot_bias, lists)
        bias = self.candidate_bias(lists, allowed, limit)
        scores = scores if bias is None else scores + bias
        return self.results(*self.top(scores, k, rows), k)

    def chunk_rows(self, k: int, nprobe: int | None = None, **options) -> int:
        return max(1, (1 << 24) // (self.lists_probed(nprobe) * self.capacity * self.dim))


def _from_description(match, dim: int, metric: str) -> IVFRaBitQ:
    if match["bits"] and int(match["bits"]) != 1:
        raise FactoryRefusal(f"RaBitQ{match['bits']}: only 1-bit RaBitQ ('RaBitQ') is implemented")
    args = ivf_arguments(match)
    return IVFRaBitQ(dim, args.pop("nlist"), metric=metric, **args)


register(
    IVFRaBitQ,
    example="IVF16,RaBitQ",
    factory=IVF_FACTORY + r",RaBitQ(?P<bits>[1-9])?",
    build=_from_description,
    syntax="IVF<nlist>,RaBitQ",
    family=IVF_FACTORY,
    faiss=("IndexIVFRaBitQ",),
)
