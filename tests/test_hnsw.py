"""vq.HNSW: recall against brute force, the same ids as faiss on the same graph (both ways),
save/load, forged graphs refused, determinism, errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_index_io import forge

import vq
from vq.kernels.common import threads

faiss = pytest.importorskip("faiss")

N, DIM = 3000, 32


@pytest.fixture(scope="module")
def data(blobs):
    x = np.ascontiguousarray(blobs[:N])
    q = np.ascontiguousarray(blobs[9000:9200] + 0.01, dtype=np.float32)
    return x, q


@pytest.fixture(scope="module")
def built(data):
    index = vq.HNSW(DIM, M=12, efConstruction=40)
    index.add(data[0])
    return index


def recall(found, expected) -> float:
    k = expected.shape[1]
    return float(np.mean([len(set(a) & set(b)) for a, b in zip(found, expected, strict=True)]) / k)


def test_recall_against_brute_force_grows_with_efsearch(data, built):
    x, q = data
    gt = faiss.knn(q, x, 10)[1]
    low = recall(built.search(q, 10, efSearch=10)[1], gt)
    high = recall(built.search(q, 10, efSearch=64)[1], gt)
    assert high >= 0.98
    assert high >= low
    D, I = built.search(q, 10, efSearch=64)
    exact = ((q[:, None, :] - x[I]) ** 2).sum(-1)
    np.testing.assert_allclose(D, exact, rtol=1e-4, atol=1e-4)
    assert np.all(np.diff(D, axis=1) >= 0)


@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_faiss_graph_imported_gives_faiss_ids(data, metric):
    x, q = data
    f = faiss.IndexHNSWFlat(DIM, 8, vq.index.core.faiss_build.faiss_metric(metric))
    f.add(x)
    for ef in (5, 16, 40):  # 5 < k: faiss's other stopping rule
        f.hnsw.efSearch = ef
        Df, If = f.search(q, 10)
        index = vq.index.from_faiss(f)
        assert index.efSearch == ef and index.M == 8
        D, I = index.search(q, 10)
        assert (I == If).mean() >= 0.99  # ties and last-bit sums aside
        same = I == If
        np.testing.assert_allclose(D[same], Df[same], rtol=1e-4, atol=1e-4)


def test_exported_graph_gives_vq_ids_in_faiss(data, built):
    x, q = data
    f = built.to_faiss()
    assert isinstance(f, faiss.IndexHNSWFlat) and f.ntotal == N
    f.hnsw.efSearch = 24
    _, If = f.search(q, 10)
    _, I = built.search(q, 10, efSearch=24)
    assert (I == If).mean() >= 0.99
    back = vq.index.from_faiss(f)
    assert torch.equal(back.neighbors, built.neighbors)
    assert torch.equal(back.upper_neighbors, built.upper_neighbors)
    assert torch.equal(back.entry_point, built.entry_point)


def test_save_load_round_trip_gives_identical_results(tmp_path, data, built):
    _, q = data
    path = tmp_path / "hnsw.vqi"
    built.save(path)
    loaded = vq.load_index(path)
    assert isinstance(loaded, vq.HNSW) and loaded.config() == built.config()
    for a, b in zip(built.search(q, 5, efSearch=20), loaded.search(q, 5, efSearch=20), strict=True):
        np.testing.assert_array_equal(a, b)


def _neighbour_past_the_end(t):
    t["neighbors"][5, 0] = t["vectors"].shape[0]


def _upper_link_to_level_zero_node(t):
    levels, up = t["levels"], t["upper_neighbors"]
    up[0, 0] = int(torch.nonzero(levels == 0)[0, 0])


def _entry_below_the_top(t):
    t["entry_point"][0] = int(torch.nonzero(t["levels"] == 0)[0, 0])


@pytest.mark.parametrize(
    "edit, message",
    [
        (_neighbour_past_the_end, r"neighbors ids outside \[-1, 3000\)"),
        (_upper_link_to_level_zero_node, "upper-level links to nodes without that level"),
        (_entry_below_the_top, "not a node of the top level"),
    ],
)
def test_forged_graph_is_refused_at_load(tmp_path, built, edit, message):
    path = tmp_path / "hnsw.vqi"
    built.save(path)
    forged = forge(path, tmp_path / "forged.vqi", edit_tensors=edit)
    with pytest.raises(ValueError, match=message):
        vq.load_index(forged)


def test_build_is_deterministic_whatever_the_thread_count(data):
    x = data[0][:1500]
    graphs = []
    for n_threads in (1, 2, 1):
        with threads.serial() if n_threads == 1 else _nothing():
            index = vq.HNSW(DIM, M=8)
            index.add(x[:700])
            index.add(x[700:])
        graphs.append((index.neighbors, index.upper_neighbors, index.entry_point))
    for g in graphs[1:]:
        for a, b in zip(graphs[0], g, strict=True):
            assert torch.equal(a, b)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_factory_strings_and_ids(data):
    x, q = data
    for description in ("HNSW16", "HNSW16,Flat"):
        index = vq.index_factory(DIM, description)
        assert isinstance(index, vq.HNSW) and index.M == 16
    index = vq.index_factory(DIM, "HNSW6", metric="ip")
    ids = np.arange(N, dtype=np.int64) * 7 + 3
    index.add_with_ids(x, ids)
    D, I = index.search(q[:20], 5, efSearch=32)
    best = np.argsort(-(q[:20] @ x.T), axis=1)[:, :5]
    assert recall(I, ids[best]) >= 0.9
    np.testing.assert_allclose(D[:, 0], (q[:20] @ x.T).max(1), rtol=1e-4)
    D, It = index.search(torch.from_numpy(q[:20]), 5, efSearch=32)
    assert isinstance(It, torch.Tensor) and np.array_equal(It.numpy(), I)
    with pytest.raises(ValueError, match="index_factory"):
        vq.index_factory(DIM, "HNSW16,PQ8")


def test_bad_input_errors(data, built):
    x, q = data
    with pytest.raises(ValueError, match="efSearch must be a positive integer"):
        built.search(q, 10, efSearch=0)
    with pytest.raises(ValueError, match="dim"):
        built.search(q[:, :16], 10)
    with pytest.raises(ValueError, match="cannot remove"):
        built.remove_ids([1, 2])
    with pytest.raises(ValueError, match="M must be"):
        vq.HNSW(DIM, M=1)
    with pytest.raises(TypeError, match="unexpected keyword argument 'nprobe'"):
        built.search(q, 10, nprobe=4)
    empty = vq.HNSW(DIM, M=8)
    D, I = empty.search(q[:3], 4)
    assert (I == -1).all() and np.isinf(D).all()


def test_few_vectors_and_k_above_ntotal(data):
    x, q = data
    index = vq.HNSW(DIM, M=4)
    index.add(x[:1])
    index.add(x[1:3])
    D, I = index.search(q[:40], 5)
    assert (I[:, :3] >= 0).all() and (I[:, 3:] == -1).all()
    assert sorted(I[0, :3]) == [0, 1, 2]


# -- the static-shape search (torch path, export) ---------------------------------------------
def test_static_search_reaches_the_kernel_results_with_enough_steps(data, built):
    from vq.index.graph.hnsw_searcher import recall_by_steps

    _, q = data
    by_steps = recall_by_steps(built, q[:60], 10, (2, 8, 64), efSearch=24, width=2)
    assert by_steps[2] < by_steps[8] <= by_steps[64]
    assert by_steps[64] >= 0.97
    with vq._cpu.torch_only():  # the torch path is the static search
        D, I = built.search(torch.from_numpy(q[:30]), 10, efSearch=24)
    x = data[0]
    exact = ((q[:30, None, :] - x[I.numpy()]) ** 2).sum(-1)
    np.testing.assert_allclose(D.numpy(), exact, rtol=1e-4, atol=1e-4)


def test_onnx_search_equals_eager_torch(tmp_path, data, built):
    pytest.importorskip("onnx")
    pytest.importorskip("onnxscript")
    pytest.importorskip("onnxruntime")
    from vq.export import OnnxRunner, audit, to_onnx

    x, q = data
    small = vq.HNSW(DIM, M=16, efSearch=3)  # few levels, 6 unrolled steps: a quick export
    small.add(x[:400])
    path = to_onnx(small, tmp_path / "hnsw.onnx", batch_size=8, k=3)
    report = audit(path)
    assert report.clean, str(report)
    D, I = OnnxRunner(path)(q[:13])
    with torch.no_grad():
        Dt, It = small.searcher(3)(torch.from_numpy(q[:13]))
    np.testing.assert_array_equal(I, It.numpy())
    np.testing.assert_allclose(D, Dt.numpy(), rtol=1e-5, atol=1e-5)


# -- a graph-routed coarse quantizer (IVF<nlist>_HNSW<M>) ---------------------------------------
@pytest.mark.parametrize("encoding", ["Flat", "PQ8"])
def test_ivf_routed_by_a_graph_over_the_centroids(tmp_path, data, encoding):
    x, q = data
    routed = vq.index_factory(DIM, f"IVF32_HNSW8,{encoding}")
    scanned = vq.index_factory(DIM, f"IVF32,{encoding}")
    for index in (routed, scanned):
        index.train(x)
        index.add(x)
    assert routed.coarse_graph.ntotal == 32 and routed.config()["coarse_hnsw"] == 8
    # the graph finds the nearest centroid (rounding aside: it sums differences, the scan
    # expands the square)
    t = torch.from_numpy(x)
    assert (routed._assign(t) == scanned._assign(t)).float().mean() >= 0.995
    gt = faiss.knn(q, x, 10)[1]
    for nprobe in (1, 6):  # as good as the scan (PQ codebooks trained apart: not the same ids)
        expected = recall(scanned.search(q, 10, nprobe=nprobe)[1], gt)
        assert recall(routed.search(q, 10, nprobe=nprobe)[1], gt) >= expected - 0.02
        np.testing.assert_array_equal(
            routed.search(q[:3], 10, nprobe=nprobe)[1], routed.search(q, 10, nprobe=nprobe)[1][:3]
        )
    f = routed.to_faiss()
    assert isinstance(faiss.downcast_index(f.quantizer), faiss.IndexHNSWFlat)
    f.nprobe = 6
    np.testing.assert_array_equal(f.search(q, 10)[1], routed.search(q, 10, nprobe=6)[1])
    back = vq.index.from_faiss(f)
    assert back.coarse_hnsw == 8
    np.testing.assert_array_equal(back.search(q, 10, nprobe=6)[1], f.search(q, 10)[1])
    routed.save(tmp_path / "ivf.vqi")
    loaded = vq.load_index(tmp_path / "ivf.vqi")
    np.testing.assert_array_equal(loaded.search(q, 10, nprobe=6)[1], f.search(q, 10)[1])


def test_int8_traversal_keeps_recall_and_exact_distances(tmp_path, data, built):
    x, q = data
    index = vq.HNSW(DIM, M=12, traversal="int8")
    index.add(x[:1000])
    index.add(x[1000:])
    assert index.codes.dtype == torch.int8 and index.codes.shape == (N, DIM)
    scale = index.code_factors[:, :1]
    np.testing.assert_allclose(index.codes.float() * scale, x, atol=float(scale.max()) / 2 + 1e-6)
    assert torch.equal(index.neighbors, _graph_of(x, 1000))  # the same graph as "float"
    gt = faiss.knn(q, x, 10)[1]
    D, I = index.search(q, 10, efSearch=48)
    assert recall(I, gt) >= recall(_float_search(x, q), gt) - 0.01
    exact = ((q[:, None, :] - x[I]) ** 2).sum(-1)  # re-ranked: exact distances
    np.testing.assert_allclose(D, exact, rtol=1e-4, atol=1e-4)
    index.save(tmp_path / "i8.vqi")
    loaded = vq.load_index(tmp_path / "i8.vqi")
    assert loaded.traversal == "int8"
    np.testing.assert_array_equal(loaded.search(q, 10, efSearch=48)[1], I)
    with pytest.raises(ValueError, match="traversal must be one of"):
        vq.HNSW(DIM, traversal="fp8")


def _graph_of(x, first):
    index = vq.HNSW(DIM, M=12)
    index.add(x[:first])
    index.add(x[first:])
    return index.neighbors


def _float_search(x, q):
    index = vq.HNSW(DIM, M=12)
    index.add(x[:1000])
    index.add(x[1000:])
    return index.search(q, 10, efSearch=48)[1]


def test_searches_from_many_threads_equal_one_at_a_time(data, built):
    from concurrent.futures import ThreadPoolExecutor

    _, q = data
    expected = [built.search(q[s : s + 20], 10, efSearch=24)[1] for s in range(0, 200, 20)]
    with ThreadPoolExecutor(4) as pool:
        found = list(pool.map(lambda s: built.search(q[s : s + 20], 10, efSearch=24)[1],
                              range(0, 200, 20)))  # fmt: skip
    for a, b in zip(expected, found, strict=True):
        np.testing.assert_array_equal(a, b)


def test_visit_stamps_are_reused_by_shape_and_never_handed_out_for_another_graph_size():
    from vq.index.graph.hnsw_graph import SeenPool

    pool = SeenPool()
    one, two = pool.take(1, 100), pool.take(2, 100)
    assert one.shape == (1, 101) and two.shape == (2, 101)
    pool.give_back(one)
    pool.give_back(two)
    assert pool.take(1, 100) is one and pool.take(2, 100) is two  # each by its own shape
    pool.give_back(one)
    pool.give_back(pool.take(1, 150))  # the graph grew: the shorter stamps are dropped
    assert all(s.shape[1] == 151 for s in pool.free)
    assert pool.take(1, 100) is not one
    for _ in range(12):  # more stamps given back than searches ever hold at once: 8 kept
        pool.give_back(np.zeros((1, 151), np.uint16))
    assert len(pool.free) == 8


@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_rabitq_walk_estimates_are_the_torch_estimates(data, metric):
    from numba import njit

    from vq.kernels.common.constants import metric as static_metric
    from vq.kernels.graph.graph_store import prepare_query, rabitq_estimate
    from vq.quantizers.rabitq import estimates, prepare_queries, unpack_bits

    @njit
    def all_estimates(queries, store, ip, out):
        for q in range(queries.shape[0]):
            x = prepare_query(queries[q], store, ip)
            for i in range(out.shape[1]):
                out[q, i] = rabitq_estimate(x, store, i, ip)

    x, q = data
    index = vq.HNSW(DIM, M=8, metric=metric, traversal="rabitq")
    index.add(x[:500])
    index.add(x[500:800])
    torch.testing.assert_close(index.center, torch.from_numpy(x[:500]).mean(0))
    _, words, factors, transform = index._search_store()
    found = np.empty((q.shape[0], 800), np.float32)
    store = (words, factors, transform, x[:800])
    all_estimates(q, store, static_metric(metric == "ip"), found)
    rotation, center = index.rotation, index.center @ index.rotation
    q_hat, constants = prepare_queries(torch.from_numpy(q), rotation, center, qb=4)
    signs = (unpack_bits(index.codes, DIM) * 2 - 1) / np.sqrt(DIM)
    expected = estimates(q_hat @ signs.T, index.code_factors, constants, metric)
    if metric == "ip":  # the walk ranks by negated inner products
        expected = -expected
    np.testing.assert_allclose(found, expected.numpy(), rtol=1e-4, atol=1e-4)
    exact = ((q[:, None, :] - x[None, :800]) ** 2).sum(-1) if metric == "l2" else -(q @ x[:800].T)
    q_c = torch.from_numpy(q) @ rotation - center  # the error bound the beam's gate uses
    bound = index.code_factors[:, 2] * q_c.norm(dim=1, keepdim=True)
    within = float((np.abs(found - exact) <= bound.numpy()).mean())
    assert within > 0.9, within


def test_rabitq_traversal_keeps_recall_and_exact_distances(tmp_path, data):
    x, q = data
    index = vq.HNSW(DIM, M=12, traversal="rabitq")
    index.add(x[:1000])
    index.add(x[1000:])
    assert index.codes.dtype == torch.uint8 and index.codes.shape == (N, DIM // 8)
    assert torch.equal(index.neighbors, _graph_of(x, 1000))  # the same graph as "float"
    gt = faiss.knn(q, x, 10)[1]
    D, I = index.search(q, 10, efSearch=96)
    assert recall(I, gt) >= recall(_float_search(x, q), gt) - 0.02
    exact = ((q[:, None, :] - x[I]) ** 2).sum(-1)  # re-ranked: exact distances
    np.testing.assert_allclose(D, exact, rtol=1e-4, atol=1e-4)
    assert recall(index.search(q, 10, efSearch=16)[1], gt) < recall(I, gt)
    index.save(tmp_path / "rq.vqi")
    loaded = vq.load_index(tmp_path / "rq.vqi")
    assert loaded.traversal == "rabitq" and torch.equal(loaded.center, index.center)
    np.testing.assert_array_equal(loaded.search(q, 10, efSearch=96)[1], I)
    loaded.reset()
    loaded.add(x[:500])  # a new first batch: a new centre, codes about it
    torch.testing.assert_close(loaded.center, torch.from_numpy(x[:500]).mean(0))
    codes, factors = loaded.rabitq_codes(torch.from_numpy(x[:500]))
    assert torch.equal(loaded.codes, codes) and torch.equal(loaded.code_factors, factors)
    assert not torch.equal(codes, index.codes[:500])  # (about the other centre)
