"""``range_search`` memory: at most twice the result (12 bytes a hit) plus a fixed block, however
many hits (a radius matching everything took 6x the result: a query number per hit, the parts
and their concatenation held together); and each id once per query, a re-ranked spilled index
included (its two copies of a vector both came back)."""

import tracemalloc

import numpy as np
import pytest

import vq
from vq.index.core import ranges

#: candidate slots of a block in these tests (the blocks' own memory: 12 bytes a slot)
SLOTS = 1 << 16


@pytest.fixture(scope="module")
def data(blobs):
    return np.ascontiguousarray(blobs[:4000])


def _peak(call):
    tracemalloc.start()
    try:
        out = call()
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("desc", ["Flat", "IVF16,Flat", "IVF16(soar),Flat", "PQ8"])
def test_range_search_memory_is_bounded_by_twice_the_result_and_a_block(desc, data, monkeypatch):
    x = data
    index = vq.index_factory(x.shape[1], desc)
    index.train(x)
    index.add(x)
    monkeypatch.setattr(ranges, "RANGE_SLOTS", SLOTS)
    monkeypatch.setattr("vq.index.flat.flat_index.RANGE_SLOTS", SLOTS)
    params = {"nprobe": 16} if "IVF" in desc else {}
    nq = 300
    (lims, d, i), peak = _peak(lambda: index.range_search(x[:nq], 1e9, **params))
    assert lims[-1] == nq * x.shape[0]  # everything is within the radius
    result = lims.nbytes + d.nbytes + i.nbytes
    block = 12 * max(SLOTS, x.shape[0]) + 12 * (1 << 14)  # (a query's rows, Flat's block)
    assert peak <= 2.2 * result + 4 * block, (peak / result, peak / 2**20, result / 2**20)
    np.testing.assert_array_equal(np.sort(i[lims[7] : lims[8]]), np.arange(x.shape[0]))


@pytest.mark.parametrize("desc", ["IVF16(soar),Flat,RFlat", "IVF16(soar),PQ8,RFlat"])
def test_a_reranked_spilled_range_search_returns_each_id_once_as_brute_force(desc, data):
    x = data
    index = vq.index_factory(x.shape[1], desc)
    index.train(x)
    index.add_with_ids(x, np.arange(x.shape[0]) + 50)
    q = x[:10] + 0.01
    lims, d, i = index.range_search(q, 2.0, nprobe=16, k_factor=1)
    exact = ((q[:, None].astype(np.float64) - x[None]) ** 2).sum(-1)
    for j in range(q.shape[0]):
        got = i[lims[j] : lims[j + 1]]
        assert len(set(got.tolist())) == got.shape[0], "an id twice"
        if "Flat" in desc.split(",")[1]:  # every list probed, exact distances: all hits
            np.testing.assert_array_equal(np.sort(got), np.flatnonzero(exact[j] < 2.0) + 50)
