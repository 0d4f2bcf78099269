"""Batches of a few hundred queries on a small IVF index: the lean kernels, the queries split
between the threads (``vq.index.ivf.ivf_lean.split_queries``), give the general path's results; and
the coarse-step kernels under them (``probe_lists``, the selection of the nprobe nearest)."""

from unittest import mock

import numpy as np
import pytest
import torch

import vq
from vq.index.core import lean
from vq.index.core.base import Index
from vq.index.ivf import ivf_lean
from vq.index.ivf.ivf_probing import BOUND_SHARE, coarse_bound
from vq.index.ivf.ivf_searchers import probe
from vq.kernels.common.bundles import Coarse
from vq.kernels.common.select import smallest_k_range
from vq.kernels.exact.coarse_probe import (
    BOUND_MOST,
    column_panels,
    probe_bounded,
    probe_few,
    probe_lists,
    products,
)

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
    assert index.lean_search().splits  # 32 lists of 32 dims: a coarse step small enough to split
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
    assert index.lean_search().splits
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

    monkeypatch.setattr(type(index), "search_ids", refuse)
    np.testing.assert_array_equal(index.search(q, 5)[1], want)
    monkeypatch.setattr(ivf_lean, "SPLIT_COARSE", 32 * 32 - 1)  # a coarse step too large now
    index._lean_cache = None
    with pytest.raises(AssertionError, match="general search path ran"):
        index.search(q, 5)


def test_large_work_and_bad_queries_go_to_the_general_path(data):
    x, q = data
    index = _index("IVF32,Flat", "l2", x)
    with mock.patch.object(ivf_lean, "SPLIT_WORK", 1):  # every batch above 16 is too much work
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
        probe_lists(q, column_panels(c.T), norms, ip, scores, lists)
        exact = -(q @ c.T) if ip else ((q[:, None, :] - c[None]) ** 2).sum(-1)
        want = np.argsort(exact, axis=1, kind="stable")[:, :nprobe]  # ties: lower list
        np.testing.assert_array_equal(lists, want)
        np.testing.assert_array_equal(scores, np.take_along_axis(exact, want, 1))


@pytest.mark.parametrize("nlist", [64, 100, 1024])
def test_probe_lists_scores_a_query_alike_alone_and_in_a_batch(nlist):
    # several queries share each load of the centroids (vq.kernels.common.dots.panel_dots_rows),
    # a query left past a multiple of DOT_ROWS takes them alone: every query's sums take the
    # same terms in the same order either way, bit for bit
    rng = np.random.default_rng(nlist)
    q = rng.standard_normal((23, 40)).astype(np.float32)
    c = rng.standard_normal((nlist, 40)).astype(np.float32)
    ct, norms = column_panels(c.T), (c * c).sum(1)
    batch_s, batch_l = np.empty((23, 9), np.float32), np.empty((23, 9), np.int64)
    probe_lists(q, ct, norms, False, batch_s, batch_l)
    for i in range(23):
        one_s, one_l = np.empty((1, 9), np.float32), np.empty((1, 9), np.int64)
        probe_lists(q[i : i + 1], ct, norms, False, one_s, one_l)
        np.testing.assert_array_equal(one_l[0], batch_l[i])
        np.testing.assert_array_equal(one_s[0], batch_s[i])


@pytest.mark.parametrize("n", [1, 16, 17, 100])
def test_column_panels_hold_each_column_once_and_zeros_past_the_last(n):
    rng = np.random.default_rng(n)
    columns_t = rng.standard_normal((5, n)).astype(np.float32)
    panels = column_panels(columns_t)
    assert panels.shape == (-(-n // 16), 5, 16) and panels.flags.c_contiguous
    flat = panels.transpose(1, 0, 2).reshape(5, -1)
    np.testing.assert_array_equal(flat[:, :n], columns_t)
    assert not flat[:, n:].any()
    with pytest.raises(ValueError, match="2-d"):
        column_panels(columns_t[0])


def test_probe_lists_refuses_panels_or_outputs_that_do_not_match_the_queries():
    rng = np.random.default_rng(2)
    q = rng.standard_normal((3, 8)).astype(np.float32)
    c = rng.standard_normal((40, 8)).astype(np.float32)
    out = np.empty((3, 2), np.float32), np.empty((3, 2), np.int64)
    norms = (c * c).sum(1)
    with pytest.raises(ValueError, match="column_panels"):
        probe_lists(q, column_panels(c[:, :7].T), norms, False, *out)  # 7 dimensions, not 8
    with pytest.raises(ValueError, match="column_panels"):
        probe_lists(q, column_panels(c[:30].T), norms, False, *out)  # 30 centroids, 40 norms
    with pytest.raises(ValueError, match="dimension >= 1"):
        probe_lists(q[:, :0], column_panels(c[:, :0].T), norms, False, *out)
    with pytest.raises(ValueError, match=r"must both be \[nq, nprobe\]"):
        probe_lists(
            q, column_panels(c.T), norms, False, out[0][:2], out[1][:2]
        )  # 2 rows, 3 queries
    with pytest.raises(ValueError, match=r"must both be \[nq, nprobe\]"):
        probe_lists(q, column_panels(c.T), norms, False, out[0], out[1][:, :1])
    probe_lists(q, column_panels(c.T), norms, False, *out)
    assert out[1][:, 0].tolist() == (((q[:, None] - c[None]) ** 2).sum(-1)).argmin(1).tolist()


@pytest.mark.parametrize("nq,n", [(1, 5), (7, 64), (13, 100), (25, 1030)])
def test_products_write_the_first_n_columns_of_each_row(nq, n):
    # every block shape of the kernel: DOT_ROWS queries at a time and the rest alone, whole
    # panels and a partial last one; an out row wider than n keeps what lies past n
    rng = np.random.default_rng(nq + n)
    q = rng.integers(-3, 4, (nq + 2, 24)).astype(np.float32)  # (small integers: exact sums)
    c = rng.integers(-3, 4, (24, n)).astype(np.float32)
    out = np.full((nq, n + 3), -7.0, np.float32)
    products(q, np.int64(1), np.int64(nq + 1), column_panels(c), n, out)
    np.testing.assert_array_equal(out[:, :n], q[1 : nq + 1] @ c)
    assert (out[:, n:] == -7.0).all()


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


def _rank(bound: tuple) -> int:
    """The number of axes of a coarse bound (the rows of its coordinates' panels)."""
    return bound[1].shape[1]


def _axes(bound: tuple) -> np.ndarray:
    """A coarse bound's axes as the columns of a float32 [d, r] matrix (from their panels)."""
    panels = bound[0]
    return panels.transpose(1, 0, 2).reshape(panels.shape[1], -1)[:, : _rank(bound)]


BOUNDED = [(200, 32, 2, 2), (256, 40, 3, 3), (256, 64, 12, 4), (300, 128, 3, 8)]


@pytest.mark.parametrize("nlist,dim,nprobe,directions", BOUNDED)
def test_the_bounded_coarse_step_ranks_as_exact_distances(nlist, dim, nprobe, directions):
    # small integers: every exact distance is exact in float32, so the lists must be the
    # stable argsort's (ties to the lower list) and the scores the exact values. The
    # centroids lie near a few directions, as trained ones do, so that the bound rules most
    # of them out, but not so near that the nprobe + BOUND_SPARE least bounds always hold
    # the nearest lists (the centroids within the margin of the nprobe-th must be taken too)
    rng = np.random.default_rng(nlist + dim)
    basis = rng.integers(-2, 3, (directions, dim))
    c = rng.integers(-3, 4, (nlist, dim)) + rng.integers(-3, 4, (nlist, directions)) @ basis
    q = rng.integers(-3, 4, (50, dim)) + rng.integers(-3, 4, (50, directions)) @ basis
    c, q = c.astype(np.float32), q.astype(np.float32)
    bound = coarse_bound(c, share=0.0)  # (the kernel's answer whatever the bound's share)
    assert _rank(bound) == 8 * -(-dim // 32)
    scores, lists = np.empty((50, nprobe), np.float32), np.empty((50, nprobe), np.int64)
    coarse = Coarse(column_panels(c.T), (c * c).sum(1), *bound)
    probe_bounded(q, coarse, scores, lists)
    exact = ((q[:, None, :].astype(np.float64) - c[None]) ** 2).sum(-1)
    want = np.argsort(exact, axis=1, kind="stable")[:, :nprobe]
    np.testing.assert_array_equal(lists, want)
    np.testing.assert_array_equal(scores, np.take_along_axis(exact, want, 1))
    lower = (((q[:, None, :] - c[None]) @ _axes(bound)) ** 2).sum(-1)  # the bounds, by numpy
    assert ((lower <= np.take_along_axis(exact, want[:, -1:], 1)).sum(1) < BOUND_MOST).all()


def test_a_loose_bound_falls_back_to_the_whole_coarse_step():
    # isotropic centroids in 64 dimensions: 16 axes bound little, more than BOUND_MOST
    # centroids stay in doubt, and the query takes the full step (same lists either way)
    rng = np.random.default_rng(5)
    c = rng.integers(-1, 2, (1024, 64)).astype(np.float32)
    q = rng.integers(-1, 2, (20, 64)).astype(np.float32)
    ct, norms = column_panels(c.T), (c * c).sum(1)
    assert _rank(coarse_bound(c)) == 0  # (16 axes hold 25%: no bound by default)
    bound = coarse_bound(c, share=0.0)
    got = probe_few(q, Coarse(ct, norms, *bound), 5, False)
    want = np.empty((20, 5), np.float32), np.empty((20, 5), np.int64)
    probe_lists(q, ct, norms, False, *want)
    exact = ((q[:, None, :] - c[None]) ** 2).sum(-1)
    lower = (((q[:, None, :] - c[None]) @ _axes(bound)) ** 2).sum(-1)  # the bounds, by numpy
    fifth = np.sort(exact, 1)[:, 4:5]
    assert ((lower <= fifth).sum(1) > BOUND_MOST).all()  # (a loose bound for every query)
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[0], want[0])


def test_few_centroids_or_dimensions_take_no_bound():
    assert _rank(coarse_bound(np.ones((63, 128), np.float32))) == 0
    assert _rank(coarse_bound(np.ones((100, 16), np.float32))) == 0
    rng = np.random.default_rng(0)
    few_axes = rng.standard_normal((128, 8)) @ rng.standard_normal((8, 128))  # rank 8
    assert _rank(coarse_bound(few_axes.astype(np.float32))) == 32


def test_a_bound_on_axes_that_hold_too_little_variance_is_not_built():
    # 32 axes of 128 hold about 75% of the variance here: under the share, no bound;
    # asked for a lower share, the bound
    rng = np.random.default_rng(1)
    scale = np.where(np.arange(128) < 32, 3.0, 1.0)
    c = (rng.standard_normal((512, 128)) * scale).astype(np.float32)
    cov = np.linalg.eigvalsh(np.cov(c.T.astype(np.float64)))[::-1]
    held = cov[:32].sum() / cov.sum()
    assert 0.7 < held < BOUND_SHARE
    assert _rank(coarse_bound(c)) == 0
    assert _rank(coarse_bound(c, share=held - 0.01)) == 32


@pytest.mark.parametrize("description", ["IVF512,Flat", "IVF512,PQ16x4fs,RFlat", "IVF512,SQ8",
                                         "IVF512(soar),Flat"])  # fmt: skip
def test_a_bounded_coarse_step_probes_the_torch_paths_lists(description):
    # anisotropic vectors (as embeddings are): the coarse step of the lean and the general
    # paths rules most lists out by their bound, and still probes the lists the torch path's
    # products pick; the general path's multiplies nothing with torch (whose OpenMP threads
    # would then spin on the cores its scan needs)
    rng = np.random.default_rng(3)
    scale = 0.93 ** np.arange(64, dtype=np.float32)
    x = rng.standard_normal((12000, 64), dtype=np.float32) * scale
    q = rng.standard_normal((200, 64), dtype=np.float32) * scale
    index = vq.index_factory(64, description)
    index.train(x)
    index.add(x)
    ivf = index.index if description.endswith("RFlat") else index
    assert _rank(ivf._coarse_bound()) == 16
    c = ivf.quantizer.codebook.float()
    for nprobe in (1, 4, 12):  # (at least BOUND_RATIO centroids for each of nprobe + 4)
        want_lists = probe(torch.from_numpy(q), c, (c * c).sum(1), nprobe, "l2")[1]
        with mock.patch.object(torch, "mm", side_effect=AssertionError("torch.mm")):
            lists = ivf.nearest_lists(torch.from_numpy(q), nprobe)[1]
            want_dist, want_ids = _general(index, q, 10, nprobe=nprobe)
        np.testing.assert_array_equal(lists.numpy(), want_lists.numpy())
        dist, ids = index.search(q, 10, nprobe=nprobe)
        np.testing.assert_array_equal(ids, want_ids)
        np.testing.assert_allclose(dist, want_dist, rtol=1e-4, atol=1e-3)
        one_dist, one_ids = index.search(q[:5], 10, nprobe=nprobe)  # (the calling thread)
        np.testing.assert_array_equal(one_ids, want_ids[:5])
