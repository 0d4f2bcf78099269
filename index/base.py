"""What every index shares: ids, input checks, result padding, numpy/torch in and out.

Indexes are ``torch.nn.Module``s: quantizers are submodules, stored data (codes, vectors, ids)
are buffers that grow with ``add``, so ``state_dict()``/``load_state_dict`` and ``.to(device)``
work as for any module.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from vq._checks import as_tensor, as_vectors, like_input

METRICS = ("l2", "ip")


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
        if dim <= 0:
            raise ValueError(f"dim must be positive, got {dim}")
        if metric not in METRICS:
            raise ValueError(f"metric must be 'l2' or 'ip', got {metric!r}")
        if k <= 0:
            raise ValueError(f"k must be positive, got {k}")
        self.dim, self.metric, self.k = int(dim), metric, int(k)
        self.verbose = verbose
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
        """Write the index to ``path`` (safetensors + JSON metadata; see :func:`vq.load_index`)."""
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
        with torch.no_grad():
            self._train(t.to(self.device))
        return self

    def add(self, x: Any) -> None:
        """Add vectors [n, dim] with ids ``ntotal, ntotal + 1, …`` (faiss's sequential ids)."""
        t = as_vectors(x, self.dim, "x")
        ids = torch.arange(self.ntotal, self.ntotal + t.shape[0], device=self.device)
        self._add(t, ids)

    def add_with_ids(self, x: Any, ids: Any) -> None:
        """Add vectors [n, dim] with caller-chosen int64 ids [n]."""
        t = as_vectors(x, self.dim, "x")
        i = as_tensor(ids, "ids")
        if i.is_floating_point() or i.is_complex() or i.dtype == torch.bool:
            raise TypeError(f"ids: expected integers, got {str(i.dtype).replace('torch.', '')}")
        if i.shape != (t.shape[0],):
            raise ValueError(
                f"ids: expected shape ({t.shape[0]},) to match x, got {tuple(i.shape)}"
            )
        self._add(t, i.to(self.device, torch.int64))

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
        """Remove every stored vector whose id is in ``ids``; returns how many were removed."""
        i = as_tensor(np.asarray(ids) if isinstance(ids, list | tuple) else ids, "ids")
        if i.is_floating_point() or i.dtype == torch.bool:
            raise TypeError(f"ids: expected integers, got {str(i.dtype).replace('torch.', '')}")
        return self._remove(i.reshape(-1).to(self.device, torch.int64))

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
            queries: float [nq, dim], numpy or torch (any device).
            k: neighbours per query (default ``self.k``).
            params: per-call search options of the index type (``nprobe`` for IVF indexes,
                ``k_factor`` for re-ranking), overriding its attributes for this call.

        Returns:
            ``(D, I)``: float32 [nq, k] distances (squared L2 ascending, or inner products
            descending) and int64 [nq, k] ids; missing results are id -1 with distance +inf
            (-inf for "ip"). numpy for numpy queries, tensors on the queries' device otherwise.
        """
        k = self.k if k is None else k
        if not isinstance(k, int | np.integer) or k <= 0:
            raise ValueError(f"k must be a positive integer, got {k!r}")
        self._require_trained("search")
        q = as_vectors(queries, self.dim, "queries").to(self.device)
        with torch.no_grad():
            dist, ids = self._search_ids(q, int(k), **params)
        return like_input(dist, queries), like_input(ids, queries)

    def forward(self, queries: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``search(queries, self.k)`` for torch queries."""
        return self.search(queries, self.k)

    # -- helpers --------------------------------------------------------------------------
    def _search_ids(self, q: torch.Tensor, k: int, **params) -> tuple[torch.Tensor, torch.Tensor]:
        """float32 distances and int64 ids [nq, k] of checked float32 queries on the device."""
        if self.ntotal == 0:
            dist = torch.empty(q.shape[0], 0, device=self.device)
            rows = torch.empty(q.shape[0], 0, dtype=torch.int64, device=self.device)
        else:
            dist, rows = self._search_rows(q, min(k, self.ntotal), **params)
        return self._finish(dist, rows, k)

    def _renumber(self, mapping: torch.Tensor) -> None:
        """Replace every stored id i by ``mapping[i]`` (used by re-ranking wrappers)."""
        self.ids = mapping[self.stored_ids()]

    def _finish(self, dist: torch.Tensor, rows: torch.Tensor, k: int):
        missing = rows < 0
        stored = self.ids if self.ids.shape[0] == self.ntotal else None
        ids = torch.where(missing, -1, rows if stored is None else stored[rows.clamp_min(0)])
        fill = float("inf") if self.metric == "l2" else float("-inf")
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
