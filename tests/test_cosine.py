"""metric="cosine" on every kind (faiss's convention: vectors scaled to unit norm where they
enter, inner products, larger is better), faiss's ``L2norm,`` / ``IDMap,`` / ``IDMap2,``
factory prefixes, and one query ``[dim]`` accepted by ``search`` and ``range_search``."""

import json

import numpy as np
import pytest
import torch
from index_kinds import KINDS, VARIANTS

import vq
from vq import _cpu
from vq.distances import unit_rows, unit_rows_np
from vq.export import OnnxRunner, audit, to_onnx
from vq.export.search import search_module

K = 5


@pytest.fixture(scope="module")
def data(blobs):
    rng = np.random.default_rng(0)
    x = np.ascontiguousarray(blobs[:3000] * rng.uniform(0.5, 3.0, (3000, 1)).astype(np.float32))
    q = np.ascontiguousarray(blobs[-40:] * 2.5 + 0.05)
    return x, q


def _params(desc):
    return {"nprobe": 16} if "IVF" in desc else {}


@pytest.mark.parametrize("desc", [*KINDS.values(), *VARIANTS])
def test_cosine_equals_inner_products_on_normalised_vectors_for_every_kind(desc, data):
    x, q = data
    cosine = vq.index_factory(x.shape[1], desc, metric="cosine")
    ip = vq.index_factory(x.shape[1], desc, metric="ip")
    cosine.train(x)
    ip.train(unit_rows_np(x))
    cosine.add_with_ids(x, np.arange(x.shape[0]) + 7)
    ip.add_with_ids(unit_rows_np(x), np.arange(x.shape[0]) + 7)
    assert cosine.metric_name == "cosine" and cosine.metric == "ip" and cosine.normalize
    for n in (3, 40):  # the lean path of a few queries, the general path
        d, i = cosine.search(q[:n], K, **_params(desc))
        d_ip, i_ip = ip.search(unit_rows_np(q[:n]), K, **_params(desc))
        np.testing.assert_array_equal(i, i_ip)
        np.testing.assert_array_equal(d, d_ip)
    with _cpu.torch_only():  # the static searches, the same normalisation
        d, i = cosine.search(torch.from_numpy(q), K, **_params(desc))
        d_ip, i_ip = ip.search(torch.from_numpy(unit_rows_np(q)), K, **_params(desc))
    np.testing.assert_array_equal(i.numpy(), i_ip.numpy())
    np.testing.assert_array_equal(d.numpy(), d_ip.numpy())
    allowed = np.arange(7, 3007, 5)
    fd, fi = cosine.search(q, K, allowed=allowed, **_params(desc))
    np.testing.assert_array_equal(fi, ip.search(unit_rows_np(q), K, allowed=allowed,
                                                **_params(desc))[1])  # fmt: skip
    assert np.isin(fi, allowed).all()


@pytest.mark.parametrize("desc", ["Flat", "IVF16,Flat", "HNSW16,RFlat", "IVF16,PQ8,RFlat"])
def test_exact_cosine_searches_equal_brute_force_through_a_save(desc, data, tmp_path):
    x, q = data
    index = vq.index_factory(x.shape[1], desc, metric="cosine")
    index.train(x)
    index.add(x)
    if "HNSW" in desc:
        index.index.efSearch = 400
    if "PQ" in desc:
        index.k_factor = 64  # (the exact re-ranking of enough candidates)
    sims = unit_rows_np(q).astype(np.float64) @ unit_rows_np(x).astype(np.float64).T
    best = np.argsort(-sims, axis=1)[:, :K]
    d, i = index.search(q, K, **_params(desc))
    assert (i == best).mean() >= 0.995  # (ties aside)
    np.testing.assert_allclose(d, np.take_along_axis(sims, i, 1), rtol=1e-5, atol=1e-5)
    assert np.all(d <= 1.0 + 1e-6)
    index.save(tmp_path / "cosine.vq")
    loaded = vq.load_index(tmp_path / "cosine.vq")
    assert loaded.metric_name == "cosine"
    np.testing.assert_array_equal(loaded.search(q, K, **_params(desc))[1], i)
    np.testing.assert_allclose(loaded.reconstruct(np.arange(3)), unit_rows_np(x[:3]), atol=1e-6)


@pytest.mark.parametrize("desc", ["Flat", "IVF16,Flat", "HNSW16", "IVF16(soar),Flat,RFlat"])
def test_cosine_range_search_returns_the_vectors_above_a_similarity(desc, data):
    x, q = data
    index = vq.index_factory(x.shape[1], desc, metric="cosine")
    index.train(x)
    index.add(x)
    sims = unit_rows_np(q) @ unit_rows_np(x).T
    lims, d, i = index.range_search(q[:6], 0.95, **_params(desc))
    for j in range(6):
        got = i[lims[j] : lims[j + 1]]
        np.testing.assert_allclose(d[lims[j] : lims[j + 1]], sims[j, got], rtol=1e-5, atol=1e-5)
        assert (d[lims[j] : lims[j + 1]] > 0.95).all()
        if desc == "Flat" or "IVF" in desc:  # every list probed: every hit
            np.testing.assert_array_equal(np.sort(got), np.flatnonzero(sims[j] > 0.95))


def test_cosine_search_graphs_normalise_the_queries_inside(data, tmp_path):
    x, q = data
    index = vq.index_factory(x.shape[1], "IVF16,Flat", metric="cosine")
    index.train(x)
    index.add(x)
    expected = index.search(q, K, nprobe=4)
    graph = index.searcher(K, nprobe=4)
    d, i = graph(torch.from_numpy(q))  # raw queries: the graph scales them
    assert (i.numpy() == expected[1]).mean() >= 0.99
    np.testing.assert_allclose(d.numpy()[:, 0], expected[0][:, 0], rtol=1e-4, atol=1e-4)
    zero = graph(torch.zeros(2, x.shape[1]))[0]
    np.testing.assert_array_equal(zero.numpy(), 0.0)  # a zero query: similarity 0
    filtered = search_module(index, K, nprobe=4, filtered=True)
    mask = torch.ones(x.shape[0], dtype=torch.bool)
    np.testing.assert_array_equal(filtered(torch.from_numpy(q), mask)[1].numpy(), i)


def test_a_cosine_onnx_graph_equals_the_index(data, tmp_path):
    pytest.importorskip("onnx")
    pytest.importorskip("onnxscript")
    pytest.importorskip("onnxruntime")
    from export_helpers import ALLOWED_OPS

    x, q = data
    index = vq.index_factory(x.shape[1], "Flat", metric="cosine")
    index.add(x)
    path = to_onnx(index, tmp_path / "cosine.onnx", batch_size=8, k=K)
    runner = OnnxRunner(path)
    d, i = runner(q[:8])
    d_ref, i_ref = index.search(q[:8], K)
    assert (i == i_ref).mean() >= 0.97
    np.testing.assert_allclose(d, d_ref, rtol=1e-4, atol=1e-4)
    assert runner.metadata["metric"] == "cosine"
    assert json.loads(runner.metadata["index"])["metric"] == "cosine"
    assert set(audit(path).op_counts) <= ALLOWED_OPS


def test_cosine_converts_to_and_from_faiss_as_l2norm(data):
    faiss = pytest.importorskip("faiss")
    x, q = data
    index = vq.index_factory(x.shape[1], "IVF16,Flat", metric="cosine")
    index.train(x)
    index.add_with_ids(x, np.arange(x.shape[0]) * 2)
    theirs = index.to_faiss()
    assert isinstance(faiss.downcast_index(theirs), faiss.IndexPreTransform)
    faiss.extract_index_ivf(theirs).nprobe = 16
    np.testing.assert_array_equal(theirs.search(q, K)[1], index.search(q, K, nprobe=16)[1])
    back = vq.index.from_faiss(theirs)
    assert back.metric_name == "cosine"
    np.testing.assert_array_equal(back.search(q, K, nprobe=16)[1], index.search(q, K, nprobe=16)[1])
    made = faiss.index_factory(x.shape[1], "L2norm,Flat", faiss.METRIC_INNER_PRODUCT)
    made.add(x)
    mine = vq.index.from_faiss(made)
    assert mine.metric_name == "cosine"
    np.testing.assert_array_equal(mine.search(q, K)[1], made.search(q, K)[1])


def test_factory_reads_faiss_s_l2norm_and_idmap_prefixes(data):
    x, q = data
    d = x.shape[1]
    assert vq.index_factory(d, "L2norm,Flat", metric="ip").config()["metric"] == "cosine"
    l2 = vq.index_factory(d, "L2norm,IVF16,Flat")
    assert l2.config()["normalize"] is True and l2.metric == "l2"
    l2.train(x)
    l2.add(x)
    plain = vq.index_factory(d, "IVF16,Flat")
    plain.train(unit_rows_np(x))
    plain.add(unit_rows_np(x))
    np.testing.assert_array_equal(l2.search(q, K)[1], plain.search(unit_rows_np(q), K)[1])
    restored = vq.index.factory.from_config({"class": "IVFFlat", **l2.config()})
    assert restored.normalize and restored.config() == l2.config()
    for desc, expected in [
        ("IDMap,Flat", "Flat"),
        ("IDMap2,HNSW16", "HNSW16"),
        ("IDMap,L2norm,PCA16,IVF16,Flat,RFlat", "PCA16,IVF16,Flat,RFlat"),
    ]:
        a, b = vq.index_factory(d, desc), vq.index_factory(d, expected)
        assert type(a) is type(b)
        assert a.normalize == ("L2norm" in desc)
        config = a.config()
        assert config.pop("normalize", False) == ("L2norm" in desc) and config == b.config()
    wrapped = vq.index_factory(d, "L2norm,PCA16,IVF16,Flat,RFlat")
    assert not wrapped.index.normalize and not wrapped.index.index.normalize
    with pytest.raises(ValueError, match=r"L2norm after a transform \(it comes first"):
        vq.index_factory(d, "PCA16,L2norm,Flat")
    with pytest.raises(ValueError, match=r"metric must be 'l2', 'ip' or 'cosine', got 'cos'"):
        vq.index_factory(d, "Flat", metric="cos")


def test_one_query_vector_is_a_batch_of_one_and_other_ranks_are_refused(data):
    x, q = data
    index = vq.index_factory(x.shape[1], "IVF16,Flat")
    index.train(x)
    index.add(x)
    for one in (q[0], torch.from_numpy(q[0]), q[0].astype(np.float64)):
        d, i = index.search(one, K)
        assert tuple(d.shape) == (1, K) and tuple(i.shape) == (1, K)
        np.testing.assert_array_equal(np.asarray(i), index.search(q[:1], K)[1])
    lims, d, i = index.range_search(q[0], 30.0, nprobe=16)
    expected = index.range_search(q[:1], 30.0, nprobe=16)
    assert lims.shape == (2,)
    np.testing.assert_array_equal(i, expected[2])
    with pytest.raises(ValueError, match=r"queries: expected a 2-D array \[n, dim\] or one "
                                         r"query \[dim\], got shape \(2, 3, 32\)"):  # fmt: skip
        index.search(np.zeros((2, 3, 32), np.float32), K)
    with pytest.raises(ValueError, match=r"got shape \(\)"):
        index.search(np.array(1.0, np.float32), K)
    with pytest.raises(ValueError, match=r"queries: expected vectors of dim 32, got 31"):
        index.search(q[0, :31], K)


def test_unit_rows_are_the_same_on_both_paths_and_keep_zero_rows():
    x = np.random.default_rng(1).standard_normal((50, 24)).astype(np.float32) * 7
    x[3] = 0
    np.testing.assert_array_equal(unit_rows_np(x), unit_rows(torch.from_numpy(x)).numpy())
    np.testing.assert_array_equal(unit_rows_np(x)[3], 0)
    np.testing.assert_allclose(np.linalg.norm(np.delete(unit_rows_np(x), 3, 0), axis=1), 1, 1e-6)
