"""The HNSW search kernel's parts (vq.kernels.graph.graph_search, graph_walk): the descent takes
faiss's greedy path, the sorted beam expands the nodes faiss's scan of the beam expands (and ends
sorted), and visit stamps that wrap around (an epoch per query's beam) change nothing."""

from __future__ import annotations

import numpy as np

import vq
from vq.kernels.common.bundles import BeamSpace, Graph, TopK
from vq.kernels.common.constants import metric
from vq.kernels.common.simd import NO_CLAIM
from vq.kernels.graph import graph_search as graph
from vq.kernels.graph import graph_walk

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


def test_descent_takes_faiss_greedy_path():
    index, queries = small_index()
    assert index.max_level >= 2  # a descent through more than one level
    data, nbr0, up_off, up_nbr = index._arrays()
    entry = int(index.entry_point[0])
    arrays = Graph(nbr0, up_off, up_nbr, entry, index.max_level)
    moved = 0
    for x in queries:
        v, dv = graph_walk.descend(x, data, False, arrays, 0)
        assert v == plain_greedy(x, data, nbr0, up_off, up_nbr, entry, index.max_level)
        assert np.isclose(dv, ((data[v] - x) ** 2).sum(dtype=np.float32), rtol=1e-5)
        moved += v != entry
    assert moved > 30


def scan_beam(x, data, nbr0, entry, cap, ef):
    """faiss's search_from_candidates on level 0, written plainly: the nearest unexpanded node
    of the beam found by a scan, the stop for efSearch < k; the beam's nodes, nearest first."""
    dist = {entry: float(((data[entry] - x) ** 2).sum(dtype=np.float32))}
    beam, expanded, visited = dict(dist), set(), {entry}
    while True:
        waiting = [v for v in beam if v not in expanded]
        if not waiting:
            break
        v = min(waiting, key=beam.get)
        expanded.add(v)
        if ef < cap and sum(d < beam[v] for d in beam.values()) >= ef:
            break
        for w in nbr0[v]:
            if w < 0:
                break
            if w in visited:
                continue
            visited.add(int(w))
            d = float(((data[w] - x) ** 2).sum(dtype=np.float32))
            if len(beam) == cap:
                far = max(beam, key=beam.get)
                if d >= beam[far]:
                    continue
                del beam[far]
            beam[int(w)] = d
    return sorted(beam, key=beam.get)


def test_the_sorted_beam_expands_the_nodes_of_faiss_scan_of_the_beam():
    index, queries = small_index(3)
    data, nbr0, up_off, up_nbr = index._arrays()
    seen = graph.new_seen(1, index.ntotal)[0]
    scratch = np.empty(nbr0.shape[1], np.int64)
    dist = np.empty(nbr0.shape[1], np.float32)
    no_filter = np.zeros(0, np.uint8)
    arrays = Graph(nbr0, up_off, up_nbr, int(index.entry_point[0]), index.max_level)
    checked = 0
    for cap, ef in ((10, 10), (10, 4), (24, 24), (64, 64), (40, 12)):
        hd, hi = np.empty(cap, np.float32), np.empty(cap, np.int64)
        for x in queries[:10]:
            entry = int(x @ x) % index.ntotal  # any node: the beam alone is compared
            d0 = np.float32(((data[entry] - x) ** 2).sum(dtype=np.float32))
            space = BeamSpace(hd, hi, scratch, dist, hd, hi, seen)
            size, _ = graph_walk.beam(x, data, False, arrays, 0, entry, d0, ef, no_filter, space)
            want = scan_beam(x, data, nbr0, entry, cap, ef)
            assert hi[:size].tolist() == want, (cap, ef)  # the same nodes, ascending
            assert np.all(np.diff(hd[:size]) >= 0)
            checked += size == cap
    assert checked > 30  # full beams, where nodes are pushed out


def test_visit_stamps_that_wrap_around_give_the_results_of_fresh_ones():
    index, queries = small_index(1)
    data, nbr0, up_off, up_nbr = index._arrays()
    arrays = Graph(nbr0, up_off, up_nbr, int(index.entry_point[0]), index.max_level)
    walk = graph.traversal(data, None)

    def search(seen):
        out = np.empty((queries.shape[0], 5), np.float32), np.empty((queries.shape[0], 5), np.int64)
        graph.hnsw_search(queries, arrays, walk, False, 8, seen, TopK(*out))
        return out

    want = search(graph.new_seen(1, index.ntotal))
    worn = graph.new_seen(1, index.ntotal)
    worn[0, :-1] = np.random.default_rng(2).integers(0, 65535, index.ntotal)  # stale stamps
    worn[0, -1] = 65530  # the epochs wrap within the first few queries
    got = search(worn)
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[0], want[0])
    assert 0 < worn[0, -1] < 65530  # it did wrap


def test_lean_searches_sharing_a_claim_counter_answer_each_query_once():
    index, queries = small_index(2)
    data, nbr0, up_off, up_nbr = index._arrays()
    arrays = tuple(Graph(nbr0, up_off, up_nbr, int(index.entry_point[0]), index.max_level))
    walk = tuple(graph.traversal(data, None))
    args = (arrays, walk, metric(False), 16, graph.new_seen(1, N), np.zeros(0, np.int64))
    nq = queries.shape[0]
    want = np.empty((nq, 5), np.float32), np.empty((nq, 5), np.int64)
    assert graph.hnsw_search_lean(queries, *args, NO_CLAIM, 8, want)
    for chunk in (1, 3, 8, 64):
        claim = np.zeros(1, np.int64)
        got = np.full((nq, 5), np.nan, np.float32), np.full((nq, 5), -2, np.int64)
        assert graph.hnsw_search_lean(queries, *args, claim, chunk, got)
        np.testing.assert_array_equal(got[1], want[1])
        np.testing.assert_array_equal(got[0], want[0])
        assert claim[0] >= nq  # every chunk claimed: a second caller finds none left
        untouched = np.full((nq, 5), -2, np.int64)
        assert graph.hnsw_search_lean(queries, *args, claim, chunk, (got[0], untouched))
        assert (untouched == -2).all()


def test_a_reranked_beam_is_sorted_by_distance_then_node():
    rng = np.random.default_rng(3)
    for size in (0, 1, 2, 10, 64):
        estimate = np.sort(rng.integers(0, 6, size)).astype(np.float32)  # ties, as a beam
        exact = estimate + rng.integers(-1, 2, size).astype(np.float32)  # nearly its order
        nodes = rng.permutation(1000)[:size].astype(np.int64)
        hd, hi = exact.copy(), nodes.copy()
        graph.sort_nearly_sorted(hd, hi, size)
        order = np.lexsort((nodes, exact))
        np.testing.assert_array_equal(hi, nodes[order])
        np.testing.assert_array_equal(hd, exact[order])
    hd, hi = np.array([3, 1, 2, 0], np.float32), np.arange(4)
    graph.sort_nearly_sorted(hd, hi, 2)  # only the first size pairs
    assert hd.tolist() == [1, 3, 2, 0] and hi.tolist() == [1, 0, 2, 3]


def test_pair_distance_is_each_metrics_own_and_refuses_a_run_time_flag():
    import numba
    import pytest

    data = np.random.default_rng(3).standard_normal((3, DIM)).astype(np.float32)

    @numba.njit
    def both(data, l2, ip):
        return graph_walk.pair_distance(data, 0, 2, l2), graph_walk.pair_distance(data, 0, 2, ip)

    l2, ip = both(data, metric(False), metric(True))
    np.testing.assert_allclose(l2, ((data[0] - data[2]) ** 2).sum(), rtol=1e-5)
    np.testing.assert_allclose(ip, -(data[0] @ data[2]), rtol=1e-5)

    @numba.njit
    def flag(data, inner_product):
        return graph_walk.pair_distance(data, 0, 1, inner_product)

    with pytest.raises(numba.core.errors.TypingError, match="compile-time constant"):
        flag(data, True)
