"""Re-ranking on vectors kept in fp16 (``Refine(index, storage="fp16")``, factory suffix
``Refine(SQfp16)``): the distances of the fp16 values, faiss's ``IndexRefine`` around an
``SQfp16`` index as the oracle, half the bytes of ``RFlat``."""

import copy

import numpy as np
import pytest
import torch

import vq
from vq._cpu import torch_only
from vq.index import Refine

DIM, K = 32, 10


@pytest.fixture(scope="module", name="faiss")
def fixture_faiss():
    return pytest.importorskip("faiss")


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((4000, DIM)) * [1 + j for j in range(DIM)]).astype(np.float32)
    return x, rng.standard_normal((30, DIM)).astype(np.float32) * 4


def _built(desc, x, metric="l2"):
    index = vq.index_factory(DIM, desc, metric)
    index.train(x)
    index.add(x)
    return index


@pytest.mark.parametrize("desc", ["IVF16,PQ8", "PQ8", "HNSW16,SQ8", "IVF16,PQ16x4fs"])
@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_fp16_reranking_equals_faiss_index_refine_around_sqfp16(faiss, data, desc, metric):
    x, q = data
    index = _built(f"{desc},Refine(SQfp16)", x, metric)
    assert index.storage == "fp16" and index.vectors.dtype == torch.float16
    ref = index.to_faiss()
    ref.k_factor = 4
    D, I = index.search(q, K, k_factor=4)
    D_ref, I_ref = ref.search(q, K)
    np.testing.assert_array_equal(I, I_ref)
    np.testing.assert_allclose(D, D_ref, rtol=1e-5, atol=1e-4)
    D_few, I_few = index.search(q[:3], K, k_factor=4)  # the lean path
    np.testing.assert_array_equal(I_few, I[:3])
    np.testing.assert_array_equal(D_few, D[:3])


def test_fp16_distances_are_those_of_the_half_rounded_vectors(data):
    x, q = data
    index = _built("IVF16,Flat,Refine(SQfp16)", x)
    D, I = index.search(q, K, k_factor=2)
    halves = x.astype(np.float16).astype(np.float64)  # IEEE round to nearest, as torch's
    expected = ((q[:, None, :].astype(np.float64) - halves[I]) ** 2).sum(-1)
    np.testing.assert_allclose(D, expected, rtol=2e-6)
    assert index.vectors.element_size() == 2  # 2 bytes a dimension, half of RFlat's


def test_fp16_reranking_by_torch_after_a_load_and_a_merge_gives_the_same_results(data, tmp_path):
    x, q = data
    index = _built("IVF16,PQ8,Refine(SQfp16)", x)
    D, I = index.search(q, K, k_factor=4)
    with torch_only():
        D_t, I_t = index.search(q, K, k_factor=4)
    np.testing.assert_array_equal(I_t, I)
    np.testing.assert_allclose(D_t, D, rtol=1e-5)
    index.save(tmp_path / "index.vq")
    loaded = vq.load_index(tmp_path / "index.vq")
    assert loaded.storage == "fp16" and loaded.vectors.dtype == torch.float16
    for a, b in zip(loaded.search(q, K, k_factor=4), (D, I), strict=True):
        np.testing.assert_array_equal(a, b)
    first, second = copy.deepcopy(index), copy.deepcopy(index)  # trained alike
    first.remove_ids(np.arange(2000, 4000))
    second.remove_ids(np.arange(2000))
    first.merge_from(second)
    assert first.vectors.dtype == torch.float16
    for a, b in zip(first.search(q, K, k_factor=4), (D, I), strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_refine_storage_it_does_not_know_is_refused_with_the_choices():
    with pytest.raises(ValueError, match=r"storage must be one of \('float32', 'fp16'\)"):
        Refine(vq.index_factory(DIM, "PQ8"), storage="bf16")
