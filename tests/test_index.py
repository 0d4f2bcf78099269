import numpy as np
import pytest
import torch

import vq
from vq import faiss_interop as fi
from vq._cpu import torch_only

faiss = pytest.importorskip("faiss")


@pytest.fixture(scope="module")
def queries(blobs):
    return (blobs[:50] + 0.05).astype(np.float32)


def same_results(D, I, Df, If, rtol=1e-4):
    """Top-k ids identical for >= 99.9% of rows (ties aside), distances close."""
    rows_same = (I == If).all(axis=1)
    assert rows_same.mean() >= 0.999 or np.allclose(D, Df, rtol=rtol, atol=1e-3)
    np.testing.assert_allclose(D, Df, rtol=rtol, atol=1e-3)


@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_flat_equals_faiss(blobs, queries, metric):
    ref = faiss.IndexFlatL2(32) if metric == "l2" else faiss.IndexFlatIP(32)
    ref.add(blobs)
    index = vq.FlatIndex(32, metric=metric)
    index.add(blobs)
    many = (blobs[::7] - 0.05).astype(np.float32)  # several blocks of queries and of vectors
    assert len(many) > 1024 and len(blobs) > 4096
    for q in (queries, many):
        D, I = index.search(q, 10)
        Df, If = ref.search(q, 10)
        same_results(D, I, Df, If)
    with torch_only():
        Dt, It = index.search(many, 10)
    same_results(Dt, It, Df, If)


@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_pq_with_faiss_codebooks_equals_faiss(blobs, queries, metric):
    ref = faiss.IndexPQ(32, 8, 8, faiss.METRIC_L2 if metric == "l2" else faiss.METRIC_INNER_PRODUCT)
    ref.train(blobs)
    ref.add(blobs)
    index = vq.PQIndex(32, 8, metric=metric)
    index.pq = fi.pq_from_faiss(ref.pq)
    index.add(blobs)
    np.testing.assert_array_equal(
        index.codes.numpy(), faiss.vector_to_array(ref.codes).reshape(-1, 8)
    )
    D, I = index.search(queries, 20)
    Df, If = ref.search(queries, 20)
    same_results(D, I, Df, If)
    with torch_only():
        Dt, It = index.search(queries, 20)
    same_results(Dt, It, Df, If)


def test_ids_add_remove_and_padding(blobs):
    index = vq.PQIndex(32, 8, niter=5).train(blobs)
    index.add_with_ids(blobs[:100], np.arange(1000, 1100))
    assert index.ntotal == 100
    D, I = index.search(blobs[:5], 3)
    assert I[:, 0].tolist() == [1000, 1001, 1002, 1003, 1004]
    assert index.remove_ids(np.array([1000, 1001, 5])) == 2
    assert index.ntotal == 98
    _, I = index.search(blobs[:2], 98)
    assert 1000 not in I and 1001 not in I and (I >= 1002).all()
    D, I = index.search(blobs[:2], 120)
    assert (I[:, 98:] == -1).all() and np.isinf(D[:, 98:]).all() and (D[:, 98:] > 0).all()


def test_empty_index_and_ip_padding(blobs):
    index = vq.FlatIndex(32, metric="ip")
    D, I = index.search(blobs[:3], 4)
    assert D.shape == (3, 4) and (I == -1).all() and np.isneginf(D).all()


def test_torch_queries_give_tensors_and_forward_uses_k(blobs):
    index = vq.FlatIndex(32, k=7)
    index.add(blobs[:500])
    D, I = index(torch.from_numpy(blobs[:4]))
    assert isinstance(I, torch.Tensor) and I.shape == (4, 7) and I.dtype == torch.int64
    assert I[:, 0].tolist() == [0, 1, 2, 3]


def test_state_dict_round_trip(blobs, queries):
    index = vq.PQIndex(32, 8, niter=5).train(blobs)
    index.add(blobs)
    index.remove_ids(np.arange(10))
    fresh = vq.PQIndex(32, 8)
    fresh.load_state_dict(index.state_dict())
    assert fresh.is_trained and fresh.ntotal == index.ntotal
    for a, b in zip(fresh.search(queries, 5), index.search(queries, 5), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda i, x: i.search(x[:, :16], 5), ValueError, "expected vectors of dim 32, got 16"),
        (lambda i, x: i.search(x, 0), ValueError, "k must be a positive integer"),
        (lambda i, x: i.add_with_ids(x[:3], np.arange(2)), ValueError, r"expected shape \(3,\)"),
        (lambda i, x: i.add_with_ids(x[:3], np.ones(3)), TypeError, "ids: expected integers"),
        (lambda i, x: i.search(np.full((2, 32), np.nan, np.float32), 5), ValueError, "NaN/Inf"),
        (lambda i, x: vq.PQIndex(32, 8).search(x, 5), RuntimeError, "not trained"),
        (lambda i, x: vq.PQIndex(32, 8).add(x), RuntimeError, "not trained"),
        (lambda i, x: vq.FlatIndex(32, metric="cos"), ValueError, "metric must be"),
    ],
)
def test_bad_input(blobs, call, error, match):
    index = vq.FlatIndex(32)
    index.add(blobs[:100])
    with pytest.raises(error, match=match):
        call(index, blobs[:10])
