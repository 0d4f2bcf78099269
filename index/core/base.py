"""What every index shares: ids, input checks, locking, chunked search, numpy/torch in and out,
saving, and the checks of its own stored data.

Indexes are ``torch.nn.Module``s: quantizers are submodules, stored data (codes, vectors, ids)
are buffers that grow with ``add``, so ``state_dict()``/``load_state_dict`` and ``.to(device)``
work as for any module. Each class knows itself (``config``, ``growing_buffers``,
``consistency_problem``, search options, ``to_faiss``, ``searcher``); this base class knows none
of its subclasses, and the modules above the kinds (io, faiss_interop, factory) only call those
methods. Writes to the stored rows (add, remove, merge) and reading them back (reconstruct)
are the :class:`vq.index.core.updates.Updates` mixin's. ``save`` writes through
:mod:`vq.index.core.fileformat`, below every index.

Threads: ``search`` and ``save`` may run from many threads at once; ``train``, ``add``,
``add_with_ids``, ``remove_ids``, ``merge_from``, ``reset`` and ``load_state_dict`` wait for running
searches and hold the index alone, and searches started meanwhile wait for them
(:mod:`vq.index.core.locking`). Moving an index (``.to``) or assigning its buffers directly is not
locked.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import numpy as np
import torch
from torch import nn

from vq._checks import (
    MAX_NORM,
    as_ids,
    as_vectors,
    check_int,
    check_vectors,
    in_chunks,
    like_input,
)
from vq._cpu import fast_path, serial_if_small, torch_only
from vq._tree_cache import cached, drop
from vq.index.core.faiss_build import import_faiss, keep_alive
from vq.index.core.fileformat import save_target, write_index_file
from vq.index.core.filters import torch_mask
from vq.index.core.lean import search_small
from vq.index.core.locking import ReadWriteLock
from vq.index.core.mapped import read_chunks
from vq.index.core.memory import held_bytes
from vq.index.core.ranges import range_search
from vq.index.core.searchers import search_in_chunks
from vq.index.core.searching import (
    MAX_K,
    check_k,
    check_options,
    drop_derived,
    filtered_params,
    one_query_as_rows,
    results_by_id,
    search_steps,
    unit_rows,
)
from vq.index.core.searching import (
    derived as derived_value,
)
from vq.index.core.storage import IdRange, check_new_ids
from vq.index.core.updates import Updates
from vq.kernels.jit import background
from vq.kernels.jit.background import KernelNotReady
from vq.kernels.jit.cache import compiles

METRICS = ("l2", "ip", "cosine")


def ids_problem(ids: torch.Tensor) -> str | None:
    """``consistency_problem``'s words for stored ids that are not int64 [n], or not all in
    [0, 2**63) (-1 is a search's "no result"; ``add_with_ids`` takes no other): a pass over
    them, read with ``pread`` where they are mapped from an index file (nothing mapped in)."""
    if ids.dim() != 1 or ids.dtype != torch.int64:
        return f"ids of dtype {ids.dtype} and shape {tuple(ids.shape)}, expected int64 [n]"
    low = min((int(c.min()) for c in read_chunks(ids) if c.shape[0]), default=0)
    return f"ids below 0 (the smallest is {low})" if low < 0 else None


class Index(Updates, nn.Module):
    """Base class. Subclasses name their per-vector buffers (``_row_buffers``), implement
    ``_encode_batch`` (what to store per vector), ``_search_rows`` (top-k row numbers) and, if
    they learn anything, ``_train``; and extend ``growing_buffers`` and ``consistency_problem``
    for the buffers they add.

    Args:
        dim: vector dimension.
        metric: "l2" (squared Euclidean distances, smaller is better), "ip" (inner products,
            larger is better), as in faiss, or "cosine": inner products of the vectors and
            queries scaled to unit norm where they enter (``train``, ``add``, ``search``,
            ``range_search``, the exported graphs), so the cosine similarities, larger is
            better (faiss's ``L2norm`` + inner product, rather than hnswlib's ``1 - cos``
            distance: the same numbers faiss gives, ``-inf`` for a missing result as for
            "ip", and a ``range_search`` radius that is a least similarity). A zero vector
            stays zero (similarity 0 with everything). Stored as it computes: ``metric`` is
            then "ip" and ``normalize`` True; ``config()`` and saved files say "cosine".
        k: number of neighbours ``forward`` returns.
        verbose: progress bars for train and add.

    Attributes:
        normalize: vectors and queries are scaled to unit norm where they enter (metric
            "cosine", or faiss's ``"L2norm,"`` factory prefix, with either metric);
            ``reconstruct`` gives the stored, unit-norm vectors.
    """

    #: vectors encoded per step of ``add`` (bounds the temporary memory of encoding)
    add_batch_size = 1 << 14
    #: buffers with one row per stored vector besides ``ids`` (grown and shrunk in place)
    row_buffers: tuple[str, ...] = ()
    #: queries per step of ``search``: beyond the results, memory does not grow with the batch
    search_batch_size = 1 << 12
    #: the per-call options ``search`` takes (``search(q, k, nprobe=4)``): keywords of
    #: ``search_rows`` / ``search_ids`` besides the filter (``allowed``) and ``probed``
    search_params: tuple[str, ...] = ()

    def __init__(
        self,
        dim: int,
        metric: str = "l2",
        k: int = 10,
        verbose: bool = False,
        *,
        store_ids: bool = True,
    ):
        super().__init__()
        dim, k = check_int(dim, "dim", 1), check_int(k, "k", 1, MAX_K)
        if not isinstance(verbose, bool | int | np.integer):
            raise TypeError(f"verbose must be True or False, got {verbose!r}")
        if metric not in METRICS:
            raise ValueError(f"metric must be 'l2', 'ip' or 'cosine', got {metric!r}")
        self.normalize = metric == "cosine"  # (inner products of unit vectors)
        self.dim, self.metric, self.k = dim, "ip" if self.normalize else metric, k
        self.verbose = bool(verbose)
        self.lock = ReadWriteLock()
        if store_ids:  # wrappers that delegate storage (PreTransform) have none of their own
            # int64 [ntotal]; empty while the ids are the row numbers 0 … ntotal - 1 (what
            # add() gives), so sequential ids cost no memory, as in faiss's flat indexes
            self.register_buffer("ids", torch.zeros(0, dtype=torch.int64))

    # -- subclass hooks -------------------------------------------------------------------
    def learn(self, x: torch.Tensor) -> None:
        pass

    def encode_batch(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """What to store for the float32 vectors ``x`` [b, dim]: named tensors with b rows."""
        raise NotImplementedError

    def search_rows(self, q: torch.Tensor, k: int, **params) -> tuple[torch.Tensor, torch.Tensor]:
        """Values [nq, k], ascending: smaller is nearer (squared L2, or negated inner
        products), +inf where fewer than k results exist; and row numbers [nq, k], -1 there.
        ``params`` are the per-call search options."""
        raise NotImplementedError

    # -- what each class knows of itself ----------------------------------------------------
    def config(self) -> dict:
        """The constructor arguments, JSON-serialisable (saved with the index): metric
        "cosine" for inner products of normalised vectors, and ``"normalize": True`` for
        squared L2 distances between them (faiss's ``"L2norm,"`` prefix)."""
        return {"dim": self.dim, **self._metric_config(), "k": self.k}

    def _metric_config(self) -> dict:
        if self.normalize and self.metric == "l2":
            return {"metric": "l2", "normalize": True}
        return {"metric": self.metric_name}

    @property
    def metric_name(self) -> str:
        """The metric as a constructor takes it: "l2", "ip" or "cosine" (``metric`` is what
        the scans compute: "ip" for "cosine", on normalised vectors)."""
        return "cosine" if self.normalize and self.metric == "ip" else self.metric

    def growing_buffers(self) -> tuple[str, ...]:
        """Names of this module's own buffers with one row per stored vector (``ids`` also
        empty while the ids are the row numbers): sized by the data, not by ``config()``, so
        a loader takes them as they come and checks them with :meth:`consistency_problem`."""
        return ("ids",) if "ids" in self._buffers else ()

    def consistency_problem(self) -> str | None:
        """What is wrong with this module's own stored data, in words (``"299 ids for 300
        vectors"``), or None: growing buffers whose sizes disagree with ``ntotal`` and ``dim``,
        codes outside their codebooks, offsets that do not cover the rows, a wrapped index that
        does not hold this one's rows (whose own data are its own to check). Extended by
        each subclass for its buffers."""
        if self.ntotal and not self.is_trained:
            return f"{self.ntotal} vectors but no trained parameters"
        ids = self._buffers.get("ids")
        if ids is None:
            return None
        if ids.dim() == 1 and ids.shape[0] not in (0, self.ntotal):
            return f"{ids.shape[0]} ids for {self.ntotal} vectors"
        return ids_problem(ids)

    def check_consistent(self) -> None:
        """ValueError for the first index of this module tree (this one, then those it wraps)
        with a :meth:`consistency_problem` (``"IVFPQ has codes of shape (1999, 8), expected
        (2000, 8)"``). The numba scans do not check bounds: :func:`vq.load_index` refuses such
        data (a forged file with recomputed checksums) rather than let a search read past."""
        for m in self.modules():
            problem = m.consistency_problem() if isinstance(m, Index) else None
            if problem is not None:
                raise ValueError(f"{type(m).__name__} has {problem}")

    @classmethod
    def has_own_searcher(cls) -> bool:
        """Whether the class writes its search as a static-shape graph (overrides
        :meth:`searcher`): its torch engine, and what :mod:`vq.export` writes out."""
        return cls.searcher is not Index.searcher

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

    def to_faiss(self):
        """The equivalent faiss index (``pip install 'vq[faiss]'``): the same trained
        parameters, stored data, ids and search options (see :mod:`vq.index.faiss_interop`),
        behind a ``NormalizationTransform`` (an ``IndexPreTransform``, faiss's ``"L2norm,"``)
        where this index normalises (metric "cosine"); a ValueError for a kind without a
        faiss counterpart."""
        out = self.faiss_counterpart()
        if not self.normalize:
            return out
        faiss = import_faiss()
        norm = faiss.NormalizationTransform(self.dim, 2.0)
        return keep_alive(faiss.IndexPreTransform(norm, out), norm, out)

    def faiss_counterpart(self):
        """``to_faiss`` of this kind, its vectors as stored (each kind with a faiss
        counterpart implements it)."""
        raise ValueError(f"{type(self).__name__} has no faiss counterpart")

    # -- public API -----------------------------------------------------------------------
    @property
    def is_trained(self) -> bool:
        return True

    @property
    def ntotal(self) -> int:
        return int(self.ids.shape[0])

    def stored_ids(self) -> torch.Tensor:
        """int64 [ntotal]: the id of every stored row, in storage order."""
        if self.ids.shape[0] != self.ntotal:  # sequential ids, kept implicit
            return torch.arange(self.ntotal, device=self.ids.device)
        return self.ids

    @property
    def device(self) -> torch.device:
        return next(self.buffers()).device

    def nbytes(self) -> int:
        """Bytes of memory the index holds: its buffers (what ``save`` writes) and the arrays
        its searches keep derived from them (the fast-scan packed copy of the codes, norms,
        an id order…; built by the first search that needs them), each region counted once,
        on every device together. ``nbytes() / ntotal`` is the memory per vector."""
        return held_bytes(self)

    def save(self, path) -> None:
        """Write the index to ``path`` (safetensors + JSON metadata; see :func:`vq.load_index`
        and :mod:`vq.index.core.fileformat`): atomically (a crash mid-save leaves the previous
        file), while searches go on; ``add`` and ``remove_ids`` wait for the save."""
        path = save_target(path)
        with self.lock.read():
            tensors = {k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()}
            write_index_file(path, tensors, {"class": type(self).__name__, **self.config()})

    def train(self, x: Any = True) -> Index:  # noqa: D401 - faiss's verb, not nn.Module.train
        """Learn the index's parameters from ``x`` (float [n, dim]); returns self.

        An index that holds vectors is not trained again (a RuntimeError): its stored codes
        and lists were made with the parameters it has, and would not match new ones.
        ``reset()`` empties it first; kinds with nothing to learn (Flat, HNSW) take the
        call as a no-op whatever they hold, as faiss's do.

        (Called with a bool — as ``nn.Module.train(mode)`` is — it sets the training mode.)
        """
        if isinstance(x, bool):
            return super().train(x)
        t = as_vectors(x, self.dim, "x", max_norm=MAX_NORM)
        with self._writing(), torch.no_grad():
            if self.ntotal and self.learns():
                name = type(self).__name__
                raise RuntimeError(
                    f"{name}.train: the index holds {self.ntotal} vectors encoded with the "
                    "parameters it has; training again would leave them unreadable. Call "
                    "reset() to empty it first (then add the vectors again), or train a new "
                    "index"
                )
            t = t.to(self.device)
            self.learn(in_chunks(unit_rows, t, 1 << 16) if self.normalize else t)
        return self

    def learns(self) -> bool:
        """Whether ``train`` changes anything (False for the kinds with nothing to learn)."""
        return type(self).learn is not Index.learn

    def reset(self) -> None:
        """Remove every stored vector, keeping what training learned (faiss ``reset``):
        ``ntotal`` becomes 0, ``add`` numbers the next vectors from 0 again, and ``train``
        may be called again. What searches derived from the trained parameters alone is
        kept (a write of the stored rows, as ``remove_ids``)."""
        with self._writing(rows_only=True):
            self.reset_rows()

    def reset_rows(self) -> None:
        """``reset`` of this index's own stored data (each kind with more than rows, such as
        list offsets or a graph's entry point, or a wrapped index, extends it)."""
        for name in self.growing_buffers():
            buf = self._buffers[name]
            self._buffers[name] = buf.new_zeros((0, *buf.shape[1:]))

    def add(self, x: Any) -> None:
        """Add vectors [n, dim] with ids ``ntotal, ntotal + 1, …`` (faiss's sequential ids).
        Vectors must be finite, of norm at most :data:`vq._checks.MAX_NORM` (1e18: their
        squared distances stay within float32's range)."""
        t = as_vectors(x, self.dim, "x", max_norm=MAX_NORM)
        with self._writing(rows_only=True):
            ids = IdRange(self.ntotal, t.shape[0], self.device)  # made a chunk at a time
            check_new_ids(self, ids, "add: the sequential ids")
            self.add_rows(t, ids, self._prepare())

    def add_with_ids(self, x: Any, ids: Any) -> None:
        """Add vectors [n, dim] with caller-chosen ids [n]: integers in [0, 2**63), distinct
        from each other and from the ids already stored (search results and ``remove_ids``
        name vectors by id)."""
        t = as_vectors(x, self.dim, "x", max_norm=MAX_NORM)
        i = as_ids(ids, t.shape[0], "ids")
        with self._writing(rows_only=True):
            i = i.to(self.device)
            check_new_ids(self, i, "ids")
            self.add_rows(t, i, self._prepare())

    def _prepare(self) -> Callable | None:
        """What ``add`` does to each chunk of vectors before the index sees them: scale them
        to unit norm (``normalize``), or nothing (None)."""
        return unit_rows if self.normalize else None

    def remove_ids(self, ids: Any) -> int:
        """Remove every stored vector whose id is in ``ids`` (integers: an array, tensor, list
        or one int; ids not stored are ignored); returns how many were removed."""
        i = as_ids(ids, None, "ids", unique=False, stored=False)
        with self._writing(rows_only=True):
            return self.remove_stored(i.to(self.device))

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
        background (:mod:`vq.kernels.jit.background`), with the same results, ties aside.
        """
        previous = background.stop_waiting()
        try:
            return self._search_once(queries, k, allowed, return_probed, params)
        except KernelNotReady:
            pass
        finally:
            background.local.waiting = previous
        with torch_only():
            return self._search_once(queries, k, allowed, return_probed, params)

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

    # -- ids --------------------------------------------------------------------------------
    def has_sequential_ids(self) -> bool:
        """Whether the stored ids are the row numbers 0 … ntotal - 1 (kept implicit)."""
        return self.ids.shape[0] != self.ntotal

    @contextmanager
    def _writing(self, rows_only: bool = False) -> Iterator[None]:
        """The index for this thread alone (see ``ReadWriteLock``); on the way out, the lean
        searches and derived arrays of the whole module tree are dropped (their storage with
        them). ``rows_only``: a write of stored rows alone (``add``, ``remove_ids``), which
        keeps the derived arrays whose sources it left as they were (those of the codebooks:
        the first search after it rebuilds nothing that does not depend on the rows)."""
        with self.lock.write():
            try:
                yield
            finally:
                drop(self, "_lean_cache")
                drop_derived(self, stale_only=rows_only)

    # -- the lean path of small searches (see vq.index.core.lean) ---------------------------------
    def lean_search(self):
        """The lean search of the index as it is now (the contract: :mod:`vq.index.core.lean`), or
        None where it has none (untrained, empty, not on CPU, or a kind without one). Built by
        ``_lean_search`` over numpy views of the buffers and kept until anything in the module
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
        """``_lean``'s search for this index as it is: None (no lean path) unless overridden."""
        return None

    def build_refined_lean_search(self, vectors: Any, ids: Any, k_factor: Callable):
        """A re-ranking wrapper's lean search fused with this index's (candidates re-ranked on
        ``vectors`` [n, dim], mapped to ``ids`` [n]; see ivf.py): None unless overridden."""
        return None

    # -- the general path -------------------------------------------------------------------
    def search_work(self, nq: int, k: int, **params) -> float:
        """Rough single-threaded ns of a CPU search of ``nq`` queries (small ones run on one
        thread: ``vq._cpu.serial_if_small``): here, a pass over every vector per query."""
        return nq * (self.ntotal * self.vector_ns() + 2000)

    def vector_ns(self) -> float:  # rough ns to compare one query with one stored vector
        return self.dim / 16

    def derived(self, name: str, sources: tuple[torch.Tensor, ...], compute):
        """``compute()``, kept until a ``sources`` tensor changes (see ``searching.derived``)."""
        return derived_value(self, name, sources, compute)

    #: whether the kind's torch searcher takes a filter (``allowed``); where not (HNSW's walk,
    #: which lacks the exact fallback), filtered searches run ``search_rows`` on CPU copies
    torch_filters = True

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
        """Results by stored row (``_search_rows``'s) → distances and ids [nq, k] (see
        :func:`vq.index.core.searching.results_by_id`)."""
        stored = self.ids if self.ids.shape[0] == self.ntotal else None
        return results_by_id(val, rows, k, self.metric, stored)

    def _require_trained(self, what: str) -> None:
        if not self.is_trained:
            name = type(self).__name__
            raise RuntimeError(f"{name}.{what}: the index is not trained; call train(x)")

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        with self._writing():
            for name in self.growing_buffers():  # sized by the data: take the incoming sizes
                buf, incoming = self._buffers[name], state_dict.get(prefix + name)
                if incoming is not None and incoming.shape != buf.shape:
                    self._buffers[name] = buf.new_empty(incoming.shape)
            super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
