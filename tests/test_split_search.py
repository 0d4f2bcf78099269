"""Batches of a few hundred queries on a small IVF index: the lean kernels, the queries split
between the threads (``vq.index.lean.split_queries``), give the general path's results; and
the coarse-step kernels under them (``probe_lists``, the selection of the nprobe nearest)."""

from unittest import mock

import numpy as np
import pytest

import vq
from vq.index import lean
from vq.index.base import Index
from vq.kernels.select import smallest_k_range
from vq.kernels.small import probe_lists

KINDS = ["IVF32,Flat", "IVF32,PQ8", "IVF32,PQ8x4fs,RFlat", "IVF32,SQ8", "IVF40,Flat",
         "IVF32(soar),Flat", "IVF32(soar),PQ8", "IVF32(soar),SQ8"]  # fmt: skip


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(11)
    x = rng.standard_normal((4000, 32), dtype=np.float32)
    q = rng.standard_normal((300, 32), dtype=np.float32)
    return x, q


def _index(description: str, metric: str, x: np.ndarray) -> Index:
    index = vq.index_factory(x.shape[1], description, metric=metric)
    index.train(x)
    index.add_with_ids(x, np.arange(len(x), dtype=np.int64) * 7 + 3)
    index.nprobe = 5
    return index


def _general(index: Index, q: np.ndarray, k: int, **params):
    with mock.patch.object(lean, "SPLIT_BATCH", lean.SMALL_BATCH):
        return index.search(q, k, **params)


@pytest.mark.parametrize("metric", ["l2", "ip"])
@pytest.mark.parametrize("description", KINDS)
def test_a_split_batch_gives_the_general_paths_results(data, description, metric):
    x, q = data
    index = _index(description, metric, x)
    assert index._lean().splits  # 32 lists of 32 dims: a coarse step small enough to split
    want_dist, want_ids = _general(index, q, 10)
    for threads in (1, 2):
        vq.set_num_threads(threads)
        try:
            dist, ids = index.search(q, 10)
        finally:
            vq.set_num_threads(2)
        np.testing.assert_array_equal(ids, want_ids)
        np.testing.assert_allclose(dist, want_dist, rtol=1e-4, atol=1e-3)
    small_dist, small_ids = index.search(q[:9], 10)  # (a small batch: the calling thread)
    np.testing.assert_array_equal(small_ids, want_ids[:9])
    np.testing.assert_allclose(small_dist, want_dist[:9], rtol=1e-4, atol=1e-3)
    if getattr(index, "spill", False):  # each id once per row
        assert all(len(set(row)) == len(row) for row in ids.tolist())


# graphs, and re-ranking around an index whose lean search cannot re-rank in its own kernel
SPLIT_WRAPPED = ["HNSW8", "HNSW8,SQ8", "HNSW8,RFlat", "PCA16,IVF32,Flat,RFlat"]


@pytest.mark.parametrize("metric", ["l2", "ip"])
@pytest.mark.parametrize("description", SPLIT_WRAPPED)
def test_a_split_graph_or_refine_batch_gives_the_general_paths_results(data, description, metric):
    x, q = data
    index = vq.index_factory(x.shape[1], description, metric=metric)
    index.train(x)
    index.add_with_ids(x, np.arange(len(x), dtype=np.int64) * 7 + 3)
    params = {"nprobe": 5} if "IVF" in description else {"efSearch": 24}
    if "RFlat" in description:
        params["k_factor"] = 3
    assert index._lean().splits
    want_dist, want_ids = _general(index, q, 10, **params)
    for threads in (1, 2):
        vq.set_num_threads(threads)
        try:
            dist, ids = index.search(q, 10, **params)
        finally:
            vq.set_num_threads(2)
        np.testing.assert_array_equal(ids, want_ids)
        np.testing.assert_allclose(dist, want_dist, rtol=1e-4, atol=1e-3)
    bad = q.copy()
    bad[250, 3] = np.inf  # in the second thread's slice: the general path says what is wrong
    assert lean.search_small(index, bad, 10, params) is None
    with pytest.raises(ValueError, match="NaN/Inf values, first in row 250"):
        index.search(bad, 10, **params)


def test_a_split_batch_runs_no_torch_search(data, monkeypatch):
    x, q = data
    index = _index("IVF32,Flat", "l2", x)
    want = index.search(q, 5)[1]

    def refuse(*args, **kwargs):
        raise AssertionError("the general search path ran")

    monkeypatch.setattr(type(index), "_search_ids", refuse)
    np.testing.assert_array_equal(index.search(q, 5)[1], want)
    monkeypatch.setattr(lean, "SPLIT_COARSE", 32 * 32 - 1)  # a coarse step too large now
    index._lean_cache = None
    with pytest.raises(AssertionError, match="general search path ran"):
        index.search(q, 5)


def test_large_work_and_bad_queries_go_to_the_general_path(data):
    x, q = data
    index = _index("IVF32,Flat", "l2", x)
    with mock.patch.object(lean, "SPLIT_WORK", 1):  # every batch above 16 is too much work
        assert lean.search_small(index, q, 10, {}) is None
    assert lean.search_small(index, q, 10, {}) is not None
    bad = q.copy()
    bad[250, 3] = np.nan  # in the second thread's slice
    assert lean.search_small(index, bad, 10, {}) is None
    with pytest.raises(ValueError, match="NaN"):
        index.search(bad, 10)


@pytest.mark.parametrize("nlist", [1, 15, 16, 63, 64, 100, 1024, 1100])
@pytest.mark.parametrize("dim", [1, 3, 40])
def test_probe_lists_ranks_as_exact_distances(nlist, dim):
    rng = np.random.default_rng(nlist * 100 + dim)
    q = rng.integers(-4, 5, (37, dim)).astype(np.float32)  # small integers: exact sums, ties
    c = rng.integers(-4, 5, (nlist, dim)).astype(np.float32)
    nprobe = min(nlist, 7)
    for ip in (False, True):
        scores = np.empty((37, nprobe), np.float32)
        lists = np.empty((37, nprobe), np.int64)
        norms = (c * c).sum(1)
        probe_lists(q, np.ascontiguousarray(c.T), norms, ip, scores, lists)
        exact = -(q @ c.T) if ip else ((q[:, None, :] - c[None]) ** 2).sum(-1)
        want = np.argsort(exact, axis=1, kind="stable")[:, :nprobe]  # ties: lower list
        np.testing.assert_array_equal(lists, want)
        np.testing.assert_array_equal(scores, np.take_along_axis(exact, want, 1))


@pytest.mark.parametrize("nlist", [64, 100, 1024])
def test_probe_lists_scores_a_query_alike_alone_and_in_a_batch(nlist):
    # several queries share each load of the centroids (vq.kernels.dots.column_dots_rows):
    # every query's sums take the same terms in the same order as its own, bit for bit
    rng = np.random.default_rng(nlist)
    q = rng.standard_normal((23, 40)).astype(np.float32)
    c = rng.standard_normal((nlist, 40)).astype(np.float32)
    ct, norms = np.ascontiguousarray(c.T), (c * c).sum(1)
    batch_s, batch_l = np.empty((23, 9), np.float32), np.empty((23, 9), np.int64)
    probe_lists(q, ct, norms, False, batch_s, batch_l)
    for i in range(23):
        one_s, one_l = np.empty((1, 9), np.float32), np.empty((1, 9), np.int64)
        probe_lists(q[i : i + 1], ct, norms, False, one_s, one_l)
        np.testing.assert_array_equal(one_l[0], batch_l[i])
        np.testing.assert_array_equal(one_s[0], batch_s[i])


SIZES = [(n, k) for n in (16, 40, 256, 300) for k in (1, 4, 15, 16, 17, 32, 33) if k <= n]


@pytest.mark.parametrize("n,k", SIZES)
def test_the_selection_keeps_the_k_least_ties_by_lower_column(n, k):
    rng = np.random.default_rng(n + k)
    values = rng.integers(0, 9, (50, n)).astype(np.float32)  # many equal values
    out_d, out_i = np.empty((50, k), np.float32), np.empty((50, k), np.int64)
    queries = np.zeros((50, 1), np.float32)
    smallest_k_range(0, 50, -values, queries, np.zeros(n, np.float32), True, out_d, out_i)
    want = np.argsort(values, axis=1, kind="stable")[:, :k]
    np.testing.assert_array_equal(out_i, want)
    np.testing.assert_array_equal(out_d, np.take_along_axis(values, want, 1))
