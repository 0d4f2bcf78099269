"""``merge_from`` for every kind the factory builds: the merged index holds both parts' vectors
and ids, searches as the index the second part was added to, and survives a save and a load
(HNSW's merge appended ids to a graph of the first part alone, and its file did not load)."""

import copy

import numpy as np
import pytest
from index_kinds import KINDS, VARIANTS

import vq
from vq.index.factory import index_classes

K = 10
N1 = 1200
#: where a stored vector must rank in a search for itself (1st; RaBitQ's 1-bit estimates at 32
#: dimensions put a few others at its own estimate, 0, for some vectors: within the first 3)
SELF_RANK = {"RaBitQ": 3}


def test_every_class_of_the_factory_has_a_merge_case():
    assert set(KINDS) == {*index_classes(), "PreTransform", "Refine"}


@pytest.fixture(scope="module")
def data(blobs):
    return np.ascontiguousarray(blobs[:2000]), np.ascontiguousarray(blobs[-30:])


def _trained(desc, x):
    index = vq.index_factory(x.shape[1], desc)
    index.train(x)
    return index


@pytest.mark.parametrize("desc", [*KINDS.values(), *VARIANTS])
def test_merge_from_holds_both_parts_and_searches_as_one_index_through_a_save(desc, data, tmp_path):
    x, q = data
    ids = np.arange(x.shape[0]) * 3 + 5
    template = _trained(desc, x)
    a, b, whole = (copy.deepcopy(template) for _ in range(3))
    a.add_with_ids(x[:N1], ids[:N1])
    b.add_with_ids(x[N1:], ids[N1:])
    whole.add_with_ids(x[:N1], ids[:N1])
    whole.add_with_ids(x[N1:], ids[N1:])  # what merging the second part must equal
    a.merge_from(b)
    assert a.ntotal == x.shape[0] and b.ntotal == x.shape[0] - N1
    np.testing.assert_array_equal(np.unique(a.stored_ids().numpy()), ids)  # (spilled: twice)
    a.check_consistent()
    d, i = a.search(q, K)
    dw, iw = whole.search(q, K)
    np.testing.assert_array_equal(i, iw)
    np.testing.assert_allclose(d, dw, rtol=1e-5, atol=1e-4)
    self_hits = a.search(x[N1 : N1 + 20], SELF_RANK.get(desc, 1))[1]
    found = (self_hits == ids[N1 : N1 + 20, None]).any(axis=1)
    assert found.mean() >= 0.9  # the merged vectors are found
    a.save(tmp_path / "merged.vq")
    loaded = vq.load_index(tmp_path / "merged.vq")
    np.testing.assert_array_equal(loaded.search(q, K)[1], i)


@pytest.mark.parametrize("desc", ["HNSW16", "HNSW16,SQ8"])
def test_graph_merge_from_numbers_sequential_rows_after_this_index(desc, data):
    x, _ = data
    template = _trained(desc, x)
    a, b, whole = (copy.deepcopy(template) for _ in range(3))
    a.add(x[:N1])
    b.add(x[N1:1500])
    whole.add(x[:N1])
    whole.add(x[N1:1500])
    a.merge_from(b)
    assert a.ntotal == 1500 and a.has_sequential_ids()
    for name, t in whole.state_dict().items():  # the very graph of adding the second part
        np.testing.assert_array_equal(a.state_dict()[name].numpy(), t.numpy(), err_msg=name)
    np.testing.assert_array_equal(a.reconstruct_n(N1, 300), b.reconstruct_n(0, 300))


def test_graph_merge_from_takes_graphs_with_other_entry_points_and_leaves_a_failed_one(data):
    x, _ = data
    a, b = vq.HNSW(x.shape[1], 16), vq.HNSW(x.shape[1], 16)
    a.add(x[:500])
    b.add_with_ids(x[500:537], np.arange(37) + 10_000)
    assert int(a.entry_point[0]) != int(b.entry_point[0])  # (stored data, not training)
    a.merge_from(b)
    assert a.ntotal == 537
    np.testing.assert_array_equal(a.search(x[500:510], 1)[1][:, 0], np.arange(10) + 10_000)
    before = {k: v.clone() for k, v in a.state_dict().items()}
    with pytest.raises(ValueError, match="37 of them are already in the index"):
        a.merge_from(b)
    for k, v in a.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), before[k].numpy(), err_msg=k)
    with pytest.raises(ValueError, match=r"configurations differ \(M: 8 in other, 16 here\)"):
        a.merge_from(vq.HNSW(x.shape[1], 8))
