"""How an index searches: the part of :class:`vq.index.Index` that answers ``search``,
``range_search`` and ``warm_up``, and the one place that picks the engine of a call.

A call goes (``search`` → ``_search_once``): first the lean path (:mod:`vq.index.core.lean`:
numba on the calling thread, no torch operation) for a few float32 numpy or CPU queries, where
the kind built one (``build_lean_search``); else the general path, ``search_batch_size``
queries at a time (:func:`vq.index.core.searching.search_steps`), whose engine
``search_ids`` picks: the kind's numba scan (``search_rows``) for CPU tensors in eager mode,
its static-shape torch search (``torch_search`` over ``torch_searcher``, the kind's
``searcher(copy=False)``) elsewhere (CUDA, ``vq._cpu.torch_only``, graph capture). A search
whose kernels are not compiled yet answers on the torch path while they compile.

What a kind declares for it: ``search_params`` (its per-call options), ``search_rows``,
``searcher`` (if it has a static search), ``torch_filters`` (whether that search takes a
filter), ``build_lean_search`` (if it has a lean path), ``search_work`` / ``vector_ns`` (the
cost model that keeps small searches on one thread).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from vq._checks import MAX_NORM, check_vectors, like_input
from vq._cpu import fast_path, serial_if_small, torch_only
from vq._tree_cache import cached
from vq.index.core.filters import torch_mask
from vq.index.core.lean import search_small
from vq.index.core.ranges import range_search
from vq.index.core.searchers import search_in_chunks
from vq.index.core.searching import (
    check_k,
    check_options,
    drop_derived_named,
    filtered_params,
    one_query_as_rows,
    results_by_id,
    search_steps,
)
from vq.kernels.jit import background
from vq.kernels.jit.background import KernelNotReady
from vq.kernels.jit.cache import compiles


class SearchPaths:
    """The mixin of :class:`vq.index.Index` holding its searches (see the module docstring)."""

    #: queries per step of ``search``: beyond the results, memory does not grow with the batch
    search_batch_size = 1 << 12

    #: the per-call options ``search`` takes (``search(q, k, nprobe=4)``): keywords of
    #: ``search_rows`` / ``search_ids`` besides the filter (``allowed``) and ``probed``
    search_params: tuple[str, ...] = ()

    #: whether the kind's torch searcher takes a filter (``allowed``); where not (HNSW's walk,
    #: which lacks the exact fallback), filtered searches run ``search_rows`` on CPU copies
    torch_filters = True

    # -- what a kind provides ----------------------------------------------------------------
    def search_rows(self, q: torch.Tensor, k: int, **params) -> tuple[torch.Tensor, torch.Tensor]:
        """Values [nq, k], ascending: smaller is nearer (squared L2, or negated inner
        products), +inf where fewer than k results exist; and row numbers [nq, k], -1 there.
        ``params`` are the per-call search options."""
        raise NotImplementedError

    @classmethod
    def has_own_searcher(cls) -> bool:
        """Whether the class writes its search as a static-shape graph (overrides
        :meth:`searcher`): its torch engine, and what :mod:`vq.export` writes out."""
        return cls.searcher is not SearchPaths.searcher

    def has_searcher(self) -> bool:
        """Whether this index has a static-shape search (a wrapper: if the index it wraps
        has one)."""
        return self.has_own_searcher()

    def searcher(self, k: int | None = None, **options):
        """The search as a static-shape graph over a snapshot of the stored data
        (``copy=False``: over the index's own; see :class:`vq.index.core.searchers.Searcher`):
        each kind that has one writes it next to its class. A TypeError here."""
        raise TypeError(f"{type(self).__name__} has no static-shape search (no search graph)")

    def search_options(self) -> tuple[str, ...]:
        """Names of the per-call options ``search`` takes (e.g. ``("nprobe",)``)."""
        return tuple(sorted(self.search_params))

    def probes_lists(self) -> bool:
        return False  # whether searches probe lists (search(..., return_probed=True))

    # -- searching -------------------------------------------------------------------------
    def search(
        self,
        queries: Any,
        k: int | None = None,
        *,
        allowed: Any = None,
        return_probed: bool = False,
        **params,
    ) -> tuple:
        """The ``k`` nearest stored vectors of each query.

        Args:
            queries: float [nq, dim], or one query [dim] (answered as a batch of one, [1,
                k]); numpy or torch (any device; float64/float16/bfloat16 are converted to
                float32, ``search_batch_size`` queries at a time), finite and of norm at most
                :data:`vq._checks.MAX_NORM` (1e18).
            k: neighbours per query (default ``self.k``).
            allowed: only these ids (filtered search: an id array, a boolean mask over the id
                space or a :class:`vq.IdFilter`; see :mod:`vq.index.core.filters`).
            return_probed: IVF indexes: also return how many lists each query probed.
            params: per-call search options of the index type (``nprobe``, ``max_codes``:
                IVF; ``k_factor``: re-ranking; see ``search_options()``).

        Returns:
            ``(D, I)``: float32 [nq, k] distances (squared L2 ascending, or inner products
            descending: cosine similarities for "cosine") and int64 [nq, k] ids; missing
            results are id -1 with distance +inf (-inf for "ip" and "cosine"). numpy for numpy
            queries, tensors on the queries' device otherwise. With ``return_probed``, ``(D,
            I, probed)``, probed int64 [nq].

        A search whose CPU kernels are not compiled yet (a machine that has compiled nothing)
        does not wait for them: it answers on the torch path while they compile in the
        background (:mod:`vq.kernels.jit.background`), with the same results, ties aside;
        the torch path's snapshot of the storage it made is let go by the first search the
        kernels answer.
        """
        previous = background.stop_waiting()
        try:
            found = self._search_once(queries, k, allowed, return_probed, params)
        except KernelNotReady:
            found = None
        finally:
            background.local.waiting = previous
        if found is not None:
            if self.__dict__.pop("_torch_stand_in", False):
                # the kernels serve now: the torch path's snapshot of the storage (unpacked
                # codes, padded lists: several times the index's bytes) is not kept
                drop_derived_named(self, "searcher")
            return found
        with torch_only():
            found = self._search_once(queries, k, allowed, return_probed, params)
        self.__dict__["_torch_stand_in"] = True
        return found

    def _search_once(self, queries: Any, k, allowed, return_probed: bool, params: dict):
        """``search``, on the paths its kernels (or ``torch_only``) allow."""
        queries = one_query_as_rows(queries)
        plain = allowed is None and not return_probed
        found = search_small(self, queries, k, params) if plain else None  # see vq.index.core.lean
        if found is not None:
            return found
        k = check_k(self.k if k is None else k)
        self._require_trained("search")
        check_options(self, params)
        q = check_vectors(queries, self.dim, "queries", max_norm=MAX_NORM)
        converted = q is not queries and q.device.type == "cpu"
        if plain and converted and q.shape[0] <= self.search_batch_size:  # as float32 ones
            found = search_small(self, q.detach().to(torch.float32), k, params)
            if found is not None:
                return like_input(found[0], queries), like_input(found[1], queries)
        found = self._search_general(q, k, allowed, return_probed, params)
        return tuple(like_input(t, queries) for t in found)

    def _search_general(self, q: torch.Tensor, k: int, allowed, return_probed: bool, params):
        """The general path of ``search`` for checked queries ``q``: ``(D, I)`` tensors (and
        probed with ``return_probed``), in steps of ``search_batch_size`` queries."""
        filtered = filtered_params(self, params, allowed, return_probed, q.shape[0])
        work = self.search_work(min(q.shape[0], self.search_batch_size), k, **params)
        small = serial_if_small(work)
        with self.lock.read(), torch.no_grad(), small:
            dist, ids = search_steps(self, q, k, filtered)
        return (dist, ids, filtered["probed"]) if return_probed else (dist, ids)

    def warm_up(self, k: int | None = None) -> int:
        """Compile (or load from the kernel cache) the CPU kernels this index's searches use,
        so that the first query of a later process does not wait for a compiler; returns how
        many kernels this call compiled (0: all were compiled or cached already).

        Kernels compile once per machine and are kept on disk (:mod:`vq.kernels.jit.cache`), but
        only those a process ran: a process that trains, adds and saves without searching
        leaves the search kernels to the first process that searches (10–40 s on a slow
        CPU). Call this before or after ``save`` where the index is built (``vq build`` does).
        It searches random queries on each CPU path (one query, a batch an IVF index splits
        between threads, the path of large batches; see :mod:`vq.index.core.lean`) with ``k``
        (default ``self.k``) and the stored search options; on an empty, untrained or
        non-CPU index it compiles nothing. Filtered and range searches are not warmed.
        """
        k = check_k(self.k if k is None else k)
        if not self.is_trained or self.ntotal == 0 or self.device.type != "cpu":
            return 0
        before = compiles()
        queries = torch.randn(64, self.dim, generator=torch.Generator().manual_seed(0))
        with background.waiting():
            for batch in (queries[:1].numpy(), queries.numpy()):
                self.search(batch, k)  # the lean paths: one query, a batch IVF splits
            self._search_general(queries, k, None, False, {})  # the path of large batches
        return compiles() - before

    def range_search(self, queries: Any, radius: float, *, allowed: Any = None, **params):
        """Every stored vector within ``radius`` of each query (faiss ``range_search``): ``(lims,
        D, I)``, see :mod:`vq.index.core.ranges`; ``queries``, ``allowed`` and ``params`` as
        ``search``'s (metric "cosine": the vectors of similarity above ``radius``)."""
        return range_search(self, queries, radius, allowed, params)

    def range_hits(self, q: torch.Tensor, radius: float, allowed, **params) -> list:
        """The hits: ``(queries, rows, values)`` per kernel call (Flat, IVFFlat, wrappers)."""
        raise NotImplementedError(f"{type(self).__name__} has no range_search yet")

    def forward(self, queries: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``search(queries, self.k)`` for torch queries."""
        return self.search(queries, self.k)

    # -- the lean path of small searches (see vq.index.core.lean) ----------------------------
    def lean_search(self):
        """The lean search of the index as it is now (the contract: :mod:`vq.index.core.lean`), or
        None where it has none (untrained, empty, not on CPU, or a kind without one). Built by
        ``build_lean_search`` over numpy views of the buffers and kept until anything in the module
        tree is replaced or modified in place, or the index is written to (which drops it at
        once, so that it holds no stale storage)."""
        return cached(self, "_lean_cache", self._build_lean)

    def _build_lean(self):
        usable = self.is_trained and self.ntotal > 0 and self.device.type == "cpu"
        search = self.build_lean_search() if usable else None
        if search is not None:
            search.options = frozenset(self.search_options())
        return search

    def build_lean_search(self):
        """The kind's lean search of the index as it is (``lean_search`` keeps it): a closure
        ``search(q, k, ranked, params)`` over numpy views of the buffers, or None (no lean
        path, the default)."""
        return None

    def build_refined_lean_search(self, vectors: Any, ids: Any, k_factor: Callable):
        """A re-ranking wrapper's lean search fused with this index's (candidates re-ranked on
        ``vectors`` [n, dim], mapped to ``ids`` [n]; see ivf.py): None unless overridden."""
        return None

    # -- the general path: the engine switch, the cost model ---------------------------------
    def search_work(self, nq: int, k: int, **params) -> float:
        """Rough single-threaded ns of a CPU search of ``nq`` queries (small ones run on one
        thread: ``vq._cpu.serial_if_small``): here, a pass over every vector per query."""
        return nq * (self.ntotal * self.vector_ns() + 2000)

    def vector_ns(self) -> float:  # rough ns to compare one query with one stored vector
        return self.dim / 16

    def search_ids(self, q: torch.Tensor, k: int, **params) -> tuple[torch.Tensor, torch.Tensor]:
        """float32 distances and int64 ids [nq, k] of checked float32 queries on the device: the
        engine switch of the general path (the lean path, tried first, is ``lean_search``).
        CPU tensors in eager mode (``vq._cpu.fast_path``) run ``search_rows`` (the numba
        kernels); anything else (CUDA, ``torch_only``, graph capture) runs
        :meth:`torch_search` where the kind has a static-shape search (``searcher``), and
        ``search_rows`` where it has none (or the call is filtered and ``torch_filters`` is
        False)."""
        if self.ntotal == 0:
            val = torch.empty(q.shape[0], 0, device=self.device)
            rows = torch.empty(q.shape[0], 0, dtype=torch.int64, device=self.device)
            return self._finish(val, rows, k)
        if not fast_path(q) and self.has_searcher():
            if self.torch_filters or params.get("allowed") is None:
                return self.torch_search(q, k, **params)
        val, rows = self.search_rows(q, min(k, self.ntotal), **params)
        return self._finish(val, rows, k)

    def torch_search(self, q: torch.Tensor, k: int, allowed=None, **params):
        """The torch engine: the kind's static search over its own storage
        (:meth:`torch_searcher`), a chunk of queries at a time; the filter as a bool mask
        over the stored rows."""
        mask = {} if allowed is None else {"allowed": torch_mask(self, allowed)}
        return search_in_chunks(self.torch_searcher(), q, k, **params, **mask)

    def torch_searcher(self):
        """The static search over the index's own storage (``searcher(copy=False)``), kept
        until a buffer changes."""
        shared = partial(self.searcher, copy=False)
        return self.derived("searcher", tuple(self.buffers()), shared)

    def candidate_ids(self, q: torch.Tensor, k: int, **params) -> torch.Tensor:
        """int64 [nq, k]: the ids of the k nearest in any order (-1 padding), the candidates a
        re-ranking wrapper asks for."""
        return self.search_ids(q, k, **params)[1]

    def _finish(self, val: torch.Tensor, rows: torch.Tensor, k: int):
        """Results by stored row (``search_rows``'s) → distances and ids [nq, k] (see
        :func:`vq.index.core.searching.results_by_id`)."""
        stored = self.ids if self.ids.shape[0] == self.ntotal else None
        return results_by_id(val, rows, k, self.metric, stored)
