"""The HNSW search kernel's parts (vq.kernels.graph): the descent that computes each node's
distance once takes faiss's greedy path, the pop-min picks faiss's node, and visit stamps
that wrap around (an epoch for the descent and one for the beam per query) change nothing."""

from __future__ import annotations

import numpy as np

import vq
from vq.kernels import graph

DIM, N = 16, 600


def small_index(seed: int = 0) -> tuple[vq.HNSW, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, DIM)).astype(np.float32)
    index = vq.HNSW(DIM, M=4, efConstruction=20)
    index.add(x)
    return index, rng.standard_normal((40, DIM)).astype(np.float32)


def plain_greedy(x, data, nbr0, up_off, up_nbr, entry, max_level):
    """faiss's greedy_update_nearest on every level above 0, every neighbour recomputed."""
    v, dv = entry, float(((data[entry] - x) ** 2).sum(dtype=np.float32))
    for level in range(max_level, 0, -1):
        while True:
            prev = v
            for w in up_nbr[up_off[prev] + level - 1]:
                if w < 0:
                    break
                d = float(((data[w] - x) ** 2).sum(dtype=np.float32))
                if d < dv:
                    v, dv = int(w), d
            if v == prev:
                break
    return v


def test_descent_that_skips_visited_nodes_takes_faiss_greedy_path():
    index, queries = small_index()
    assert index.max_level >= 2  # a descent through more than one level
    data, nbr0, up_off, up_nbr = index._arrays()
    entry = int(index.entry_point[0])
    seen = graph.new_seen(1, index.ntotal)[0]
    scratch = np.empty(nbr0.shape[1], np.int64)
    for x in queries:
        v, _ = graph.descend(x, data, False, nbr0, up_off, up_nbr, entry, index.max_level, 0,
                             seen, scratch)  # fmt: skip
        assert v == plain_greedy(x, data, nbr0, up_off, up_nbr, entry, index.max_level)


def test_pop_min_takes_the_nearest_unexpanded_node_and_ties_go_to_the_last_slot():
    hd = np.array([0.5, 0.1, 0.3, 0.1, 0.2, 0.1], np.float32)
    hi = np.array([4, -9, 7, 2, 5, 8], np.int64)  # slot 1 expanded (ids below 0)
    assert graph.nearest_unexpanded(hd, hi, 6) == (5, np.float32(0.1))
    assert graph.nearest_unexpanded(hd, hi, 5) == (3, np.float32(0.1))
    hi[3] = -4
    assert graph.nearest_unexpanded(hd, hi, 5) == (4, np.float32(0.2))


def test_visit_stamps_that_wrap_around_give_the_results_of_fresh_ones():
    index, queries = small_index(1)
    data, nbr0, up_off, up_nbr = index._arrays()
    args = (data, False, nbr0, up_off, up_nbr, int(index.entry_point[0]), index.max_level, 8)

    def search(seen):
        out = np.empty((queries.shape[0], 5), np.float32), np.empty((queries.shape[0], 5), np.int64)
        graph.hnsw_search(queries, *args, seen, *out)
        return out

    want = search(graph.new_seen(1, index.ntotal))
    worn = graph.new_seen(1, index.ntotal)
    worn[0, :-1] = np.random.default_rng(2).integers(0, 65535, index.ntotal)  # stale stamps
    worn[0, -1] = 65530  # the epochs wrap within the first few queries
    got = search(worn)
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[0], want[0])
    assert 0 < worn[0, -1] < 65530  # it did wrap
