"""Every index kind checks its constructor's arguments at construction (types and ranges, the
message naming the argument and what it accepts: ``IVFFlat(dim, 64, coarse_niter=-1)`` was
accepted and failed in ``train``), and the cosmetic findings of the hostile-input study: search
arguments, ``reconstruct`` of graph indexes, factory strings."""

import numpy as np
import pytest
import torch

import vq
from vq.index import HNSW, HNSWSQ, IVFPQ, IVFSQ, FlatIndex, IVFFlat, PQIndex, Refine, SQIndex

D = 16

CONSTRUCTORS = [
    # (call, error type, message)
    (lambda: IVFFlat(D, 64, coarse_niter=-1), ValueError, r"coarse_niter must be >= 0, got -1"),
    (
        lambda: IVFFlat(D, 64, coarse_niter=2.5),
        TypeError,
        r"coarse_niter must be an integer, got 2.5 \(float\)",
    ),
    (
        lambda: IVFFlat(D, 64, seed=None),
        TypeError,
        r"seed must be an integer in \[0, 2\*\*63\), got None",
    ),
    (lambda: IVFFlat(D, 64, seed=-1), ValueError, r"seed must be >= 0, got -1"),
    (lambda: IVFFlat(D, 64, seed=2**63), ValueError, r"seed must be at most 9223372036854775807"),
    (lambda: IVFFlat(D, 2.0), TypeError, r"nlist must be an integer, got 2.0 \(float\)"),
    (lambda: IVFFlat(D, 10**14), ValueError, r"nlist must be at most 2147483647, got 10{14}"),
    (
        lambda: IVFFlat(D, 8, soar_lambda=None, spill=True),
        TypeError,
        r"soar_lambda must be a number, got None",
    ),
    (
        lambda: IVFFlat(D, 8, soar_lambda=-1.0),
        ValueError,
        r"soar_lambda must be a finite number >= 0, got -1.0",
    ),
    (
        lambda: IVFFlat(D, 8, coarse_hnsw=1),
        ValueError,
        r"coarse_hnsw must be 0 \(no graph\) or the graph's M >= 2, got 1",
    ),
    (lambda: IVFFlat(D, 8, coarse_hnsw=2.5), TypeError, r"coarse_hnsw must be an integer"),
    (lambda: IVFPQ(D, 8, 4.0), TypeError, r"M must be an integer, got 4.0 \(float\)"),
    (lambda: IVFPQ(D, 8, 4, nbits=17), ValueError, r"nbits must be at most 16, got 17"),
    (lambda: IVFPQ(D, 8, 4, niter=-2), ValueError, r"niter must be >= 0, got -2"),
    (
        lambda: IVFPQ(D, 8, 4, max_points_per_centroid=0.5),
        TypeError,
        r"max_points_per_centroid must be an integer",
    ),
    (lambda: PQIndex(D, 4, niter=1.5), TypeError, r"niter must be an integer, got 1.5"),
    (lambda: PQIndex(D, 4, seed="1"), TypeError, r"seed must be an integer, got '1' \(str\)"),
    (lambda: PQIndex(D, True), TypeError, r"M must be an integer, got True \(bool\)"),
    (lambda: SQIndex(D, 8.0), TypeError, r"bits must be one of 8, 6, 4, 'fp16', 'bf16'; got 8.0"),
    (lambda: SQIndex(D, 8, margin=None), TypeError, r"margin must be a number, got None"),
    (lambda: IVFSQ(D, 8, 5), ValueError, r"bits must be one of 8, 6, 4, 'fp16', 'bf16'; got 5"),
    (
        lambda: HNSWSQ(D, 16, margin=float("inf")),
        ValueError,
        r"margin must be a finite number >= 0, got inf",
    ),
    (lambda: HNSW(D, 1), ValueError, r"M must be >= 2, got 1"),
    (lambda: HNSW(D, 2**20), ValueError, r"M must be at most 32768, got 1048576"),
    (lambda: HNSW(D, 16, seed=None), TypeError, r"seed must be an integer in \[0, 2\*\*63\)"),
    (lambda: HNSW(D, 16, efSearch=0), ValueError, r"efSearch must be positive, got 0"),
    (lambda: FlatIndex(D, k=2**40), ValueError, r"k must be at most 2147483647"),
    (lambda: FlatIndex(D, verbose="yes"), TypeError, r"verbose must be True or False, got 'yes'"),
    (lambda: Refine("IVF16,Flat"), TypeError, r"index must be a vq index to re-rank, got str"),
    (lambda: vq.PreTransform(vq.PCA(D, 8), "Flat"), TypeError, r"index must be a vq index"),
]


@pytest.mark.parametrize("call,error,message", CONSTRUCTORS)
def test_constructors_check_their_arguments(call, error, message):
    with pytest.raises(error, match=message):
        call()


FACTORY = [
    ("IVF٤,Flat", r"index_factory: cannot read 'IVF٤,Flat'; supported: Flat"),
    ("IVF16_HNSW0,Flat", r"index_factory: _HNSW0: the graph's M must be >= 2 in 'IVF16_HNSW0"),
    (
        "IVF100000000000000,Flat",
        r"index_factory: nlist must be at most 2147483647, got 100000000000000 \(in 'IVF1000",
    ),
    ("IVF10¹⁴,Flat", r"index_factory: cannot read 'IVF10¹⁴,Flat'"),
    ("HNSW1", r"index_factory: M must be >= 2, got 1 \(in 'HNSW1'\)"),
    ("PQ٣", r"cannot read 'PQ٣'"),
]


@pytest.mark.parametrize("desc,message", FACTORY)
def test_index_factory_refuses_what_it_cannot_build_in_its_own_words(desc, message):
    with pytest.raises(ValueError, match=message):
        vq.index_factory(D, desc)


def test_index_factory_builds_a_graph_routed_ivf_where_it_says_so():
    index = vq.index_factory(D, "IVF16_HNSW8,Flat")
    assert index.coarse_hnsw == 8 and index.coarse_graph.M == 8


@pytest.fixture(scope="module")
def filled(blobs):
    x = np.ascontiguousarray(blobs[:1000, :D])
    out = {}
    for desc in ("Flat", "IVF8,Flat", "HNSW8", "HNSW8,SQ8"):
        index = vq.index_factory(D, desc)
        index.train(x)
        index.add(x)
        out[desc] = index
    return x, out


def test_search_arguments_get_the_index_s_words_not_numpy_s_or_torch_s(filled):
    x, out = filled
    flat, ivf = out["Flat"], out["IVF8,Flat"]
    sparse = torch.from_numpy(x[:3]).to_sparse()
    with pytest.raises(TypeError, match=r"queries: expected a dense tensor, got layout "
                                        r"torch.sparse_coo; call .to_dense\(\)"):  # fmt: skip
        flat.search(sparse, 2)
    for k in (2**62, 2**70, np.int64(2**40)):
        with pytest.raises(ValueError, match=r"k must be at most 2147483647 \(2\*\*31 - 1\)"):
            flat.search(x[:3], k)
        with pytest.raises(ValueError, match=r"k must be at most 2147483647"):
            flat.search(x[:300], k)  # (the general path)
    for bad in (-1, 0, 2.5):
        with pytest.raises(ValueError, match=rf"max_codes must be a positive integer, got {bad}"):
            ivf.search(x[:3], 2, max_codes=bad)
        with pytest.raises(ValueError, match=r"max_codes must be a positive integer"):
            ivf.search(x[:300], 2, max_codes=bad)


@pytest.mark.parametrize("desc", ["HNSW8", "HNSW8,SQ8"])
def test_graph_indexes_reconstruct_what_they_store(filled, desc):
    x, out = filled
    index = out[desc]
    got = index.reconstruct(np.arange(5, 10))
    if desc == "HNSW8":
        np.testing.assert_array_equal(got, x[5:10])
        np.testing.assert_array_equal(index.reconstruct(7), x[7])
    else:  # the codes decoded: within half a cell of each value
        width = (index.sq.vdiff / 255).numpy()
        assert (np.abs(got - x[5:10]) <= width * 0.5 + 1e-6).all()
        np.testing.assert_array_equal(got, index.sq.decode(index.codes[5:10]).numpy())
