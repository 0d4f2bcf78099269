"""The parts of :class:`vq.HNSW` that are about its graph arrays rather than the index: the
checks a loaded graph must pass, faiss's flat neighbour layout, the visit stamps searches
reuse, and the row selection of a filtered search.
"""

from __future__ import annotations

import threading

import numpy as np
import torch

from vq.index.core.faiss_build import faiss_metric, import_faiss, with_id_map
from vq.index.core.searching import shape_problem
from vq.kernels.common.bundles import TopK
from vq.kernels.graph import graph_search as graph
from vq.kernels.graph import graph_store

MAX_LEVEL = 32
#: an insertion walks int8 codes when it adds at least 1 / CODES_RATIO of the stored vectors
#: (the codes of every vector are made for it: dim operations per vector, against thousands
#: of distances per inserted one)
CODES_RATIO = 64
#: a filtered search scans the allowed rows exactly when there are at most this many per
#: beam slot and link (the distances a graph search computes are about beam * 2M)
SCAN_FACTOR = 2


class SeenPool:
    """Visit stamps (:func:`vq.kernels.graph.graph_search.new_seen`) reused from search to search;
    each search takes its own, so that searches may run from many threads at once."""

    def __init__(self):
        self.lock = threading.Lock()
        self.free: list[np.ndarray] = []

    def take(self, slots: int, n: int) -> np.ndarray:
        shape = (slots, n + 1)
        with self.lock:
            free = self.free
            for j in range(len(free) - 1, -1, -1):  # the last given back first
                if free[j].shape == shape:
                    return free.pop(j)
        return graph.new_seen(slots, n)

    def give_back(self, seen: np.ndarray) -> None:
        """Keep ``seen`` for a later search: at most 8 stamps, all for a graph of the same
        size (those of an older size are dropped; the list never holds two sizes)."""
        with self.lock:
            free = self.free
            if free and free[-1].shape[1] != seen.shape[1]:
                free.clear()
            free.append(seen)
            if len(free) > 8:
                del free[0]

    def __reduce__(self):  # copies get an empty pool
        return (type(self), ())


def insertion_codes(data: np.ndarray, n0: int, stored: tuple = ()) -> tuple | None:
    """The int8 codes the insertion searches of rows ``n0:`` of ``data`` (float32 [n, d])
    walk (:func:`vq.kernels.graph.graph_build.hnsw_insert`): (int8 [n, d], float32 [n, 2]) for
    every row, the ``stored`` codes of rows ``:n0`` reused where given; None for a batch
    under 1 / :data:`CODES_RATIO` of the index (coding every vector would cost more than it
    saves: those insertions read the vectors)."""
    if (data.shape[0] - n0) * CODES_RATIO < n0:
        return None
    if not stored:
        return graph_store.int8_codes(data)
    codes, factors = graph_store.int8_codes(data[n0:])
    return np.concatenate([stored[0], codes]), np.concatenate([stored[1], factors])


def filtered_search(search, scan, mask: np.ndarray, nq: int, k: int, cap: int, degree: int):
    """Rows and distances of a filtered HNSW search, k of them wherever k rows are allowed.

    Args:
        search: ``search(mask)`` → (dist float32 [nq, k], rows int64 [nq, k]): the graph
            search under the filter ``mask`` (uint8 [ntotal]).
        scan: ``scan(rows, which)`` → (dist, rows) [len(which), k]: an exact scan of the
            stored ``rows`` (int64 [m]) for the queries ``which`` (int64).
        cap: the search's beam, max(efSearch, k); degree: the level-0 links per node (2M).

    With few rows allowed (at most :data:`SCAN_FACTOR` * cap * degree, about what a graph
    search computes) every query scans them; otherwise the graph search runs, and the
    queries it left short of min(k, allowed) results scan them (a filter the beam meets too
    rarely).
    """
    allowed_rows = np.flatnonzero(mask)
    everyone = np.arange(nq)
    if allowed_rows.shape[0] <= SCAN_FACTOR * cap * degree:
        return scan(allowed_rows, everyone)
    dist, rows = search(mask)
    want = min(k, allowed_rows.shape[0])
    short = np.flatnonzero(rows[:, want - 1] < 0)
    if short.shape[0]:
        dist[short], rows[short] = scan(allowed_rows, short)
    return dist, rows


def faiss_neighbors(nbr0: np.ndarray, levels: np.ndarray, up_nbr: np.ndarray) -> np.ndarray:
    """faiss's flat neighbour array (per node: 2M level-0 slots, then M per upper level)."""
    n, M = nbr0.shape[0], up_nbr.shape[1]
    sizes = 2 * M + levels * M
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    flat = np.full(int(offsets[-1]), -1, np.int32)
    flat[offsets[:-1, None] + np.arange(2 * M)] = nbr0
    owner = np.repeat(np.arange(n), levels)
    within = np.arange(owner.shape[0]) - np.repeat(np.cumsum(levels) - levels, levels)
    flat[(offsets[owner] + 2 * M + within * M)[:, None] + np.arange(M)] = up_nbr
    return flat


def graph_from_faiss(faiss, f) -> tuple:
    """The graph of faiss's HNSW index ``f`` as :mod:`vq.kernels.graph.graph_search` arrays: ``(M,
    nbr0, levels, up_off, up_nbr, entry)``; a ValueError for a graph that does not convert."""
    h = f.hnsw
    M = int(h.nb_neighbors(1))
    cum = faiss.vector_to_array(h.cum_nneighbor_per_level).astype(np.int64)
    if len(cum) < 2 or cum[1] != 2 * M or np.any(np.diff(cum[1:]) != M):
        raise ValueError("only faiss HNSW graphs with 2M level-0 and M upper links convert")
    n = f.ntotal
    levels = faiss.vector_to_array(h.levels).astype(np.int64) - 1
    offsets = faiss.vector_to_array(h.offsets).astype(np.int64)
    flat = faiss.vector_to_array(h.neighbors).astype(np.int32)
    if levels.shape != (n,) or offsets.shape != (n + 1,) or (n and levels.min() < 0):
        raise ValueError("the faiss HNSW graph does not match its ntotal")
    nbr0 = flat[offsets[:-1, None] + np.arange(2 * M)] if n else np.zeros((0, 2 * M), np.int32)
    up_off = np.concatenate([[0], np.cumsum(levels)]).astype(np.int64)
    owner = np.repeat(np.arange(n), levels)
    within = np.arange(int(up_off[-1])) - up_off[owner]
    starts = offsets[owner] + 2 * M + within * M
    up_nbr = flat[starts[:, None] + np.arange(M)].reshape(-1, M)
    return M, nbr0, levels, up_off, up_nbr, int(h.entry_point) if n else -1


def graph_to_faiss(faiss, h, levels, nbr0, up_nbr, entry: int, max_level: int) -> None:
    """Write the graph into faiss's ``HNSW`` struct ``h`` (made for the same M)."""
    levels = levels.astype(np.int64)
    cum = faiss.vector_to_array(h.cum_nneighbor_per_level).astype(np.int64)
    if levels.shape[0] and levels.max() + 1 >= len(cum):
        raise ValueError(f"faiss's HNSW{up_nbr.shape[1]} has no level {levels.max()}")
    flat = faiss_neighbors(nbr0, levels, up_nbr)
    offsets = np.concatenate([[0], np.cumsum(cum[levels + 1])]).astype(np.uint64)
    faiss.copy_array_to_vector((levels + 1).astype(np.int32), h.levels)
    faiss.copy_array_to_vector(offsets, h.offsets)
    faiss.copy_array_to_vector(flat, h.neighbors)
    h.entry_point, h.max_level = entry, max_level


def graph_problem(nbr0, levels, up_off, up_nbr, entry: int, M: int) -> str | None:
    """What makes these graph arrays unsafe to search (a neighbour out of range, an upper
    link to a node without that level, offsets that do not follow the levels, a bad entry
    point), in words, or None."""
    n = nbr0.shape[0]
    if n and (int(levels.min()) < 0 or int(levels.max()) > MAX_LEVEL):
        return f"node levels outside [0, {MAX_LEVEL}]"
    if int(up_off[0]) != 0 or not torch.equal(up_off.diff(), levels.long()):
        return "upper-level offsets that do not follow the node levels"
    problem = shape_problem("upper_neighbors", up_nbr, (int(up_off[-1]), M))
    if problem:
        return problem
    for name, t in (("neighbors", nbr0), ("upper_neighbors", up_nbr)):
        if t.numel() and (int(t.min()) < -1 or int(t.max()) >= n):
            return f"{name} ids outside [-1, {n})"
    if up_nbr.numel():
        row_level = torch.arange(up_nbr.shape[0]) - torch.repeat_interleave(
            up_off[:-1], levels.long()
        )
        row_level = row_level + 1
        target = levels.long()[up_nbr.long().clamp_min(0)]
        if bool(((up_nbr >= 0) & (target < row_level[:, None])).any()):
            return "upper-level links to nodes without that level"
    if n == 0:
        return None if entry == -1 else f"entry point {entry} in an empty graph"
    if not 0 <= entry < n or int(levels[entry]) != int(levels.max()):
        return f"entry point {entry} that is not a node of the top level"
    return None


def filtered_rows(index, q: np.ndarray, k: int, ef: int, slots: int, allowed) -> tuple:
    """The k nearest rows of an HNSW ``index`` (its ``_rows_numba`` walk) under the
    :class:`vq.index.IdFilter` ``allowed``: see :func:`filtered_search`."""
    data, _, _, _, *codes = index._arrays()

    def scan(rows, which):
        out_dist = np.empty((which.shape[0], k), np.float32)
        out_rows = np.empty((which.shape[0], k), np.int64)
        walk, out = graph.traversal(data, tuple(codes) or None), TopK(out_dist, out_rows)
        graph.rows_scan(np.ascontiguousarray(q[which]), walk, index.metric == "ip", rows, out)
        return out_dist, out_rows

    def search(mask):
        return index._rows_numba(q, k, ef, slots, mask)

    mask = allowed.row_mask(index)
    cap = max(ef, k)
    return filtered_search(search, scan, mask, q.shape[0], k, cap, 2 * index.M)


def hnsw_to_faiss(index, faiss, h) -> None:
    """The graph of an HNSW ``index`` (entry point, levels, links, efConstruction, efSearch)
    into the ``faiss.HNSW`` ``h``."""
    h.efConstruction, h.efSearch = index.efConstruction, index.efSearch
    levels = index.levels.cpu().numpy()
    nbr0, up_nbr = index.neighbors.cpu().numpy(), index.upper_neighbors.cpu().numpy()
    graph_to_faiss(faiss, h, levels, nbr0, up_nbr, int(index.entry_point[0]), index.max_level)


def hnsw_flat_to_faiss(index):
    """faiss ``IndexHNSWFlat`` holding ``index``'s graph, vectors, entry point and efSearch
    (in an ``IndexIDMap`` unless its ids are 0 … ntotal - 1)."""
    faiss = import_faiss()
    out = faiss.IndexHNSWFlat(index.dim, index.M, faiss_metric(index.metric))
    hnsw_to_faiss(index, faiss, out.hnsw)
    out.storage.add(index.vectors.float().cpu().numpy())
    out.ntotal = index.ntotal
    return with_id_map(out, index.stored_ids())
