"""vq.HNSW and vq.HNSWSQ under a filter (``allowed=``), range search, and searches from
many threads: brute force restricted to the allowed ids, faiss's HNSW with an
IDSelectorBatch on the same graph, k results wherever k ids are allowed."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import vq
from vq.index.graph import hnsw_graph

faiss = pytest.importorskip("faiss")

N, DIM = 3000, 32


@pytest.fixture(scope="module")
def data(blobs):
    x = np.ascontiguousarray(blobs[:N])
    q = np.ascontiguousarray(blobs[9000:9060] + 0.01, dtype=np.float32)
    return x, q


@pytest.fixture(scope="module")
def indexes(data):
    x = data[0]
    out = {}
    for name, index in (
        ("float", vq.HNSW(DIM, M=8, efConstruction=40)),
        ("int8", vq.HNSW(DIM, M=8, efConstruction=40, traversal="int8")),
        ("rabitq", vq.HNSW(DIM, M=8, efConstruction=40, traversal="rabitq")),
        ("sq8", vq.HNSWSQ(DIM, M=8, bits=8, efConstruction=40)),
    ):
        index.train(x)
        index.add(x)
        out[name] = index
    return out


def brute_force(index, x, q, allowed, k):
    """The k nearest allowed rows by the index's own distances (exact, or on the codes)."""
    if isinstance(index, vq.HNSWSQ):
        x = index.sq.decode(index.codes).numpy()
    d = ((q[:, None, :] - x[None, allowed]) ** 2).sum(-1)
    order = np.argsort(d, axis=1, kind="stable")[:, :k]
    return allowed[order], np.take_along_axis(d, order, 1)


@pytest.fixture(params=["graph", "scan"])
def path(request, monkeypatch):
    """Filtered searches through the graph (no exact scan however few ids are allowed) or
    through the exact scan of the allowed rows (however many)."""
    monkeypatch.setattr(hnsw_graph, "SCAN_FACTOR", 0 if request.param == "graph" else 10**9)
    return request.param


@pytest.mark.parametrize("kind", ["float", "int8", "rabitq", "sq8"])
@pytest.mark.parametrize("form", ["ids", "mask", "filter"])
def test_filtered_search_equals_brute_force_over_the_allowed_ids(data, indexes, kind, form, path):
    x, q = data
    index = indexes[kind]
    allowed = np.flatnonzero(np.random.default_rng(5).random(N) < 0.2)
    given = {"ids": allowed, "mask": np.isin(np.arange(N), allowed), "filter": vq.IdFilter(allowed)}
    D, I = index.search(q, 10, allowed=given[form], efSearch=N)
    ref_i, ref_d = brute_force(index, x, q, allowed, 10)
    assert (I == ref_i).mean() >= 0.99  # ties aside
    np.testing.assert_allclose(D, ref_d, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("kind", ["float", "sq8"])
def test_a_selective_filter_still_gives_k_results(data, indexes, kind, path):
    x, q = data
    index = indexes[kind]
    for count in (3, 12, 40):
        allowed = np.random.default_rng(count).choice(N, count, replace=False)
        D, I = index.search(q, 10, allowed=allowed, efSearch=16)
        assert (I >= 0).sum(1).min() == min(10, count)  # every query, at a small beam too
        assert np.isin(I[I >= 0], allowed).all()
        if count <= 12:  # k results that are all allowed ones are the exact answer
            exact = brute_force(index, x, q, np.sort(allowed), 10)[0]
            assert np.array_equal(np.sort(I[:, : min(10, count)], 1), np.sort(exact, 1))


def test_filtered_search_equals_faiss_idselector_on_an_imported_graph(data, monkeypatch):
    monkeypatch.setattr(hnsw_graph, "SCAN_FACTOR", 0)  # the graph walk itself
    x, q = data
    f = faiss.IndexHNSWFlat(DIM, 8)
    f.add(x)
    index = vq.index.from_faiss(f)
    for frac, ef in ((0.5, 16), (0.2, 32), (0.05, 64)):
        allowed = np.flatnonzero(np.random.default_rng(7).random(N) < frac).astype(np.int64)
        sel = faiss.IDSelectorBatch(allowed)
        params = faiss.SearchParametersHNSW(sel=sel, efSearch=ef)
        Df, If = f.search(q, 10, params=params)
        D, I = index.search(q, 10, allowed=allowed, efSearch=ef)
        full = (If >= 0).all(1)  # the queries where faiss returns k
        assert full.sum() >= len(q) // 2
        assert (I[full] == If[full]).mean() >= 0.99
        same = I == If
        np.testing.assert_allclose(D[same], Df[same], rtol=1e-4, atol=1e-4)


def test_filtered_search_leaves_unfiltered_results_alone(data, indexes):
    _, q = data
    index = indexes["float"]
    before = index.search(q, 5, efSearch=24)
    index.search(q, 5, efSearch=24, allowed=np.arange(0, N, 2))
    for a, b in zip(before, index.search(q, 5, efSearch=24), strict=True):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(TypeError, match="integer ids or a boolean mask"):
        index.search(q, 5, allowed=np.ones(N, np.float32))


@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_range_search_at_a_wide_beam_equals_the_exact_one(data, metric):
    x, q = data
    index = vq.HNSW(DIM, M=8, metric=metric)
    index.add(x)
    flat = vq.FlatIndex(DIM, metric)
    flat.add(x)
    d = ((q[:, None] - x[None]) ** 2).sum(-1) if metric == "l2" else q @ x.T
    radius = float(np.quantile(d, 0.002 if metric == "l2" else 0.998))
    lims, D, I = index.range_search(q, radius, efSearch=N)
    lims_f, D_f, I_f = flat.range_search(q, radius)
    found = missed = 0
    for i in range(len(q)):
        a, b = set(I[lims[i] : lims[i + 1]]), set(I_f[lims_f[i] : lims_f[i + 1]])
        assert a <= b  # hits are hits; a node the beam never reached is missed (approximate)
        found, missed = found + len(a), missed + len(b - a)
    assert missed == 0 if metric == "l2" else missed <= 0.02 * (found + missed)
    same = np.isin(I, I_f)
    assert np.all(same) and len(D) == len(I)
    allowed = np.arange(0, N, 2)
    lims, D, I = index.range_search(q, radius, efSearch=N, allowed=allowed)
    assert np.all(I % 2 == 0)
    if metric == "l2":
        assert len(I) == np.isin(I_f, allowed).sum()


@pytest.mark.parametrize("kind", ["float", "int8", "rabitq", "sq8"])
def test_searches_from_many_threads_equal_one_at_a_time(data, indexes, kind):
    _, q = data
    index = indexes[kind]
    allowed = np.arange(0, N, 3)

    def one(s):
        part = q[s : s + 6]
        return (index.search(part, 10, efSearch=24)[1],
                index.search(part, 10, efSearch=24, allowed=allowed)[1])  # fmt: skip

    starts = list(range(0, len(q), 6))
    expected = [one(s) for s in starts]
    with ThreadPoolExecutor(4) as pool:
        found = list(pool.map(one, starts * 3))
    for a, b in zip(expected * 3, found, strict=True):
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])
