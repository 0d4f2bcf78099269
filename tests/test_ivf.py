"""IVF indexes, OPQ pre-transform, re-ranking and the factory: parity with faiss (same
parameters ⇒ same answers, both ways), faiss's id semantics, and edge cases."""

import re

import numpy as np
import pytest
import torch

import vq
from vq._cpu import torch_only

faiss = pytest.importorskip("faiss")

NLIST = 16


@pytest.fixture(scope="module")
def queries(blobs):
    return (blobs[::97][:60] + 0.05).astype(np.float32)


def same_results(D, I, Df, If, rtol=1e-4):
    """Top-k ids identical for >= 99.9% of rows unless distances tie; distances close."""
    np.testing.assert_allclose(D, Df, rtol=rtol, atol=1e-3)
    differing = ~(I == If).all(axis=1)
    for row in np.flatnonzero(differing):  # only ties may differ: same distance multiset
        mismatch = I[row] != If[row]
        assert np.allclose(D[row][mismatch], Df[row][mismatch], rtol=1e-5, atol=1e-5)
    assert differing.mean() <= 0.05


def faiss_trained(desc, metric, blobs, by_residual=True):
    fm = faiss.METRIC_L2 if metric == "l2" else faiss.METRIC_INNER_PRODUCT
    # "np": no polysemous training, which costs seconds and changes nothing compared here
    index = faiss.index_factory(32, re.sub(r"(^|,)(PQ\d+)", r"\1\2np", desc), fm)
    if isinstance(index, faiss.IndexPreTransform):  # a trained rotation is all this compares:
        faiss.downcast_VectorTransform(index.chain.at(0)).niter = 3  # 50 alternations: 15 s
    ivf = faiss.try_extract_index_ivf(index)
    if isinstance(ivf, faiss.IndexIVFPQ):
        ivf.by_residual = by_residual
    index.train(blobs[:5000])
    index.add(blobs)
    return index


def set_nprobe(findex, nprobe):
    faiss.extract_index_ivf(findex).nprobe = nprobe


CASES = [
    ("IVF16,Flat", True),
    ("IVF16,PQ8", True),
    ("IVF16,PQ8", False),
    ("OPQ8,IVF16,PQ8", True),
    ("IVF16,PQ8,RFlat", True),
]


@pytest.mark.parametrize("metric", ["l2", "ip"])
@pytest.mark.parametrize("desc, by_residual", CASES)
def test_imported_from_faiss_equals_faiss(blobs, queries, desc, by_residual, metric):
    ref = faiss_trained(desc, metric, blobs, by_residual)
    index = vq.index.from_faiss(ref)
    assert index.ntotal == ref.ntotal == len(blobs)
    for nprobe in (1, 4, 16):
        set_nprobe(ref, nprobe)
        Df, If = ref.search(queries, 20)
        D, I = index.search(queries, 20, nprobe=nprobe)
        same_results(D, I, Df, If)
        with torch_only():  # the device-agnostic path (CUDA, export) gives the same answers
            Dt, It = index.search(queries, 20, nprobe=nprobe)
        same_results(Dt, It, Df, If)


@pytest.mark.parametrize(
    "desc", ["PQ8x6", "IVF16,Flat", "IVF16,PQ8", "OPQ8_16,IVF16,PQ8,RFlat", "PQ8,Refine(Flat)"]
)
def test_to_faiss_equals_vq(blobs, queries, desc):
    index = vq.index_factory(32, desc)
    index.train(blobs[:5000])
    index.add_with_ids(blobs, np.arange(len(blobs)) * 3 + 7)  # non-sequential ids
    index.remove_ids(np.arange(7, 3000, 3))
    if hasattr(index, "nprobe"):
        index.nprobe = 4
    ref = index.to_faiss()
    assert ref.ntotal == index.ntotal
    D, I = index.search(queries, 10)
    Df, If = ref.search(queries, 10)
    same_results(D, I, Df, If)


def test_ids_semantics_as_faiss(blobs, queries):
    ref = faiss_trained("IVF16,PQ8", "l2", blobs)
    ref.reset()
    index = vq.index.from_faiss(ref)
    rng = np.random.default_rng(0)
    ids = rng.permutation(10**6)[: len(blobs)].astype(np.int64)
    for part in np.array_split(np.arange(len(blobs)), 3):  # several adds merge into the lists
        ref.add_with_ids(blobs[part], ids[part])
        index.add_with_ids(blobs[part], ids[part])
    gone = np.concatenate([ids[::5], [-3, 10**7]])  # unknown ids are ignored
    assert index.remove_ids(gone) == ref.remove_ids(gone) == len(ids[::5])
    assert index.ntotal == ref.ntotal
    for nprobe in (2, 16):
        set_nprobe(ref, nprobe)
        D, I = index.search(queries, 10, nprobe=nprobe)
        Df, If = ref.search(queries, 10)
        same_results(D, I, Df, If)
        assert not np.isin(I, ids[::5]).any()


def test_adding_in_batches_equals_one_add(blobs, queries):
    one = vq.IVFPQ(32, NLIST, 8, niter=4, coarse_niter=4).train(blobs[:3000])
    many = vq.IVFPQ(32, NLIST, 8)
    many.load_state_dict(one.state_dict())
    one.add(blobs[:4000])
    for s in range(0, 4000, 1500):
        many.add(blobs[s : min(s + 1500, 4000)])
    torch.testing.assert_close(many.offsets, one.offsets)
    assert torch.equal(many.ids, one.ids) and torch.equal(many.codes, one.codes)
    for a, b in zip(
        many.search(queries, 5, nprobe=3), one.search(queries, 5, nprobe=3), strict=True
    ):
        np.testing.assert_array_equal(a, b)


def test_edge_cases_like_faiss(blobs, queries):
    index = vq.IVFFlat(32, NLIST, coarse_niter=4).train(blobs[:2000])
    D, I = index.search(queries[:3], 5)  # empty index: all missing
    assert (I == -1).all() and np.isposinf(D).all()
    index.add(blobs[:30])
    D, I = index.search(queries[:3], 50, nprobe=NLIST)  # k > ntotal: padded
    assert ((I >= 0).sum(1) == 30).all() and (I[:, 30:] == -1).all() and np.isinf(D[:, 30:]).all()
    D1, I1 = index.search(queries, 5, nprobe=1000)  # nprobe > nlist: every list, as faiss
    D2, I2 = index.search(queries, 5, nprobe=NLIST)
    np.testing.assert_array_equal(I1, I2)
    exact = vq.FlatIndex(32)
    exact.add(blobs[:30])
    np.testing.assert_array_equal(I1, exact.search(queries, 5)[1])
    with pytest.raises(ValueError, match="nprobe must be a positive integer"):
        index.search(queries, 5, nprobe=0)
    with pytest.raises(ValueError, match="NaN/Inf"):
        index.search(np.full((2, 32), np.nan, np.float32), 5)
    with pytest.raises(ValueError, match="expected vectors of dim 32, got 31"):
        index.search(queries[:, :31], 5)
    with pytest.raises(TypeError, match="unexpected keyword argument 'k_factor'"):
        index.search(queries, 5, k_factor=2)
    with pytest.raises(ValueError, match="needs at least k=16 training vectors, got 10"):
        vq.IVFFlat(32, NLIST).train(blobs[:10])


def test_forward_uses_k_and_nprobe_and_keeps_tensors(blobs, queries):
    index = vq.IVFPQ(32, NLIST, 8, k=7, nprobe=3, niter=4, coarse_niter=4).train(blobs[:3000])
    index.add(blobs)
    D, I = index(torch.from_numpy(queries))
    assert isinstance(D, torch.Tensor) and I.shape == (len(queries), 7)
    _, I3 = index.search(queries, 7, nprobe=3)
    np.testing.assert_array_equal(I.numpy(), I3)
    index.nprobe = NLIST
    assert not np.array_equal(index(torch.from_numpy(queries))[1].numpy(), I3)


def test_refine_with_every_candidate_is_exact(blobs, queries):
    index = vq.index_factory(32, "PQ8,RFlat")
    index.train(blobs[:3000])
    index.add(blobs[:500])
    index.remove_ids(np.arange(0, 500, 7))
    exact = vq.FlatIndex(32)
    exact.add_with_ids(blobs[:500], np.arange(500))
    exact.remove_ids(np.arange(0, 500, 7))
    D, I = index.search(queries, 10, k_factor=50)  # 500 candidates: all of them
    De, Ie = exact.search(queries, 10)
    np.testing.assert_array_equal(I, Ie)
    np.testing.assert_allclose(D, De, rtol=1e-5, atol=1e-4)
    with torch_only():  # the torch re-ranking (CUDA, export) agrees with the numba kernel
        Dt, It = index.search(queries, 10, k_factor=50)
    np.testing.assert_array_equal(It, Ie)
    np.testing.assert_allclose(Dt, De, rtol=1e-5, atol=1e-4)
    # and re-ranking more candidates never loses recall
    recall = [np.isin(index.search(queries, 10, k_factor=f)[1], Ie).mean() for f in (1, 4, 16)]
    assert recall == sorted(recall) and recall[-1] > recall[0]


def test_factory_builds_what_it_reads():
    index = vq.index_factory(64, "OPQ16_32,IVF128,PQ16x4,RFlat", metric="ip")
    assert isinstance(index, vq.Refine) and isinstance(index.index, vq.PreTransform)
    ivf = index.index.index
    assert isinstance(ivf, vq.IVFPQ) and ivf.dim == 32 and ivf.nlist == 128
    assert (ivf.M, ivf.nbits, ivf.metric) == (16, 4, "ip")
    assert index.index.transform.dim_out == 32
    assert isinstance(vq.index_factory(8, "Refine(Flat)".join(["PQ4,", ""])), vq.Refine)
    assert isinstance(vq.index_factory(8, "IVF4,Flat"), vq.IVFFlat)


@pytest.mark.parametrize(
    "desc", ["HNSW32,PQ8", "IVF1024,SQ5", "PQ", "OPQ16,IVF1024", "Flat,PQ8", ""]
)
def test_factory_rejects_unknown_strings(desc):
    with pytest.raises(ValueError, match="supported: Flat | PQ<M>"):
        vq.index_factory(64, desc)


def test_pretransform_saves_the_rotation_only(tmp_path, blobs, queries):
    from safetensors import safe_open

    index = vq.index_factory(32, "OPQ8,PQ8")
    index.transform.niter = 2
    index.train(blobs[:3000])
    index.add(blobs[:2000])
    index.save(tmp_path / "opq.vq")
    with safe_open(tmp_path / "opq.vq", "pt") as f:
        names = set(f.keys())
    assert "transform.rotation" in names and not any(n.startswith("transform.pq.") for n in names)
    loaded = vq.load_index(tmp_path / "opq.vq")
    assert loaded.is_trained
    for a, b in zip(loaded.search(queries, 5), index.search(queries, 5), strict=True):
        np.testing.assert_array_equal(a, b)
    # the loaded OPQ holds its rotation but not the PQ that learned it: coding with it refuses
    assert not loaded.transform.is_trained
    with pytest.raises(RuntimeError, match="not trained"):
        loaded.transform.encode(blobs[:3])
