"""vq.HNSWSQ: an HNSW graph over scalar-quantizer codes (faiss IndexHNSWSQ, "HNSW32,SQ8"):
faiss's ids and distances on the same graph and codes, the factory strings, save/load,
memory per vector, the static search."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import vq

faiss = pytest.importorskip("faiss")

N, DIM = 3000, 32


@pytest.fixture(scope="module")
def data(aniso):
    x = np.ascontiguousarray(aniso[:N])
    q = np.ascontiguousarray(aniso[9000:9100])
    return x, q


@pytest.fixture(scope="module")
def built(data):
    index = vq.index_factory(DIM, "HNSW8,SQ8")
    index.train(data[0])
    index.add(data[0][:1000])
    index.add(data[0][1000:])
    return index


def test_factory_strings_make_hnsw_over_codes():
    for description, bits in (("HNSW32,SQ8", 8), ("HNSW16,SQ4", 4), ("HNSW8,SQfp16", "fp16")):
        index = vq.index_factory(DIM, description)
        assert isinstance(index, vq.HNSWSQ) and index.bits == bits
        assert index.M == int(description[4:].split(",")[0])
    assert vq.index_factory(DIM, "HNSW8,SQfp16").is_trained
    with pytest.raises(RuntimeError, match="not trained"):
        vq.index_factory(DIM, "HNSW8,SQ8").add(np.zeros((4, DIM), np.float32))


@pytest.mark.parametrize("metric", ["l2", "ip"])
@pytest.mark.parametrize("bits", [8, "fp16"])
def test_same_graph_and_codes_give_faiss_ids_and_distances(data, metric, bits):
    x, q = data
    index = vq.HNSWSQ(DIM, M=8, bits=bits, metric=metric)
    index.train(x)
    index.add(x)
    f = index.to_faiss()
    assert isinstance(f, faiss.IndexHNSWSQ) and f.ntotal == N
    back = vq.index.from_faiss(f)
    assert isinstance(back, vq.HNSWSQ) and torch.equal(back.codes, index.codes)
    assert torch.equal(back.neighbors, index.neighbors) and back.bits == bits
    for ef in (16, 64):
        f.hnsw.efSearch = ef
        Df, If = f.search(q, 10)
        D, I = index.search(q, 10, efSearch=ef)
        assert (I == If).mean() >= 0.99  # ties and last-bit sums aside
        same = I == If
        np.testing.assert_allclose(D[same], Df[same], rtol=1e-4, atol=1e-4)


def test_recall_and_distances_are_those_of_the_decoded_codes(data, built):
    x, q = data
    decoded = built.sq.decode(built.codes).numpy()
    D, I = built.search(q, 10, efSearch=128)
    exact = ((q[:, None, :] - decoded[I]) ** 2).sum(-1)
    np.testing.assert_allclose(D, exact, rtol=1e-3, atol=1e-3)
    gt = faiss.knn(q, x, 10)[1]
    hits = np.mean([len(set(a) & set(b)) for a, b in zip(I, gt, strict=True)]) / 10
    assert hits >= 0.95


def test_keeps_codes_not_vectors(data, built):
    x, _ = data
    flat = vq.HNSW(DIM, M=8)
    flat.add(x)

    def size(index):
        return sum(t.numel() * t.element_size() for t in index.state_dict().values())

    assert built.vectors.shape[0] == 0 and built.codes.shape == (N, DIM)
    assert size(built) <= size(flat) - N * (4 * DIM - DIM)  # 3 bytes per dimension saved


def test_save_load_round_trip_gives_identical_results(tmp_path, data, built):
    _, q = data
    path = tmp_path / "hnswsq.vqi"
    built.save(path)
    loaded = vq.load_index(path)
    assert isinstance(loaded, vq.HNSWSQ) and loaded.config() == built.config()
    for a, b in zip(built.search(q, 5, efSearch=20), loaded.search(q, 5, efSearch=20), strict=True):
        np.testing.assert_array_equal(a, b)


def test_static_search_reaches_the_kernel_results(data, built):
    _, q = data
    _, I = built.search(q, 10, efSearch=32)
    searcher = built.searcher(10, efSearch=32, steps=128)
    with torch.no_grad():
        _, It = searcher(torch.from_numpy(q))
    assert (It.numpy() == I).mean() >= 0.97


def test_faiss_built_hnswsq_imported_gives_faiss_ids(data):
    x, q = data
    f = faiss.IndexHNSWSQ(DIM, faiss.ScalarQuantizer.QT_8bit, 8)
    f.train(x)
    f.add(x)
    f.hnsw.efSearch = 32
    Df, If = f.search(q, 10)
    D, I = vq.index.from_faiss(f).search(q, 10)
    assert (I == If).mean() >= 0.99
    same = I == If
    np.testing.assert_allclose(D[same], Df[same], rtol=1e-4, atol=1e-4)
