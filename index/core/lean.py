"""The lean path of small searches: at most :data:`SMALL_BATCH` float32 queries on CPU go from
numpy (or a CPU tensor outside autograd and graph capture) straight to ids, through numba
kernels on the calling thread over numpy views of the index's buffers: no torch operation, no
thread-pool wake-up where the work is small (a service answering one query at a time).

Each index kind builds its lean search in ``build_lean_search`` (a closure over those views, see
``Index.lean_search``); the index keeps it until anything in its module tree changes, or the index
is written to. :func:`search_small` is what ``Index.search`` tries first: it answers None
wherever the lean path does not apply (the general path then serves the call, and raises any
error), so the two paths give the same results and the same errors.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from vq._checks import MAX_NORM, is_eager
from vq._cpu import numpy_path
from vq.distances import unit_rows_np
from vq.index.core.searching import MAX_K

#: searches of at most this many queries may take the lean path
SMALL_BATCH = 16
#: an IVF search of more queries may take it too, its queries split between the threads (see
#: vq.index.ivf.ivf_lean: where its coarse step and its whole work are small)
SPLIT_BATCH = 4096
_FLOAT32 = np.dtype(np.float32)
_MAX_NORM_SQ = MAX_NORM * MAX_NORM


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
