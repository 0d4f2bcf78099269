"""Re-ranking around a graph index on the torch path (CUDA tensors, ``vq._cpu.torch_only()``,
the exported graph): ``Refine`` over ``HNSW`` / ``HNSWSQ`` re-ranks the candidates of the
static-shape graph search (:mod:`vq.index.graph.hnsw_searcher`). Oracles: the exact re-ranking of
those candidates, exact search where the beam holds every node, the numba path."""

import numpy as np
import pytest
import torch

import vq
from vq._cpu import torch_only
from vq.export import export_module

DIM, K = 16, 10
GRAPHS = ["HNSW16,Refine(Flat)", "HNSW16,SQ8,Refine(SQfp16)"]


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2000, DIM)).astype(np.float32)
    return x, rng.standard_normal((40, DIM)).astype(np.float32)


def _built(desc, x, metric="l2"):
    index = vq.index_factory(DIM, desc, metric)
    index.train(x)
    index.add(x)
    return index


def _exact(q, x, metric, k):
    """The k nearest rows of ``x`` (float64 distances: squared L2, or negated products)."""
    q, x = q.astype(np.float64), x.astype(np.float64)
    d = -(q @ x.T) if metric == "ip" else ((q[:, None, :] - x[None]) ** 2).sum(-1)
    rows = np.argsort(d, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(d, rows, 1), rows


def _stored(index) -> np.ndarray:
    """The vectors a Refine re-ranks on (fp16 storage: the half-rounded values)."""
    return index.vectors.float().numpy()


@pytest.mark.parametrize("desc", GRAPHS)
@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_torch_refine_is_the_exact_reranking_of_the_static_graph_candidates(data, desc, metric):
    x, q = data
    index = _built(desc, x, metric)
    with torch_only():
        D, I = index.search(torch.from_numpy(q), K, k_factor=4)
    with torch.no_grad():  # the candidates: the wrapped graph's static search for k * k_factor
        _, cand = index.index.searcher(K * 4, copy=False)(torch.from_numpy(q))
    cand = cand.numpy()
    assert (cand >= 0).all() and all(len(set(r)) == K * 4 for r in cand)
    v = _stored(index).astype(np.float64)
    qd = q.astype(np.float64)
    if metric == "ip":
        d = -np.einsum("qd,qcd->qc", qd, v[cand])
    else:
        d = ((qd[:, None, :] - v[cand]) ** 2).sum(-1)
    order = np.argsort(d, axis=1, kind="stable")[:, :K]
    np.testing.assert_array_equal(I.numpy(), np.take_along_axis(cand, order, 1))
    expected = np.take_along_axis(d, order, 1)
    np.testing.assert_allclose(D.numpy(), -expected if metric == "ip" else expected, rtol=1e-5,
                               atol=1e-4)  # fmt: skip


@pytest.mark.parametrize("desc", GRAPHS)
def test_torch_and_numba_refine_agree_on_the_same_graph(data, desc):
    x, q = data
    index = _built(desc, x)
    for ef, k_factor in ((16, 4), (8, 1), (32, 2)):  # efSearch below and above k * k_factor
        D, I = index.search(q, K, k_factor=k_factor, efSearch=ef)
        with torch_only():
            Dt, It = index.search(torch.from_numpy(q), K, k_factor=k_factor, efSearch=ef)
        np.testing.assert_array_equal(It.numpy(), I)
        np.testing.assert_allclose(Dt.numpy(), D, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("desc", GRAPHS)
def test_a_beam_over_every_node_gives_exact_search_on_both_paths(data, desc):
    x, q = data
    x = x[:300]
    index = _built(desc, x)
    _, exact = _exact(q, _stored(index), "l2", K)
    _, I = index.search(q, K, k_factor=2, efSearch=300)
    with torch_only():
        _, It = index.search(torch.from_numpy(q), K, k_factor=2, efSearch=300)
    np.testing.assert_array_equal(I, exact)
    np.testing.assert_array_equal(It.numpy(), exact)


def test_a_filter_masks_the_static_graph_search(data):
    x, q = data
    index = _built("HNSW16,Refine(Flat)", x[:300])
    allowed = np.arange(0, 300, 3)
    with torch_only():  # a beam over every node: the exact filtered search
        D, I = index.search(torch.from_numpy(q), K, k_factor=2, efSearch=300, allowed=allowed)
    d, rows = _exact(q, x[:300][allowed], "l2", K)
    np.testing.assert_array_equal(I.numpy(), allowed[rows])
    np.testing.assert_allclose(D.numpy(), d, rtol=1e-5, atol=1e-5)
    with torch_only():  # the default beam: only allowed ids, nearest first
        D, I = index.search(torch.from_numpy(q), K, k_factor=2, allowed=allowed)
    assert np.isin(I.numpy(), allowed).all()
    assert (np.diff(D.numpy(), axis=1) >= 0).all()


def test_a_filter_allowing_every_row_changes_nothing(data):
    x, q = data
    graph = _built("HNSW16", x)
    searcher = graph.searcher(K, efSearch=12, copy=False)
    qt = torch.from_numpy(q)
    with torch.no_grad():
        D, I = searcher.search(qt, K)
        Da, Ia = searcher.search(qt, K, allowed=torch.ones(graph.ntotal, dtype=torch.bool))
        Dh, Ih = searcher.search(qt, K, allowed=torch.arange(graph.ntotal) % 2 == 0)
    np.testing.assert_array_equal(Ia.numpy(), I.numpy())
    np.testing.assert_array_equal(Da.numpy(), D.numpy())
    assert (Ih.numpy() % 2 == 0).all() and (Ih.numpy() >= 0).all()


def test_hnswsq_static_search_holds_codes_and_returns_their_decoded_distances(data):
    x, q = data
    graph = _built("HNSW16,SQ8", x)
    searcher = graph.searcher(K, copy=False)
    held = {n: b for n, b in searcher.named_buffers()}
    assert "vectors" not in held and held["values"].dtype == torch.uint8  # no float32 copy
    with torch.no_grad():
        D, I = searcher(torch.from_numpy(q))
    decoded = graph.sq.decode(graph.codes).float().numpy()[I.numpy()]
    np.testing.assert_allclose(D.numpy(), ((q[:, None, :] - decoded) ** 2).sum(-1), rtol=1e-4,
                               atol=1e-4)  # fmt: skip
    _, I_cpu = graph.search(q, K)  # the numba walk on the same codes
    assert (I.numpy() == I_cpu).mean() >= 0.95


@pytest.mark.parametrize("desc", GRAPHS)
def test_the_exported_refine_graph_equals_the_torch_path(data, desc):
    x, q = data
    index = _built(desc, x)
    with torch.no_grad():
        D, I = index.searcher(K, k_factor=4)(torch.from_numpy(q))  # a snapshot (export)
    with torch_only():
        Dt, It = index.search(torch.from_numpy(q), K, k_factor=4)
    np.testing.assert_array_equal(I.numpy(), It.numpy())
    np.testing.assert_array_equal(D.numpy(), Dt.numpy())


def test_the_torch_path_reads_no_numpy(data, monkeypatch):
    x, q = data
    index = _built("HNSW16,SQ8,Refine(SQfp16)", x)
    qt = torch.from_numpy(q)
    with torch_only():
        expected = index.search(qt, K, k_factor=4)

    def refuse(self, *args, **kwargs):
        raise AssertionError("the torch path called Tensor.numpy()")

    # the search past the input checks (which view CPU queries as numpy: device-specific)
    monkeypatch.setattr(torch.Tensor, "numpy", refuse)
    with torch_only(), torch.no_grad():
        D, I = index.search_ids(qt, K, k_factor=4, efSearch=24)
        D, I = index.search_ids(qt, K, k_factor=4)
    monkeypatch.undo()
    np.testing.assert_array_equal(I.numpy(), expected[1].numpy())
    np.testing.assert_array_equal(D.numpy(), expected[0].numpy())


def test_a_bad_efsearch_on_the_torch_path_says_what_to_pass(data):
    x, q = data
    index = _built("HNSW16,Refine(Flat)", x[:300])
    with torch_only(), pytest.raises(ValueError, match="efSearch"):
        index.search(torch.from_numpy(q), K, efSearch=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("desc", GRAPHS)
def test_a_cuda_refine_over_a_graph_equals_the_cpu_torch_path(data, desc):
    x, q = data
    index = _built(desc, x)
    with torch_only():
        D, I = index.search(torch.from_numpy(q), K, k_factor=4)
    index.to("cuda")
    Dc, Ic = index.search(torch.from_numpy(q).cuda(), K, k_factor=4)
    assert Ic.device.type == "cuda"
    np.testing.assert_array_equal(Ic.cpu().numpy(), I.numpy())
    np.testing.assert_allclose(Dc.cpu().numpy(), D.numpy(), rtol=1e-4, atol=1e-4)


def test_a_filtered_export_of_refine_over_a_graph_is_refused(data):
    x, _ = data
    index = _built("HNSW16,Refine(Flat)", x[:300])
    with pytest.raises(ValueError, match="Refine search graph takes no filter"):
        export_module(index, k=5, filtered=True)


def test_the_torch_refine_reads_fp16_vectors_in_place(data):
    """The static re-ranking keeps the fp16 vectors as they are stored (no float32 copy of
    every vector per search: only the candidates' rows are widened), and ranks as the
    float32 copy does."""
    from vq.index.wrappers.refine import RefineSearch, rerank

    x, q = data
    index = _built("HNSW16,SQ8,Refine(SQfp16)", x)
    searcher = RefineSearch(index, index.index.torch_searcher(), copy=False)
    assert searcher.vectors.dtype == torch.float16
    assert searcher.vectors.data_ptr() == index.vectors.data_ptr()
    cand = torch.from_numpy(np.random.default_rng(3).integers(-1, len(x), (len(q), 24)))
    got = rerank(torch.from_numpy(q), index.vectors, cand, K, "l2")
    want = rerank(torch.from_numpy(q), index.vectors.float(), cand, K, "l2")
    torch.testing.assert_close(got[0], want[0])
    assert torch.equal(got[1], want[1])


def test_the_torch_refine_counts_the_lists_of_an_ivf_behind_a_transform(data):
    x, q = data
    index = _built("OPQ4,IVF8,PQ4,RFlat", x)  # Refine(PreTransform(IVFPQ)): nprobe forwarded
    probed = index.search(q[:3], K, nprobe=3, return_probed=True)[2]
    with torch_only():
        probed_torch = index.search(torch.from_numpy(q[:3]), K, nprobe=3, return_probed=True)[2]
    np.testing.assert_array_equal(probed, [3, 3, 3])
    np.testing.assert_array_equal(probed_torch.numpy(), probed)
