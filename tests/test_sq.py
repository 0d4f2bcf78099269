"""Scalar quantization: vq.ScalarQuantizer, SQIndex and IVFSQ against faiss (same ranges ⇒ the
same bytes and the same search results), the numba kernels against the static torch search,
invariants of decoding, persistence, bad input and ONNX export."""

import numpy as np
import pytest
import torch
from export_helpers import assert_same_search, fixture_exported, fixture_ort  # noqa: F401

import vq
from vq import faiss_interop as fi
from vq._cpu import torch_only
from vq.datasets import clustered_vectors
from vq.export import OnnxRunner, audit

KINDS = [8, 6, 4, "fp16", "bf16"]
QT = {8: "QT_8bit", 6: "QT_6bit", 4: "QT_4bit", "fp16": "QT_fp16", "bf16": "QT_bf16"}


@pytest.fixture(scope="module", name="faiss")
def fixture_faiss():
    return pytest.importorskip("faiss")


@pytest.fixture(scope="module", name="data")
def fixture_data():
    rng = np.random.default_rng(5)
    x = clustered_vectors(3000, 13, n_clusters=30, seed=5) * rng.uniform(0.2, 3, 13)
    x[:, 3] = 2.5  # a constant dimension: vdiff 0, every code 0
    return x.astype(np.float32)


@pytest.fixture(scope="module", name="queries")
def fixture_queries(data):
    rng = np.random.default_rng(6)
    return (data[:40] + rng.standard_normal((40, 13)).astype(np.float32)).astype(np.float32)


# -- the quantizer against faiss's ------------------------------------------------------------
@pytest.mark.parametrize("bits", KINDS)
@pytest.mark.parametrize("dim", [13, 16])
def test_codes_equal_faiss_from_the_same_training(faiss, data, bits, dim):
    x = np.ascontiguousarray(data[:, :dim]) if dim <= 13 else np.tile(data, 2)[:, :dim].copy()
    fsq = faiss.ScalarQuantizer(dim, getattr(faiss.ScalarQuantizer, QT[bits]))
    fsq.train(x)
    sq = vq.ScalarQuantizer(dim, bits).fit(x)
    if bits not in ("fp16", "bf16"):  # the same ranges, to the bit
        trained = faiss.vector_to_array(fsq.trained)
        np.testing.assert_array_equal(trained, np.concatenate([sq.vmin, sq.vdiff]))
    y = np.concatenate([x * 1.7 - 0.3, x[:5] * 1e3, -x[:5] * 1e3])  # outside the ranges too
    codes = sq.encode(y)
    assert codes.dtype == np.uint8 and codes.shape == (len(y), fsq.code_size)
    expected = fsq.compute_codes(y)
    if bits == "bf16":  # faiss's AVX512-BF16 build rounds whole 16-lane chunks ties-to-even
        words = y.view(np.uint32).repeat(2, axis=1)
        ties = (words & 0xFFFF) == 0x8000
        assert (codes[~ties] == expected[~ties]).all()
        expected = np.where(ties, codes, expected)
    np.testing.assert_array_equal(codes, expected)
    # to float32 rounding of vmin + t * vdiff (faiss's SIMD decoders fuse the multiply-add)
    scale = float((sq.vmin.abs() + sq.vdiff).max()) if bits in (8, 6, 4) else 0.0
    np.testing.assert_allclose(sq.decode(codes), fsq.decode(codes), rtol=1e-6, atol=scale * 1e-6)
    back = fi.sq_to_faiss(fi.sq_from_faiss(fsq))  # and the ranges convert both ways
    np.testing.assert_array_equal(back.compute_codes(y), fsq.compute_codes(y))


def test_fp16_rounds_as_faiss_not_as_ieee(faiss):
    """faiss's portable fp16 encoder rounds some halfway values away from zero."""
    x = np.array([[2905.0, 11444.0, -1480.5, 65504.0, 1e6, 6e-8]], np.float32)
    fsq = faiss.ScalarQuantizer(6, faiss.ScalarQuantizer.QT_fp16)
    codes = vq.ScalarQuantizer(6, "fp16").encode(x)
    np.testing.assert_array_equal(codes, fsq.compute_codes(x))
    ieee = torch.from_numpy(x).half().view(torch.uint8).numpy()
    assert (codes != ieee).any()


def test_sq_from_faiss_refuses_what_it_cannot_hold(faiss):
    with pytest.raises(ValueError, match="no vq counterpart"):
        fi.sq_from_faiss(faiss.ScalarQuantizer(8, faiss.ScalarQuantizer.QT_8bit_direct))
    untrained = faiss.ScalarQuantizer(8, faiss.ScalarQuantizer.QT_8bit)
    with pytest.raises(ValueError, match="train the faiss ScalarQuantizer first"):
        fi.sq_from_faiss(untrained)


# -- invariants ---------------------------------------------------------------------------
@pytest.mark.parametrize("bits", [8, 6, 4])
def test_decode_is_within_half_a_cell_and_clamps_outside(data, bits):
    sq = vq.ScalarQuantizer(13, bits).fit(data)
    half = sq.cell_width().numpy() / 2
    err = np.abs(sq.decode(sq.encode(data)) - data)
    rounding = 1e-6 * (sq.vmin.abs() + sq.vdiff).numpy()  # of floats the size of the range
    assert (err <= half + rounding).all()  # the maximum itself decodes half a cell above
    assert err.max() > half.max() / 4  # not trivially exact
    far = sq.decode(sq.encode(np.stack([data.max(0) + 100, data.min(0) - 100])))
    top, low = sq.vmin + sq.vdiff, sq.vmin  # clamped to the top and bottom levels (faiss's)
    np.testing.assert_allclose(far[0], (top + sq.cell_width() / 2).numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(far[1], (low + sq.cell_width() / 2).numpy(), rtol=1e-5, atol=1e-5)


def test_more_bits_reconstruct_better(data):
    errors = []
    for bits in (4, 6, 8, "bf16", "fp16"):
        sq = vq.ScalarQuantizer(13, bits).fit(data)
        errors.append(float(((sq.decode(sq.encode(data)) - data) ** 2).mean()))
    assert errors == sorted(errors, reverse=True) and errors[-1] < errors[0] / 100


@pytest.mark.parametrize("bits", [8, 4])
def test_distance_tables_sum_to_the_decoded_distances(data, queries, bits):
    sq = vq.ScalarQuantizer(13, bits).fit(data)
    codes = sq.encode(data[:50])
    x_hat = sq.decode(codes)
    for metric in ("l2", "ip"):
        tables = sq.distance_tables(queries[:3], metric)  # [3, code_size, 256]
        sums = np.take_along_axis(tables[:, None], codes[None, :, :, None].astype(np.int64), 3)
        got = sums[..., 0].sum(-1)
        want = (
            queries[:3] @ x_hat.T
            if metric == "ip"
            else ((queries[:3, None] - x_hat[None]) ** 2).sum(-1)
        )
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
    with pytest.raises(NotImplementedError, match="use bits=8 or 4"):
        vq.ScalarQuantizer(13, 6).fit(data).distance_tables(queries[:3])


def test_the_kernels_half_decoding_is_exact_for_every_16_bit_word():
    from numba import njit

    from vq.kernels.sq.sq_scans import half_value

    @njit
    def decode_all(out):
        for w in range(65536):
            out[w] = half_value(np.uint32(w))

    got = np.empty(65536, np.float32)
    decode_all(got)
    expected = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)
    same = (got.view(np.uint32) == expected.view(np.uint32)) | (np.isnan(got) & np.isnan(expected))
    assert same.all(), np.flatnonzero(~same)[:5]


def test_values_past_the_fp16_range_are_stored_as_infinities_and_searched_as_faiss_does(faiss):
    x = np.random.default_rng(3).standard_normal((200, 13)).astype(np.float32)
    x[7, 2] = 1e6  # past fp16's largest value: stored as +inf
    index = _index("SQfp16", x)
    ref = faiss.index_factory(13, "SQfp16")
    ref.train(x)
    ref.add(x)
    D, I = index.search(x[:20], 10)
    D_ref, I_ref = ref.search(x[:20], 10)
    assert_same_search(D, I, D_ref, I_ref)
    assert not np.isin(7, I)  # an infinite distance from every query


# -- indexes: kernels against the torch search, and against faiss -------------------------------
def _index(desc, data, metric="l2"):
    index = vq.index_factory(13, desc, metric)
    index.train(data)
    index.add(data)
    return index


@pytest.mark.parametrize("bits", KINDS)
@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_kernels_equal_the_static_search(data, queries, bits, metric):
    for desc, params in ((f"SQ{bits}", {}), (f"IVF16,SQ{bits}", {"nprobe": 3})):
        index = _index(desc, data, metric)
        D, I = index.search(queries, 10, **params)
        with torch_only():
            D_ref, I_ref = index.search(queries, 10, **params)
        assert_same_search(D, I, D_ref, I_ref)
        D_few, I_few = index.search(queries[:4], 10, **params)  # the lean path
        assert_same_search(D_few, I_few, D_ref[:4], I_ref[:4])


def test_ivfsq_without_residuals_and_its_lists(data, queries):
    index = vq.IVFSQ(13, 16, 8, by_residual=False, nprobe=16)
    index.train(data)
    index.add(data)
    flat = vq.SQIndex(13, 8)
    flat.sq.load_state_dict(index.sq.state_dict())  # the same ranges
    flat.add(data)
    D, I = index.search(queries, 10)  # every list probed: the flat scan's results
    D_flat, I_flat = flat.search(queries, 10)
    assert_same_search(D, I, D_flat, I_flat)
    assert index.config()["by_residual"] is False


@pytest.mark.parametrize(
    "desc", ["SQ8", "SQ6", "SQ4", "SQfp16", "SQbf16", "IVF16,SQ8", "IVF16,SQ4"]
)
@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_search_equals_faiss_on_an_imported_index(faiss, data, queries, desc, metric):
    findex = faiss.index_factory(13, desc, vq.index.core.faiss_build.faiss_metric(metric))
    findex.train(data)
    findex.add(data)
    if "IVF" in desc:
        findex.nprobe = 4
    index = vq.index.from_faiss(findex)
    assert type(index).__name__ == ("IVFSQ" if "IVF" in desc else "SQIndex")
    assert index.ntotal == findex.ntotal
    D_f, I_f = findex.search(queries, 10)
    D, I = index.search(queries, 10)
    assert_same_search(D, I, D_f, I_f)
    with torch_only():
        assert_same_search(*index.search(queries, 10), D_f, I_f)
    back = index.to_faiss()  # and back: the same bytes in every list
    assert_same_search(*back.search(queries, 10), D_f, I_f)


def test_ids_removal_and_refine(data, queries):
    index = vq.index_factory(13, "IVF16,SQ8,RFlat")
    index.train(data)
    ids = np.arange(len(data)) * 5 + 3
    index.add_with_ids(data, ids)
    D, I = index.search(queries, 5, nprobe=16, k_factor=8)
    exact = ((queries[:, None] - data[None]) ** 2).sum(-1).argsort(1)[:, :5]
    assert (I == ids[exact]).mean() > 0.95
    assert index.remove_ids(ids[:1000]) == 1000
    _, I2 = index.search(queries, 5, nprobe=16)
    assert not np.isin(I2, ids[:1000]).any() and index.ntotal == len(data) - 1000
    index.index.check_consistent()


@pytest.mark.parametrize("desc", ["SQ8", "SQ6", "IVF16,SQ4", "IVF16,SQbf16,RFlat"])
def test_save_and_load_round_trip(tmp_path, data, queries, desc):
    index = _index(desc, data, "ip")
    index.save(tmp_path / "i.vq")
    loaded = vq.load_index(tmp_path / "i.vq")
    assert type(loaded) is type(index) and loaded.config() == index.config()
    params = {"nprobe": 5} if "IVF" in desc else {}
    np.testing.assert_array_equal(
        loaded.search(queries, 7, **params)[1], index.search(queries, 7, **params)[1]
    )


def test_a_forged_file_is_refused(tmp_path, data):
    index = _index("SQ8", data)
    index.codes = index.codes[:-1]  # one code row short of the ids... forged
    index.ids = torch.arange(len(data))
    index.save(tmp_path / "bad.vq")
    with pytest.raises(ValueError, match="ids for"):
        vq.load_index(tmp_path / "bad.vq")


def test_bad_input_is_refused_with_what_to_do(data):
    with pytest.raises(ValueError, match="bits must be one of"):
        vq.ScalarQuantizer(8, 5)
    with pytest.raises(ValueError, match="margin must be"):
        vq.ScalarQuantizer(8, 8, margin=-1)
    with pytest.raises(RuntimeError, match="call fit"):
        vq.ScalarQuantizer(13, 8).encode(data)
    assert vq.ScalarQuantizer(13, "fp16").is_trained  # nothing to train
    sq = vq.ScalarQuantizer(13, 8).fit(data)
    with pytest.raises(ValueError, match="dim 13"):
        sq.encode(data[:, :12])
    bad = data[:3].copy()
    bad[1, 2] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        sq.encode(bad)
    with pytest.raises(ValueError, match=r"codes must lie in \[0, 256\)"):
        sq.decode(np.full((2, 13), 300))
    index = vq.SQIndex(13, 4)
    with pytest.raises(RuntimeError, match="not trained; call train"):
        index.search(data[:2], 3)
    index.train(data)
    with pytest.raises(ValueError, match="dim 13"):
        index.add(data[:, :5])
    with pytest.raises(ValueError, match="NaN"):
        index.search(bad, 3)
    with pytest.raises(ValueError, match="supported"):
        vq.index_factory(13, "SQ5")


def test_layer_forward_gives_the_decoded_codes(data):
    sq = vq.ScalarQuantizer(13, 6).fit(data)
    x = torch.from_numpy(data[:64]).requires_grad_()
    out = sq(x)
    np.testing.assert_array_equal(out.codes.numpy(), sq.encode(data[:64]))
    np.testing.assert_allclose(out.quantized.detach().numpy(), sq.decode(out.codes.numpy()))
    out.loss.backward()  # the commitment loss reaches the input
    assert x.grad is not None and float(x.grad.abs().sum()) > 0


# -- export ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("bits", KINDS)
def test_onnx_codecs_equal_torch(exported, data, bits):
    sq = vq.ScalarQuantizer(13, bits).fit(data)
    codes = sq.encode(data[:19])
    decoder = OnnxRunner(exported(sq, batch_size=8, what="decode"))
    np.testing.assert_allclose(decoder(codes), sq.decode(codes), rtol=1e-6, atol=1e-6)
    assert audit(decoder.path).clean
    if bits in ("fp16", "bf16"):
        return  # encoding reinterprets float bits: no ONNX graph
    encoder = OnnxRunner(exported(sq, batch_size=8, what="encode"))
    np.testing.assert_array_equal(encoder(data[:19] * 1.5), sq.encode(data[:19] * 1.5))


@pytest.mark.parametrize("desc", ["SQ8", "SQ4", "IVF16,SQ8", "IVF16,SQ6", "IVF16,SQfp16"])
@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_onnx_search_equals_torch(exported, data, queries, desc, metric):
    index = _index(desc, data, metric)
    params = {"nprobe": 3} if "IVF" in desc else {}
    runner = OnnxRunner(exported(index, batch_size=8, k=10, **params))
    with torch_only():
        D_ref, I_ref = index.search(queries, 10, **params)
    D, I = runner(queries)
    assert_same_search(D, I, D_ref, I_ref)
    report = audit(runner.path)
    assert report.clean, str(report)
