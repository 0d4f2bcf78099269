import numpy as np
import pytest
import torch

import vq
from vq.distances import nearest, nearest_static, unit_rows_np

faiss = pytest.importorskip("faiss")


def sq_error(x, centroids):
    c = torch.as_tensor(np.asarray(centroids, dtype=np.float32))
    return float(nearest(torch.as_tensor(np.asarray(x)), c).distances.double().sum())


def test_assignment_equals_faiss_with_same_centroids(blobs):
    km = faiss.Kmeans(32, 64, niter=10, seed=3)
    km.train(blobs)
    _, ref = km.index.search(blobs, 1)
    ours = nearest(torch.from_numpy(blobs), torch.from_numpy(km.centroids))
    assert torch.equal(ours.indices, torch.from_numpy(ref[:, 0]))


def test_numba_and_torch_paths_agree(blobs):
    x = torch.from_numpy(blobs)
    c = x[:50].clone()
    a, b = nearest(x, c), nearest_static(x, c)
    assert torch.equal(a.indices, b.indices)
    torch.testing.assert_close(a.distances, b.distances, rtol=1e-4, atol=1e-3)


def test_ties_go_to_lowest_index():
    x = torch.zeros(5, 4)
    c = torch.zeros(3, 4)
    assert nearest(x, c).indices.tolist() == [0] * 5


@pytest.mark.parametrize("init", ["k-means++", "random"])
def test_objective_within_one_percent_of_faiss(blobs, init):
    ref = faiss.Kmeans(32, 64, niter=25, seed=1234, max_points_per_centroid=256)
    ref.train(blobs)
    ours = vq.kmeans(blobs, 64, niter=25, init=init, seed=1234)
    assert ours.inertia == pytest.approx(sq_error(blobs, ours.centroids), rel=1e-6)
    assert ours.inertia <= 1.01 * sq_error(blobs, ref.centroids)


def test_result_types_and_shapes(blobs):
    r = vq.kmeans(blobs, 16, niter=5)
    assert isinstance(r.centroids, np.ndarray) and r.centroids.shape == (16, 32)
    assert r.centroids.dtype == np.float32 and r.assignments.dtype == np.int64
    assert r.assignments.shape == (10_000,) and r.objective.shape == (5,)
    assert np.all(np.diff(r.objective) <= 1e-3 * r.objective[0])  # Lloyd never increases it
    t = vq.kmeans(torch.from_numpy(blobs), 16, niter=5)
    assert isinstance(t.centroids, torch.Tensor)
    np.testing.assert_array_equal(t.centroids.numpy(), r.centroids)


def test_deterministic_for_a_seed(blobs):
    a = vq.kmeans(blobs, 32, niter=5, seed=7)
    b = vq.kmeans(blobs, 32, niter=5, seed=7)
    c = vq.kmeans(blobs, 32, niter=5, seed=8)
    np.testing.assert_array_equal(a.centroids, b.centroids)
    assert not np.array_equal(a.centroids, c.centroids)


def test_subsampling_trains_on_k_times_max_points(blobs):
    r = vq.kmeans(blobs, 10, niter=3, max_points_per_centroid=50)
    # the objective is summed over the 500-vector sample, the inertia over all 10k vectors
    assert r.objective[-1] < 0.1 * r.inertia
    assert r.assignments.shape == (10_000,)


def test_empty_clusters_are_split():
    # 20 distinct points, each repeated: random init picks duplicates, leaving clusters empty
    rng = np.random.default_rng(0)
    base = rng.standard_normal((20, 8)).astype(np.float32)
    x = np.repeat(base, 50, axis=0)
    r = vq.kmeans(x, 20, niter=20, init="random", seed=0)
    counts = np.bincount(r.assignments, minlength=20)
    assert (counts > 0).all()
    assert r.inertia < 1e-6 * len(x)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_low_and_high_precision_input(blobs, dtype):
    x = torch.from_numpy(blobs).to(dtype)
    r = vq.kmeans(x, 16, niter=5)
    ref = vq.kmeans(blobs, 16, niter=5)
    assert r.centroids.dtype == torch.float32
    assert r.inertia == pytest.approx(ref.inertia, rel=0.02)


def test_non_contiguous_input(blobs):
    x = np.asfortranarray(blobs)
    a = vq.kmeans(x, 8, niter=3)
    b = vq.kmeans(np.ascontiguousarray(blobs), 8, niter=3)
    np.testing.assert_allclose(a.centroids, b.centroids, rtol=1e-5, atol=1e-5)


def test_lbg_power_of_two_and_not(blobs):
    for k in (32, 48, 1):
        r = vq.lbg(blobs, k, niter=8)
        assert r.centroids.shape == (k, 32)
        assert len(np.unique(r.assignments)) == k
    r64 = vq.lbg(blobs, 64, niter=10)
    km = vq.kmeans(blobs, 64, niter=25, init="random")
    assert r64.inertia <= 1.05 * km.inertia
    np.testing.assert_array_equal(r64.centroids, vq.lbg(blobs, 64, niter=10).centroids)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda x: vq.kmeans(x[:, :, None], 4), "expected a 2-D array"),
        (lambda x: vq.kmeans(x[:0], 4), "empty training set"),
        (lambda x: vq.kmeans(x[:3], 4), "at least k=4 training vectors, got 3"),
        (lambda x: vq.kmeans(x, 0), "k must be a positive"),
        (lambda x: vq.kmeans(x, 4, init="foo"), "init must be"),
        (lambda x: vq.kmeans(x, 4, niter=-1), "niter must be >= 0"),
        (lambda x: vq.lbg(x, 4, epsilon=0), "epsilon must be positive"),
        (lambda x: vq.lbg(x[:2], 4), "at least k=4"),
    ],
)
def test_bad_input_value_errors(blobs, call, match):
    with pytest.raises(ValueError, match=match):
        call(blobs)


def test_nan_and_inf_are_rejected_with_count_and_row(blobs):
    x = blobs.copy()
    x[7, 3] = np.nan
    x[9, 0] = np.inf
    with pytest.raises(ValueError, match=r"2 NaN/Inf values, first in row 7"):
        vq.kmeans(x, 4)


def test_integer_input_is_a_type_error(blobs):
    with pytest.raises(TypeError, match="expected floating-point vectors"):
        vq.kmeans(blobs.astype(np.int32), 4)
    with pytest.raises(TypeError, match="numpy array or torch tensor"):
        vq.kmeans(blobs.tolist(), 4)


def test_bounded_lloyd_gives_plain_lloyd_iterations(blobs, monkeypatch):
    import vq.clustering.lloyd

    bounded = vq.kmeans(blobs, 64, niter=15, init="random", seed=4)
    monkeypatch.setattr(vq.clustering.lloyd, "_BOUNDED", False)
    plain = vq.kmeans(blobs, 64, niter=15, init="random", seed=4)
    np.testing.assert_array_equal(bounded.assignments, plain.assignments)
    np.testing.assert_allclose(bounded.centroids, plain.centroids, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(bounded.objective, plain.objective, rtol=1e-6)


def test_second_nearest_distance(blobs):
    x = torch.from_numpy(blobs[:500])
    c = x[:40].clone()
    full = ((x[:, None, :] - c[None]) ** 2).sum(-1)
    expected = full.sort(dim=1).values[:, 1]
    res = nearest(x, c, second=True)
    torch.testing.assert_close(res.second, expected, rtol=1e-4, atol=1e-3)
    from vq._cpu import torch_only

    with torch_only():
        torch.testing.assert_close(
            nearest(x, c, second=True).second, expected, rtol=1e-4, atol=1e-3
        )


def test_verbose_shows_progress(blobs, capsys):
    vq.kmeans(blobs, 8, niter=3, verbose=True)
    assert "k-means k=8" in capsys.readouterr().err


def test_fewer_distinct_vectors_than_k_warns():
    x = np.repeat(np.eye(3, 4, dtype=np.float32), 20, axis=0)
    with pytest.warns(RuntimeWarning, match="7 of 10 clusters are empty"):
        r = vq.kmeans(x, 10, niter=5)
    assert r.inertia < 1e-3  # split copies keep their ±1/1024 perturbation


def test_autograd_input_is_detached(blobs):
    x = torch.from_numpy(blobs[:2000]).clone().requires_grad_()
    r = vq.kmeans(x, 8, niter=2)
    assert not r.centroids.requires_grad
    ref = vq.kmeans(blobs[:2000], 8, niter=2)
    np.testing.assert_array_equal(r.centroids.numpy(), ref.centroids)


@pytest.mark.parametrize("most", [64, 16])
def test_ivf_coarse_training_seeds_by_kmeanspp_up_to_the_limit_and_random_rows_above(
    blobs, monkeypatch, most
):
    from vq.index.ivf import ivf_index as ivf

    monkeypatch.setattr(ivf, "KMEANSPP_MAX_NLIST", most)
    x = torch.as_tensor(np.asarray(blobs[:4000]))
    index = vq.IVFFlat(x.shape[1], nlist=32, coarse_niter=3, seed=7)
    index.train(x)
    init = "k-means++" if 32 <= most else "random"
    expected = vq.kmeans(x, 32, niter=3, init=init, seed=7).centroids
    torch.testing.assert_close(index.quantizer.codebook, expected, rtol=0, atol=0)


def cosine_loss(x, centroids):
    """Σ (1 - the largest cosine of each row with a centroid), for unit-norm rows."""
    c = unit_rows_np(np.asarray(centroids, dtype=np.float32))
    return float((1.0 - (x @ c.T).max(axis=1)).astype(np.float64).sum())


def test_spherical_centroids_are_unit_norm_and_as_good_as_faiss(blobs):
    x = unit_rows_np(blobs)
    ours = vq.kmeans(x, 64, niter=20, seed=5, spherical=True)
    np.testing.assert_allclose(np.linalg.norm(ours.centroids, axis=1), 1.0, rtol=1e-5)
    ref = faiss.Kmeans(32, 64, niter=20, seed=5, spherical=True)
    ref.train(x)
    assert cosine_loss(x, ours.centroids) <= 1.01 * cosine_loss(x, ref.centroids)
    plain = vq.kmeans(x, 64, niter=20, seed=5)
    assert np.linalg.norm(plain.centroids, axis=1).max() < 0.999  # means of unit rows: shorter
    with pytest.raises(TypeError, match="spherical must be True or False"):
        vq.kmeans(x, 4, spherical="yes")


def test_spherical_lloyd_loops_agree(blobs, monkeypatch):
    import vq.clustering.lloyd

    x = unit_rows_np(blobs)
    fused = vq.kmeans(x, 64, niter=12, init="random", seed=4, spherical=True)  # 10k rows: fused
    monkeypatch.setattr(vq.clustering.lloyd, "_FUSED_MAX_N", 0)
    bounded = vq.kmeans(x, 64, niter=12, init="random", seed=4, spherical=True)
    monkeypatch.setattr(vq.clustering.lloyd, "_BOUNDED", False)
    plain = vq.kmeans(x, 64, niter=12, init="random", seed=4, spherical=True)
    for other in (bounded, plain):
        np.testing.assert_array_equal(fused.assignments, other.assignments)
        np.testing.assert_allclose(fused.centroids, other.centroids, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(fused.objective, other.objective, rtol=1e-5)
