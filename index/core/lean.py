"""The lean path of small searches: at most :data:`SMALL_BATCH` float32 queries on CPU go from
numpy (or a CPU tensor outside autograd and graph capture) straight to ids, through numba
kernels on the calling thread over numpy views of the index's buffers: no torch operation, no
thread-pool wake-up where the work is small (a service answering one query at a time).

Each index kind builds its lean search in ``_lean_search`` (a closure over those views, see
``Index.lean_search``); the index keeps it until anything in its module tree changes, or the index
is written to. :func:`search_small` is what ``Index.search`` tries first: it answers None
wherever the lean path does not apply (the general path then serves the call, and raises any
error), so the two paths give the same results and the same errors.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import torch

from vq import _cpu
from vq._checks import MAX_NORM, check_positive, is_eager
from vq._cpu import numpy_path
from vq.index.core.mapped import read_lists
from vq.index.core.searching import MAX_K, NO_IDS, unit_rows_np
from vq.kernels.common.constants import metric as kernel_metric
from vq.kernels.common.select import unique_rows, unique_rows_range
from vq.kernels.common.threads import parallel_for
from vq.kernels.exact.lean_scans import BOUND_RATIO, BOUND_SPARE, probe_lists

#: searches of at most this many queries may take the lean path
SMALL_BATCH = 16
#: an IVF search of more queries may take it too, its queries split between the threads, where
#: its coarse step is small (at most SPLIT_COARSE products of centroid and query components:
#: the lean kernels scan the centroids, with no matrix product; fewer where a bound rules most
#: centroids out, see vq.kernels.exact.lean_scans.probe_bounded) and so is its whole estimated
#: work (SPLIT_WORK ns): there the general path's fixed costs (a multi-threaded BLAS product
#: of a few hundred queries, torch tensors, two pool wake-ups) are most of the time
SPLIT_BATCH = 4096
SPLIT_COARSE = 1 << 16
SPLIT_WORK = 20_000_000
_FLOAT32 = np.dtype(np.float32)
_MAX_NORM_SQ = MAX_NORM * MAX_NORM
_NO_NORMS = np.zeros(0, np.float32)
_NO_BOUND = (np.zeros((0, 0), np.float32), np.zeros((0, 0), np.float32), _NO_NORMS,
             np.zeros((0, 0), np.float32))  # fmt: skip


def search_small(index, queries: Any, k: Any, params: dict):
    """``index.search(queries, k, **params)`` by the index's lean search, or None where it
    does not apply: not float32 numpy or CPU-tensor queries of the index's dim, more than
    :data:`SMALL_BATCH` of them (:data:`SPLIT_BATCH` for an IVF index whose lean search
    splits batches), k not a positive int, the kernels disabled
    (``vq._cpu.torch_only``), an option the lean search does not take, or a call the lean
    search declines (work too large for one thread, a query that is not finite, or
    queries whose squared norms sum past ``MAX_NORM²``: :data:`vq._checks.MAX_NORM`).

    Returns:
        ``(D, I)`` as ``search`` returns them (numpy for numpy queries, CPU tensors for
        tensors), or None.
    """
    if type(queries) is np.ndarray:
        if queries.dtype is not _FLOAT32:
            return None
        q, tensor = queries, False
    elif isinstance(queries, torch.Tensor):
        if (
            queries.dtype != torch.float32
            or queries.layout != torch.strided
            or queries.device.type != "cpu"
            or queries.requires_grad
            or not is_eager()
        ):
            return None
        q, tensor = queries.numpy(), True
    else:
        return None
    shape = q.shape
    if len(shape) != 2 or not 0 < shape[0] <= SPLIT_BATCH or shape[1] != index.dim:
        return None
    if k is None:
        k = index.k
    elif type(k) is not int:
        if isinstance(k, bool) or not isinstance(k, np.integer):
            return None
        k = int(k)
    if k <= 0 or k > MAX_K or not numpy_path():
        return None
    if not q.flags.c_contiguous:
        q = np.ascontiguousarray(q)
    # one BLAS dot of all the values (it raises no floating-point warning, so no np.errstate,
    # which costs twice the dot): about 1 µs for a few queries
    if not np.vdot(q, q) <= _MAX_NORM_SQ:
        return None  # a NaN, an infinity or a norm past MAX_NORM: the general path says
    if index.normalize:  # (metric "cosine", "L2norm,": as the general path's query_rows)
        q = unit_rows_np(q)
    lock = index.lock
    token = None if lock.try_read() else lock.acquire_read()
    try:
        search = index.lean_search()
        if search is None or (params and not params.keys() <= search.options):
            found = None  # (an unknown option: the general path says which)
        elif shape[0] > SMALL_BATCH and not getattr(search, "splits", False):
            found = None
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


def ivf_lean_search(index, refine: tuple | None) -> Callable:
    """The lean search of an IVF index (``index._lean_kernel``: the coarse step, the scan of
    the probed lists and ids in one kernel call on the calling thread), and with ``refine`` =
    (vectors, ids, k_factor) that of a re-ranking wrapper around it, in the same call (see
    ``Index.build_refined_lean_search``). The closure returns None for a call whose estimated
    work is not small (the general, parallel path)."""
    mapped = refine is None and index.rows_mapped()
    kernel, args = (None, ()) if mapped else index._lean_kernel(index)
    ip = kernel_metric(index.metric == "ip")  # (a static: each metric compiles its own kernel)
    norms = _NO_NORMS if ip else index._centroid_norms()
    c = index.quantizer.codebook
    centroids_t = index.derived("centroids_t", (c,), lambda: c.float().T.contiguous().numpy())
    bound = _NO_BOUND if ip else index._coarse_bound()  # (L2: see probe_bounded)
    coarse = (centroids_t, norms, *bound)
    # spilled lists: the best k distinct ids among the best 2 k rows (made unique below),
    # unless the kind's scan keeps each id once itself
    distinct = not mapped and index.scans_distinct_ids()
    repeats = index.copies > 1 and not distinct
    ids = index.ids.numpy() if index.ids.shape[0] == index.ntotal or distinct else NO_IDS
    if repeats:
        if refine is not None:
            raise ValueError("the lean search of spilled lists takes no re-ranking")
        ids = NO_IDS  # (the kernel's ids: rows, made unique below)
        row_ids = None if mapped else index.ids.numpy()
    if mapped:  # the lists the kernel may probe read from the file first (see ivf.py)
        c_sq = norms if not ip else (centroids_t * centroids_t).sum(0)
        rows = {name: index._buffers[name] for name in index.row_buffers}
        offsets = index.offsets.numpy()
    ref_x, ref_ids, k_factor = refine or (None, None, None)  # (None: compiled without it)
    nlist = index.nlist
    # _search_work's estimate: fixed + nprobe * per_probe per query
    per_probe = index.ntotal / nlist * index.vector_ns()
    fixed = index.search_work(1, 1, nprobe=1) - per_probe
    serial_work = _cpu.SERIAL_WORK
    d, r = index.dim, bound[0].shape[1]

    def coarse_products(nprobe: int) -> int:  # per query, as probe_few computes them
        if r and nlist >= BOUND_RATIO * (nprobe + BOUND_SPARE):
            return d * r + nlist * r + (nprobe + BOUND_SPARE) * d
        return nlist * d

    split = coarse_products(1) <= SPLIT_COARSE

    def search(q: np.ndarray, k: int, ranked: bool, params: dict):
        nprobe = params.get("nprobe")
        nprobe = min(index.nprobe if nprobe is None else check_positive(nprobe, "nprobe"), nlist)
        max_codes = params.get("max_codes")  # (a filter's cap: checked, then unused here)
        if max_codes is not None and (type(max_codes) is not int or max_codes < 1):
            return None  # the general path says what is wrong
        nq = q.shape[0]
        kc = k
        if k_factor is not None:  # candidates for the re-ranking
            factor = params.get("k_factor")
            factor = k_factor() if factor is None else factor
            if type(factor) is not int or factor < 1:
                return None  # the general path says what is wrong
            kc = k * factor
        work = nq * (fixed + nprobe * per_probe)
        if nq > SMALL_BATCH and (coarse_products(nprobe) > SPLIT_COARSE or work >= SPLIT_WORK):
            return None
        if nq <= SMALL_BATCH and work >= serial_work:
            return None
        split_up = nq > SMALL_BATCH and work >= serial_work  # else on the calling thread
        # spilled lists: the best copies * k rows (k_candidates), made unique below
        width = min(k * index.copies, index.n_rows) if repeats else k
        out_dist = np.empty((nq, width), np.float32)
        found = np.empty((nq, width), np.int64)  # ids, or rows where mapped or spilled
        ranked = ranked or repeats
        if not mapped:
            run = partial(split_queries, kernel) if split_up else kernel
            if not run(q, coarse, nprobe, *args, ids, ip, ref_x, ref_ids,
                       width if repeats else kc, out_dist, found, ranked):  # fmt: skip
                return None  # (not finite: the general path says)
            if not repeats:
                return out_dist, found
            at, stored = found, row_ids
        else:
            lists = near_lists(q, centroids_t, c_sq, ip, nprobe)
            local = read_lists(rows, offsets, np.arange(nlist) if lists is None else lists)
            local_kernel, rest = index._lean_kernel(local)
            run = partial(split_queries, local_kernel) if split_up else local_kernel
            if not run(q, coarse, nprobe, *rest, NO_IDS, ip, ref_x, ref_ids,
                       width if repeats else kc, out_dist, found, ranked):  # fmt: skip
                return None
            at, stored = index._ids_of(local.stored_rows(found))
        if repeats:  # each id's first row, as the general path keeps them (unique_rows)
            first_dist, first = np.empty((nq, k), np.float32), np.empty((nq, k), np.int64)
            if split_up:
                unique_rows(out_dist, at, stored, first_dist, first)
            else:
                unique_rows_range(0, nq, out_dist, at, stored, first_dist, first)
            out_dist, at = first_dist, first
        return out_dist, np.where(at >= 0, stored[np.maximum(at, 0)], -1)

    search.splits = split
    return search


def split_queries(kernel, q: np.ndarray, *rest):
    """``kernel(q, *rest)`` (a lean IVF kernel: the queries first, ``out_dist``, ``out_ids``
    and ``ranked`` last) with the queries cut into one slice per thread
    (:func:`vq.kernels.common.threads.parallel_for`); whether every slice was done (False: a slice
    held a query that is not finite)."""
    *rest, out_dist, out_ids, ranked = rest
    refused = []

    def body(q0: int, q1: int) -> None:
        if not kernel(q[q0:q1], *rest, out_dist[q0:q1], out_ids[q0:q1], ranked):
            refused.append(q0)

    parallel_for(body, q.shape[0], grain=SMALL_BATCH)
    return not refused


def near_lists(q, centroids_t, c_sq, inner_product: bool, nprobe: int) -> np.ndarray | None:
    """Every list a lean search of ``q`` (float32 [nq, d]) may probe (the lean kernels run
    :func:`vq.kernels.exact.lean_scans.probe_lists` over ``centroids_t`` [d, nlist] themselves): the
    lists whose score, as computed here (the same kernel, on the calling thread), is within a
    rounding bound of the ``nprobe``-th smallest (int64, any shape), or None for all of them
    (``c_sq``: float32 [nlist], the centroids' squared norms). Each score is a float32 dot
    product of d terms, within ``δ = (d + 3) · 2⁻²⁴ · (‖q‖² + ‖c‖²)`` of the exact value
    wherever it is computed, so a list the lean kernel picks lies within 4 δ of this
    ``nprobe``-th value; the band is twice that wide (None where it reaches past the
    ``2 nprobe + 8`` nearest)."""
    nlist = c_sq.shape[0]
    wide = min(nlist, 2 * nprobe + 8)
    scores = np.empty((q.shape[0], wide), dtype=np.float32)
    lists = np.empty((q.shape[0], wide), dtype=np.int64)
    probe_lists(q, centroids_t, c_sq, kernel_metric(inner_product), scores, lists)
    bound = (q.shape[1] + 8) * 2.0**-21 * ((q * q).sum(1) + c_sq.max(initial=0.0))
    with np.errstate(invalid="ignore"):  # NaN queries match nothing (the kernel refuses them)
        near = scores <= (scores[:, nprobe - 1] + bound)[:, None]
    if wide < nlist and near[:, -1].any():
        return None
    return lists[near]
