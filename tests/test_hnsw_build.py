"""HNSW construction on int8 codes (vq.kernels.graph.graph_build.hnsw_insert with ``codes``): the
lists it gives are those of the build on the vectors but for near ties, and an index uses
the codes only for batches worth coding every vector for; a batch's reverse links are grouped
by the list they extend."""

from __future__ import annotations

import numpy as np
import pytest

from vq.index.graph.hnsw_graph import CODES_RATIO, insertion_codes
from vq.kernels.common.bundles import Graph
from vq.kernels.graph import graph_build, graph_search, graph_store

M = 8


def build(x: np.ndarray, codes, ef: int = 40):
    """The graph of x inserted in one batch, as vq.HNSW orders it: (nbr0, up_nbr, entry)."""
    rng = np.random.default_rng(3)
    levels = graph_build.random_levels(x.shape[0], M, rng)
    nbr0 = np.full((x.shape[0], 2 * M), -1, np.int32)
    up_off = np.concatenate([[0], np.cumsum(levels, dtype=np.int64)])
    up_nbr = np.full((int(up_off[-1]), M), -1, np.int32)
    order = np.argsort(-levels, kind="stable").astype(np.int64)
    walk = graph_search.traversal(x, codes)
    entry, _ = graph_build.hnsw_insert(
        order, Graph(nbr0, up_off, up_nbr, -1, -1), walk, False, levels, ef
    )
    return nbr0, up_nbr, entry


@pytest.mark.parametrize("fixture", ["blobs", "aniso"])
def test_build_on_codes_chooses_the_neighbours_of_the_build_on_vectors(request, fixture):
    x = np.ascontiguousarray(request.getfixturevalue(fixture)[:2000])
    on_vectors = build(x, None)[0]
    codes, factors = graph_store.int8_codes(x)
    assert shared_links(on_vectors, build(x, (codes, factors))[0]) >= 0.97  # near ties aside
    # the walk reads the codes: codes of other vectors lead it elsewhere
    shuffled = np.random.default_rng(0).permutation(x.shape[0])
    assert shared_links(on_vectors, build(x, (codes[shuffled], factors[shuffled]))[0]) < 0.9


def shared_links(a: np.ndarray, b: np.ndarray) -> float:
    """The fraction of the links of lists ``a`` that lists ``b`` hold too."""
    same = sum(
        len(set(r[r >= 0].tolist()) & set(s[s >= 0].tolist())) for r, s in zip(a, b, strict=True)
    )
    return same / int((a >= 0).sum())


def test_insertion_codes_only_for_batches_worth_coding_the_index_for(blobs):
    x = np.ascontiguousarray(blobs[:1300])
    assert (1300 - 1290) * CODES_RATIO < 1290 and insertion_codes(x, 1290) is None
    full = graph_store.int8_codes(x)
    for stored in ((), graph_store.int8_codes(x[:1000])):
        codes, factors = insertion_codes(x, 1000, stored)
        np.testing.assert_array_equal(codes, full[0])
        np.testing.assert_array_equal(factors, full[1])


def test_stable_order_sorts_as_numpy_stable_argsort_ties_in_their_own_order():
    rng = np.random.default_rng(5)
    for n in (0, 1, 2, 7, 64, 1000):
        keys = rng.integers(0, max(1, n // 4), n)  # many ties
        np.testing.assert_array_equal(
            graph_build.stable_order(keys), np.argsort(keys, kind="stable")
        )


def test_reverse_links_group_every_link_by_level_and_target_in_batch_order():
    rng = np.random.default_rng(4)
    n = 300
    levels = np.minimum(rng.geometric(0.5, n) - 1, 3).astype(np.int32)
    up_off = np.concatenate([[0], np.cumsum(levels, dtype=np.int64)])
    nbr0 = rng.integers(-1, n, (n, 2 * M)).astype(np.int32)
    up_nbr = rng.integers(-1, n, (int(up_off[-1]), M)).astype(np.int32)
    batch = rng.permutation(n)[:80].astype(np.int64)
    want: dict[tuple[int, int], list[int]] = {}
    for u in batch:  # every link of the batch's lists, its source in batch order
        for level in range(levels[u] + 1):
            row = nbr0[u] if level == 0 else up_nbr[up_off[u] + level - 1]
            for t in row[row >= 0]:
                want.setdefault((level, int(t)), []).append(int(u))
    targets, tlevels, starts, sources = graph_build.reverse_links(batch, nbr0, up_off, up_nbr)
    got = {
        (int(lv), int(t)): sources[starts[g] : starts[g + 1]].tolist()
        for g, (t, lv) in enumerate(zip(targets, tlevels, strict=True))
    }
    assert got == want
    assert list(zip(tlevels, targets, strict=True)) == sorted(zip(tlevels, targets, strict=True))
    assert starts[0] == 0 and starts[-1] == len(sources) == sum(map(len, want.values()))


@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_the_link_kernels_asked_for_ahead_are_the_ones_the_build_calls(monkeypatch, metric):
    """train (HNSW.kernels_ahead) and add ask the background server for phase two's kernels
    before the first batch (vq.kernels.jit.cache.prefetch, on placeholder arrays); a type that
    differed from the later call's would compile a kernel nobody calls while the build
    compiles the real one itself."""
    from vq.index.graph.hnsw import HNSW
    from vq.kernels.jit import numba_compat

    asked = []

    def record(dispatcher, *args):
        asked.append((dispatcher, numba_compat.argtypes(dispatcher, args)))
        return False

    monkeypatch.setattr(graph_build.cache, "prefetch", record)
    x = np.random.default_rng(0).standard_normal((300, 8)).astype(np.float32)
    index = HNSW(8, 8, metric=metric)
    index.train(x)
    assert [d for d, _ in asked] == [graph_build.reverse_links, graph_build.link_range]
    index.add(x)
    assert {d for d, _ in asked} == {graph_build.reverse_links, graph_build.link_range}
    for dispatcher, argtypes in asked:
        assert argtypes is not None and argtypes in dispatcher.overloads
