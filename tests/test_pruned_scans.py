"""Exact distances in two parts (vq.kernels.common.rowdist) and the scans that skip a row's tail:
the same distances alone, four at a time or as head + tail, and the same results with pruning as
without; ``vq.PCA`` (faiss's PCAMatrix) in front of an index, where pruning pays."""

import numpy as np
import pytest
import torch
from numba import njit

import vq
from vq.index.ivf.ivfflat import head_share
from vq.kernels.common.bundles import FlatLists, TopK
from vq.kernels.common.rowdist import head_dims, ip_row, l2_heads4, l2_row, l2_tail
from vq.kernels.exact.exact_scans import exact_distance
from vq.kernels.exact.ivf_flat import NO_ROW_IDS, ivf_flat_scan

faiss = pytest.importorskip("faiss")


@njit
def _alone(x, v, out, ip):
    for i in range(v.shape[0]):
        out[i] = ip_row(x, v, i) if ip else l2_row(x, v, i)


@njit
def _by_parts(x, v, heads, whole):
    n = v.shape[0]
    for i in range(0, n, 4):
        four = l2_heads4(x, v, i, min(i + 1, n - 1), min(i + 2, n - 1), min(i + 3, n - 1))
        for r in range(min(4, n - i)):
            heads[i + r] = four[r]
            whole[i + r] = four[r] + l2_tail(x, v, i + r)


@njit
def _exact(x, v, out, ip):
    for i in range(v.shape[0]):
        out[i] = exact_distance(x, v, i, ip)


@pytest.mark.parametrize("d", [1, 7, 8, 9, 31, 63, 64, 65, 100, 128, 129, 384])
def test_a_row_s_distance_is_the_same_alone_four_at_a_time_and_by_parts(d):
    rng = np.random.default_rng(d)
    v = rng.standard_normal((11, d)).astype(np.float32)
    x = rng.standard_normal(d).astype(np.float32)
    alone, heads, whole, exact = (np.empty(11, np.float32) for _ in range(4))
    _alone(x, v, alone, False)
    _by_parts(x, v, heads, whole)
    _exact(x, v, exact, False)
    np.testing.assert_array_equal(whole, alone)  # bit for bit
    np.testing.assert_array_equal(exact, alone)
    want = ((v.astype(np.float64) - x) ** 2).sum(1)
    np.testing.assert_allclose(alone, want, rtol=1e-5)
    h = head_dims(d)
    np.testing.assert_allclose(heads, ((v[:, :h] - x[:h]).astype(np.float64) ** 2).sum(1),
                               rtol=1e-5, atol=1e-6)  # fmt: skip
    assert np.all(heads <= alone)  # a head never exceeds its distance
    _alone(x, v, alone, True)
    np.testing.assert_allclose(alone, -(v.astype(np.float64) @ x), rtol=1e-5, atol=1e-5)


def test_the_head_is_a_quarter_of_the_dimensions_from_64():
    assert [head_dims(d) for d in (32, 63, 64, 100, 128, 384)] == [32, 63, 16, 32, 32, 96]


def _lists(rng, n, sizes):
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    assert offsets[-1] == n
    return offsets


@pytest.mark.parametrize("k", [1, 5, 10])
def test_pruned_ivf_flat_scans_return_what_unpruned_ones_do(k):
    # principal-axis-like data (variance falling along the dimensions), integer-valued so that
    # many distances tie; lists of every length 0-9 and longer, some probes skipped (-1)
    rng = np.random.default_rng(k)
    d, sizes = 96, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 23, 40, 1, 0, 17]
    n = sum(sizes)
    scale = np.linspace(6, 0.5, d)
    x = np.round(rng.standard_normal((n, d)) * scale).astype(np.float32)
    q = np.round(rng.standard_normal((40, d)) * scale).astype(np.float32)
    q[:5] = x[rng.integers(0, n, 5)]  # queries equal to stored rows: distance 0
    offsets = _lists(rng, n, sizes)
    probes = np.argsort(rng.random((40, len(sizes))), axis=1)[:, :6]  # distinct lists
    probes[::7, 2] = -1
    for allowed in (np.zeros(0, np.uint8), (rng.random(n) < 0.7).astype(np.uint8)):
        got = [np.empty((40, k), np.float32), np.empty((40, k), np.int64)]
        want = [np.empty((40, k), np.float32), np.empty((40, k), np.int64)]
        for out, prune in ((want, False), (got, True)):
            lists = FlatLists(x, offsets, prune, NO_ROW_IDS, None)
            ivf_flat_scan(q, lists, probes, allowed, False, TopK(*out))
        np.testing.assert_array_equal(got[1], want[1])
        np.testing.assert_array_equal(got[0], want[0])
        # and both are the brute-force answer over the probed, allowed rows
        for i in range(40):
            rows = [r for lst in probes[i] if lst >= 0 for r in range(*offsets[lst : lst + 2])]
            rows = [r for r in rows if allowed.size == 0 or allowed[r]]
            dist = ((x[rows].astype(np.float64) - q[i]) ** 2).sum(1)
            best = np.sort(dist)[:k]
            np.testing.assert_allclose(want[0][i, : len(best)], best, rtol=1e-6)


def test_an_ivf_flat_index_prunes_behind_a_pca_and_not_on_isotropic_vectors():
    rng = np.random.default_rng(0)
    iso = rng.standard_normal((4000, 64)).astype(np.float32)
    skewed = (iso * np.geomspace(8, 0.1, 64)) @ np.linalg.qr(rng.standard_normal((64, 64)))[0]
    skewed = skewed.astype(np.float32)
    plain = vq.index_factory(64, "IVF16,Flat")
    plain.train(iso)
    assert not plain.prunes() and head_share(plain.quantizer.codebook) < 0.4
    behind = vq.index_factory(64, "PCA64,IVF16,Flat")
    behind.train(skewed)
    assert behind.index.prunes()
    ip = vq.index_factory(64, "PCA64,IVF16,Flat", metric="ip")
    ip.train(skewed)
    assert not ip.index.prunes()  # (inner products are not monotone in their terms)


@pytest.fixture(scope="module")
def skewed():
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((3000, 48)) * np.geomspace(5, 0.05, 48) + 3.0).astype(np.float32)
    x = (x @ np.linalg.qr(rng.standard_normal((48, 48)))[0]).astype(np.float32)
    return x, (x[:60] + rng.standard_normal((60, 48)).astype(np.float32) * 0.05)


def test_pca_learns_the_principal_axes_by_decreasing_variance(skewed):
    x, _ = skewed
    pca = vq.PCA(48, 20).fit(x)
    r = pca.rotation.double().numpy()
    np.testing.assert_allclose(r @ r.T, np.eye(20), atol=1e-5)
    evals = np.linalg.eigvalsh(np.cov(x.astype(np.float64).T))[::-1][:20]
    np.testing.assert_allclose(pca.eigenvalues.numpy(), evals, rtol=1e-4)
    np.testing.assert_allclose(pca.mean.numpy(), x.mean(0), atol=1e-5)
    y = pca.rotate(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(y.var(0, ddof=1), evals, rtol=1e-3)
    full = vq.PCA(48).fit(x)  # a rotation: distances kept
    z = full.rotate(torch.from_numpy(x[:50])).numpy()
    d_in = ((x[:50, None] - x[None, :50]) ** 2).sum(-1)
    np.testing.assert_allclose(((z[:, None] - z[None]) ** 2).sum(-1), d_in, rtol=1e-4, atol=1e-3)


def test_pca_transforms_as_faiss_pcamatrix_does_both_ways(skewed):
    x, q = skewed
    pca = vq.PCA(48, 24).fit(x)
    matrix = pca.to_faiss()
    want = pca.rotate(torch.from_numpy(q)).numpy()
    np.testing.assert_allclose(matrix.apply(q), want, atol=1e-4)
    trained = faiss.PCAMatrix(48, 24)
    trained.train(x)
    back = vq.PCA.from_faiss(trained)
    np.testing.assert_allclose(back.rotate(torch.from_numpy(q)).numpy(), trained.apply(q),
                               atol=1e-4)  # fmt: skip
    whitening = faiss.PCAMatrix(48, 24, -0.5)
    whitening.train(x)
    with pytest.raises(ValueError, match="eigen_power"):
        vq.PCA.from_faiss(whitening)


@pytest.mark.parametrize("desc", ["PCA48,IVF16,Flat", "PCA24,IVF16,Flat,RFlat", "PCA32,Flat"])
def test_a_pca_index_gives_faiss_s_results_from_the_same_parameters(skewed, desc):
    x, q = skewed
    ours = vq.index_factory(48, desc)
    ours.train(x)
    ours.add(x)
    params = {"nprobe": 4} if "IVF" in desc else {}
    if "RFlat" in desc:
        params["k_factor"] = 3
    d, i = ours.search(q, 10, **params)
    theirs = ours.to_faiss()
    space = faiss.ParameterSpace()
    for name, value in params.items():
        space.set_index_parameter(theirs, "k_factor_rf" if name == "k_factor" else name, value)
    fd, fi = theirs.search(q, 10)
    assert (fi == i).mean() > 0.99  # (ties aside)
    np.testing.assert_allclose(fd, d, rtol=1e-4, atol=1e-3)
    again = vq.index.from_faiss(theirs)
    np.testing.assert_array_equal(again.search(q, 10, **params)[1], i)


def test_a_pca_index_saves_loads_and_searches_alike_on_every_path(skewed, tmp_path):
    x, q = skewed
    index = vq.index_factory(48, "PCA48,IVF16,Flat")
    index.train(x)
    index.add(x)
    d, i = index.search(q, 10, nprobe=5)
    path = tmp_path / "pca.vq"
    index.save(path)
    loaded = vq.load_index(path)
    ld, li = loaded.search(q, 10, nprobe=5)
    np.testing.assert_array_equal(li, i)
    np.testing.assert_array_equal(ld, d)
    one = np.stack([index.search(q[j : j + 1], 10, nprobe=5)[1][0] for j in range(8)])
    np.testing.assert_array_equal(one, i[:8])  # the lean path of a single query
    sd, si = index.searcher(10, nprobe=5).search(torch.from_numpy(q), 10)
    assert (si.numpy() == i).mean() > 0.99  # the static torch path (ties aside)
    np.testing.assert_allclose(index.reconstruct(np.arange(5)), x[:5], atol=1e-4)


def test_the_factory_refuses_a_pca_wider_than_the_vectors():
    with pytest.raises(ValueError, match="PCA200"):
        vq.index_factory(128, "PCA200,IVF16,Flat")


@pytest.mark.parametrize("d_out", [7, 16, 48, 100])
def test_project_range_maps_queries_as_numpy_does(d_out):
    from vq.kernels.exact.coarse_probe import column_panels
    from vq.kernels.exact.lean_scans import project_range

    rng = np.random.default_rng(d_out)
    q = rng.standard_normal((37, 48)).astype(np.float32)
    rt = rng.standard_normal((48, d_out)).astype(np.float32)
    mean = rng.standard_normal(48).astype(np.float32)
    out = np.full((37, d_out), np.nan, np.float32)
    panels = column_panels(rt)
    project_range(0, 20, q, panels, mean, out)
    project_range(20, 37, q, panels, mean, out)
    want = (q.astype(np.float64) - mean) @ rt
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-4)
