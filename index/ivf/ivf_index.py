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

import re

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
from vq.index.core.mapped import file_range
from vq.index.core.registry import FactoryRefusal
from vq.index.core.searching import results_by_id
from vq.index.graph.hnsw import HNSW, MAX_M
from vq.index.ivf.ivf_faiss import ivf_to_faiss
from vq.index.ivf.ivf_lists import IVFStorage
from vq.index.ivf.ivf_probing import IVFProbing
from vq.index.ivf.ivf_searchers import IVFSearch, padded_rows, probe
from vq.index.ivf.spill import SPILL_COPIES
from vq.quantizers import VectorQuantizer

_NO_NORMS = np.zeros(0, np.float32)


#: the coarse k-means starts from k-means++ seeds up to this many lists, from random rows above
KMEANSPP_MAX_NLIST = 2048
#: the values of ``coarse_init``
COARSE_INITS = ("auto", "k-means++", "random")
#: the most inverted lists (list numbers are int32 nodes in a graph-routed coarse quantizer)
MAX_NLIST = (1 << 31) - 1
#: the IVF part of a factory description (the kinds' patterns go on from it): "IVF1024";
#: options in parentheses, comma-separated: "IVF1024(soar)" / "IVF1024(soar=0.5)" spilled
#: lists (SOAR, λ 1 unless given), "IVF1024(spherical)" unit-norm centroids (spherical
#: k-means), both "IVF1024(soar=1.5,spherical)"; "IVF65536_HNSW32" the coarse quantizer
#: routed by an HNSW graph over the centroids
IVF_FACTORY = r"IVF(?P<nlist>\d+)(?:_HNSW(?P<graph>\d+))?(?:\((?P<ivf_options>[a-z0-9.=,]*)\))?"
_SOAR_OPTION = re.compile(r"soar(?:=(?P<lam>\d+(?:\.\d*)?))?")


def ivf_arguments(match) -> dict:
    """``nlist`` and the IVF options (``coarse_hnsw``, ``spill``, ``soar_lambda``,
    ``spherical``) of a description's IVF part (:data:`IVF_FACTORY`)."""
    graph = match["graph"]
    if graph is not None and int(graph) < 2:
        raise FactoryRefusal(f"_HNSW{graph}: the graph's M must be >= 2")
    extra = {"coarse_hnsw": int(graph)} if graph else {}
    options = match["ivf_options"]
    for option in options.split(",") if options is not None else ():
        soar = _SOAR_OPTION.fullmatch(option)
        if soar and "spill" not in extra:
            extra.update(spill=True, soar_lambda=float(soar["lam"] or 1.0))
        elif option == "spherical" and "spherical" not in extra:
            extra["spherical"] = True
        else:
            raise FactoryRefusal(
                f"IVF option {option!r} in ({options}): expected soar, soar=<lambda> or "
                "spherical, each at most once, comma-separated"
            )
    return {"nlist": int(match["nlist"]), **extra}


class IVFIndex(IVFStorage, IVFProbing, Index):
    """Shared by :class:`IVFFlat`, :class:`IVFPQ` and :class:`IVFSQ`: the coarse quantizer, the
    CSR inverted lists, spilling and the probe step. Subclasses name their per-row buffers in
    ``row_buffers`` and fill them in ``_encode_rows``.

    Args:
        dim: vector dimension.
        nlist: number of inverted lists (coarse centroids).
        metric: "l2" or "ip" (lists are probed by the same metric, as faiss does).
        k: neighbours ``forward`` returns.
        nprobe: lists scanned per query (``search(..., nprobe=)`` overrides it per call).
        coarse_niter: k-means iterations of the coarse quantizer (faiss's IVF default, 10).
        coarse_init: how the coarse k-means starts: "k-means++" seeds, "random" rows (faiss's
            start: the same algorithm as faiss, for recall parity at equal parameters), or
            "auto" (k-means++ up to :data:`KMEANSPP_MAX_NLIST` lists, random rows above).
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
        spherical: train the coarse quantizer by spherical k-means (unit-norm centroids,
            faiss's ``spherical`` clustering option; factory ``"IVF1024(spherical),Flat"``).
            For unit-norm vectors (normalised embeddings, ``metric="cosine"``) the lists then
            rank by cosine, and fewer rows are scanned for the same recall; the L2 ranking of
            the lists is kept. No effect on a trained index's layout or on faiss interop.

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
        coarse_init: str = "auto",
        seed: int = 1234,
        verbose: bool = False,
        spill: bool = False,
        soar_lambda: float = 1.0,
        coarse_hnsw: int = 0,
        spherical: bool = False,
    ):
        super().__init__(dim, metric, k, verbose)
        if coarse_init not in COARSE_INITS:
            raise ValueError(
                f"coarse_init must be one of {', '.join(map(repr, COARSE_INITS))}, got "
                f"{coarse_init!r}"
            )
        self.coarse_init = coarse_init
        self.nlist = check_int(nlist, "nlist", 1, MAX_NLIST)
        self.coarse_hnsw = check_int(coarse_hnsw, "coarse_hnsw", 0, MAX_M)
        if self.coarse_hnsw == 1:
            raise ValueError("coarse_hnsw must be 0 (no graph) or the graph's M >= 2, got 1")
        self.spill = check_flag(spill, "spill")
        self.soar_lambda = check_real(soar_lambda, "soar_lambda")
        self.spherical = check_flag(spherical, "spherical")
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
            **({"coarse_init": self.coarse_init} if self.coarse_init != "auto" else {}),
            "seed": self.seed,
            **({"spill": True, "soar_lambda": self.soar_lambda} if self.spill else {}),
            **({"coarse_hnsw": self.coarse_hnsw} if self.coarse_hnsw else {}),
            **({"spherical": True} if self.spherical else {}),
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
        """``consistency_problem`` of the kind's per-vector buffers (``row_buffers``)."""
        return None

    def faiss_counterpart(self):
        """The faiss IVF index of this kind (see :func:`vq.index.ivf.ivf_faiss.ivf_to_faiss`)."""
        return ivf_to_faiss(self)

    def _empty_faiss(self, quantizer) -> tuple:
        """The kind's empty faiss ``IndexIVF`` around the coarse ``quantizer``, and what its
        lists store per row: uint8 [n_rows, code_size], in list order."""
        raise NotImplementedError

    # -- training and routing -------------------------------------------------------------
    def kernels_ahead(self) -> None:
        """``Index.kernels_ahead``: the coarse assignment's kernel after the coarse k-means
        (L2, without a graph over the centroids), then the storage's."""
        if self.device.type == "cpu" and self.metric == "l2" and not self.coarse_hnsw:
            kernels.argmin_ahead()
        super().kernels_ahead()

    def _train_coarse(self, x: torch.Tensor) -> None:
        check_training_size(x.shape[0], self.nlist, f"{type(self).__name__}.train")
        # "auto": k-means++ rather than faiss's random start up to KMEANSPP_MAX_NLIST lists
        # (recall at equal nprobe is what the partition buys; the seeding's cost is quadratic
        # in nlist, and above that it no longer bought recall: docs/perf/indexes.md)
        init = self.coarse_init
        if init == "auto":
            init = "k-means++" if self.nlist <= KMEANSPP_MAX_NLIST else "random"
        result = kmeans(
            x,
            self.nlist,
            niter=self.coarse_niter,
            init=init,
            seed=self.seed,
            spherical=self.spherical,
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


__all__ = ["IVFIndex", "IVFSearch", "padded_rows", "probe"]
