"""Range search against faiss's on the same (imported) indexes, and bad radii."""

import numpy as np
import pytest

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
    pq = vq.PQIndex(32, M=8, niter=2)
    pq.train(x)
    pq.add(x)
    with pytest.raises(NotImplementedError, match="no range_search"):
        pq.range_search(x[:2], 1.0)
    lims, D, I = index.range_search(
        x[:3], 1e-2
    )  # each query finds itself (0, give or take rounding)
    np.testing.assert_array_equal(lims, [0, 1, 2, 3])
    np.testing.assert_array_equal(I, [0, 1, 2])
