"""The plumbing of the general search path that every index kind shares: the check of the
per-call options a kind declares (``Index.search_params``), arrays derived for searching (kept
until their sources change), queries as contiguous float32 rows, and results by stored row
turned into results by id.

Results by id have one implementation per engine: on CPU the numba kernel
``vq.kernels.rows_to_ids``, elsewhere :func:`vq.index.core.searchers.to_results`, the torch function
the static search graphs end with (and which the kernel is tested against).
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np
import torch

from vq import _cpu, kernels
from vq._checks import check_positive
from vq.distances import unit_rows
from vq.index.core.filters import IdFilter
from vq.index.core.searchers import to_results
from vq.kernels.common.constants import metric as kernel_metric

#: the most neighbours a search returns per query (results are int64 and float32 [nq, k])
MAX_K = (1 << 31) - 1


def check_k(k) -> int:
    """A search's ``k`` as an int: a positive integer up to :data:`MAX_K` (ValueError)."""
    k = check_positive(k, "k")
    if k > MAX_K:
        raise ValueError(
            f"k must be at most {MAX_K} (2**31 - 1), got {k}; a search returns [nq, k] arrays "
            "(k beyond ntotal is padded with id -1)"
        )
    return k


def one_query_as_rows(queries: Any) -> Any:
    """One query vector ``[dim]`` (numpy or torch) as a batch of one, ``[1, dim]`` (a view):
    ``search`` and ``range_search`` then answer ``[1, k]``; anything else as it is (what is
    not a 2-D array gets the input checks' error)."""
    if isinstance(queries, np.ndarray | torch.Tensor) and queries.ndim == 1:
        return queries[None]
    if isinstance(queries, np.ndarray | torch.Tensor) and queries.ndim != 2:
        raise ValueError(
            f"queries: expected a 2-D array [n, dim] or one query [dim], got shape "
            f"{tuple(queries.shape)}"
        )
    return queries


#: ``rows_to_ids``'s id table where the ids are the rows themselves
NO_IDS = np.zeros(0, dtype=np.int64)


def check_options(index, params: dict) -> None:
    """TypeError, as Python words it for an unknown keyword, for a ``params`` name that is not
    one of ``index.search_options()`` (listing those)."""
    unknown = sorted(set(params) - set(index.search_options()))
    if unknown:
        takes = ", ".join(index.search_options()) or "none"
        raise TypeError(
            f"{type(index).__name__}.search() got an unexpected keyword argument "
            f"{unknown[0]!r}; its search options: {takes}"
        )


def filtered_params(index, params: dict, allowed, return_probed: bool, nq: int) -> dict:
    """The keywords of ``index.search_ids`` for a ``search`` call: its options, the filter as
    an :class:`IdFilter` (``allowed``) and, with ``return_probed``, the int64 [nq] tensor that
    IVF scans write how many lists each query probed into (``probed``)."""
    out = dict(params)
    if allowed is not None:
        out["allowed"] = IdFilter.of(allowed)
    if return_probed is not False:
        if return_probed is not True:
            raise TypeError(f"return_probed must be True or False, got {return_probed!r}")
        if not index.probes_lists():
            raise TypeError(
                f"{type(index).__name__}.search(): return_probed=True is for IVF indexes "
                "(only their searches probe lists)"
            )
        out["probed"] = torch.zeros(nq, dtype=torch.int64)
    return out


def search_steps(index, q: torch.Tensor, k: int, params: dict):
    """``index.search_ids`` over checked queries [nq, dim], ``index.search_batch_size`` at a
    time (bounded memory: per-chunk tables and buffers, results written in place)."""
    nq, step, device = q.shape[0], index.search_batch_size, index.device
    if nq <= step:
        return index.search_ids(query_rows(q, device, index.normalize), k, **params)
    dist = torch.empty(nq, k, device=device)
    ids = torch.empty(nq, k, dtype=torch.int64, device=device)
    probed = params.get("probed")
    for s in range(0, nq, step):
        part = params if probed is None else {**params, "probed": probed[s : s + step]}
        chunk = query_rows(q[s : s + step], device, index.normalize)
        dist[s : s + step], ids[s : s + step] = index.search_ids(chunk, k, **part)
    return dist, ids


def _source_key(sources: tuple[torch.Tensor, ...]) -> tuple:
    return tuple((t.data_ptr(), t._version, t.shape, t.device) for t in sources)


def derived(module, name: str, sources: tuple[torch.Tensor, ...], compute):
    """``compute()``, kept in ``module`` under ``name`` until one of the ``sources`` tensors is
    replaced, modified in place or moved (arrays derived from codebooks or stored data that
    every search reads; an index drops them when it is written to, see :func:`drop_derived`)."""
    key = _source_key(sources)
    entry = module.__dict__.get("_derived_cache", {}).get(name)
    if entry is None or entry[0] != key:
        entry = (key, compute(), tuple(weakref.ref(t) for t in sources))
        module.__dict__.setdefault("_derived_cache", {})[name] = entry
    return entry[1]


def drop_derived(root, *, stale_only: bool = False) -> None:
    """Forget the :func:`derived` arrays of every module in the tree of ``root`` (and the
    storage they hold); with ``stale_only``, only those with a source that is no longer one of
    the tree's buffers or parameters as it was (replaced, resized, modified in place), so that
    a write of stored rows (``add``, ``remove_ids``) keeps the arrays derived from the
    codebooks, which it does not touch."""
    tensors = [t for m in root.modules() for t in (*m.buffers(False), *m.parameters(False))]
    own = {id(t) for t in tensors if t is not None}
    for m in root.modules():
        cache = m.__dict__.get("_derived_cache")
        if not cache:
            continue
        if not stale_only:
            del m.__dict__["_derived_cache"]
            continue
        for name, (key, _, refs) in list(cache.items()):
            sources = tuple(ref() for ref in refs)
            if any(t is None or id(t) not in own for t in sources) or _source_key(sources) != key:
                del cache[name]


def drop_derived_named(root, name: str) -> None:
    """Forget the :func:`derived` array ``name`` of every module in the tree of ``root`` (and
    the storage it holds); a search that still uses it keeps its own reference."""
    for m in root.modules():
        cache = m.__dict__.get("_derived_cache")
        if cache:
            cache.pop(name, None)


def query_rows(q: torch.Tensor, device: torch.device, normalize: bool = False) -> torch.Tensor:
    """Checked queries as contiguous float32 on ``device`` (the same results whatever the
    input's dtype or memory layout: BLAS rounds differently for transposed operands), scaled
    to unit norm with ``normalize`` (:func:`unit_rows`)."""
    rows = q.float().to(device)
    return unit_rows(rows).contiguous() if normalize else rows.contiguous()


def results_by_id(val, rows, k: int, metric: str, stored: torch.Tensor | None):
    """Results by stored row → distances float32 [nq, k] and ids int64 [nq, k], as ``search``
    returns them.

    Args:
        val: float32 [nq, kk], smaller is nearer (squared L2, or negated inner products),
            +inf where missing; rows: int64 [nq, kk], -1 there; kk <= k.
        metric: "l2" or "ip"; stored: int64 [ntotal], the id of each row, or None where the
            ids are the rows.
    """
    if not (_cpu.fast_path(rows) and val.dtype == torch.float32 and rows.dtype == torch.int64):
        return to_results(val.float(), rows.long(), k, metric, stored)
    ip = kernel_metric(metric == "ip")
    nq = rows.shape[0]
    out_dist, out_ids = _cpu.empty((nq, k)), _cpu.empty((nq, k), torch.int64)
    kernels.rows_to_ids(
        val.contiguous().numpy(),
        rows.contiguous().numpy(),
        NO_IDS if stored is None else stored.contiguous().numpy(),
        ip,
        np.float32(float("-inf") if ip else float("inf")),
        out_dist.numpy(),
        out_ids.numpy(),
    )
    return out_dist, out_ids


def shape_problem(name: str, t: torch.Tensor, expected: tuple[int, ...]) -> str | None:
    """``consistency_problem``'s words for a buffer ``t`` whose shape is not ``expected``."""
    if tuple(t.shape) != expected:
        return f"{name} of shape {tuple(t.shape)}, expected {expected}"
    return None
