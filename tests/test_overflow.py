"""Vectors whose squared distances would overflow float32 (finite values near 1e19: Flat
returned ``[-1, 999, 998]`` with ``[inf, nan, inf]``, IVF-PQ nothing) are refused where they
enter an index — ``add``, ``add_with_ids``, ``train``, ``search`` (both paths), ``range_search``
— with one message; vectors up to the bound search as float64 brute force does."""

import numpy as np
import pytest
import torch
from index_kinds import KINDS

import vq
from vq._checks import MAX_NORM

D = 32


def _big(n, scale, seed=0):
    return (np.random.default_rng(seed).standard_normal((n, D)) * scale).astype(np.float32)


NORM_MESSAGE = (
    r"vector of norm beyond 1e\+18 \(first: row 3, norm .*\), whose squared distances "
    r"overflow float32; rescale the vectors"
)


@pytest.fixture(scope="module")
def built(blobs):
    out = {}
    for desc in KINDS.values():
        index = vq.index_factory(D, desc)
        index.train(blobs[:2000])
        index.add(blobs[:500])
        out[desc] = index
    return out


@pytest.mark.parametrize("desc", list(KINDS.values()))
def test_vectors_whose_distances_overflow_float32_are_refused_at_every_entry(built, desc):
    index = built[desc]
    bad = np.array(built[desc].reconstruct_n(0, 8))
    bad[3] = 1e19  # finite, but its squared norm is not
    before = index.ntotal
    for call in (
        lambda: index.add(bad),
        lambda: index.add_with_ids(bad, np.arange(8) + 10_000),
        lambda: index.search(bad, 3),  # the general path
        lambda: index.search(bad[:4], 3),  # the lean path of a few queries declines them
        lambda: index.search(torch.from_numpy(bad[:4]), 3),
        lambda: index.search(bad.astype(np.float64), 3),
        lambda: index.range_search(bad, 1.0),
    ):
        with pytest.raises(ValueError, match=r"(x|queries): 1 " + NORM_MESSAGE):
            call()
    assert index.ntotal == before
    fresh = vq.index_factory(D, desc)
    with pytest.raises(ValueError, match=r"x: 1 " + NORM_MESSAGE):
        fresh.train(np.concatenate([bad, np.asarray(built[desc].reconstruct_n(0, 500))]))


def test_flat_search_of_vectors_near_the_bound_equals_float64_brute_force():
    x = _big(1000, 0.9 * MAX_NORM / np.sqrt(D))  # norms about 0.9e18
    x /= max(1.0, float(np.linalg.norm(x, axis=1).max()) / (0.99 * MAX_NORM))
    q = x[:5] + _big(5, 1e15, seed=1)
    for metric in ("l2", "ip"):
        index = vq.FlatIndex(D, metric)
        index.add(x)
        d, i = index.search(q, 3)
        x64, q64 = x.astype(np.float64), q.astype(np.float64)
        if metric == "l2":
            exact = ((q64[:, None] - x64[None]) ** 2).sum(-1)
        else:
            exact = -(q64 @ x64.T)
        np.testing.assert_array_equal(i, np.argsort(exact, axis=1)[:, :3])
        assert np.isfinite(d).all()


def test_the_norm_check_reads_each_value_once_and_refuses_nan_first():
    x = _big(6, 1.0)
    x[2] = np.nan
    x[4] = 1e19
    index = vq.FlatIndex(D)
    with pytest.raises(ValueError, match=r"x: 32 NaN/Inf values, first in row 2"):
        index.add(x)
    x[2] = 0
    with pytest.raises(ValueError, match=r"x: 1 vector of norm beyond 1e\+18 \(first: row 4"):
        index.add(x)
    y = np.full((3, D), 1e39, np.float64)
    with pytest.raises(ValueError, match=r"96 float64 values beyond float32's range"):
        index.add(y)
