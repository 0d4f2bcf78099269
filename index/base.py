"""What every index shares: ids, input checks, locking, chunked search, result padding, numpy/torch
in and out.

Indexes are ``torch.nn.Module``s: quantizers are submodules, stored data (codes, vectors, ids)
are buffers that grow with ``add``, so ``state_dict()``/``load_state_dict`` and ``.to(device)``
work as for any module.

Threads: ``search`` (and ``save``) may run from many threads at once; ``train``, ``add``,
``add_with_ids``, ``remove_ids`` and ``load_state_dict`` take the index for themselves, waiting
for running searches to finish, and searches started meanwhile wait for them (a readers-writer
lock per index). Moving an index (``.to``) or assigning its buffers directly is not locked.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from vq import _cpu, kernels
from vq._checks import as_ids, as_vectors, check_int, check_vectors, is_eager, like_input
from vq._cpu import serial_if_small
from vq._tree_cache import cached, drop

METRICS = ("l2", "ip")
#: searches of at most this many queries may take the lean path (``Index._search_small``)
SMALL_BATCH = 16


class ReadWriteLock:
    """Many readers or one writer; a waiting writer goes before new readers (so a stream of
    searches cannot starve an ``add``). Both sides are reentrant per thread, and the writing
    thread may also read; a thread that reads and then asks to write gets a RuntimeError (it
    would wait for itself forever)."""

    def __init__(self):
        self._mutex = threading.Lock()  # entered directly where no wait is needed (faster)
        self._cond = threading.Condition(self._mutex)
        self._readers = 0
        self._writer: int | None = None
        self._writes = 0  # the writer's nesting depth
        self._waiting_writers = 0
        self._local = threading.local()  # this thread's read depth

    @contextmanager
    def read(self) -> Iterator[None]:
        token = self.acquire_read()
        try:
            yield
        finally:
            self.release_read(token)

    def acquire_read(self) -> tuple[int, bool]:
        """``read()`` without a context manager (a few µs less per call): the token to give
        back to :meth:`release_read`."""
        depth = getattr(self._local, "depth", 0)
        nested = depth > 0 or self._writer == threading.get_ident()
        if not nested:
            with self._mutex:
                while self._writer is not None or self._waiting_writers:
                    self._cond.wait()
                self._readers += 1
        self._local.depth = depth + 1
        return depth, nested

    def try_read(self) -> bool:
        """Enter as a plain reader if no writer holds or awaits the lock (True; leave with
        :meth:`end_read`), else False (use :meth:`acquire_read`). For a reader that runs none
        of the caller's code while it reads (a lean search): it skips the per-thread depth
        that nested reads and the write-inside-read check need."""
        mutex = self._mutex
        mutex.acquire()  # (not "with": this runs on every small search)
        free = self._writer is None and not self._waiting_writers
        if free:
            self._readers += 1
        mutex.release()
        return free

    def end_read(self) -> None:
        """Leave a read entered with :meth:`try_read`."""
        with self._mutex:
            self._readers -= 1
            if not self._readers and self._waiting_writers:  # only writers wait on readers
                self._cond.notify_all()

    def release_read(self, token: tuple[int, bool]) -> None:
        depth, nested = token
        self._local.depth = depth
        if not nested:
            with self._mutex:
                self._readers -= 1
                if not self._readers and self._waiting_writers:  # only writers wait on readers
                    self._cond.notify_all()

    @contextmanager
    def write(self) -> Iterator[None]:
        me = threading.get_ident()
        with self._cond:
            if self._writer != me:
                if getattr(self._local, "depth", 0):
                    raise RuntimeError("cannot modify an index from inside one of its own searches")
                self._waiting_writers += 1
                try:
                    while self._writer is not None or self._readers:
                        self._cond.wait()
                finally:
                    self._waiting_writers -= 1
                self._writer = me
            self._writes += 1
        try:
            yield
        finally:
            with self._cond:
                self._writes -= 1
                if not self._writes:
                    self._writer = None
                    self._cond.notify_all()

    def __reduce__(self):  # copies (deepcopy, pickling by torch) get a fresh, free lock
        return (type(self), ())


class Index(nn.Module):
    """Base class. Subclasses implement ``_encode_batch`` (what to store per vector), ``_store``
    (append it), ``_keep`` (drop rows), ``_search_rows`` (top-k row numbers) and, if they learn
    anything, ``_train``.

    Args:
        dim: vector dimension.
        metric: "l2" (squared Euclidean distances, smaller is better) or "ip" (inner products,
            larger is better), as in faiss.
        k: number of neighbours ``forward`` returns.
        verbose: progress bars for train and add.
    """

    #: vectors encoded per step of ``add`` (bounds the temporary memory of encoding)
    add_batch_size = 1 << 16
    #: queries per step of ``search``: beyond the results, memory does not grow with the batch
    search_batch_size = 1 << 12

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
        dim, k = check_int(dim, "dim", 1), check_int(k, "k", 1)
        if metric not in METRICS:
            raise ValueError(f"metric must be 'l2' or 'ip', got {metric!r}")
        self.dim, self.metric, self.k = dim, metric, k
        self.verbose = verbose
        self._lock = ReadWriteLock()
        if store_ids:  # wrappers that delegate storage (PreTransform) have none of their own
            # int64 [ntotal]; empty while the ids are the row numbers 0 … ntotal - 1 (what
            # add() gives), so sequential ids cost no memory, as in faiss's flat indexes
            self.register_buffer("ids", torch.zeros(0, dtype=torch.int64))

    # -- subclass hooks -------------------------------------------------------------------
    def _train(self, x: torch.Tensor) -> None:
        pass

    def _encode_batch(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """What to store for the float32 vectors ``x`` [b, dim]: named tensors with b rows."""
        raise NotImplementedError

    def _store(self, encoded: dict[str, torch.Tensor], ids: torch.Tensor) -> None:
        """Append encoded rows (all of an ``add`` call) and their ids."""
        raise NotImplementedError

    def _keep(self, rows: torch.Tensor) -> None:
        raise NotImplementedError

    def _search_rows(self, q: torch.Tensor, k: int, **params) -> tuple[torch.Tensor, torch.Tensor]:
        """Distances [nq, k] (ascending for l2, descending for ip) and row numbers [nq, k]
        (-1 where fewer than k results exist); ``params`` are the per-call search options."""
        raise NotImplementedError

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

    def _sequential_ids(self) -> bool:
        """Whether the stored ids are the row numbers 0 … ntotal - 1 (kept implicit)."""
        ids = self._buffers.get("ids")
        if ids is None:  # a wrapper that stores nothing itself (PreTransform)
            return self.index._sequential_ids()
        return ids.shape[0] != self.ntotal

    def _append_ids(self, ids: torch.Tensor) -> None:
        """Record the ids of rows about to be appended (call before the storage grows)."""
        n0 = self.ntotal
        if self.ids.shape[0] == 0 and torch.equal(
            ids, torch.arange(n0, n0 + ids.shape[0], device=ids.device)
        ):
            return
        self.ids = torch.cat([self.stored_ids(), ids.to(self.ids.device)])

    @property
    def device(self) -> torch.device:
        return next(self.buffers()).device

    def config(self) -> dict:
        """The constructor arguments, JSON-serialisable (saved with the index)."""
        return {"dim": self.dim, "metric": self.metric, "k": self.k}

    def save(self, path) -> None:
        """Write the index to ``path`` (safetensors + JSON metadata; see :func:`vq.load_index`):
        atomically (a crash mid-save leaves the previous file), while searches go on."""
        from vq.index.io import save_index

        save_index(self, path)

    def to_faiss(self):
        """The equivalent faiss index (``pip install 'vq[faiss]'``); see
        :func:`vq.index.to_faiss`."""
        from vq.index.faiss_interop import to_faiss

        return to_faiss(self)

    def train(self, x: Any = True) -> Index:  # noqa: D401 - faiss's verb, not nn.Module.train
        """Learn the index's parameters from ``x`` (float [n, dim]); returns self.

        (Called with a bool — as ``nn.Module.train(mode)`` is — it sets the training mode.)
        """
        if isinstance(x, bool):
            return super().train(x)
        t = as_vectors(x, self.dim, "x")
        with self._writing(), torch.no_grad():
            self._train(t.to(self.device))
        return self

    def add(self, x: Any) -> None:
        """Add vectors [n, dim] with ids ``ntotal, ntotal + 1, …`` (faiss's sequential ids)."""
        t = as_vectors(x, self.dim, "x")
        with self._writing():
            ids = torch.arange(self.ntotal, self.ntotal + t.shape[0], device=self.device)
            self._check_new_ids(ids, "add: the sequential ids")
            self._add(t, ids)

    def add_with_ids(self, x: Any, ids: Any) -> None:
        """Add vectors [n, dim] with caller-chosen ids [n]: integers in [0, 2**63), distinct
        from each other and from the ids already stored (search results and ``remove_ids``
        name vectors by id)."""
        t = as_vectors(x, self.dim, "x")
        i = as_ids(ids, t.shape[0], "ids")
        with self._writing():
            i = i.to(self.device)
            self._check_new_ids(i, "ids")
            self._add(t, i)

    def _check_new_ids(self, ids: torch.Tensor, what: str) -> None:
        """Refuse ids (non-negative, distinct) that are already stored."""
        if not self.ntotal or not ids.numel():
            return
        if self._sequential_ids():  # the stored ids are 0 … ntotal - 1: no search needed
            taken = ids < self.ntotal
        else:
            taken = torch.isin(ids, self.stored_ids())
        if bool(taken.any()):
            first = int(ids[torch.argmax(taken.to(torch.uint8))])
            raise ValueError(
                f"{what}: {int(taken.sum())} of them are already in the index (first: {first}); "
                "remove_ids them first, or add with new ids"
            )

    def _add(self, x: torch.Tensor, ids: torch.Tensor) -> None:
        self._require_trained("add")
        step = self.add_batch_size
        parts: dict[str, list[torch.Tensor]] = {}
        with (
            torch.no_grad(),
            tqdm(
                total=x.shape[0],
                desc=f"{type(self).__name__}.add",
                disable=not self.verbose,
                leave=False,
                unit="vec",
            ) as bar,
        ):
            for s in range(0, x.shape[0], step):
                for name, t in self._encode_batch(x[s : s + step].to(self.device)).items():
                    parts.setdefault(name, []).append(t)
                bar.update(min(step, x.shape[0] - s))
            if x.shape[0] == 0:
                return
            self._store({name: torch.cat(ts) for name, ts in parts.items()}, ids)

    def remove_ids(self, ids: Any) -> int:
        """Remove every stored vector whose id is in ``ids`` (integers: an array, tensor, list
        or one int; ids not stored are ignored); returns how many were removed."""
        i = as_ids(ids, None, "ids", unique=False, stored=False)
        with self._writing():
            return self._remove(i.to(self.device))

    def _remove(self, ids: torch.Tensor) -> int:
        stored = self.stored_ids()
        keep = ~torch.isin(stored, ids)
        removed = self.ntotal - int(keep.sum())
        if removed:
            rows = torch.nonzero(keep).flatten()
            self._keep(rows)
            self.ids = stored[rows]
        return removed

    def search(self, queries: Any, k: int | None = None, **params) -> tuple[Any, Any]:
        """The ``k`` nearest stored vectors of each query.

        Args:
            queries: float [nq, dim], numpy or torch (any device; float64/float16/bfloat16 are
                converted to float32, ``search_batch_size`` queries at a time).
            k: neighbours per query (default ``self.k``).
            params: per-call search options of the index type (``nprobe`` for IVF indexes,
                ``k_factor`` for re-ranking; see ``search_options()``), overriding its
                attributes for this call.

        Returns:
            ``(D, I)``: float32 [nq, k] distances (squared L2 ascending, or inner products
            descending) and int64 [nq, k] ids; missing results are id -1 with distance +inf
            (-inf for "ip"). numpy for numpy queries, tensors on the queries' device otherwise.
        """
        found = self._search_small(queries, k, params)
        if found is not None:
            return found
        k = self.k if k is None else k
        if isinstance(k, bool) or not isinstance(k, int | np.integer) or k <= 0:
            raise ValueError(f"k must be a positive integer, got {k!r}")
        self._require_trained("search")
        unknown = sorted(set(params) - set(self.search_options()))
        if unknown:
            takes = ", ".join(self.search_options()) or "none"
            raise TypeError(
                f"{type(self).__name__}.search() got an unexpected keyword argument "
                f"{unknown[0]!r}; its search options: {takes}"
            )
        q = check_vectors(queries, self.dim, "queries")
        nq, k, step = q.shape[0], int(k), self.search_batch_size
        small = serial_if_small(self._search_work(min(nq, step), int(k), **params))
        with self._lock.read(), torch.no_grad(), small:
            if nq <= step:
                dist, ids = self._search_ids(_rows(q, self.device), k, **params)
            else:  # bounded memory: per-chunk tables and buffers, results written in place
                dist = torch.empty(nq, k, device=self.device)
                ids = torch.empty(nq, k, dtype=torch.int64, device=self.device)
                for s in range(0, nq, step):
                    chunk = _rows(q[s : s + step], self.device)
                    dist[s : s + step], ids[s : s + step] = self._search_ids(chunk, k, **params)
        return like_input(dist, queries), like_input(ids, queries)

    def search_options(self) -> tuple[str, ...]:
        """Names of the per-call options ``search`` takes (e.g. ``("nprobe",)``)."""
        names = _option_names(type(self))
        if isinstance(self, Wrapper):
            names = names | set(self.index.search_options())
        return tuple(sorted(names))

    def forward(self, queries: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``search(queries, self.k)`` for torch queries."""
        return self.search(queries, self.k)

    # -- the lean path of small searches ---------------------------------------------------
    def _search_small(self, queries: Any, k: Any, params: dict):
        """``search`` of at most :data:`SMALL_BATCH` float32 queries on CPU (numpy, or a CPU
        tensor outside autograd and graph capture) straight to ids: numba kernels on the
        calling thread over numpy views of the buffers, no torch operation, no thread pool
        wake-up where the work is small (a service answering one query at a time). None where
        it does not apply: the general path then serves the call, and raises any error."""
        if type(queries) is np.ndarray:
            if queries.dtype is not _FLOAT32:
                return None
            q, tensor = queries, False
        elif isinstance(queries, torch.Tensor):
            if (
                queries.dtype != torch.float32
                or queries.device.type != "cpu"
                or queries.requires_grad
                or not is_eager()
            ):
                return None
            q, tensor = queries.numpy(), True
        else:
            return None
        shape = q.shape
        if len(shape) != 2 or not 0 < shape[0] <= SMALL_BATCH or shape[1] != self.dim:
            return None
        if k is None:
            k = self.k
        elif type(k) is not int:
            if isinstance(k, bool) or not isinstance(k, np.integer):
                return None
            k = int(k)
        if k <= 0 or _cpu._disabled:
            return None
        if not q.flags.c_contiguous:
            q = np.ascontiguousarray(q)
        lock = self._lock
        token = None if lock.try_read() else lock.acquire_read()
        try:
            search = self._lean()
            if search is None or (params and not params.keys() <= search.options):
                found = None  # (an unknown option: the general path says which)
            else:
                found = search(q, k, True, params)
        finally:
            if token is None:
                lock.end_read()
            else:
                lock.release_read(token)
        if found is None or not tensor:
            return found
        return torch.from_numpy(found[0]), torch.from_numpy(found[1])

    def _lean(self):
        """The lean search of the index as it is now, ``search(q, k, ranked, params)`` (params:
        the per-call options, a dict)
        → float32 distances and int64 ids, numpy [nq, k] padded as ``search`` pads (in any
        order if not ``ranked``: re-ranking candidates), or None where the call is not small
        or a query is not finite (the general path then serves it, or says what is wrong);
        q: checked C-contiguous float32 [nq <= SMALL_BATCH, dim]. None where the index has no
        lean path (untrained, empty, not on CPU, or a kind without one). Built by
        ``_lean_search`` over numpy views of the buffers, and kept until a buffer, parameter
        or submodule anywhere in the module tree is replaced or modified in place, or the
        index is written to (which drops it at once, so that it holds no stale storage)."""
        return cached(self, "_lean_cache", self._build_lean)

    def _build_lean(self):
        usable = self.is_trained and self.ntotal > 0 and self.device.type == "cpu"
        search = self._lean_search() if usable else None
        if search is not None:
            search.options = frozenset(self.search_options())
        return search

    def _lean_search(self):
        """``_lean``'s search for this index as it is (see there; the kinds that have a lean
        path override this): None, no lean path."""
        return None

    @contextmanager
    def _writing(self) -> Iterator[None]:
        """The index for this thread alone (see ``ReadWriteLock``); on the way out, the lean
        searches and derived arrays of the whole module tree are dropped (their storage with
        them)."""
        with self._lock.write():
            try:
                yield
            finally:
                drop(self, "_lean_cache")
                drop(self, "_derived_cache")

    # -- helpers --------------------------------------------------------------------------
    def _search_work(self, nq: int, k: int, **params) -> float:
        """Rough single-threaded nanoseconds a CPU search of ``nq`` queries takes (small ones
        run on one thread; see ``vq._cpu.serial_if_small``): here, one pass over every stored
        vector per query."""
        return nq * (self.ntotal * self._vector_ns() + 2000)

    def _derived(self, name: str, sources: tuple[torch.Tensor, ...], compute):
        """``compute()``, kept under ``name`` until one of the ``sources`` tensors is replaced,
        modified in place or moved (for arrays derived from codebooks on every search)."""
        key = tuple((t.data_ptr(), t._version, t.shape, t.device) for t in sources)
        entry = self.__dict__.get("_derived_cache", {}).get(name)
        if entry is None or entry[0] != key:
            entry = (key, compute())
            self.__dict__.setdefault("_derived_cache", {})[name] = entry
        return entry[1]

    def _vector_ns(self) -> float:
        """Rough nanoseconds to compare one query with one stored vector."""
        return self.dim / 16

    def _search_ids(self, q: torch.Tensor, k: int, **params) -> tuple[torch.Tensor, torch.Tensor]:
        """float32 distances and int64 ids [nq, k] of checked float32 queries on the device."""
        if self.ntotal == 0:
            dist = torch.empty(q.shape[0], 0, device=self.device)
            rows = torch.empty(q.shape[0], 0, dtype=torch.int64, device=self.device)
        else:
            dist, rows = self._search_rows(q, min(k, self.ntotal), **params)
        return self._finish(dist, rows, k)

    def _candidate_ids(self, q: torch.Tensor, k: int, **params) -> torch.Tensor:
        """int64 [nq, k]: the ids of the k nearest, in any order (-1 padding): the candidates
        a re-ranking wrapper asks for, which an index may return without sorting them."""
        return self._search_ids(q, k, **params)[1]

    def _renumber(self, mapping: torch.Tensor) -> None:
        """Replace every stored id i by ``mapping[i]`` (used by re-ranking wrappers)."""
        self.ids = mapping[self.stored_ids()]

    def _finish(self, dist: torch.Tensor, rows: torch.Tensor, k: int):
        """Results by stored row (distances float32 [nq, kk], rows int64 [nq, kk], -1 where
        missing; kk <= k) → by id, padded to k."""
        fill = float("inf") if self.metric == "l2" else float("-inf")
        stored = self.ids if self.ids.shape[0] == self.ntotal else None
        if _cpu.fast_path(rows) and dist.dtype == torch.float32 and rows.dtype == torch.int64:
            nq = rows.shape[0]
            out_dist, out_ids = _cpu.empty((nq, k)), _cpu.empty((nq, k), torch.int64)
            kernels.rows_to_ids(
                dist.contiguous().numpy(),
                rows.contiguous().numpy(),
                _NO_IDS if stored is None else stored.contiguous().numpy(),
                False,
                np.float32(fill),
                out_dist.numpy(),
                out_ids.numpy(),
            )
            return out_dist, out_ids
        missing = rows < 0
        ids = torch.where(missing, -1, rows if stored is None else stored[rows.clamp_min(0)])
        dist = torch.where(missing, fill, dist)
        pad = k - rows.shape[1]
        if pad > 0:
            nq = rows.shape[0]
            dist = torch.cat([dist, torch.full((nq, pad), fill, device=dist.device)], dim=1)
            ids = torch.cat([ids, torch.full((nq, pad), -1, device=ids.device)], dim=1)
        return dist.float(), ids.long()

    def _require_trained(self, what: str) -> None:
        if not self.is_trained:
            raise RuntimeError(
                f"{type(self).__name__}.{what}: the index is not trained; call train(x)"
            )

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        with self._writing():
            # stored data grows with add(): take the incoming sizes before copying
            for name, buf in list(self._buffers.items()):
                incoming = state_dict.get(prefix + name)
                if buf is not None and incoming is not None and incoming.shape != buf.shape:
                    self._buffers[name] = torch.empty(
                        incoming.shape, dtype=buf.dtype, device=buf.device
                    )
            super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


class Wrapper(Index):
    """An index around another one (``self.index``, set by the subclass), which holds the
    search options: ``nprobe`` reads and sets the wrapped index's."""

    index: Index

    @property
    def nprobe(self) -> int:
        return self.index.nprobe

    @nprobe.setter
    def nprobe(self, value: int) -> None:
        self.index.nprobe = value


def _rows(q: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Checked queries as contiguous float32 on ``device`` (the same results whatever the
    input's dtype or memory layout: BLAS rounds differently for transposed operands)."""
    return q.float().to(device).contiguous()


_OPTIONS: dict[type, frozenset[str]] = {}
_NO_IDS = np.zeros(0, dtype=np.int64)  # rows_to_ids: the ids are the rows
_FLOAT32 = np.dtype(np.float32)


def _option_names(cls: type) -> frozenset[str]:
    """Keyword options of ``cls._search_rows`` and ``cls._search_ids`` (besides q and k)."""
    names = _OPTIONS.get(cls)
    if names is None:
        found = set()
        for method in (cls._search_rows, cls._search_ids):
            for p in list(inspect.signature(method).parameters.values())[3:]:  # self, q, k
                if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
                    found.add(p.name)
        names = _OPTIONS[cls] = frozenset(found)
    return names
