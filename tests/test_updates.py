"""Cheap updates: ``remove_ids`` in place, buffers grown with amortised capacity, ``reconstruct``
/ ``reconstruct_n`` and ``merge_from`` — against an index built without the removed ids, against
faiss (reconstruct, merge_from), and their invariants and errors."""

import copy

import numpy as np
import pytest
import torch

import vq
from vq.index import IVFPQ, IVFSQ, FlatIndex, IVFFlat, IVFIndex, PQIndex, PreTransform, Refine
from vq.kernels.common import rows as row_kernels

K = 10
N = 2000


def _kinds(dim):
    return {
        "flat": lambda: FlatIndex(dim),
        "pq": lambda: PQIndex(dim, M=8, niter=4),
        "pq-fs": lambda: PQIndex(dim, M=8, nbits=4, fast_scan=True, niter=4),
        "ivfflat": lambda: IVFFlat(dim, nlist=16, nprobe=4),
        "ivfpq": lambda: IVFPQ(dim, nlist=16, M=8, nprobe=4, niter=4),
        "ivfpq-flat-codes": lambda: IVFPQ(dim, nlist=16, M=8, by_residual=False, niter=4),
        "ivfpq-fs": lambda: IVFPQ(dim, nlist=16, M=8, nbits=4, fast_scan=True, nprobe=4, niter=4),
        "ivfsq": lambda: IVFSQ(dim, nlist=16, nprobe=4),
        "ivfpq-spilled": lambda: IVFPQ(dim, nlist=16, M=8, nprobe=4, niter=4, spill=True),
        "ivfflat-spilled": lambda: IVFFlat(dim, nlist=16, nprobe=4, spill=True),
        "refine-ivfpq": lambda: Refine(IVFPQ(dim, nlist=16, M=8, nprobe=4, niter=4), k_factor=4),
        "opq-ivfpq": lambda: PreTransform(
            vq.OPQ(dim, M=8, niter=2, niter_pq=2), IVFPQ(dim, nlist=16, M=8, nprobe=4, niter=4)
        ),
    }


@pytest.fixture(scope="module")
def data(blobs):
    return np.ascontiguousarray(blobs[:N]), np.ascontiguousarray(blobs[-30:])


@pytest.fixture(scope="module")
def trained(data):
    x, _ = data
    out = {}
    for name, make in _kinds(x.shape[1]).items():
        index = make()
        index.train(x)
        out[name] = index
    return out


def _filled(trained, name, x, ids):
    index = copy.deepcopy(trained[name])
    index.add_with_ids(x, ids)
    return index


def _storage(index):
    """The stored data by name (a fast-scan index's codes unpacked from its blocks, whose
    order within a list ``_by_list`` cannot sort)."""
    out = {k: v.clone() for k, v in index.state_dict().items()}
    for prefix, m in index.named_modules():
        if getattr(m, "fast_scan", False):
            key = f"{prefix}.packed_codes" if prefix else "packed_codes"
            out[key.replace("packed_codes", "codes")] = m.codes.clone()
            del out[key]
    return out


def _row_buffer(index):
    """The buffer holding the rows (or a fast-scan index's blocks of codes)."""
    return index.row_buffers[0] if index.row_buffers else "packed_codes"


def _by_list(index):
    """The stored rows with each IVF index's lists in id order (``remove_ids`` changes the
    order within lists, as faiss's does: each removed row takes its list's last kept row)."""
    out = _storage(index)
    for prefix, m in index.named_modules():
        if isinstance(m, IVFIndex):
            lists = np.repeat(np.arange(m.nlist), m.list_sizes().numpy())
            order = torch.from_numpy(np.lexsort((m.ids.numpy(), lists)))
            for name in (*m.row_buffers, *m.block_rows, "ids"):
                key = f"{prefix}.{name}" if prefix else name
                out[key] = out[key][order]
    return out


def _assert_same_storage(a, b, within_lists=False):
    """The same stored rows (``within_lists``: in any order within each list)."""
    sa, sb = (_by_list(a), _by_list(b)) if within_lists else (_storage(a), _storage(b))
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


def _assert_same_results(index, oracle, q, k=K):
    """``index.search(q, k)`` equals ``oracle.search(q, k)`` as faiss compares them, ties
    aside: the same distances; the same ids, but among equal distances in any order, and the
    ids tied at the k-th distance any of the oracle's ids at that distance (the kernels break
    ties by stored row, and removal reorders rows within lists)."""
    d, i = index.search(q, k)
    d0, i0 = oracle.search(q, k)
    wide_d, wide_i = oracle.search(q, k + 50)
    np.testing.assert_array_equal(d, d0)
    for row in range(q.shape[0]):
        last = d0[row, -1]
        inner = d0[row] != last
        assert set(i[row][inner]) == set(i0[row][inner]), row
        assert set(i[row][~inner]) <= set(wide_i[row][wide_d[row] == last]), row


@pytest.mark.parametrize("name", list(_kinds(8)))
def test_remove_ids_then_search_equals_an_index_built_without_them(trained, data, name):
    x, q = data
    ids = np.arange(N) * 5 + 3
    index = _filled(trained, name, x, ids)
    rng = np.random.default_rng(1)
    gone = rng.choice(ids, 300, replace=False)
    assert index.remove_ids(np.concatenate([gone, [10**9]])) == 300  # unknown ids ignored
    keep = ~np.isin(ids, gone)
    oracle = _filled(trained, name, x[keep], ids[keep])
    _assert_same_storage(index, oracle, within_lists=True)  # the same rows in the same lists
    _assert_same_results(index, oracle, q)
    assert not np.isin(index.search(q, K)[1], gone).any()


@pytest.mark.parametrize("name", ["ivfpq", "ivfpq-fs", "ivfsq", "ivfpq-spilled"])
def test_removals_in_several_calls_then_adds_equal_an_index_built_with_what_is_left(
    trained, data, name, monkeypatch
):
    x, q = data
    ids = np.arange(N) * 3 + 1
    index = _filled(trained, name, x, ids)
    scanned = []
    real = row_kernels.rows_of_ids
    monkeypatch.setattr(
        row_kernels, "rows_of_ids", lambda *a: scanned.append(a[4][a[0] : a[1]]) or real(*a)
    )
    rng = np.random.default_rng(2)
    gone = [rng.choice(ids, 5, replace=False), rng.choice(ids, 200, replace=False), ids[:7]]
    row_lists = np.repeat(np.arange(index.nlist), index.list_sizes().numpy())
    holding = np.unique(row_lists[np.isin(index.ids.numpy(), gone[0])])
    removed = 0
    for batch in gone:  # overlapping batches: an id removed twice counts once
        removed += index.remove_ids(batch)
    keys = index._id_lists.keys
    all_gone = np.unique(np.concatenate(gone))
    assert removed == all_gone.size
    # the first call built the id -> list map, the later ones kept it; each call read only the
    # lists holding its ids
    assert index._id_lists.keys is keys and len(scanned) == len(gone)
    np.testing.assert_array_equal(scanned[0], holding)
    keep = ~np.isin(ids, all_gone)
    new_ids = np.arange(5) * 3 + 2
    index.add_with_ids(x[:5], new_ids)  # (the map is dropped, rebuilt by the next removal)
    assert index.remove_ids(np.concatenate([new_ids[:2], ids[keep][:3]])) == 5
    oracle = _filled(trained, name, x[keep][3:], ids[keep][3:])
    oracle.add_with_ids(x[2:5], new_ids[2:])
    _assert_same_storage(index, oracle, within_lists=True)
    _assert_same_results(index, oracle, q)


@pytest.mark.parametrize("name", ["pq-fs", "ivfpq", "ivfflat", "flat"])
def test_remove_ids_moves_rows_in_place_and_add_fills_the_room_left(trained, data, name):
    x, _ = data
    index = _filled(trained, name, x, np.arange(N))
    buf = _row_buffer(index)
    ptr = getattr(index, buf).data_ptr()
    index.remove_ids(np.arange(0, N, 2))
    assert getattr(index, buf).data_ptr() == ptr  # compacted in place, not copied
    index.add_with_ids(x[:500], np.arange(N, N + 500))  # within the capacity: no new tensor
    assert getattr(index, buf).data_ptr() == ptr
    assert index.ntotal == N // 2 + 500
    index.check_consistent()


@pytest.mark.parametrize("name", ["pq", "ivfpq-fs", "ivfflat", "refine-ivfpq"])
def test_adds_in_many_calls_store_what_one_add_stores_with_few_reallocations(trained, data, name):
    x, q = data
    one = _filled(trained, name, x, np.arange(N))
    many = copy.deepcopy(trained[name])
    ptrs = set()
    for s in range(0, N, 50):
        many.add(x[s : s + 50])
        inner = many.index if isinstance(many, Refine) else many
        ptrs.add(getattr(inner, _row_buffer(inner)).data_ptr())
    _assert_same_storage(many, one)
    assert len(ptrs) <= 16  # 1.25x growth: ~log(40)/log(1.25) reallocations, not 40
    np.testing.assert_array_equal(many.search(q, K)[1], one.search(q, K)[1])


def test_a_saved_file_holds_the_rows_not_the_capacity(trained, data, tmp_path):
    x, q = data
    a = _filled(trained, "ivfpq", x[:1000], np.arange(1000))
    a.add(x[1000:1100])  # grown with room to spare
    b = _filled(trained, "ivfpq", x[:1100], np.arange(1100))
    a.save(tmp_path / "a.vq")
    b.save(tmp_path / "b.vq")
    assert (tmp_path / "a.vq").stat().st_size == (tmp_path / "b.vq").stat().st_size
    loaded = vq.load_index(tmp_path / "a.vq")
    np.testing.assert_array_equal(loaded.search(q, K)[1], b.search(q, K)[1])


@pytest.mark.parametrize("name", ["pq", "ivfpq", "ivfflat"])
def test_an_add_that_fails_midway_leaves_the_index_as_it_was(trained, data, name, monkeypatch):
    x, q = data
    index = _filled(trained, name, x[:1000], np.arange(1000))
    before = _storage(index)
    calls = []
    kind = type(index)
    hook = "_encode_rows" if hasattr(kind, "_encode_rows") else "encode_batch"
    original = getattr(kind, hook)

    def failing(self, *args):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("disk on fire")
        return original(self, *args)

    monkeypatch.setattr(kind, hook, failing)
    monkeypatch.setattr(index, "add_batch_size", 100)
    with pytest.raises(RuntimeError, match="disk on fire"):
        index.add(x[1000:1500])
    monkeypatch.undo()
    after = _storage(index)
    for k in before:
        assert torch.equal(before[k], after[k]), k
    index.check_consistent()
    index.add(x[1000:1500])  # and it still works
    assert index.ntotal == 1500


@pytest.mark.parametrize("name", [k for k in _kinds(8) if k != "ivfsq"])  # (no reconstruct)
def test_reconstruct_gives_the_stored_vectors_decoded(trained, data, name):
    x, _ = data
    ids = np.arange(N) * 7 + 1
    index = _filled(trained, name, x, ids)
    pick = ids[[5, 900, 3, 1999]]
    got = index.reconstruct(pick)
    assert got.shape == (4, x.shape[1]) and got.dtype == np.float32
    np.testing.assert_allclose(index.reconstruct(int(pick[1])), got[1], rtol=1e-6, atol=1e-6)
    exact = name in ("flat", "ivfflat", "refine-ivfpq")
    if exact:
        np.testing.assert_array_equal(got, x[[5, 900, 3, 1999]])
    else:  # decoding is no worse than the nearest codeword allows: close to the vectors
        err = ((got - x[[5, 900, 3, 1999]]) ** 2).sum(1)
        assert (err < (x[[5, 900, 3, 1999]] ** 2).sum(1)).all()
    t = index.reconstruct(torch.from_numpy(pick))
    assert isinstance(t, torch.Tensor)
    np.testing.assert_array_equal(t.numpy(), got)


@pytest.mark.parametrize("name", ["flat", "pq", "ivfflat", "ivfpq", "ivfpq-flat-codes"])
def test_reconstruct_equals_faiss(trained, data, name):
    pytest.importorskip("faiss")
    x, _ = data
    index = _filled(trained, name, x, np.arange(N))
    ref = index.to_faiss()
    if hasattr(ref, "make_direct_map"):
        ref.make_direct_map()
    keys = np.array([0, 17, 1500, 1999], dtype=np.int64)
    np.testing.assert_allclose(index.reconstruct(keys), ref.reconstruct_batch(keys), atol=1e-5)
    np.testing.assert_allclose(index.reconstruct_n(100, 50), ref.reconstruct_n(100, 50), atol=1e-5)


def test_reconstruct_of_an_id_not_stored_says_which(trained, data):
    x, _ = data
    index = _filled(trained, "ivfpq", x[:100], np.arange(100) + 1000)
    with pytest.raises(ValueError, match=r"id 5 is not in the index \(1 of the 2 ids"):
        index.reconstruct([1000, 5])
    with pytest.raises(ValueError, match="id 1100 is not in the index"):
        index.reconstruct_n(1050, 51)
    flat = _filled(trained, "flat", x[:100], np.arange(100))
    with pytest.raises(ValueError, match="id 100 is not in the index"):
        flat.reconstruct(100)


@pytest.mark.parametrize("name", list(_kinds(8)))
def test_merge_from_stores_what_adding_both_parts_stores(trained, data, name):
    x, q = data
    ids = np.arange(N) * 3
    a = _filled(trained, name, x[:1200], ids[:1200])
    b = _filled(trained, name, x[1200:], ids[1200:])
    a.merge_from(b)
    whole = _filled(trained, name, x, ids)
    _assert_same_storage(a, whole)
    assert b.ntotal == N - 1200  # other is left as it was
    np.testing.assert_array_equal(a.search(q, K)[1], whole.search(q, K)[1])


def test_merge_from_numbers_sequential_rows_after_this_index_as_faiss_flat(trained, data):
    x, _ = data
    a, b = copy.deepcopy(trained["pq"]), copy.deepcopy(trained["pq"])
    a.add(x[:100])
    b.add(x[100:150])
    a.merge_from(b)
    assert a.has_sequential_ids() and a.ntotal == 150
    np.testing.assert_array_equal(a.reconstruct_n(100, 50), b.reconstruct_n(0, 50))


@pytest.mark.parametrize("name", ["ivfflat", "ivfpq"])
def test_merge_from_equals_faiss_merge_from(trained, data, name):
    pytest.importorskip("faiss")
    x, q = data
    a = _filled(trained, name, x[:1000], np.arange(1000) * 2)
    b = _filled(trained, name, x[1000:], np.arange(1000, N) * 2)
    fa, fb = a.to_faiss(), b.to_faiss()
    fa.merge_from(fb, 0)  # ids kept
    a.merge_from(b)
    d, i = a.search(q, K)
    fd, fi = fa.search(q, K)
    np.testing.assert_array_equal(i, fi)
    np.testing.assert_allclose(d, fd, rtol=1e-5, atol=1e-4)


def test_merge_from_refuses_indexes_not_trained_alike(trained, data):
    x, _ = data
    a = _filled(trained, "ivfpq", x[:100], np.arange(100))
    other = IVFPQ(x.shape[1], nlist=16, M=8, nprobe=4, niter=4)
    other.train(x[::-1].copy())  # the same configuration, other data
    with pytest.raises(ValueError, match="trained tensor 'quantizer.codebook' differs"):
        a.merge_from(other)
    with pytest.raises(ValueError, match="other is a IVFFlat, this index a IVFPQ"):
        a.merge_from(copy.deepcopy(trained["ivfflat"]))
    with pytest.raises(ValueError, match=r"configurations differ \(by_residual: False in other"):
        a.merge_from(copy.deepcopy(trained["ivfpq-flat-codes"]))
    with pytest.raises(ValueError, match="cannot merge itself"):
        a.merge_from(a)
    same = _filled(trained, "ivfpq", x[100:110], np.arange(95, 105))
    before = _storage(a)
    with pytest.raises(ValueError, match="5 of them are already in the index"):
        a.merge_from(same)
    for k, v in _storage(a).items():
        assert torch.equal(v, before[k])


@pytest.mark.parametrize("name", ["flat", "pq-fs", "ivfflat", "ivfpq", "refine-ivfpq", "opq-ivfpq"])
def test_a_memory_mapped_index_searches_as_a_loaded_one_and_copies_before_writing(
    trained, data, name, tmp_path
):
    x, q = data
    path = tmp_path / "index.vq"
    _filled(trained, name, x, np.arange(N) * 2).save(path)
    raw = path.read_bytes()
    loaded, mapped = vq.load_index(path), vq.load_index(path, mmap=True)
    for a, b in zip(loaded.search(q, K), mapped.search(q, K), strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(mapped.reconstruct([0, 10]), loaded.reconstruct([0, 10]))
    mapped.remove_ids(np.arange(0, 400, 2))
    mapped.add_with_ids(x[:10], np.arange(10) * 2 + 1)
    loaded.remove_ids(np.arange(0, 400, 2))
    loaded.add_with_ids(x[:10], np.arange(10) * 2 + 1)
    _assert_same_storage(mapped, loaded)
    assert path.read_bytes() == raw  # the file never changes


def test_a_mapped_load_refuses_a_truncated_file_and_verify_catches_a_tampered_one(
    trained, data, tmp_path
):
    x, _ = data
    path = tmp_path / "index.vq"
    _filled(trained, "ivfpq", x, np.arange(N)).save(path)
    raw = path.read_bytes()
    (tmp_path / "short.vq").write_bytes(raw[:-100])
    with pytest.raises(ValueError, match="truncated or corrupted"):
        vq.load_index(tmp_path / "short.vq", mmap=True)
    tampered = bytearray(raw)
    tampered[-50] ^= 0xFF  # a byte of the stored data
    (tmp_path / "bad.vq").write_bytes(bytes(tampered))
    with pytest.raises(ValueError, match="checksum mismatch"):
        vq.load_index(tmp_path / "bad.vq", mmap=True, verify=True)
    with pytest.raises(ValueError, match="checksum mismatch"):
        vq.load_index(tmp_path / "bad.vq")
    with pytest.raises(ValueError, match="verify=False needs mmap=True"):
        vq.load_index(path, verify=False)


@pytest.mark.parametrize("name", ["ivfflat", "ivfpq", "pq", "refine-ivfpq"])
def test_adding_nothing_to_an_empty_index_and_removing_from_it_change_nothing(trained, name):
    index = copy.deepcopy(trained[name])
    index.add(np.zeros((0, index.dim), np.float32))
    assert index.ntotal == 0 and index.remove_ids([1, 2]) == 0
    index.check_consistent()
