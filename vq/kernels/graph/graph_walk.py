"""The steps of an HNSW traversal, shared by the search and the construction: greedy descent on
the upper levels, the beam search of a level, and their helpers.

Reference: Yu. A. Malkov, D. A. Yashunin, "Efficient and robust approximate nearest neighbor
search using Hierarchical Navigable Small World graphs", IEEE TPAMI 2018; faiss ``HNSW::search``
(``greedy_update_nearest``, ``search_from_candidates`` with its ``MinimaxHeap``).

The graph is a :class:`~vq.kernels.common.bundles.Graph`: ``nbr0`` int32 [n, 2M], each node's
level-0 neighbours (-1 after the last); ``up_off`` int64 [n + 1] and ``up_nbr`` int32 [rows, M]:
node v's neighbours at level l >= 1 are row ``up_off[v] + l - 1`` (v has ``up_off[v + 1] -
up_off[v]`` upper levels); ``entry``, a node of the top level ``max_level``. The traversal
ranks nodes by :func:`vq.kernels.graph.graph_store.node_distance` on its *store* (the vectors,
or codes of them).

The beam is faiss's: the ``cap`` = max(efSearch, k) nearest nodes seen; the nearest one not
yet expanded is expanded next, and the search stops when none is left (or, for efSearch < k,
when efSearch of them are nearer than the one to expand), so that the same graph gives faiss's
ids (ties aside). faiss finds that node by scanning the beam (its ``MinimaxHeap``), hnswlib
keeps a heap of candidates beside the beam; here the beam is one sorted array (NSG's and
DiskANN's search list, see :func:`beam`): the same nodes expanded in the same order, with
neither scan nor heap. The upper levels are descended as faiss does (:func:`greedy`).

Visited nodes of the beam are stamped with an epoch in a uint16 array per thread (``seen``
[n + 1], the epoch in its last slot), reused from query to query and cleared once every 65,534
searches.
"""

from __future__ import annotations

import numpy as np
from numba import njit
from numba.core.errors import TypingError
from numba.extending import overload

from vq.kernels.common.constants import constant_metric
from vq.kernels.common.heaps import push_pair, sift_down_pair
from vq.kernels.common.simd import prefetch_line
from vq.kernels.graph.graph_store import fresh_distances, node_distance, prefetch_node

_EPOCHS = 65535


def _ip_pair(data, a, b, inner_product):  # (each takes the metric, as pair_distance does)
    d = np.float32(0.0)
    for j in range(data.shape[1]):
        d -= data[a, j] * data[b, j]
    return d


def _l2_pair(data, a, b, inner_product):
    d = np.float32(0.0)
    for j in range(data.shape[1]):
        diff = data[a, j] - data[b, j]
        d += diff * diff
    return d


def pair_distance(data, a, b, inner_product):
    """:func:`~vq.kernels.graph.graph_store.node_distance` between rows a and b of ``data``:
    squared L2, or the negated inner product. In a kernel, a numba overload resolved by the
    metric's type (:func:`vq.kernels.common.constants.metric`): the kernel types a call site,
    not the code of both metrics. (This body runs with ``NUMBA_DISABLE_JIT=1``.)"""
    if inner_product:
        return _ip_pair(data, a, b, inner_product)
    return _l2_pair(data, a, b, inner_product)


@overload(pair_distance, jit_options={"fastmath": True})
def _pair_distance(data, a, b, inner_product):
    fixed = constant_metric(inner_product)
    if fixed is None:
        raise TypingError(
            f"pair_distance: the metric must be a compile-time constant, got {inner_product}; "
            "pass vq.kernels.common.constants.metric(inner_product)"
        )
    return _ip_pair if fixed else _l2_pair


@njit(inline="always")
def neighbour(graph, v, level, j):
    """The j-th neighbour of node v at ``level`` (-1: none)."""
    if level == 0:
        return graph.nbr0[v, j]
    return graph.up_nbr[graph.up_off[v] + level - 1, j]


@njit(inline="always")
def degree(graph, level):
    """Neighbour slots per node at ``level``: 2M on level 0, M above."""
    return graph.nbr0.shape[1] if level == 0 else graph.up_nbr.shape[1]


@njit(inline="always")
def next_epoch(seen):
    """A fresh visit stamp for ``seen`` (uint16 [n + 1], the last slot holding the epoch)."""
    n = seen.shape[0] - 1
    e = np.int64(seen[n]) + 1
    if e >= _EPOCHS:
        for i in range(n):
            seen[i] = 0
        e = 1
    seen[n] = e
    return e


@njit(inline="always", fastmath=True)
def greedy(x, store, ip, graph, level, v, dv):
    """faiss's ``greedy_update_nearest`` at an upper ``level``: move to a nearer neighbour
    until none is; returns the node and its distance. Every neighbour's distance is computed,
    as faiss does, seen before or not (stamping the visited ones costs more than the distances
    it saves)."""
    up_off, up_nbr = graph.up_off, graph.up_nbr
    while True:
        prev = v
        row = up_off[prev] + level - 1
        for j in range(up_nbr.shape[1]):
            w = up_nbr[row, j]
            if w < 0:
                break
            d = node_distance(x, store, w, ip)
            if d < dv:
                v, dv = w, d
        if v == prev:
            return v, dv


@njit(inline="always", fastmath=True)
def descend(x, store, ip, graph, stop):
    """Greedy descent from the graph's entry through levels ``max_level`` .. ``stop + 1``: the
    node reached on level ``stop`` and its distance."""
    v = graph.entry
    dv = node_distance(x, store, v, ip)
    for level in range(graph.max_level, stop, -1):
        v, dv = greedy(x, store, ip, graph, level, v, dv)
    return v, dv


@njit(inline="always", fastmath=True)
def beam(x, store, ip, graph, level, entry, d_entry, ef, allowed, space):
    """Beam search at ``level`` from ``entry``: the ``cap`` nearest nodes seen (cap =
    ``space.beam_d``'s size), ascending in ``space.beam_d``/``beam_i``; returns their number
    and, with a filter, how many allowed nodes ``space.kept_d``/``kept_i`` hold. ``ef`` is
    faiss's stopping efSearch (see the module docstring); ``space`` (a
    :class:`~vq.kernels.common.bundles.BeamSpace`) also holds a node's unvisited neighbours
    and their distances, and the visit stamps. ``allowed`` uint8 [n] (or [0]: no filter): the
    beam walks every node, and the ``cap`` nearest allowed ones seen are kept in the max-heap
    ``kept_d``/``kept_i`` (faiss's search with an ``IDSelector``). ``allowed`` may also be the
    constant ``None`` (a build's searches): numba then drops the filter's code before typing
    it (each use is a branch on ``allowed is not None``, which its dead-branch pruning
    resolves once the beam is inlined).

    The beam is a sorted array (NSG's and DiskANN's search list): the nearest node not yet
    expanded is expanded next (marked by its id's complement while the search runs), and
    the search stops when every node of the beam is expanded. That is the order of faiss's
    search (a node pushed out of the beam is farther than all in it, so faiss stops before
    it expands one), without a heap's unpredictable sift branches: a new node takes its
    place by an insertion sort's step from the far end, which is short."""
    bd, bi, scratch, dist, rd, ri, seen = space
    cap = bd.shape[0]
    epoch = next_epoch(seen)
    deg = degree(graph, level)
    filtered = False
    if allowed is not None:
        filtered = allowed.shape[0] > 0
    bd[0], bi[0] = d_entry, entry
    size, cur, rsize = 1, 0, 0
    seen[entry] = epoch
    if allowed is not None:
        if filtered and allowed[entry] != 0:
            rd[0], ri[0] = d_entry, entry
            rsize = 1
    while cur < size:
        if ef < cap and cur >= ef:  # faiss's stop for efSearch < k: ef nodes are nearer
            break
        v = bi[cur]
        bi[cur] = ~v
        first = size  # the nearest place a node entered this round
        fresh = unvisited(store, graph, level, v, deg, seen, epoch, scratch)
        gate = size == cap and not filtered  # (a filter's heap takes every distance exact)
        fresh_distances(x, store, ip, scratch, fresh, dist, gate, bd[size - 1])
        for j in range(fresh):
            w, d = scratch[j], dist[j]
            if allowed is not None:
                if filtered and allowed[w] != 0:
                    rsize = keep_nearest(rd, ri, rsize, cap, d, w)
            if size == cap and d >= bd[size - 1]:
                continue
            if size < cap:
                size += 1
            at = size - 1  # an insertion sort's step, from the far end (where most land)
            while at > 0 and bd[at - 1] > d:
                bd[at], bi[at] = bd[at - 1], bi[at - 1]
                at -= 1
            bd[at], bi[at] = d, w
            first = min(first, at)
            if level == 0:  # its neighbour list, read when it is expanded
                prefetch_line(graph.nbr0, w, 0)
        if first <= cur:
            cur = first
        else:
            cur += 1
            while cur < size and bi[cur] < 0:
                cur += 1
    for j in range(size):
        if bi[j] < 0:
            bi[j] = ~bi[j]
    return size, rsize


@njit(inline="always")
def unvisited(store, graph, level, v, deg, seen, epoch, scratch):
    """Node v's neighbours at ``level`` not stamped ``epoch`` in ``seen``, in list order:
    stamped, their number returned, themselves in ``scratch`` and their nodes in ``store``
    asked of the CPU ahead of the distances. Branch-free over the stamps (a visited neighbour
    is written and then overwritten): whether a neighbour was seen is a coin toss to the
    branch predictor."""
    fresh = 0
    for j in range(deg):
        w = neighbour(graph, v, level, j)
        if w < 0:
            break
        new = seen[w] != epoch
        seen[w] = epoch
        scratch[fresh] = w
        fresh += new
    for j in range(fresh):
        prefetch_node(store, scratch[j])
    return fresh


@njit(inline="always")
def keep_nearest(heap_d, heap_i, count, limit, dist, node):
    """Offer (dist, node) to the max-heap ``heap_d``/``heap_i`` of at most ``limit``
    entries (``count`` now); returns its new count."""
    grown = count
    if count < limit:
        push_pair(heap_d, heap_i, count, dist, node)
        grown = count + 1
    elif dist < heap_d[0]:
        sift_down_pair(heap_d, heap_i, count, 0, dist, node)
    return grown
