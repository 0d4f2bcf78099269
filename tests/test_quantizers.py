import numpy as np
import pytest
import torch

import vq

faiss = pytest.importorskip("faiss")


def errors(x, x_hat):
    return ((np.asarray(x, np.float64) - np.asarray(x_hat, np.float64)) ** 2).sum(1)


def mse(x, x_hat):
    return float(errors(x, x_hat).mean())


def assert_same_codes(ours, ref, err_ours, err_ref):
    """Codes equal, ties aside: where they differ both encodings must be equally good."""
    ours, ref = np.asarray(ours), np.asarray(ref)
    differ = (ours != ref).any(axis=-1) if ours.ndim > 1 else ours != ref
    assert differ.mean() < 1e-3
    np.testing.assert_allclose(err_ours[differ], err_ref[differ], rtol=1e-5, atol=1e-6)


def loaded(module, **buffers):
    module.load_state_dict({"trained": torch.tensor(True), **buffers})
    return module


# --- same codebooks => same codes -------------------------------------------------------------
def test_pq_faiss_codebooks_give_faiss_codes(blobs):
    fpq = faiss.ProductQuantizer(32, 8, 8)
    fpq.train(blobs)
    cb = torch.from_numpy(faiss.vector_to_array(fpq.centroids).reshape(8, 256, 4))
    pq = loaded(vq.ProductQuantizer(32, 8), codebooks=cb)
    ref = fpq.compute_codes(blobs)
    codes = pq.encode(blobs)
    assert codes.dtype == np.uint8 and codes.shape == (10_000, 8)
    assert_same_codes(codes, ref, errors(blobs, pq.decode(codes)), errors(blobs, fpq.decode(ref)))
    np.testing.assert_allclose(pq.decode(ref), fpq.decode(ref), rtol=1e-5, atol=1e-5)


def test_our_pq_codebooks_in_faiss_give_our_codes(blobs):
    pq = vq.ProductQuantizer(32, 8, niter=10).fit(blobs)
    fpq = faiss.ProductQuantizer(32, 8, 8)
    faiss.copy_array_to_vector(pq.codebooks.numpy().ravel(), fpq.centroids)
    codes, ref = pq.encode(blobs), fpq.compute_codes(blobs)
    assert_same_codes(codes, ref, errors(blobs, pq.decode(codes)), errors(blobs, fpq.decode(ref)))
    np.testing.assert_allclose(fpq.decode(codes), pq.decode(codes), rtol=1e-5, atol=1e-5)


def test_greedy_rvq_with_faiss_codebooks_gives_faiss_codes(blobs):
    frq = faiss.ResidualQuantizer(32, 3, 8)
    frq.max_beam_size = 1
    frq.train(blobs)
    cb = torch.from_numpy(faiss.vector_to_array(frq.codebooks).reshape(3, 256, 32))
    rq = loaded(vq.ResidualVQ(32, 3, 256), codebooks=cb)
    ref = frq.compute_codes(blobs)  # 8-bit codes: one byte per stage
    codes = rq.encode(blobs)
    assert_same_codes(codes, ref, errors(blobs, rq.decode(codes)), errors(blobs, frq.decode(ref)))
    np.testing.assert_allclose(rq.decode(ref), frq.decode(ref), rtol=1e-5, atol=1e-5)


def test_our_rvq_codebooks_in_faiss_give_our_codes(blobs):
    rq = vq.ResidualVQ(32, 3, 256, niter=10).fit(blobs)
    frq = faiss.ResidualQuantizer(32, 3, 8)
    frq.max_beam_size = 1
    faiss.copy_array_to_vector(rq.codebooks.numpy().ravel(), frq.codebooks)
    frq.is_trained = True
    codes, ref = rq.encode(blobs), frq.compute_codes(blobs)
    assert_same_codes(codes, ref, errors(blobs, rq.decode(codes)), errors(blobs, frq.decode(ref)))


def test_vector_quantizer_with_faiss_centroids_assigns_like_faiss(blobs):
    km = faiss.Kmeans(32, 64, niter=10, seed=5)
    km.train(blobs)
    q = loaded(vq.VectorQuantizer(32, 64), codebook=torch.from_numpy(km.centroids))
    _, ref = km.index.search(blobs, 1)
    np.testing.assert_array_equal(q.encode(blobs), ref[:, 0])
    np.testing.assert_allclose(q.decode(ref[:, 0]), km.centroids[ref[:, 0]], rtol=1e-6)


# --- trained independently => same quality ---------------------------------------------------
def test_pq_mse_within_one_percent_of_faiss(blobs):
    fpq = faiss.ProductQuantizer(32, 8, 8)
    fpq.train(blobs)
    ref = mse(blobs, fpq.decode(fpq.compute_codes(blobs)))
    pq = vq.ProductQuantizer(32, 8).fit(blobs)
    assert mse(blobs, pq.decode(pq.encode(blobs))) <= 1.01 * ref


def test_opq_mse_within_one_percent_of_faiss(aniso):
    opq_f = faiss.OPQMatrix(32, 8)  # at vq's alternations (faiss's 50: 34 s on one Zen 1 core)
    opq_f.niter, opq_f.niter_pq, opq_f.niter_pq_0 = 10, 4, 20
    pq_f = faiss.ProductQuantizer(32, 8, 8)
    opq_f.train(aniso)
    y = opq_f.apply(aniso)
    pq_f.train(y)
    ref = mse(aniso, opq_f.reverse_transform(pq_f.decode(pq_f.compute_codes(y))))
    opq = vq.OPQ(32, 8, niter=10).fit(aniso)
    assert mse(aniso, opq.decode(opq.encode(aniso))) <= 1.01 * ref


@pytest.mark.parametrize("beam", [1, 4])
def test_rvq_mse_within_two_percent_of_faiss(blobs, beam):
    frq = faiss.ResidualQuantizer(32, 4, 6)
    frq.max_beam_size = beam
    frq.train(blobs)
    ref = mse(blobs, frq.decode(frq.compute_codes(blobs)))
    rq = vq.ResidualVQ(32, 4, 64, beam_size=beam).fit(blobs)
    assert mse(blobs, rq.decode(rq.encode(blobs))) <= 1.02 * ref


# --- OPQ ---------------------------------------------------------------------------------------
def test_opq_rotation_is_orthogonal_and_helps(aniso):
    opq = vq.OPQ(32, 8, niter=5).fit(aniso)
    r = opq.rotation
    torch.testing.assert_close(r @ r.T, torch.eye(32), atol=1e-4, rtol=0)
    torch.testing.assert_close(r.T @ r, torch.eye(32), atol=1e-4, rtol=0)
    pq = vq.ProductQuantizer(32, 8).fit(aniso)
    assert mse(aniso, opq.decode(opq.encode(aniso))) < 0.8 * mse(aniso, pq.decode(pq.encode(aniso)))


def test_opq_dimension_reduction(aniso):
    opq = vq.OPQ(32, 4, dim_out=16, niter=3).fit(aniso)
    r = opq.rotation
    assert r.shape == (16, 32)
    torch.testing.assert_close(r @ r.T, torch.eye(16), atol=1e-4, rtol=0)
    assert opq.encode(aniso[:5]).shape == (5, 4)
    assert opq.decode(opq.encode(aniso[:5])).shape == (5, 32)


# --- the shared interface ----------------------------------------------------------------------
def all_quantizers(x):
    return [
        vq.VectorQuantizer(32, 64, niter=5).fit(x),
        vq.ProductQuantizer(32, 8, niter=5).fit(x),
        vq.ResidualVQ(32, 3, 32, niter=5).fit(x),
        vq.ResidualVQ(32, 3, 32, beam_size=4, niter=5).fit(x),
        vq.OPQ(32, 8, niter=2).fit(x),
    ]


@pytest.fixture(scope="module")
def quantizers(blobs):
    return all_quantizers(blobs)


def test_distance_tables_sum_to_adc_distances(blobs, quantizers):
    q, x = blobs[:7], blobs[100:150]
    for quantizer in quantizers:
        codes = np.asarray(quantizer.encode(x), np.int64).reshape(50, -1)
        x_hat = np.asarray(quantizer.decode(quantizer.encode(x)), np.float64)
        t_ip = quantizer.distance_tables(q, metric="ip")
        t_l2 = quantizer.distance_tables(q, metric="l2")
        n_tables = codes.shape[1]
        assert t_ip.shape == (7, n_tables, quantizer.codebook_size)
        cols = np.arange(n_tables)
        ip = np.stack([t_ip[:, cols, c].sum(1) for c in codes], axis=1)
        np.testing.assert_allclose(ip, q @ x_hat.T, rtol=1e-4, atol=1e-3)
        l2 = np.stack([t_l2[:, cols, c].sum(1) for c in codes], axis=1)
        exact = ((q[:, None, :] - x_hat[None]) ** 2).sum(-1)
        if isinstance(quantizer, vq.ResidualVQ):
            l2 = l2 + (quantizer.norms(codes) - quantizer.codeword_norm_sums(codes)).numpy()
        np.testing.assert_allclose(l2, exact, rtol=1e-4, atol=1e-3)


def test_beam_search_never_worse_than_greedy(blobs):
    rq = vq.ResidualVQ(32, 4, 32, niter=5).fit(blobs)
    greedy = errors(blobs, rq.decode(rq.encode(blobs)))
    rq.beam_size = 8
    beam = errors(blobs, rq.decode(rq.encode(blobs)))
    assert (beam <= greedy + 1e-4).all() and beam.mean() < greedy.mean()


def test_numpy_in_numpy_out_torch_in_torch_out(blobs, quantizers):
    for quantizer in quantizers:
        codes = quantizer.encode(blobs[:10])
        assert isinstance(codes, np.ndarray) and codes.dtype == np.uint8
        t_codes = quantizer.encode(torch.from_numpy(blobs[:10]))
        assert isinstance(t_codes, torch.Tensor) and t_codes.dtype == torch.uint8
        np.testing.assert_array_equal(codes, t_codes.numpy())
        assert isinstance(quantizer.decode(t_codes), torch.Tensor)


def test_batch_dimensions_are_kept(blobs, quantizers):
    x = torch.from_numpy(blobs[:24]).reshape(2, 3, 4, 32)
    for quantizer in quantizers:
        codes = quantizer.encode(x)
        assert codes.shape == (2, 3, 4, *quantizer.code_shape)
        assert quantizer.decode(codes).shape == (2, 3, 4, 32)


def test_code_dtypes_widen_with_codebook_size(blobs):
    assert (
        vq.ProductQuantizer(32, 8, nbits=10, niter=1).fit(blobs).encode(blobs[:3]).dtype == np.int16
    )
    assert vq.VectorQuantizer(32, 300, niter=1).fit(blobs).encode(blobs[:3]).dtype == np.int16
    assert (
        vq.ProductQuantizer(32, 16, nbits=4, niter=1).fit(blobs).encode(blobs[:3]).dtype == np.uint8
    )
    one_bit = vq.ProductQuantizer(32, 32, nbits=1, niter=3).fit(blobs)
    codes = one_bit.encode(blobs[:100])
    assert codes.dtype == np.uint8 and set(np.unique(codes)) <= {0, 1}
    assert mse(blobs[:100], one_bit.decode(codes)) < mse(blobs[:100], np.zeros_like(blobs[:100]))


def test_numba_and_torch_pq_paths_agree(blobs, quantizers):
    pq = quantizers[1]
    x = torch.from_numpy(blobs)
    fast, _ = pq._assign(x)
    slow, _ = pq._assign(x.clone().requires_grad_())  # autograd input takes the torch path
    same = (fast.long() == slow.long()).all(1)
    assert same.float().mean() > 0.999


def test_forward_is_straight_through(blobs, quantizers):
    for quantizer in quantizers:
        x = torch.from_numpy(blobs[:16]).clone().requires_grad_()
        out = quantizer(x)
        x_hat = torch.as_tensor(quantizer.decode(out.codes))
        torch.testing.assert_close(out.quantized.detach(), x_hat)
        if isinstance(quantizer, vq.ResidualVQ):  # mean over stages, to each partial sum
            stages = range(1, quantizer.num_quantizers + 1)
            partial = [quantizer.decode(out.codes, num_stages=s) for s in stages]
            expected = torch.stack([((x.detach() - p) ** 2).mean() for p in partial]).mean()
        else:
            expected = ((x.detach() - x_hat) ** 2).mean()
        torch.testing.assert_close(out.loss, expected)
        (out.quantized.sum() + 0 * out.loss).backward()
        torch.testing.assert_close(x.grad, torch.ones_like(x))


def test_state_dict_round_trip(blobs, quantizers):
    for quantizer in quantizers:
        args = {
            vq.VectorQuantizer: lambda q: vq.VectorQuantizer(32, q.codebook_size),
            vq.ProductQuantizer: lambda q: vq.ProductQuantizer(32, q.M),
            vq.ResidualVQ: lambda q: vq.ResidualVQ(
                32, q.num_quantizers, q.codebook_size, q.beam_size
            ),
            vq.OPQ: lambda q: vq.OPQ(32, q.M),
        }
        fresh = args[type(quantizer)](quantizer)
        assert not fresh.is_trained
        fresh.load_state_dict(quantizer.state_dict())
        assert fresh.is_trained
        np.testing.assert_array_equal(fresh.encode(blobs[:100]), quantizer.encode(blobs[:100]))


def test_half_precision_buffers(blobs):
    pq = vq.ProductQuantizer(32, 8, niter=5).fit(blobs)
    ref = mse(blobs, pq.decode(pq.encode(blobs)))
    pq.half()
    assert pq.codebooks.dtype == torch.float16
    assert mse(blobs, pq.decode(pq.encode(blobs))) == pytest.approx(ref, rel=0.01)


def test_same_seed_same_codebooks(blobs):
    for make in (
        lambda: vq.ProductQuantizer(32, 8, niter=3, seed=3),
        lambda: vq.ResidualVQ(32, 2, 16, niter=3, seed=3),
        lambda: vq.OPQ(32, 8, niter=2, seed=3),
    ):
        a, b = make().fit(blobs), make().fit(blobs)
        for (name, ta), (_, tb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
            assert torch.equal(ta, tb), name


# --- bad input ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: vq.ProductQuantizer(30, 8), "multiple of M=8"),
        (lambda: vq.ProductQuantizer(32, 8, nbits=17), "nbits must be between 1 and 16"),
        (lambda: vq.ProductQuantizer(32, 8, init="x"), "init must be"),
        (lambda: vq.ResidualVQ(32, 0, 16), "num_quantizers must be >= 1"),
        (lambda: vq.ResidualVQ(32, 2, 16, beam_size=0), "beam_size must be >= 1"),
        (lambda: vq.OPQ(32, 8, dim_out=64), r"dim_out must lie in \[1, dim=32\]"),
        (lambda: vq.VectorQuantizer(0, 16), "dim must be positive"),
    ],
)
def test_bad_constructor_arguments(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_bad_inputs_to_trained_quantizers(blobs, quantizers):
    for quantizer in quantizers:
        with pytest.raises(ValueError, match="expected vectors of dim 32, got 16"):
            quantizer.encode(blobs[:, :16])
        bad = blobs[:10].copy()
        bad[4, 0] = np.nan
        with pytest.raises(ValueError, match="1 NaN/Inf values, first in row 4"):
            quantizer.encode(bad)
        with pytest.raises(ValueError, match="codes must lie in"):
            codes = np.asarray(quantizer.encode(blobs[:2])).astype(np.int64)
            codes[...] = quantizer.codebook_size
            quantizer.decode(codes)
        with pytest.raises(TypeError, match="expected integer codes"):
            quantizer.decode(np.zeros((2, *quantizer.code_shape), np.float32))
        with pytest.raises(ValueError, match="metric must be 'l2' or 'ip'"):
            quantizer.distance_tables(blobs[:2], metric="cos")


def test_fit_errors(blobs):
    with pytest.raises(ValueError, match="at least k=256 training vectors, got 100"):
        vq.ProductQuantizer(32, 8).fit(blobs[:100])
    with pytest.raises(ValueError, match="empty training set"):
        vq.ResidualVQ(32, 2, 16).fit(blobs[:0])
    with pytest.raises(ValueError, match="expected vectors of dim 32, got 31"):
        vq.VectorQuantizer(32, 16).fit(blobs[:, :31])
    inf = blobs[:500].copy()
    inf[3, 3] = np.inf
    with pytest.raises(ValueError, match="first in row 3"):
        vq.OPQ(32, 8).fit(inf)


def test_untrained_quantizer_says_fit_first(blobs):
    with pytest.raises(RuntimeError, match="call fit"):
        vq.ProductQuantizer(32, 8).encode(blobs[:2])


# --- the device-agnostic torch path (what CUDA tensors and exported graphs run) ------------------
def test_torch_path_matches_numba_path(blobs, quantizers):
    from vq._cpu import torch_only

    x = blobs[:3000]
    fast = [np.asarray(q.encode(x)) for q in quantizers]
    fast_dec = [np.asarray(q.decode(c)) for q, c in zip(quantizers, fast, strict=True)]
    with torch_only():
        slow = [np.asarray(q.encode(x)) for q in quantizers]
        slow_dec = [np.asarray(q.decode(c)) for q, c in zip(quantizers, fast, strict=True)]
    for q, a, b, da, db in zip(quantizers, fast, slow, fast_dec, slow_dec, strict=True):
        same = (a == b).reshape(len(x), -1).all(1).mean()
        assert same > 0.999, type(q).__name__
        np.testing.assert_allclose(da, db, rtol=1e-5, atol=1e-5)


def test_training_on_the_torch_path(blobs):
    from vq._cpu import torch_only

    with torch_only():
        km = vq.kmeans(blobs, 32, niter=10)
        pq = vq.ProductQuantizer(32, 8, niter=10).fit(blobs)
    ref_km = vq.kmeans(blobs, 32, niter=10)
    ref_pq = vq.ProductQuantizer(32, 8, niter=10).fit(blobs)
    assert km.inertia == pytest.approx(ref_km.inertia, rel=1e-3)
    assert mse(blobs, pq.decode(pq.encode(blobs))) == pytest.approx(
        mse(blobs, ref_pq.decode(ref_pq.encode(blobs))), rel=1e-3
    )


def test_empty_batches_and_single_vectors(blobs, quantizers):
    from vq._cpu import torch_only

    empty = np.zeros((0, 32), np.float32)
    for quantizer in quantizers:
        for ctx in (torch_only, None):
            with ctx() if ctx else np.errstate():
                codes = quantizer.encode(empty)
                assert codes.shape == (0, *quantizer.code_shape)
                assert quantizer.decode(codes).shape == (0, 32)
        one = quantizer.encode(blobs[5])
        assert one.shape == quantizer.code_shape
        np.testing.assert_array_equal(one, quantizer.encode(blobs[5:6])[0])
        assert quantizer.decode(one).shape == (32,)
