"""RaBitQ: vq.RaBitQ and RaBitQIndex against faiss's IndexRaBitQ (the same centre and rotation
give the same codes and search results), the estimator's unbiasedness and error bound, the
numba scan against the static torch estimate, persistence, re-ranking recall, bad input and
the static search graph."""

import platform

import numba
import numpy as np
import pytest
import torch

import vq
from vq._cpu import torch_only
from vq.datasets import clustered_vectors
from vq.index import from_faiss
from vq.kernels.common.bundles import TopK
from vq.kernels.rabitq.rabitq_scans import (
    code_words,
    level_scratch,
    plane_kernels,
    quantize_planes,
    rabitq_flat_scan,
)
from vq.quantizers.rabitq import (
    errors_of_factors,
    prepare_queries,
    quantized_levels,
    rabitq_distances,
    random_rotation,
    unpack_bits,
)


@pytest.fixture(scope="module", name="faiss")
def fixture_faiss():
    return pytest.importorskip("faiss")


@pytest.fixture(scope="module", name="data")
def fixture_data():
    x = clustered_vectors(3000, 70, n_clusters=30, seed=11) + 0.5  # d not a multiple of 8
    return x.astype(np.float32)


@pytest.fixture(scope="module", name="queries")
def fixture_queries():
    return (clustered_vectors(30, 70, n_clusters=30, seed=12) + 0.5).astype(np.float32)


def faiss_metric(faiss, metric):
    return faiss.METRIC_L2 if metric == "l2" else faiss.METRIC_INNER_PRODUCT


def faiss_codes(faiss, findex, n):
    return faiss.vector_to_array(findex.codes).reshape(n, -1)


# -- the codec against faiss's ----------------------------------------------------------------
@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_codes_and_factors_equal_faiss_from_the_same_training(faiss, data, metric):
    d, n = data.shape[1], len(data)
    f = faiss.IndexRaBitQ(d, faiss_metric(faiss, metric))
    f.train(data)
    f.add(data)
    rq = vq.RaBitQ(d, metric=metric, rotate=False).fit(data)
    center = faiss.vector_to_array(f.center)
    np.testing.assert_allclose(rq.center.numpy(), center, rtol=1e-5, atol=1e-5)  # (sum order)
    rq.set_state(None, torch.from_numpy(center))  # the same centre: the same bits exactly
    codes, factors = rq.encode(data)
    raw = faiss_codes(faiss, f, n)
    assert codes.shape == (n, 9) and factors.shape == (n, 3) and raw.shape[1] == 9 + 8
    np.testing.assert_array_equal(codes, raw[:, :9])  # the same bits
    theirs = np.ascontiguousarray(raw[:, 9:]).view(np.float32)
    np.testing.assert_allclose(factors[:, :2], theirs, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(rq.decode(codes, factors), f.sa_decode(raw), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("qb", [0, 4, 8])
@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_estimates_equal_faiss_search_distances(faiss, data, queries, metric, qb):
    d = data.shape[1]
    f = faiss.IndexRaBitQ(d, faiss_metric(faiss, metric))
    f.train(data)
    f.add(data)
    f.qb = qb
    D, I = f.search(queries, 10)
    rq = vq.RaBitQ(d, metric=metric, rotate=False).fit(data)
    est = rq.distances(queries, *rq.encode(data), qb=qb)
    np.testing.assert_allclose(np.take_along_axis(est, I, 1), D, rtol=1e-5, atol=1e-4)
    order = np.argsort(est if metric == "l2" else -est, axis=1, kind="stable")[:, :10]
    assert (order == I).mean() > 0.98  # ties aside


# -- invariants -------------------------------------------------------------------------------
def test_rotation_is_orthogonal_and_seeded():
    r = random_rotation(40, 3)
    torch.testing.assert_close(r.T @ r, torch.eye(40), atol=1e-5, rtol=0)
    assert torch.equal(r, random_rotation(40, 3)) and not torch.equal(r, random_rotation(40, 4))


def test_decode_keeps_the_signs_and_the_residual_inner_product(data):
    rq = vq.RaBitQ(70, seed=5).fit(data)
    x = torch.from_numpy(data[:500])
    codes, factors = rq.encode(x)
    x_hat = rq.decode(codes, factors)
    r = x @ rq.rotation - rq.center
    r_hat = x_hat @ rq.rotation - rq.center
    # the decoded residual has the code's signs, and <r̂, r> = ||r||² (dp_multiplier's choice)
    assert torch.equal(rq.encode(x_hat).codes, codes)
    assert torch.equal((r_hat > 0), unpack_bits(codes, 70).bool())
    torch.testing.assert_close((r_hat * r).sum(1), (r * r).sum(1), rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(factors[:, 0], (r * r).sum(1), rtol=1e-5, atol=1e-5)


def test_estimator_is_unbiased_over_rotations():
    torch.manual_seed(0)
    x, q = torch.randn(20, 64), torch.randn(5, 64)
    true = torch.cdist(q, x) ** 2
    trials = []
    for seed in range(200):  # the estimate's mean over random rotations is the distance
        rq = vq.RaBitQ(64, seed=seed).fit(x)
        trials.append(rq.distances(q, *rq.encode(x)))
    trials = torch.stack(trials)
    z = (trials.mean(0) - true) / (trials.std(0) / len(trials) ** 0.5)
    assert z.abs().mean() < 1.2 and z.abs().max() < 4.5  # |N(0, 1)|: mean 0.8
    assert (trials.std(0) / true).mean() > 0.02  # (a real spread, which the mean removes)


def test_error_bound_covers_nearly_every_estimate():
    torch.manual_seed(1)
    x, q = torch.randn(2000, 128), torch.randn(40, 128)
    rq = vq.RaBitQ(128).fit(x)
    codes, factors = rq.encode(x)
    err = rq.distances(q, codes, factors) - torch.cdist(q, x) ** 2
    bound = rq.error_bounds(q, factors)
    assert abs(float(err.mean())) < 0.02 * float(err.std())  # no bias over many pairs
    outside = float((err.abs() > bound).float().mean())
    assert outside < 0.08  # ε0 = 1.9: a bound of about 1.9 standard deviations (5.8% here)
    assert float((err.abs() > 1.5 * bound).float().mean()) < 0.01


def test_error_factor_recomputed_from_faiss_layout(data):
    rq = vq.RaBitQ(70).fit(data)
    factors = rq.encode(data).factors
    again = errors_of_factors(torch.from_numpy(factors[:, :2]), 70)
    np.testing.assert_allclose(again.numpy(), factors[:, 2], rtol=1e-4, atol=1e-4)


# -- the numba scan against the torch estimate -------------------------------------------------
@pytest.mark.parametrize("qb", [0, 2, 4, 8])
@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_kernel_equals_torch_estimates(data, queries, metric, qb):
    rq = vq.RaBitQ(70, metric=metric).fit(data)
    codes, factors = rq.encode(torch.from_numpy(data))
    q = torch.from_numpy(queries)
    est = rabitq_distances(q, codes, factors, rq.rotation, rq.center, metric, qb)
    ranked = -est if metric == "ip" else est
    q_c, constants = prepare_queries(q, rq.rotation, rq.center, 0)  # quantized in the kernel
    k = 20
    out = TopK(np.empty((len(q), k), np.float32), np.empty((len(q), k), np.int64))
    allowed = np.zeros(0, np.uint8)
    c = codes.numpy()
    rabitq_flat_scan(
        q_c.numpy(),
        constants.numpy(),
        qb,
        c,
        code_words(c),
        factors.numpy(),
        allowed,
        metric == "ip",
        out,
    )
    expected = torch.topk(ranked, k, dim=1, largest=False).values.numpy()
    np.testing.assert_allclose(out.distances, expected, rtol=1e-5, atol=1e-4)
    # the rows' own estimates are the values returned, and the rows are the top k (ties aside)
    mine = np.take_along_axis(ranked.numpy(), out.labels, 1)
    np.testing.assert_allclose(mine, out.distances, rtol=1e-5, atol=1e-4)
    same = [
        len(set(a) & set(b))
        for a, b in zip(out.labels, torch.topk(ranked, k, 1, False)[1].numpy(), strict=True)
    ]
    assert np.mean(same) > k - 0.5


def test_kernel_bit_planes_hold_the_torch_levels_exactly(data, queries):
    rq = vq.RaBitQ(70).fit(data)
    q_c, _ = prepare_queries(torch.from_numpy(queries), rq.rotation, rq.center, 0)
    q_c = torch.cat([q_c, torch.zeros(1, 70)])  # a constant query: delta 0, every level 0
    for qb in range(1, 9):
        levels, vmin, delta = quantized_levels(q_c, qb)
        for i in range(q_c.shape[0]):
            planes = np.empty((qb, 2), np.uint64)
            lo, step, total = quantize_planes(q_c[i].numpy(), qb, planes, level_scratch(70))
            bits = np.unpackbits(planes.view(np.uint8), axis=1, bitorder="little")
            assert not bits[:, 70:].any()  # the padding dimensions are in no plane
            mine = (bits[:, :70].astype(np.int64) << np.arange(qb)[:, None]).sum(0)
            np.testing.assert_array_equal(mine, levels[i].numpy().astype(np.int64))
            assert (lo, step, total) == (vmin[i, 0], delta[i, 0], int(levels[i].sum()))


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 assembly")
def test_kernel_popcount_is_one_instruction():
    # the row loop compiled on its own (the kernels are loaded from the disk cache, whose
    # assembly numba does not keep)
    f = numba.njit(fastmath=True)(plane_kernels(2, 4).push_rows.py_func)
    words = np.arange(64, dtype=np.uint64)
    factors = np.ones(96, np.float32)
    heap = (np.full(5, np.inf, np.float32), np.full(5, -1, np.int64))
    f(
        words,
        factors,
        0,
        32,
        np.ones(8, np.uint64),
        np.float32(1),
        np.float32(1),
        0,
        128,
        np.float32(1),
        np.float32(1),
        False,
        np.zeros(0, np.uint8),
        heap,
        np.empty(32, np.float32),
    )
    asm = f.inspect_asm(f.signatures[0])
    assert "popcnt" in asm  # popcnt or vpopcntq, never a bit-twiddling loop


def test_kernel_filter_skips_rows(data, queries):
    index = vq.RaBitQIndex(70)
    index.train(data)
    index.add(data)
    even = np.arange(0, len(data), 2)
    D, I = index.search(queries, 10, allowed=even)
    assert (I % 2 == 0).all()
    with torch_only():
        Dt, It = index.search(torch.from_numpy(queries), 10, allowed=even)
    np.testing.assert_allclose(Dt.numpy(), D, rtol=1e-5, atol=1e-4)
    assert (It.numpy() == I).mean() > 0.98


# -- the index ------------------------------------------------------------------------------
@pytest.mark.parametrize("qb", [0, 4])
@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_index_search_equals_its_faiss_counterpart(faiss, data, queries, metric, qb):
    index = vq.index_factory(70, "RaBitQ", metric)
    index.train(data)
    index.add_with_ids(data, np.arange(len(data)) * 3 + 7)
    D, I = index.search(queries, 10, qb=qb)
    f = index.to_faiss()  # IndexIDMap(IndexPreTransform(LinearTransform, IndexRaBitQ))
    faiss.downcast_index(faiss.downcast_index(f.index).index).qb = qb
    Df, If = f.search(queries, 10)
    assert (I == If).mean() > 0.98  # ties aside
    np.testing.assert_allclose(D, Df, rtol=1e-5, atol=1e-4)
    with torch_only():
        Dt, It = index.search(torch.from_numpy(queries), 10, qb=qb)
    assert (It.numpy() == I).mean() > 0.98
    np.testing.assert_allclose(Dt.numpy(), D, rtol=1e-5, atol=1e-4)


def test_from_faiss_rr_rabitq_keeps_rotation_centre_and_codes(faiss, data, queries):
    f = faiss.index_factory(70, "RR70,RaBitQ")
    f.train(data)
    f.add(data)
    inner = faiss.downcast_index(f.index)
    inner.qb = 0
    index = from_faiss(f)
    assert isinstance(index, vq.RaBitQIndex) and index.config()["qb"] == 0
    rr = faiss.downcast_VectorTransform(f.chain.at(0))
    a = faiss.vector_to_array(rr.A).reshape(70, 70)
    np.testing.assert_array_equal(index.rabitq.rotation.numpy(), a.T)
    raw = faiss_codes(faiss, inner, len(data))
    np.testing.assert_array_equal(index.codes.numpy(), raw[:, :9])
    # vq's encode of the same vectors with faiss's state: the same bits (float rounding of the
    # rotation aside)
    again = index.rabitq.encode(data).codes
    assert (again == raw[:, :9]).mean() > 0.999
    D, I = index.search(queries, 10)
    Df, If = f.search(queries, 10)
    assert (I == If).mean() > 0.98
    np.testing.assert_allclose(D, Df, rtol=1e-5, atol=1e-4)
    back = index.to_faiss()  # and back: the same results again
    np.testing.assert_allclose(back.search(queries, 10)[0], Df, rtol=1e-5, atol=1e-4)


def test_save_load_round_trip(tmp_path, data, queries):
    index = vq.index_factory(70, "RaBitQ,RFlat", "ip")
    index.k_factor = 4
    index.train(data)
    index.add(data)
    index.remove_ids(np.arange(0, 100))
    D, I = index.search(queries, 10)
    index.save(tmp_path / "r.index")
    loaded = vq.load_index(tmp_path / "r.index")
    assert isinstance(loaded.index, vq.RaBitQIndex) and loaded.config() == index.config()
    D2, I2 = loaded.search(queries, 10)
    np.testing.assert_array_equal(I2, I)
    np.testing.assert_array_equal(D2, D)
    assert not np.isin(I, np.arange(100)).any()
    x_hat = loaded.index.reconstruct(np.arange(100, 105))  # the RaBitQ decode, rotated back
    assert x_hat.shape == (5, 70)


def test_refined_recall_matches_faiss_trained_independently(faiss):
    d = 128
    xb = clustered_vectors(5000, d, n_clusters=50, seed=1).astype(np.float32)
    xq = clustered_vectors(200, d, n_clusters=50, seed=2).astype(np.float32)
    gt = faiss.knn(xq, xb, 10)[1]

    def recall(ids):
        return np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ids, gt, strict=True)])

    same, ours, theirs = [], [], []
    for seed in range(4):
        f = faiss.index_factory(d, f"RR{d},RaBitQ,RFlat")
        rr = faiss.downcast_VectorTransform(faiss.downcast_index(f.base_index).chain.at(0))
        rr.init(seed)
        f.train(xb)
        f.add(xb)
        f.k_factor = 10
        theirs.append(recall(f.search(xq, 10)[1]))
        index = vq.Refine(vq.RaBitQIndex(d, seed=seed, qb=4), k_factor=10)  # faiss's qb
        index.train(xb)
        index.add(xb)
        ours.append(recall(index.search(xq, 10)[1]))
        # vq's own training (centre, codes) on faiss's rotation: the same recall
        shared = vq.Refine(vq.RaBitQIndex(d, qb=4), k_factor=10)
        shared.train(xb)
        a = faiss.vector_to_array(rr.A).reshape(d, d)
        center = torch.from_numpy(xb @ a.T).mean(0)
        shared.index.rabitq.set_state(torch.from_numpy(a.T.copy()), center)
        shared.add(xb)
        same.append(recall(shared.search(xq, 10)[1]))
    assert 0.5 < np.mean(theirs) < 0.99  # a regime where recall tells them apart
    assert abs(np.mean(same) - np.mean(theirs)) < 0.005
    # vq's own rotations: the spread over rotations is about 0.015 a seed (measured)
    assert abs(np.mean(ours) - np.mean(theirs)) < 0.03


# -- bad input --------------------------------------------------------------------------------
def test_bad_input_errors(faiss, data):
    with pytest.raises(ValueError, match="nbits=2 .*not implemented; use nbits=1"):
        vq.RaBitQ(16, nbits=2)
    with pytest.raises(ValueError, match="RaBitQ4: only 1-bit"):
        vq.index_factory(16, "RaBitQ4")
    with pytest.raises(ValueError, match="metric must be 'l2' or 'ip'"):
        vq.RaBitQ(16, metric="cos")
    with pytest.raises(RuntimeError, match="not trained; call fit"):
        vq.RaBitQ(16).encode(np.zeros((2, 16), np.float32))
    with pytest.raises(ValueError, match="qb must"):
        vq.RaBitQIndex(16, qb=9)
    rq = vq.RaBitQ(70).fit(data)
    codes, factors = rq.encode(data[:10])
    with pytest.raises(ValueError, match=r"codes must be uint8 \[n, 9\]"):
        rq.decode(codes[:, :8], factors)
    with pytest.raises(ValueError, match=r"factors must be float32 \[10, 3\]"):
        rq.decode(codes, factors[:, :2])
    with pytest.raises(ValueError, match="expected .*dim 70|70"):
        rq.encode(data[:, :60])
    index = vq.RaBitQIndex(70)
    index.train(data)
    index.add(data[:50])
    with pytest.raises(ValueError, match="qb must"):
        index.search(data[:2], 5, qb=-1)
    with pytest.raises(ValueError, match="not orthogonal"):
        index.take_rotation(torch.ones(70, 70))
    f = faiss.IndexRaBitQ(16, faiss.METRIC_L2, 2)
    with pytest.raises(ValueError, match="only 1-bit faiss IndexRaBitQ converts"):
        from_faiss(f)


# -- static shapes ----------------------------------------------------------------------------
def test_search_graph_exports_and_equals_the_index(data, queries):
    index = vq.RaBitQIndex(70, "ip")
    index.train(data)
    index.add(data)
    searcher = index.searcher(10).eval()
    q = torch.from_numpy(queries[:16])
    program = torch.export.export(searcher, (q,), strict=True)
    D, I = program.module()(q)
    De, Ie = index.search(q, 10)
    assert (I == Ie).float().mean() > 0.98
    torch.testing.assert_close(D, De, rtol=1e-5, atol=1e-4)
    # the codec's estimate is one graph too
    rq = index.rabitq

    def estimate(qq, codes, factors):
        return rabitq_distances(qq, codes, factors, rq.rotation, rq.center, "ip", 4)

    traced = torch.jit.trace(estimate, (q, index.codes[:100], index.factors[:100]))
    torch.testing.assert_close(
        traced(q[:3], index.codes[100:200], index.factors[100:200]),
        estimate(q[:3], index.codes[100:200], index.factors[100:200]),
    )
