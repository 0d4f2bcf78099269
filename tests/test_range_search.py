"""Range search against faiss's on the same (imported) indexes, and bad radii."""

import numpy as np
import pytest
import torch

import vq
from vq.index import FlatIndex, IVFFlat


def _sorted_hits(lims, D, I):
    out = []
    for i in range(len(lims) - 1):
        s, e = lims[i], lims[i + 1]
        order = np.argsort(I[s:e])
        out.append((I[s:e][order], D[s:e][order]))
    return out


@pytest.mark.parametrize("kind", ["flat", "flat-ip", "ivfflat", "ivfflat-ip"])
def test_range_search_equals_faiss_on_imported_indexes(blobs, kind):
    pytest.importorskip("faiss")
    x, q = np.ascontiguousarray(blobs[:4000]), np.ascontiguousarray(blobs[-30:])
    metric = "ip" if kind.endswith("ip") else "l2"
    index = FlatIndex(32, metric) if kind.startswith("flat") else IVFFlat(32, 16, metric, nprobe=4)
    index.train(x)
    index.add_with_ids(x, np.arange(4000) * 2 + 1)
    source = index.to_faiss()
    index = vq.index.from_faiss(source)
    D0, _ = index.search(q, 20)
    radius = float(np.median(D0[:, -1]))  # some queries with many hits, some with few
    lims, D, I = index.range_search(q, radius)
    limsf, Df, If = source.range_search(q, radius)
    assert lims[-1] > 0
    for (i, d), (i_f, d_f) in zip(
        _sorted_hits(lims, D, I), _sorted_hits(limsf, Df, If), strict=True
    ):
        near = np.abs(d_f - radius) < 1e-4 * max(1.0, abs(radius))  # at the boundary: rounding
        assert set(i.tolist()) ^ set(i_f.tolist()) <= set(i_f[near].tolist()) | set(i.tolist())
        common, a, b = np.intersect1d(i, i_f, return_indices=True)
        assert len(common) >= len(i_f) - near.sum()
        np.testing.assert_allclose(d[a], d_f[b], rtol=1e-4, atol=1e-3)
    ok = (D < radius).all() if metric == "l2" else (D > radius).all()
    assert ok
    # filtered: the hits among the allowed ids
    allowed = index.stored_ids().numpy()[::3]
    lims2, D2, I2 = index.range_search(q, radius, allowed=allowed)
    for (i, _), (i2, _) in zip(_sorted_hits(lims, D, I), _sorted_hits(lims2, D2, I2), strict=True):
        keep = np.isin(i, allowed)
        np.testing.assert_array_equal(i[keep], i2)


def test_range_search_refuses_bad_radii_and_kinds(blobs):
    x = np.ascontiguousarray(blobs[:500])
    index = FlatIndex(32)
    index.add(x)
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="finite"):
            index.range_search(x[:2], bad)
    with pytest.raises(TypeError, match="number"):
        index.range_search(x[:2], "1.0")
    lean = vq.index.Index(32)  # a kind without one says so
    with pytest.raises(NotImplementedError, match="no range_search"):
        lean.range_hits(x[:2], 1.0, None)
    lims, D, I = index.range_search(
        x[:3], 1e-2
    )  # each query finds itself (0, give or take rounding)
    np.testing.assert_array_equal(lims, [0, 1, 2, 3])
    np.testing.assert_array_equal(I, [0, 1, 2])


def _pq_kind(kind):
    from vq.index import IVFPQ, PQIndex

    metric = "ip" if kind.endswith("-ip") else "l2"
    fast = {"nbits": 4, "fast_scan": True} if "fs" in kind else {}
    if kind.startswith("pq"):
        return PQIndex(32, M=8, metric=metric, niter=4, **fast)
    by_residual = "flatcodes" not in kind
    return IVFPQ(32, 16, M=8, metric=metric, nprobe=4, niter=4, by_residual=by_residual, **fast)


@pytest.mark.parametrize("kind", ["pq", "pq-ip", "ivfpq", "ivfpq-ip", "ivfpq-flatcodes"])
def test_pq_range_search_equals_faiss_on_imported_indexes(blobs, kind):
    pytest.importorskip("faiss")
    x, q = np.ascontiguousarray(blobs[:4000]), np.ascontiguousarray(blobs[-30:])
    index = _pq_kind(kind)
    index.train(x)
    index.add_with_ids(x, np.arange(4000) * 2 + 1)
    source = index.to_faiss()
    index = vq.index.from_faiss(source)
    D0, _ = index.search(q, 20)
    radius = float(np.median(D0[:, -1]))
    lims, D, I = index.range_search(q, radius)
    limsf, Df, If = source.range_search(q, radius)
    assert lims[-1] > 0
    for (i, d), (i_f, d_f) in zip(
        _sorted_hits(lims, D, I), _sorted_hits(limsf, Df, If), strict=True
    ):
        near = np.abs(d_f - radius) < 1e-4 * max(1.0, abs(radius))
        common, a, b = np.intersect1d(i, i_f, return_indices=True)
        assert len(common) >= len(i_f) - near.sum()
        assert len(i) - len(common) <= near.sum() + 1
        np.testing.assert_allclose(d[a], d_f[b], rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("kind", ["pq-fs", "ivfpq-fs", "pq", "ivfpq", "refine"])
def test_range_search_hits_are_the_decoded_vectors_within_the_radius(blobs, kind):
    """ADC distances are those to the decoded vectors: the hits are exactly the ids whose
    reconstruction lies within the radius (fast-scan: float tables, not quantized ones);
    Refine: those of the wrapped index's hits whose exact distance is within it."""
    x, q = np.ascontiguousarray(blobs[:3000]), np.ascontiguousarray(blobs[-20:])
    inner = _pq_kind(kind if kind != "refine" else "ivfpq")
    index = vq.Refine(inner, k_factor=4) if kind == "refine" else inner
    index.train(x)
    ids = np.arange(3000) * 3
    index.add_with_ids(x, ids)
    D0, _ = (
        index.search(q, 30, nprobe=16) if "ivf" in kind or kind == "refine" else index.search(q, 30)
    )
    radius = float(np.median(D0[:, -1]))
    params = {"nprobe": 16} if "ivf" in kind or kind == "refine" else {}
    lims, D, I = index.range_search(q, radius, **params)
    assert lims[-1] > 0
    decoded = index.reconstruct(ids)
    for j in range(q.shape[0]):
        d = ((decoded - q[j]) ** 2).sum(1)
        expect = ids[d < radius]
        if kind == "refine":  # the wrapped index's hits, filtered by exact distance
            li, _, ii = inner.range_search(q[j : j + 1], radius, nprobe=16)
            expect = np.intersect1d(expect, ids[ii])
        near = ids[np.abs(d - radius) < 1e-3 * radius]
        got = I[lims[j] : lims[j + 1]]
        assert set(got.tolist()) ^ set(expect.tolist()) <= set(near.tolist())
        np.testing.assert_allclose(
            np.sort(D[lims[j] : lims[j + 1]]), np.sort(d[np.isin(ids, got)]), rtol=1e-4, atol=1e-4
        )


SQ_KINDS = {
    "sq8": ("SQ8", "l2"),
    "sq4": ("SQ4", "l2"),
    "sqfp16-ip": ("SQfp16", "ip"),
    "ivfsq8": ("IVF16,SQ8", "l2"),
    "ivfsq4-ip": ("IVF16,SQ4", "ip"),
    "ivfsqfp16": ("IVF16,SQfp16", "l2"),
    "ivfsq6": ("IVF16,SQ6", "l2"),
}


def _sq_index(kind, x):
    desc, metric = SQ_KINDS[kind]
    index = vq.index_factory(32, desc, metric=metric)
    if desc.startswith("IVF"):
        index.nprobe = 4
    index.train(x)
    index.add_with_ids(x, np.arange(x.shape[0]) * 2 + 1)
    return index


@pytest.mark.parametrize("kind", list(SQ_KINDS))
def test_sq_range_search_hits_are_the_decoded_vectors_within_the_radius(blobs, kind):
    """SQ and IVF-SQ: the hits are exactly the ids whose decoded vector lies within the radius
    (IVF: among the probed lists' vectors), with those distances; filtered: the allowed ones."""
    x, q = np.ascontiguousarray(blobs[:3000]), np.ascontiguousarray(blobs[-20:])
    index = _sq_index(kind, x)
    ip = SQ_KINDS[kind][1] == "ip"
    D0, _ = index.search(q, 30)
    radius = float(np.median(D0[:, -1]))
    lims, D, I = index.range_search(q, radius)
    assert lims[-1] > 0
    ids = index.stored_ids().numpy()
    decoded = index.reconstruct(ids)
    if "ivf" in kind:  # the vectors of each query's probed lists
        _, near_lists = vq.index.ivf.ivf_index.probe(
            torch.from_numpy(q), index.quantizer.codebook, (index.quantizer.codebook**2).sum(1),
            4, "ip" if ip else "l2",
        )  # fmt: skip
        row_list = np.repeat(np.arange(16), index.list_sizes().numpy())
    for j in range(q.shape[0]):
        d = decoded @ q[j] if ip else ((decoded - q[j]) ** 2).sum(1)
        inside = d > radius if ip else d < radius
        if "ivf" in kind:
            inside &= np.isin(row_list, near_lists[j].numpy())
        expect = ids[inside]
        edge = ids[np.abs(d - radius) < 1e-3 * max(1.0, abs(radius))]
        got = I[lims[j] : lims[j + 1]]
        assert set(got.tolist()) ^ set(expect.tolist()) <= set(edge.tolist())
        by_id = np.argsort(ids)
        d_got = d[by_id][np.searchsorted(ids[by_id], got)]
        np.testing.assert_allclose(D[lims[j] : lims[j + 1]], d_got, rtol=1e-4, atol=1e-3)
    allowed = ids[::3]
    lims2, D2, I2 = index.range_search(q, radius, allowed=allowed)
    for (i, _), (i2, _) in zip(_sorted_hits(lims, D, I), _sorted_hits(lims2, D2, I2), strict=True):
        np.testing.assert_array_equal(i[np.isin(i, allowed)], i2)


@pytest.mark.parametrize("kind", ["sq8", "sqfp16-ip", "ivfsq8", "ivfsq4-ip"])
def test_sq_range_search_equals_faiss_on_imported_indexes(blobs, kind):
    faiss = pytest.importorskip("faiss")
    x, q = np.ascontiguousarray(blobs[:4000]), np.ascontiguousarray(blobs[-30:])
    source = _sq_index(kind, x).to_faiss()
    index = vq.index.from_faiss(source)
    if "ivf" in kind:
        faiss.extract_index_ivf(source).nprobe = index.nprobe = 4
    D0, _ = index.search(q, 20)
    radius = float(np.median(D0[:, -1]))
    lims, D, I = index.range_search(q, radius)
    limsf, Df, If = source.range_search(q, radius)
    assert lims[-1] > 0
    for (i, d), (i_f, d_f) in zip(
        _sorted_hits(lims, D, I), _sorted_hits(limsf, Df, If), strict=True
    ):
        near = np.abs(d_f - radius) < 1e-4 * max(1.0, abs(radius))
        common, a, b = np.intersect1d(i, i_f, return_indices=True)
        assert len(common) >= len(i_f) - near.sum()
        assert len(i) - len(common) <= near.sum() + 1
        np.testing.assert_allclose(d[a], d_f[b], rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("desc", ["IVF16(soar),Flat", "IVF16(soar),SQ8"])
def test_spilled_range_search_returns_each_id_once(blobs, desc):
    """A spilled vector is stored twice; both copies may lie within the radius, its id is
    returned once (with the nearer copy's distance). Every list probed: the exhaustive answer."""
    x, q = np.ascontiguousarray(blobs[:3000]), np.ascontiguousarray(blobs[-20:])
    index = vq.index_factory(32, desc)
    index.train(x)
    index.add(x)
    D0, _ = index.search(q, 30, nprobe=16)
    radius = float(np.median(D0[:, -1]))
    lims, D, I = index.range_search(q, radius, nprobe=16)
    decoded = index.reconstruct(np.arange(3000))
    for j in range(q.shape[0]):
        got = I[lims[j] : lims[j + 1]]
        assert len(set(got.tolist())) == len(got)
        d = ((decoded - q[j]) ** 2).sum(1)
        edge = np.flatnonzero(np.abs(d - radius) < 1e-2 * radius)
        assert set(got.tolist()) ^ set(np.flatnonzero(d < radius).tolist()) <= set(edge.tolist())
