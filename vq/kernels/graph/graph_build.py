"""HNSW construction: level assignment and batched parallel insertion.

Reference: Malkov & Yashunin, TPAMI 2018 (levels, neighbour selection by heuristic: hnswlib's
``getNeighborsByHeuristic2``, faiss's ``shrink_neighbor_list``); the batched insertion is the
lock-free scheme of ParlayANN (M. D. Manohar et al., "ParlayANN: Scalable and Deterministic
Parallel Graph-Based Approximate Nearest Neighbor Search Algorithms", PPoPP 2024).

A new node keeps at most M neighbours of its own on every level, chosen by the heuristic
among its efConstruction nearest (hnswlib's rule; faiss keeps up to 2M on level 0, unpruned
while fewer than 2M are found): level-0 lists then fill to 2M through reverse links only. The
pruned lists make every later insertion visit fewer nodes, at the same recall per efSearch
as hnswlib's graph (bench.hnsw).

Nodes are inserted highest level first (as faiss does), in batches. Within a batch, each new
node searches the graph as it was before the batch (read-only: threads split the batch) and
writes its own neighbour lists; then the reverse links are grouped by target node and each
target's list is extended, or, when full, re-chosen by the heuristic among its old and new
neighbours (threads split the targets). No two threads ever write the same list, no lock is
taken, and the graph does not depend on the number of threads. Batches grow with the graph
(a fraction :data:`BATCH_FRACTION` of it, at most :data:`MAX_BATCH` nodes), so that a new node
misses few neighbours by not seeing the rest of its batch; a node that raises the top level
is inserted alone and becomes the entry point.

The insertion searches may walk int8 codes of the vectors (the store of :func:`hnsw_insert`'s
``walk``, as ``HNSW(traversal="int8")`` searches): a quarter of the bytes per visited node, the
beam then ranked by exact distances and the neighbours chosen on the vectors, so that the lists
are those of a build on the vectors but for near ties, at the same recall per efSearch.

The kernels take the metric as a type (:mod:`vq.kernels.common.constants`), as the search kernels
do: an L2 build compiles no inner-product code.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import njit, types
from numba.extending import intrinsic

from vq.kernels.common.bundles import BeamSpace, Graph, Links
from vq.kernels.common.constants import metric
from vq.kernels.common.simd import borrow
from vq.kernels.common.threads import get_num_threads, parallel_for
from vq.kernels.graph.graph_store import node_distance, prepare_query, reranks
from vq.kernels.graph.graph_walk import beam, descend, pair_distance
from vq.kernels.jit import cache
from vq.kernels.jit.cache import kernel

#: a batch holds at most this fraction of the nodes already in the graph (and at least one)
BATCH_FRACTION = 0.02
#: and at most this many nodes
MAX_BATCH = 4096


def level_probabilities(M: int) -> np.ndarray:
    """faiss's ``set_default_probas(M, 1 / ln M)``: the probability of each top level."""
    mult = 1.0 / math.log(M)
    probas = []
    level = 0
    while True:
        p = math.exp(-level / mult) * (1 - math.exp(-1 / mult))
        if p < 1e-9:
            break
        probas.append(p)
        level += 1
    return np.array(probas)


def random_levels(n: int, M: int, rng: np.random.Generator) -> np.ndarray:
    """int32 [n]: a top level per node, drawn as faiss's ``random_level`` draws them."""
    probas = level_probabilities(M)
    u = rng.random(n)
    levels = np.searchsorted(np.cumsum(probas), u, side="right")
    return np.minimum(levels, len(probas) - 1).astype(np.int32)


@njit(inline="always", fastmath=True)
def select_neighbours(data, ip, cand_d, cand_i, size, out_rows, row, m):
    """Row ``row`` of ``out_rows`` := at most m of the ``size`` candidates (ascending by
    distance to the node) chosen by the heuristic: a candidate is kept unless a kept one is
    nearer to it than the node is; -1 after them. Returns how many were kept. As faiss's
    ``shrink_neighbor_list``, at most m candidates are all kept (no pruning)."""
    count = 0
    prune = size > m
    for c in range(size):
        w = cand_i[c]
        dq = cand_d[c]
        good = True
        if prune:
            for r in range(count):
                if pair_distance(data, w, np.int64(out_rows[row, r]), ip) < dq:
                    good = False
                    break
        if good:
            out_rows[row, count] = w
            count += 1
            if count == m:
                break
    for r in range(count, out_rows.shape[1]):
        out_rows[row, r] = -1
    return count


@intrinsic
def claim(typingctx, counter, amount):
    """Atomically add ``amount`` to ``counter[0]`` (int64 [1]) and return the value before:
    threads taking work from one counter each get a range no other thread gets."""
    if not (isinstance(counter, types.Array) and counter.dtype == types.int64):
        raise numba.core.errors.TypingError(f"claim: expected an int64 array, got {counter}")
    sig = types.int64(counter, types.int64)

    def codegen(context, builder, signature, args):
        a = context.make_array(signature.args[0])(context, builder, args[0])
        return builder.atomic_rmw("add", a.data, args[1], "seq_cst")

    return sig, codegen


if numba.config.DISABLE_JIT:  # the kernels run as plain Python (numba's debugging mode)

    def claim(counter, amount):  # noqa: F811
        before = int(counter[0])
        counter[0] += amount
        return before


#: nodes a thread takes from the batch at a time (the rest go to whichever thread is free)
CLAIM = 1


@kernel(nogil=True, fastmath=True)
def insert_range(s0, s1, nodes, levels, graph, walk, ip, ef, seen, counter):
    """Phase one of a batch, on thread slots ``s0..s1`` (visit stamps ``seen[s]``): each
    node's own neighbour lists, from a search of ``graph`` without the batch on the ``walk``'s
    store (the vectors themselves, or int8 codes, then re-ranked: see :func:`hnsw_insert`).
    The nodes are taken :data:`CLAIM` at a time from ``counter`` (int64 [1], 0 at the start),
    so that a thread held up (a busy machine) leaves its share to the others; which thread
    inserts a node does not change its lists."""
    levels, graph, seen, nodes = borrow(levels), borrow(graph), borrow(seen), borrow(nodes)
    walk = borrow(walk)
    width = graph.nbr0.shape[1]
    hd = np.empty(ef, dtype=np.float32)
    hi = np.empty(ef, dtype=np.int64)
    scratch = np.empty(width, dtype=np.int64)
    dist = np.empty(width, dtype=np.float32)
    nb = nodes.shape[0]
    for s in range(s0, s1):
        space = BeamSpace(hd, hi, scratch, dist, hd, hi, seen[s])  # (no filter: hd, hi unread)
        while True:
            b0 = claim(counter, CLAIM)
            if b0 >= nb:
                break
            for b in range(b0, min(b0 + CLAIM, nb)):
                _insert_one(nodes[b], levels, graph, walk, ip, ef, space)


@njit(inline="always", fastmath=True)
def _insert_one(u, levels, graph, walk, ip, ef, space):
    """Node u's own lists at its levels: a beam of ``ef`` per level on the walk's store, the
    beam ranked by the exact distances, then the heuristic on the vectors."""
    store, data = walk
    hd, hi = space.beam_d, space.beam_i
    x = prepare_query(data[u], store, ip)
    top = min(np.int64(levels[u]), graph.max_level)
    v, dv = descend(x, store, ip, graph, top)
    m = graph.up_nbr.shape[1]  # hnswlib: M links of its own at every level
    for level in range(top, -1, -1):
        size, _ = beam(x, store, ip, graph, level, v, dv, ef, None, space)
        rank_exactly(store, data, u, ip, hd, hi, size)
        rows, row = (graph.nbr0, u) if level == 0 else (graph.up_nbr, graph.up_off[u] + level - 1)
        select_neighbours(data, ip, hd, hi, size, rows, row, m)
        v = hi[0]
        dv = node_distance(x, store, v, ip)


@njit(inline="always")
def sort_pairs(dist, idx, size):
    """Sort the first ``size`` pairs of ``dist``/``idx`` ascending by distance, equal ones in
    their own order, by insertion: few moves where the order is nearly right already (a beam
    ranked on codes, a list chosen ascending and then appended to); O(size²) at worst. (The
    search's :func:`~vq.kernels.graph.graph_search.sort_nearly_sorted` also orders ties by
    node, for the results it returns; the build needs no tie rule, and this loop types in
    two thirds of the statements.)"""
    for j in range(1, size):
        d, w = dist[j], idx[j]
        at = j
        while at > 0 and dist[at - 1] > d:
            dist[at], idx[at] = dist[at - 1], idx[at - 1]
            at -= 1
        dist[at], idx[at] = d, w


@njit(inline="always", fastmath=True)
def rank_exactly(store, data, u, ip, beam_d, beam_i, size):
    """For a beam walked on codes (a ``store`` that
    :func:`~vq.kernels.graph.graph_store.reranks`): its ``size`` nodes
    ranked by their exact distances to node u of ``data``, ascending in ``beam_d``/``beam_i``
    (ties in the beam's order), by insertion: the beam's order by estimates is nearly that of
    the exact distances. Nothing for a store of the vectors (a branch on a constant of the store's
    type)."""
    if reranks(store):
        for j in range(size):
            beam_d[j] = pair_distance(data, u, beam_i[j], ip)
        sort_pairs(beam_d, beam_i, size)


@njit(inline="always", fastmath=True)
def _link(data, ip, rows, row, v, sources, s0, s1, cd, ci):
    """Add the nodes ``sources[s0:s1]`` to row ``row`` of ``rows`` (node v's list): appended
    while there is room, else the list re-chosen by the heuristic among old and new."""
    m = rows.shape[1]
    count = 0
    while count < m and rows[row, count] >= 0:
        count += 1
    if count + (s1 - s0) <= m:
        for s in range(s0, s1):
            rows[row, count] = sources[s]
            count += 1
        return
    size = 0
    for j in range(count):
        w = rows[row, j]
        cd[size], ci[size] = pair_distance(data, v, w, ip), w
        size += 1
    for s in range(s0, s1):
        w = sources[s]
        cd[size], ci[size] = pair_distance(data, v, w, ip), w
        size += 1
    sort_pairs(cd, ci, size)  # (the list: ascending as last chosen, then appended ones)
    select_neighbours(data, ip, cd, ci, size, rows, row, m)


#: reverse-link groups a thread takes at a time
LINK_CLAIM = 16


@kernel(nogil=True, fastmath=True)
def link_range(s0, s1, links, data, ip, graph, width, counter):
    """Phase two of a batch, on each thread ``parallel_for`` gave a slice (``s0``, ``s1``
    are not used otherwise): each group of ``links`` (a
    :class:`~vq.kernels.common.bundles.Links`) is added to its target's list; ``width``
    bounds a list plus its group. The groups are taken :data:`LINK_CLAIM` at a time from
    ``counter`` (int64 [1], 0 at the start), as the nodes of phase one."""
    data, graph, links = borrow(data), borrow(graph), borrow(links)
    targets, target_levels, starts, sources = links
    nbr0, up_off, up_nbr = graph.nbr0, graph.up_off, graph.up_nbr
    cd = np.empty(width, dtype=np.float32)
    ci = np.empty(width, dtype=np.int64)
    ng = targets.shape[0]
    while True:
        g0 = claim(counter, LINK_CLAIM)
        if g0 >= ng:
            break
        for g in range(g0, min(g0 + LINK_CLAIM, ng)):
            v, level = targets[g], target_levels[g]
            rows, row = (nbr0, v) if level == 0 else (up_nbr, up_off[v] + level - 1)
            _link(data, ip, rows, row, v, sources, starts[g], starts[g + 1], cd, ci)


@njit(inline="always")
def stable_order(keys):
    """int64 [n]: the order that sorts ``keys`` (int64 [n]), equal keys in their own order (as
    ``np.argsort(keys, kind="stable")``): a bottom-up merge sort, O(n log n), written out
    because numba's own compiles several times slower."""
    n = keys.shape[0]
    a = np.arange(n)
    b = np.empty(n, np.int64)
    width = 1
    while width < n:
        for lo in range(0, n, 2 * width):
            mid, hi = min(lo + width, n), min(lo + 2 * width, n)
            i, j, o = lo, mid, lo
            while i < mid and j < hi:
                if keys[a[j]] < keys[a[i]]:  # the left run's first on a tie: stable
                    b[o] = a[j]
                    j += 1
                else:
                    b[o] = a[i]
                    i += 1
                o += 1
            for r in range(i, mid):
                b[o] = a[r]
                o += 1
            for r in range(j, hi):
                b[o] = a[r]
                o += 1
        a, b = b, a
        width *= 2
    return a


@kernel(nogil=True)
def reverse_links(batch, nbr0, up_off, up_nbr):
    """The links the batch's lists point at, grouped by (level, target), each group's sources
    in batch order: targets int64 [g], their levels int64 [g], group starts int64 [g + 1],
    sources int64 [links] (phase two's work, :func:`link_range`)."""
    n = nbr0.shape[0]
    room = 0
    for u in batch:
        room += nbr0.shape[1] + (up_off[u + 1] - up_off[u]) * up_nbr.shape[1]
    keys = np.empty(room, dtype=np.int64)  # level * n + target
    sources = np.empty(room, dtype=np.int64)
    links = 0
    for u in batch:
        for level in range(up_off[u + 1] - up_off[u] + 1):
            rows, row = (nbr0, u) if level == 0 else (up_nbr, up_off[u] + level - 1)
            for j in range(rows.shape[1]):
                t = rows[row, j]
                if t >= 0:
                    keys[links], sources[links] = level * n + t, u
                    links += 1
    order = stable_order(keys[:links])  # sources stay in batch order
    targets = np.empty(links, dtype=np.int64)
    target_levels = np.empty(links, dtype=np.int64)
    starts = np.empty(links + 1, dtype=np.int64)
    grouped = np.empty(links, dtype=np.int64)
    groups = 0
    for e in range(links):
        key = keys[order[e]]
        if e == 0 or key != keys[order[e - 1]]:
            targets[groups], target_levels[groups], starts[groups] = key % n, key // n, e
            groups += 1
        grouped[e] = sources[order[e]]
    starts[groups] = links
    return targets[:groups], target_levels[:groups], starts[: groups + 1], grouped


def hnsw_insert(nodes, graph, walk, inner_product, levels, ef_construction):
    """Insert ``nodes`` into the graph, in place; returns the new ``(entry, max_level)``.

    Args:
        nodes: int64 [b], every row of ``walk.data`` not yet in the graph, in insertion
            order: by decreasing level (see the module docstring).
        graph: a :class:`~vq.kernels.common.bundles.Graph` of :mod:`vq.kernels.graph.graph_walk`,
            its arrays sized for every node (the new nodes' rows hold -1); entry and
            max_level -1 for an empty graph.
        walk: a :class:`~vq.kernels.common.bundles.Walk`
            (:func:`vq.kernels.graph.graph_search.traversal`): the vectors (``data``), and what the
            insertion searches read: the vectors, or int8 codes of every row (int8 [n, d], float32
            [n, 2]: :func:`vq.kernels.graph.graph_store.int8_codes`), on which the searches walk the
            graph, a quarter of the bytes per visit, each beam then ranked by exact distances before
            the neighbours are chosen on ``data`` (the lists they give are those of the float
            searches but for a few near ties).
        levels: int32 [n], each node's top level.
        ef_construction: the beam of the insertion searches.
    """
    nodes = np.ascontiguousarray(nodes, dtype=np.int64)
    ip = metric(inner_product)  # (a type: each metric compiles its own code)
    ef = int(ef_construction)
    nbr0, up_off, up_nbr, entry, max_level = graph
    data = walk.data
    seen = np.zeros((get_num_threads(), data.shape[0] + 1), np.uint16)
    inserted, pos = data.shape[0] - len(nodes), 0
    link_kernels_ahead(inner_product)  # (asked already by an index's train or add: a no-op)
    while pos < len(nodes):
        u = int(nodes[pos])
        if entry < 0:
            entry, max_level, pos, inserted = u, int(levels[u]), pos + 1, inserted + 1
            continue
        size = 1
        if levels[u] <= max_level:
            size = int(min(max(1, inserted * BATCH_FRACTION), MAX_BATCH))
        batch = nodes[pos : pos + size]
        slots = max(1, min(len(seen), len(batch)))
        now = Graph(nbr0, up_off, up_nbr, int(entry), int(max_level))
        parallel_for(
            insert_range, slots, batch, levels, now, walk, ip, ef, seen, np.zeros(1, np.int64)
        )
        links = Links(*reverse_links(batch, nbr0, up_off, up_nbr))
        width = nbr0.shape[1] + int(np.diff(links.starts).max(initial=0))
        threads = max(1, min(len(seen), -(-len(links.targets) // LINK_CLAIM)))
        parallel_for(link_range, threads, links, data, ip, now, width, np.zeros(1, np.int64))
        if levels[u] > max_level:
            entry, max_level = u, int(levels[u])
        pos += len(batch)
        inserted += len(batch)
    return entry, max_level


def link_kernels_ahead(inner_product: bool) -> None:
    """On a machine where phase two's kernels are not compiled yet, start compiling them in
    the background server (:func:`vq.kernels.jit.cache.prefetch`), so that they compile
    there while the first batch compiles :func:`insert_range` here: the types of
    :func:`hnsw_insert`'s calls, on placeholder arrays. Called by an HNSW index's
    ``kernels_ahead`` (``train``) and first ``add`` before they prepare the vectors, and by
    :func:`hnsw_insert`; nothing where the kernels are loaded or asked for already."""
    nbr0, up_off = np.full((1, 2), -1, np.int32), np.zeros(2, np.int64)
    up_nbr, none = np.full((0, 1), -1, np.int32), np.zeros(0, np.int64)
    cache.prefetch(reverse_links, np.zeros(1, np.int64), nbr0, up_off, up_nbr)
    now = Graph(nbr0, up_off, up_nbr, 0, 0)
    links = Links(none, none.copy(), none.copy(), none.copy())
    data = np.zeros((1, 1), np.float32)
    cache.prefetch(
        link_range, 0, 1, links, data, metric(inner_product), now, 1, np.zeros(1, np.int64)
    )
