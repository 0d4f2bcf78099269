"""IVFRaBitQ against faiss's IndexIVFRaBitQ (the same coarse centroids and rotation give the same
codes, factors, ids and search results, both ways), the numba scan against the static torch
search, recall at equal parameters, persistence, the factory and spilled lists."""

import numpy as np
import pytest
import torch

import vq
from vq._cpu import torch_only
from vq.datasets import clustered_vectors
from vq.index import from_faiss

D = 70  # not a multiple of 8 nor of 64: padded bytes and words


@pytest.fixture(scope="module", name="faiss")
def fixture_faiss():
    return pytest.importorskip("faiss")


@pytest.fixture(scope="module", name="data")
def fixture_data():
    return (clustered_vectors(4000, D, n_clusters=30, seed=11) + 0.5).astype(np.float32)


@pytest.fixture(scope="module", name="queries")
def fixture_queries():
    return (clustered_vectors(40, D, n_clusters=30, seed=12) + 0.5).astype(np.float32)


def faiss_metric(faiss, metric):
    return faiss.METRIC_L2 if metric == "l2" else faiss.METRIC_INNER_PRODUCT


def list_codes(faiss, ivf):
    """Every list's raw codes (bits + two float32 factors) and ids, in list order."""
    inv = ivf.invlists
    sizes = [inv.list_size(i) for i in range(ivf.nlist)]
    codes = [faiss.rev_swig_ptr(inv.get_codes(i), s * ivf.code_size) for i, s in enumerate(sizes)]
    ids = [faiss.rev_swig_ptr(inv.get_ids(i), s) for i, s in enumerate(sizes)]
    raw = np.concatenate([np.array(c) for c in codes if len(c)]).reshape(-1, ivf.code_size)
    return raw, np.concatenate([np.array(i) for i in ids if len(i)])


# -- the same quantizer: the same codes --------------------------------------------------------
@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_codes_and_factors_equal_faiss_on_the_same_centroids(faiss, data, metric):
    f = faiss.index_factory(D, "IVF32,RaBitQ", faiss_metric(faiss, metric))
    f.train(data)
    empty = from_faiss(f)  # trained, nothing stored: faiss's centroids, no rotation
    assert isinstance(empty, vq.IVFRaBitQ) and empty.ntotal == 0
    f.add(data)
    empty.add(data)  # vq's own encoding, on faiss's lists
    raw, ids = list_codes(faiss, f)
    size = (D + 7) // 8
    np.testing.assert_array_equal(empty.stored_ids().numpy(), ids)
    np.testing.assert_array_equal(empty.codes.numpy(), raw[:, :size])
    theirs = np.ascontiguousarray(raw[:, size : size + 8]).view(np.float32)
    np.testing.assert_allclose(empty.factors[:, :2].numpy(), theirs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("qb", [0, 4])
@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_search_equals_its_faiss_counterpart_behind_the_rotation(faiss, data, queries, metric, qb):
    index = vq.IVFRaBitQ(D, 32, metric, nprobe=6, qb=qb)
    index.train(data)
    index.add_with_ids(data, np.arange(len(data)) * 3 + 7)
    D_, I = index.search(queries, 10)
    f = index.to_faiss()  # IndexPreTransform(LinearTransform, IndexIVFRaBitQ)
    assert isinstance(f, faiss.IndexPreTransform)
    ivf = faiss.downcast_index(faiss.extract_index_ivf(f))
    assert (ivf.nprobe, ivf.qb) == (6, qb)
    Df, If = f.search(queries, 10)
    assert (I == If).mean() > 0.98  # ties aside
    np.testing.assert_allclose(D_, Df, rtol=1e-5, atol=1e-4)
    back = from_faiss(f)  # the rotation taken back (take_rotation), the codes kept
    assert isinstance(back, vq.IVFRaBitQ) and back.rabitq.rotate
    np.testing.assert_array_equal(back.codes.numpy(), index.codes.numpy())
    torch.testing.assert_close(back.rabitq.rotation, index.rabitq.rotation)
    Db, Ib = back.search(queries, 10)
    assert (Ib == I).mean() > 0.98
    np.testing.assert_allclose(Db, D_, rtol=1e-5, atol=1e-4)


def test_from_faiss_rr_ivf_rabitq_searches_as_faiss(faiss, data, queries):
    f = faiss.index_factory(D, f"RR{D},IVF32,RaBitQ")
    f.train(data)
    f.add(data)
    ivf = faiss.downcast_index(faiss.extract_index_ivf(f))
    ivf.nprobe, ivf.qb = 5, 4
    index = from_faiss(f)
    assert isinstance(index, vq.IVFRaBitQ) and (index.nprobe, index.qb) == (5, 4)
    Df, If = f.search(queries, 10)
    D_, I = index.search(queries, 10)
    assert (I == If).mean() > 0.98
    np.testing.assert_allclose(D_, Df, rtol=1e-5, atol=1e-4)


# -- the numba scan against the torch search ---------------------------------------------------
@pytest.mark.parametrize("qb", [0, 2, 4, 8])
@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_kernel_equals_the_static_torch_search(data, queries, metric, qb):
    index = vq.IVFRaBitQ(D, 32, metric, nprobe=5, qb=qb)
    index.train(data)
    index.add(data)
    D_, I = index.search(queries, 20)
    Dt, It = index.searcher(20)(torch.from_numpy(queries))
    np.testing.assert_allclose(Dt.numpy(), D_, rtol=1e-5, atol=1e-4)
    same = [len(set(a) & set(b)) for a, b in zip(I, It.numpy(), strict=True)]
    assert np.mean(same) > 19.5  # ties aside
    with torch_only():  # the index's own torch path, at its qb
        Do, _ = index.search(torch.from_numpy(queries), 20)
    np.testing.assert_allclose(Do.numpy(), D_, rtol=1e-5, atol=1e-4)


def test_filtered_search_skips_rows_on_both_engines(data, queries):
    index = vq.IVFRaBitQ(D, 32, nprobe=4, qb=4)
    index.train(data)
    index.add(data)
    even = vq.IdFilter(np.arange(0, len(data), 2))
    D_, I = index.search(queries, 10, allowed=even)
    assert (I % 2 == 0).all() and (I >= 0).all()
    with torch_only():
        Dt, It = index.search(torch.from_numpy(queries), 10, allowed=even)
    np.testing.assert_allclose(Dt.numpy(), D_, rtol=1e-5, atol=1e-4)
    assert (It.numpy() == I).mean() > 0.98


# -- quality at equal parameters ---------------------------------------------------------------
def test_refined_recall_matches_faiss_on_a_shared_rotation_and_quantizer(faiss):
    d = 128
    xb = clustered_vectors(6000, d, n_clusters=50, seed=1).astype(np.float32)
    xq = clustered_vectors(200, d, n_clusters=50, seed=2).astype(np.float32)
    gt = faiss.knn(xq, xb, 10)[1]

    def recall(ids):
        return np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ids, gt, strict=True)])

    ours, theirs = [], []
    for seed in range(3):
        f = faiss.index_factory(d, f"RR{d},IVF32,RaBitQ")
        faiss.downcast_VectorTransform(f.chain.at(0)).init(seed)
        f.train(xb)
        ivf = faiss.downcast_index(faiss.extract_index_ivf(f))
        ivf.nprobe, ivf.qb = 8, 4
        index = vq.Refine(from_faiss(f), k_factor=5)  # faiss's centroids and rotation
        index.add(xb)  # vq's own codes
        refined = faiss.IndexRefineFlat(f)
        refined.k_factor = 5
        refined.add(xb)
        theirs.append(recall(refined.search(xq, 10)[1]))
        ours.append(recall(index.search(xq, 10)[1]))
    assert 0.5 < np.mean(theirs) < 0.99  # a regime where recall tells them apart
    assert abs(np.mean(ours) - np.mean(theirs)) < 0.005


# -- persistence, factory, spilling ------------------------------------------------------------
def test_save_load_round_trip(tmp_path, data, queries):
    index = vq.index_factory(D, "IVF16,RaBitQ")
    index.qb = 4
    index.train(data)
    index.add_with_ids(data, np.arange(len(data)) + 100)
    D_, I = index.search(queries, 10, nprobe=3)
    index.save(tmp_path / "ivf.index")
    loaded = vq.load_index(tmp_path / "ivf.index")
    assert isinstance(loaded, vq.IVFRaBitQ) and loaded.config() == index.config()
    D2, I2 = loaded.search(queries, 10, nprobe=3)
    np.testing.assert_array_equal(I2, I)
    np.testing.assert_array_equal(D2, D_)
    x_hat = loaded.reconstruct(np.arange(100, 105))  # the RaBitQ decode, rotated back
    np.testing.assert_array_equal(x_hat, index.reconstruct(np.arange(100, 105)))
    # RaBitQ's decode keeps the residual's inner product with itself: <x̂ - c, x - c> = ||x - c||²
    centroids = index.quantizer.codebook.numpy()
    c = centroids[((data[:5, None, :] - centroids[None]) ** 2).sum(-1).argmin(1)]
    r = data[:5] - c
    np.testing.assert_allclose(((x_hat - c) * r).sum(1), (r * r).sum(1), rtol=1e-4)


def test_factory_builds_and_refuses():
    index = vq.index_factory(32, "IVF8,RaBitQ,RFlat", "ip")
    assert isinstance(index, vq.Refine) and isinstance(index.index, vq.IVFRaBitQ)
    assert index.index.metric == "ip" and index.index.nlist == 8
    assert vq.index_factory(32, "IVF8(soar),RaBitQ").spill
    with pytest.raises(ValueError, match="RaBitQ2: only 1-bit"):
        vq.index_factory(32, "IVF8,RaBitQ2")


def test_spilled_lists_return_each_id_once(data, queries):
    index = vq.index_factory(D, "IVF16(soar),RaBitQ")
    index.train(data)
    index.add(data)
    assert index.n_rows == 2 * len(data)
    _, I = index.search(queries, 20, nprobe=4)
    assert all(len(set(row)) == 20 for row in I)
    with torch_only():
        _, It = index.search(torch.from_numpy(queries), 20, nprobe=4)
    assert (It.numpy() == I).mean() > 0.98


@pytest.mark.parametrize("qb", [0, 4])
def test_mapped_index_reads_its_lists_from_the_file_and_searches_alike(tmp_path, queries, qb):
    x = np.random.default_rng(3).standard_normal((100_000, D), dtype=np.float32)
    index = vq.IVFRaBitQ(D, 16, nprobe=3, qb=qb, coarse_niter=2)
    index.train(x[:2000])
    index.add(x)  # factors of 1.2 MB: the loader maps them
    D_, I = index.search(queries, 10)
    index.save(tmp_path / "ivf.index")
    mapped = vq.load_index(tmp_path / "ivf.index", mmap=True)
    assert mapped.rows_mapped()
    D2, I2 = mapped.search(queries, 10)
    np.testing.assert_array_equal(I2, I)
    np.testing.assert_array_equal(D2, D_)
