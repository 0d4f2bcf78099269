"""IVF-Flat sketches (``IVFFlat(sketch=True)``, ``"IVF…,Flat(sketch)"``): the integer products
of the codes, the bound every exact distance respects, and scans that skip rows by it with the
same results as scans that do not, whatever the metric, filter, spill or path."""

import numpy as np
import pytest
import torch
from numba import njit

import vq
from vq.datasets import clustered_vectors
from vq.index.ivf.sketches import sketch_ranges, sketch_rows
from vq.kernels.exact.sketch import (
    centre_distance,
    dots_intrinsic,
    sketch_dot,
    sketch_dots4,
    sketch_lower,
    sketch_prepare,
    sketch_width,
)

DIM = 40  # not a multiple of 32: codes padded to 64 bytes


def _products(dot, dots4):
    @njit
    def products(q, codes):
        n = codes.shape[0]
        one, four = np.empty(n, np.int64), np.empty(n, np.int64)
        for i in range(n):
            one[i] = dot(q, codes, i)
        for i in range(0, n - 3, 4):
            a, b, c, d = dots4(q, codes, i, i + 1, i + 2, i + 3)
            four[i], four[i + 1], four[i + 2], four[i + 3] = a, b, c, d
        return one, four

    return products


_DOTS = _products(sketch_dot, sketch_dots4)  # (as this CPU allows: AVX2 where it has it)
_GENERIC = _products(dots_intrinsic(1, False), dots_intrinsic(4, False))


@pytest.mark.parametrize("generic", [False, True])
@pytest.mark.parametrize("width", [32, 64, 160])
def test_sketch_products_equal_the_integer_dot_products(width, generic):
    rng = np.random.default_rng(width)
    codes = rng.integers(0, 128, size=(12, width)).astype(np.uint8)
    codes[0] = 127  # the largest products: no int16 pair saturates
    q = rng.integers(-127, 128, size=width).astype(np.int8)
    q[: width // 2] = -127
    want = codes.astype(np.int64) @ q.astype(np.int64)
    one, four = (_GENERIC if generic else _DOTS)(q, codes)
    np.testing.assert_array_equal(one, want)
    np.testing.assert_array_equal(four, want)


@njit
def _lowers(queries, codes, factors, low, step, centroids, lists, inner_product):
    nq, n = queries.shape[0], codes.shape[0]
    qc = np.zeros(codes.shape[1], np.int8)
    margin = np.float32((queries.shape[1] + 32) * 2.0**-20)
    out = np.empty((nq, n), np.float32)
    for q in range(nq):
        prepared = sketch_prepare(queries[q], low, step, qc)
        for i in range(n):
            rho = centre_distance(queries[q], centroids, lists[i])
            dot = sketch_dot(qc, codes, i)
            out[q, i] = sketch_lower(dot, factors, i, prepared, rho, margin, inner_product)
    return out


@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_the_sketch_bound_never_exceeds_an_exact_distance(metric):
    rng = np.random.default_rng(3)
    # dimensions of very different scales, rows beyond the trained ranges (clipped codes)
    scales = np.geomspace(30.0, 0.01, DIM).astype(np.float32)
    train = rng.normal(size=(500, DIM)).astype(np.float32) * scales
    x = rng.normal(size=(300, DIM)).astype(np.float32) * scales * 1.5
    q = rng.normal(size=(40, DIM)).astype(np.float32) * scales
    centroids = train[:8].copy()
    lists = rng.integers(0, 8, size=300)
    low, step = sketch_ranges(torch.from_numpy(train))
    codes, factors = sketch_rows(torch.from_numpy(x), torch.from_numpy(centroids[lists]), low, step)
    assert codes.shape == (300, sketch_width(DIM)) and int(codes.max()) <= 127
    lower = _lowers(q, codes.numpy(), factors.numpy(), low.numpy(), step.numpy(), centroids,
                    lists, metric == "ip")  # fmt: skip
    q64, x64 = q.astype(np.float64), x.astype(np.float64)
    if metric == "ip":
        exact = -(q64 @ x64.T)
    else:
        exact = (q64**2).sum(1)[:, None] + (x64**2).sum(1)[None] - 2 * q64 @ x64.T
    assert (lower <= exact).all(), float((lower - exact).max())
    # and it is a bound worth having: most rows' lower bounds lie near their distances
    spread = exact.max(1, keepdims=True) - exact.min(1, keepdims=True)
    assert np.median((exact - lower) / spread) < 0.5


@pytest.fixture(scope="module", name="data")
def fixture_data():
    x = clustered_vectors(4000, DIM, n_clusters=40, seed=5)
    x[:, :8] *= 6.0  # dimensions of unequal scales
    return x


def _pair(data, description, metric):
    out = []
    for kind in ("Flat", "Flat(sketch)"):
        index = vq.index_factory(DIM, description.format(kind), metric)
        index.coarse_niter = 4
        index.train(data[:2000])
        index.add(data)
        out.append(index)
    return out


@pytest.mark.parametrize("description", ["IVF32,{}", "IVF32(soar),{}"])
@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_sketched_scans_give_the_results_of_unsketched_ones(data, description, metric):
    plain, sketched = _pair(data, description, metric)
    assert sketched.sketch and not plain.sketch
    rng = np.random.default_rng(7)
    q = data[rng.choice(len(data), 300, replace=False)] + 0.05
    many = np.repeat(q, 17, axis=0)[:5000]  # more than the lean path takes: the general path
    allowed = rng.choice(len(data), 1500, replace=False)
    for queries in (q[:3], q, many):
        for k, nprobe in ((1, 1), (10, 3), (64, 8)):
            want = plain.search(queries, k, nprobe=nprobe)
            got = sketched.search(queries, k, nprobe=nprobe)
            np.testing.assert_array_equal(got[1], want[1])
            np.testing.assert_array_equal(got[0], want[0])
    want = plain.search(q, 10, nprobe=4, allowed=allowed)
    got = sketched.search(q, 10, nprobe=4, allowed=allowed)
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[0], want[0])


def test_sketches_follow_adds_removals_and_a_save(data, tmp_path):
    plain, sketched = _pair(data, "IVF32,{}", "l2")
    far = data[:200] * 3.0  # beyond the trained ranges: clipped codes, looser bounds
    for index in (plain, sketched):
        index.add(far)
        index.remove_ids(np.arange(0, 4000, 3))
    assert sketched.consistency_problem() is None
    assert sketched.sketches.shape == (sketched.n_rows, sketch_width(DIM))
    q = np.concatenate([data[1:60], far[:20]]) + 0.01
    want = plain.search(q, 10, nprobe=5)
    np.testing.assert_array_equal(sketched.search(q, 10, nprobe=5)[1], want[1])
    sketched.save(tmp_path / "s.vq")
    loaded = vq.load_index(tmp_path / "s.vq")
    assert loaded.config() == sketched.config() and loaded.config()["sketch"] is True
    got = loaded.search(q, 10, nprobe=5)
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[0], want[0])
    plain.save(tmp_path / "p.vq")
    extra = loaded.nbytes() - vq.load_index(tmp_path / "p.vq").nbytes()
    assert extra >= sketched.n_rows * (sketch_width(DIM) + 16)


def test_sketches_are_tested_only_where_the_heads_do_not_prune():
    rng = np.random.default_rng(9)
    x = rng.normal(size=(3000, 64)).astype(np.float32)
    spread = vq.index_factory(64, "IVF16,Flat(sketch)")
    headed = vq.index_factory(64, "IVF16,Flat(sketch)")
    for index, data in ((spread, x), (headed, x * np.r_[np.full(16, 10.0), np.ones(48)])):
        index.coarse_niter = 3
        index.train(data.astype(np.float32))
        index.add(data.astype(np.float32))
    assert not spread.prunes() and spread.scans_sketches()
    assert headed.prunes() and not headed.scans_sketches()  # (its heads prune already)
    assert not vq.index_factory(64, "IVF16,Flat").scans_sketches()
