"""What every index shares: ids, input checks, locking, chunked search, numpy/torch in and out,
saving, and the checks of its own stored data.

Indexes are ``torch.nn.Module``s: quantizers are submodules, stored data (codes, vectors, ids)
are buffers that grow with ``add``, so ``state_dict()``/``load_state_dict`` and ``.to(device)``
work as for any module. Each class knows itself (``config``, ``growing_buffers``,
``consistency_problem``, ``search_params``, ``faiss_counterpart``, ``searcher``); this base
class knows none of its subclasses, and the modules above the kinds (io, faiss_interop,
factory) find them in the registry (:mod:`vq.index.core.registry`) and only call those
methods. Writes to the stored rows (add, remove, merge) and reading them back (reconstruct)
are the :class:`vq.index.core.updates.Updates` mixin's, searching the
:class:`vq.index.core.search_paths.SearchPaths` mixin's. ``save`` writes through
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
from typing import Any

import numpy as np
import torch
from torch import nn

from vq._checks import (
    MAX_NORM,
    as_ids,
    as_vectors,
    check_int,
    in_chunks,
)
from vq._tree_cache import drop
from vq.distances import unit_rows
from vq.index.core.faiss_build import import_faiss, keep_alive
from vq.index.core.fileformat import save_target, write_index_file
from vq.index.core.locking import ReadWriteLock
from vq.index.core.mapped import read_chunks
from vq.index.core.memory import held_bytes
from vq.index.core.search_paths import SearchPaths
from vq.index.core.searching import (
    MAX_K,
    drop_derived,
)
from vq.index.core.searching import (
    derived as derived_value,
)
from vq.index.core.storage import IdRange, check_new_ids
from vq.index.core.updates import Updates

METRICS = ("l2", "ip", "cosine")


def ids_problem(ids: torch.Tensor) -> str | None:
    """``consistency_problem``'s words for stored ids that are not int64 [n], or not all in
    [0, 2**63) (-1 is a search's "no result"; ``add_with_ids`` takes no other): a pass over
    them, read with ``pread`` where they are mapped from an index file (nothing mapped in)."""
    if ids.dim() != 1 or ids.dtype != torch.int64:
        return f"ids of dtype {ids.dtype} and shape {tuple(ids.shape)}, expected int64 [n]"
    low = min((int(c.min()) for c in read_chunks(ids) if c.shape[0]), default=0)
    return f"ids below 0 (the smallest is {low})" if low < 0 else None


class Index(Updates, SearchPaths, nn.Module):
    """Base class of every index kind, and the contract a kind implements (public names; the
    base calls them, and so do wrappers and the other packages; docs/architecture.md):

    - ``row_buffers`` (class attribute): its buffers with one row per stored vector;
      ``encode_batch(x)``: what to store for checked float32 vectors; ``ntotal``;
      ``growing_buffers()`` and ``consistency_problem()`` extended for its buffers;
    - ``search_params`` (class attribute): the options ``search`` takes; ``search_rows(q, k,
      **options)``: the numba engine (values and rows); ``searcher(k, copy=...)``: its static
      torch search, if it has one; ``build_lean_search()``: its lean path, if it has one;
      ``search_work`` / ``vector_ns``: its cost model (:mod:`vq.index.core.search_paths`);
    - if it learns anything, ``learn(x)`` and ``is_trained``; ``decode_rows(rows)``
      (``reconstruct``); ``faiss_counterpart()`` and the classmethod ``from_faiss(f,
      metric)``; ``range_hits`` (``range_search``);
    - and registers itself (:func:`vq.index.core.registry.register`).

    The stored rows' writes (``add_rows``, ``remove_stored``, ``merge_rows``, ``reset_rows``,
    ``renumber``) are :class:`vq.index.core.updates.Updates`'s, the searches (the engine
    switch ``search_ids``, ``torch_search``, ``candidate_ids``, ``lean_search``)
    :class:`vq.index.core.search_paths.SearchPaths`'s; kinds with more than rows (IVF lists, a
    graph) extend them.

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
        its searches keep derived from them (norms, an id order…; built by the first search
        that needs them), each region counted once,
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
            self.kernels_ahead()
            self.learn(in_chunks(unit_rows, t, 1 << 16) if self.normalize else t)
        return self

    def kernels_ahead(self) -> None:
        """Start compiling, in the background (``vq.kernels.jit.cache.prefetch``), the
        kernels that ``learn``'s later steps and the first ``add`` run, while ``learn``'s first
        steps compile theirs here: on a machine that has compiled nothing yet, the two compile
        on two cores. Called by ``train``; nothing by default, nor where the kernels are
        compiled already."""

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

    def derived(self, name: str, sources: tuple[torch.Tensor, ...], compute):
        """``compute()``, kept until a ``sources`` tensor changes (see ``searching.derived``)."""
        return derived_value(self, name, sources, compute)

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
