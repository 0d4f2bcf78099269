"""``remove_ids`` on IVF indexes in time proportional to the lists it touches: the rows it
copies (a hand-worked case, and the lists it leaves alone), its results against an index built
without the removed ids and against faiss's ``remove_ids``, and what the first search after it
rebuilds (the fast-scan packed copy: only the changed lists; the arrays derived from the
codebooks: nothing)."""

import copy

import numpy as np
import pytest
import torch

import vq
from vq.index.core import fastscan_codes as fastscan_index
from vq.kernels.common import rows as row_kernels
from vq.kernels.fastscan import fastscan_scans as fastscan

K = 10
N = 2000
KINDS = {
    "IVF16,Flat": {},
    "IVF16,PQ8": {},
    "IVF16,PQ8x4fs": {},
    "IVF16,SQ8": {},
    "IVF16(soar),Flat": {},
    "IVF16(soar),PQ8x4fs": {},
    "IVF16_HNSW32,PQ8": {},
}


@pytest.fixture(scope="module")
def data(blobs):
    return np.ascontiguousarray(blobs[:N]), np.ascontiguousarray(blobs[-30:])


@pytest.fixture(scope="module")
def trained(data):
    x, _ = data
    out = {}
    for name in KINDS:
        index = vq.index_factory(x.shape[1], name)
        index.nprobe = 16  # every list: results depend on the stored rows alone
        index.train(x)
        out[name] = index
    return out


def _filled(trained, name, x, ids):
    index = copy.deepcopy(trained[name])
    index.add_with_ids(x, ids)
    return index


def _assert_same_results(index, oracle, q):
    """The same distances, and the same ids but for the order among equal distances (the
    kernels break ties by stored row; removal reorders rows within lists, as faiss's does)."""
    d, i = index.search(q, K)
    d0, i0 = oracle.search(q, K)
    wide_d, wide_i = oracle.search(q, K + 50)
    np.testing.assert_array_equal(d, d0)
    for row in range(q.shape[0]):
        inner = d0[row] != d0[row, -1]
        assert set(i[row][inner]) == set(i0[row][inner]), row
        assert set(i[row][~inner]) <= set(wide_i[row][wide_d[row] == d0[row, -1]]), row


def test_removal_fills_holes_from_the_end_and_moves_each_later_list_by_few_rows():
    # lists [0 1 2 3 4] [5 6 7] [8 9 10 11]; rows 1, 3 and 9 removed
    buf = np.arange(12, dtype=np.uint64)
    offsets = np.array([0, 5, 8, 12], dtype=np.int64)
    new = np.empty_like(offsets)
    moves = row_kernels.remove_from_lists(buf, 1, offsets, np.array([1, 3, 9]), new)
    # list 0: row 1 takes its last kept row (4), row 3 is past the new end
    # list 1: moved down by 2: its last two rows (6, 7) into the two free rows before it
    # list 2: row 9 takes 11, then moved down by 2: its last two kept rows (11, 10) to the front
    np.testing.assert_array_equal(buf[:9], [0, 4, 2, 6, 7, 5, 11, 10, 8])
    np.testing.assert_array_equal(new, [0, 3, 6, 9])
    assert moves == 1 + 2 + (1 + 2)


def test_a_list_moved_by_more_rows_than_it_keeps_keeps_its_order():
    buf = np.arange(20, dtype=np.uint64).reshape(10, 2).copy()  # rows of two words
    offsets = np.array([0, 6, 8, 10], dtype=np.int64)
    new = np.empty_like(offsets)
    moves = row_kernels.remove_from_lists(buf.reshape(-1), 2, offsets, np.arange(1, 6), new)
    np.testing.assert_array_equal(buf[:5, 0], [0, 12, 14, 16, 18])
    np.testing.assert_array_equal(buf[:5, 1], buf[:5, 0] + 1)
    assert moves == 4 and new.tolist() == [0, 1, 3, 5]


def test_removal_from_the_last_list_copies_only_its_rows_and_leaves_the_others_alone(
    trained, data, monkeypatch
):
    x, _ = data
    index = _filled(trained, "IVF16,PQ8", x, np.arange(N))
    sizes = index.list_sizes().numpy()
    last = int(np.flatnonzero(sizes)[-1])
    start = int(index.offsets[last])
    codes, ids = index.codes[:start].clone(), index.ids[:start].clone()
    ptr = index.codes.data_ptr()
    copies = []
    real = row_kernels.remove_from_lists
    monkeypatch.setattr(
        row_kernels, "remove_from_lists", lambda *a: copies.append(real(*a)) or copies[-1]
    )
    gone = index.ids[start : start + 6 : 2].numpy().copy()  # 3 of its first rows
    assert index.remove_ids(gone) == 3
    assert copies == [3, 3]  # (codes, ids): each removed row takes one of the last kept rows
    assert index.codes.data_ptr() == ptr  # in place
    assert torch.equal(index.codes[:start], codes) and torch.equal(index.ids[:start], ids)
    assert not np.isin(index.ids.numpy(), gone).any()
    # one row from the first list instead: every later list moves by one row, one copy each
    copies.clear()
    first = int(np.flatnonzero(sizes)[0])
    one = (
        index.ids[int(index.offsets[first + 1]) - 1 : int(index.offsets[first + 1])].numpy().copy()
    )
    index.remove_ids(one)  # (the list's last row: no hole to fill)
    assert copies[0] == np.count_nonzero(index.list_sizes().numpy()[first + 1 :])
    index.check_consistent()


@pytest.mark.parametrize("name", list(KINDS))
def test_removals_then_search_equal_an_index_built_without_the_ids(trained, data, name):
    x, q = data
    ids = np.arange(N) * 3 + 1
    index = _filled(trained, name, x, ids)
    index.search(q, K)  # (the fast-scan copy packed before the removals)
    rng = np.random.default_rng(5)
    gone = np.unique(np.concatenate([rng.choice(ids, 3), rng.choice(ids, 400), ids[-50:]]))
    for part in np.array_split(rng.permutation(gone), 3):
        index.remove_ids(part)
    index.check_consistent()
    keep = ~np.isin(ids, gone)
    oracle = _filled(trained, name, x[keep], ids[keep])
    np.testing.assert_array_equal(index.list_sizes(), oracle.list_sizes())
    np.testing.assert_array_equal(np.sort(index.ids.numpy()), np.sort(oracle.ids.numpy()))
    _assert_same_results(index, oracle, q)


@pytest.mark.parametrize("name", ["IVF16,Flat", "IVF16,PQ8", "IVF16,PQ8x4fs"])
def test_removal_gives_faiss_remove_ids_results(trained, data, name):
    pytest.importorskip("faiss")
    x, q = data
    ids = np.arange(N) * 2 + 5
    index = _filled(trained, name, x, ids)
    ref = index.to_faiss()
    gone = np.random.default_rng(6).choice(ids, 500, replace=False)
    try:
        assert ref.remove_ids(gone) == 500
    except RuntimeError:  # (fast-scan: not in every faiss version)
        pytest.skip("this faiss has no remove_ids for " + name)
    assert index.remove_ids(gone) == 500
    d, i = index.search(q, K)
    d0, i0 = ref.search(q, K)
    np.testing.assert_allclose(d, d0, rtol=1e-5, atol=1e-4)
    # ties aside: equal distances (faiss's float sums round apart by 1e-6) in any order, and
    # at the k-th distance any of the tied ids
    close = np.isclose(d[:, :, None], d[:, None, :], rtol=1e-5, atol=1e-4)
    ties = (close.sum(2) > 1) | close[:, :, -1]
    assert (i[~ties] == i0[~ties]).all()
    for row in range(q.shape[0]):
        same = np.isclose(d[row, :, None], d[row, None, :], rtol=1e-5, atol=1e-4)
        for col in np.flatnonzero(ties[row] & ~close[row, :, -1]):
            assert set(i[row][same[col]]) == set(i0[row][same[col]]), (row, col)


@pytest.mark.parametrize("name", ["IVF16,PQ8x4fs", "IVF16(soar),PQ8x4fs"])
def test_the_blocks_after_removals_and_adds_are_those_of_packing_the_lists_anew(
    trained, data, name, monkeypatch
):
    x, q = data
    index = _filled(trained, name, x[:1500], np.arange(1500))
    packed_anew = []
    real = fastscan_index.pack_rows
    monkeypatch.setattr(fastscan_index, "pack_rows", lambda *a: packed_anew.append(1) or real(*a))
    first = index.ids[int(index.offsets[-2]) :][:2].numpy().copy()  # rows of the last list only
    index.remove_ids(first)
    index.remove_ids(index.ids[int(index.offsets[-2]) :][:1].numpy().copy())
    index.add_with_ids(x[1500:1502], np.arange(1500, 1502))
    index.remove_ids(np.arange(0, 1500, 7))  # rows of every list
    assert not packed_anew  # the blocks moved and written, never packed from all the codes
    fresh, starts = fastscan.pack_lists(index.codes.numpy(), index.offsets.numpy())
    np.testing.assert_array_equal(index.packed_codes.numpy().reshape(-1, 32), fresh)
    np.testing.assert_array_equal(index.list_blocks.numpy(), starts)
    index.check_consistent()
    _, i = index.search(q, K)
    assert not np.isin(i, np.concatenate([first, np.arange(0, 1500, 7)])).any()
    assert np.isin([1500, 1501], index.ids.numpy()).all()


def test_a_removal_keeps_the_arrays_derived_from_the_codebooks(trained, data):
    x, q = data
    index = _filled(trained, "IVF16,PQ8", x, np.arange(N))
    index.search(q, K)
    index.range_search(q[:2], 1.0)  # (a term per stored row: derived from the codes)
    cache = index.__dict__["_derived_cache"]
    inputs = cache["table_inputs"]
    assert "row_terms" in cache
    index.remove_ids(np.arange(0, N, 3))
    assert index.__dict__["_derived_cache"]["table_inputs"] is inputs
    assert "row_terms" not in index.__dict__["_derived_cache"]
    index.reset()  # (a populated index is not trained again; the codebooks stay)
    assert index.__dict__["_derived_cache"]["table_inputs"] is inputs
    index.train(x)  # the codebooks change: everything derived is dropped
    assert "table_inputs" not in index.__dict__.get("_derived_cache", {})
