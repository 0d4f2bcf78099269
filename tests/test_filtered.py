"""Filtered search (``search(..., allowed=...)``): every kind against an oracle — brute force
restricted to the allowed ids, or the same index holding only the allowed vectors — the torch
path against the kernels, faiss's IDSelectorBatch / IDSelectorBitmap, the IVF probing further,
and bad filters."""

import contextlib
import copy

import numba
import numpy as np
import pytest
import torch
from index_kinds import KINDS

import vq
from vq import _cpu
from vq.index import IVFPQ, FlatIndex, IVFFlat, IVFIndex, PQIndex, Refine
from vq.kernels.common.bitmask import pack_rows, rows_allowed
from vq.kernels.fastscan.fastscan_ivf import block_bits

K = 10


def _data(blobs, n=3000, nq=40):
    return np.ascontiguousarray(blobs[:n]), np.ascontiguousarray(blobs[-nq:])


def _allowed(n, fraction, seed=0):
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(n, max(1, int(n * fraction)), replace=False))


def _kinds(dim):
    return {
        "flat": lambda: FlatIndex(dim),
        "flat-ip": lambda: FlatIndex(dim, metric="ip"),
        "pq": lambda: PQIndex(dim, M=8, niter=4),
        "pq-fs": lambda: PQIndex(dim, M=8, nbits=4, fast_scan=True, niter=4),
        "ivfflat": lambda: IVFFlat(dim, nlist=16, nprobe=3),
        "ivfpq": lambda: IVFPQ(dim, nlist=16, M=8, nprobe=3, niter=4),
        "ivfpq-ip": lambda: IVFPQ(dim, nlist=16, M=8, nprobe=3, niter=4, metric="ip"),
        "ivfpq-fs": lambda: IVFPQ(dim, nlist=16, M=8, nbits=4, fast_scan=True, nprobe=3, niter=4),
        "refine-ivfpq": lambda: Refine(IVFPQ(dim, nlist=16, M=8, nprobe=3, niter=4), k_factor=4),
        "sq8": lambda: vq.index_factory(dim, "SQ8"),
        "sq4-ip": lambda: vq.index_factory(dim, "SQ4", metric="ip"),
        "ivfsq8": lambda: vq.index_factory(dim, "IVF16,SQ8"),
        "ivfflat-spill": lambda: vq.index_factory(dim, "IVF16(soar),Flat"),
    }


@pytest.fixture(scope="module")
def built(blobs):
    x, _ = _data(blobs)
    out = {}
    for name, make in _kinds(x.shape[1]).items():
        index = make()
        index.train(x)
        index.add_with_ids(x, np.arange(x.shape[0]) * 3 + 7)  # ids are not the rows
        out[name] = index
    return out


def _row_keys(ivf):
    """(list, id) of each stored row, as one int64: one row each, spilled indexes too."""
    lists = np.repeat(np.arange(ivf.nlist), ivf.list_sizes().numpy())
    return (lists << 40) | ivf.ids.numpy()


def _only(index, allowed_ids):
    """The same trained index holding only the allowed vectors, in the order ``index`` holds
    them (the oracle: kernels break ties by row, and ``remove_ids`` reorders rows within
    lists, so each IVF index's rows are put back in ``index``'s order)."""
    sub = copy.deepcopy(index)
    sub.remove_ids(np.setdiff1d(index.stored_ids().numpy(), allowed_ids))
    full = dict(index.named_modules())
    for prefix, m in sub.named_modules():
        if isinstance(m, IVFIndex):
            before = _row_keys(full[prefix])
            sorter = np.argsort(before)
            rank = sorter[np.searchsorted(before, _row_keys(m), sorter=sorter)]
            order = torch.from_numpy(np.argsort(rank))
            for name in (*m.row_buffers, *m.block_rows, "ids"):  # (fast-scan codes: packed)
                setattr(m, name, getattr(m, name)[order].contiguous())
    return sub


def test_filtered_flat_equals_brute_force_over_the_allowed_ids(blobs):
    x, q = _data(blobs)
    index = FlatIndex(x.shape[1])
    index.add(x)
    allowed = _allowed(x.shape[0], 0.05)
    D, I = index.search(q, K, allowed=allowed)
    d2 = ((q[:, None, :] - x[None, allowed, :]) ** 2).sum(-1)
    order = np.argsort(d2, axis=1, kind="stable")[:, :K]
    np.testing.assert_array_equal(I, allowed[order])
    np.testing.assert_allclose(D, np.take_along_axis(d2, order, 1), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("name", list(_kinds(1)))
@pytest.mark.parametrize("fraction", [0.01, 0.3, 0.7])
def test_filtered_search_equals_the_index_holding_only_the_allowed_vectors(built, blobs, name,
                                                                            fraction):  # fmt: skip
    index = built[name]
    _, q = _data(blobs)
    ids = index.stored_ids().numpy()
    allowed = ids[_allowed(ids.shape[0], fraction, seed=3)]
    params = {"nprobe": 16} if "ivf" in name else {}  # every list: the same lists scanned
    D, I = index.search(q, K, allowed=allowed, **params)
    D0, I0 = _only(index, allowed).search(q, K, **params)
    np.testing.assert_array_equal(I, I0)
    np.testing.assert_allclose(D, D0, rtol=1e-5, atol=1e-4)
    assert np.isin(I[I >= 0], allowed).all()
    with _cpu.torch_only():  # the static torch search, masked, against its own oracle
        t = torch.from_numpy(q)
        Dt, It = index.search(t, K, allowed=torch.from_numpy(allowed), **params)
        Dt0, It0 = _only(index, allowed).search(t, K, **params)
    np.testing.assert_allclose(Dt, Dt0, rtol=1e-5, atol=1e-4)  # (ties between 4-bit codes
    assert np.isin(It[It >= 0], allowed).all()  # come in any order from torch.topk)
    if "fs" not in name:  # (fast-scan: float tables here, uint8 ones in the kernels)
        assert (It.numpy() == I).mean() > 0.995


def test_the_three_forms_of_a_filter_give_the_same_results(built, blobs):
    index = built["ivfpq"]
    _, q = _data(blobs)
    ids = index.stored_ids().numpy()
    allowed = ids[_allowed(ids.shape[0], 0.1, seed=4)]
    mask = np.zeros(ids.max() + 1, bool)
    mask[allowed] = True
    bitmap = np.packbits(mask, bitorder="little")
    ref = index.search(q, K, allowed=allowed)[1]
    for form in (
        list(allowed[::-1]),  # any order
        torch.from_numpy(allowed),
        mask,
        torch.from_numpy(mask),
        vq.IdFilter(allowed),
        vq.IdFilter.from_bitmap(bitmap, mask.shape[0]),
    ):
        np.testing.assert_array_equal(index.search(q, K, allowed=form)[1], ref)
    f = vq.IdFilter(mask)
    assert len(f) == allowed.shape[0]
    for _ in range(2):  # reusable: the row mask is kept for the index's ids
        np.testing.assert_array_equal(index.search(q[:3], K, allowed=f)[1], ref[:3])


def test_a_selective_ivf_search_probes_further_until_k_allowed_vectors(built, blobs):
    index = built["ivfflat"]
    _, q = _data(blobs)
    ids = index.stored_ids().numpy()
    allowed = ids[_allowed(ids.shape[0], 0.01, seed=5)]  # 30 vectors
    D, I, probed = index.search(q, K, allowed=allowed, nprobe=1, return_probed=True)
    assert (I >= 0).all(), "k results for every query: 30 allowed vectors exist"
    assert probed.min() >= 1 and probed.max() > 1
    # the result is the exact search over the lists it says it probed: the k nearest allowed
    # vectors of those lists
    D0, I0 = _only(index, allowed).search(q, K, nprobe=16)
    better_or_equal = D[:, -1] >= D0[:, -1] - 1e-4
    assert better_or_equal.all()
    # max_codes caps the further probing (never below nprobe)
    _, I1, p1 = index.search(q, K, allowed=allowed, nprobe=1, max_codes=1, return_probed=True)
    assert (p1 == 1).all() and (I1 == -1).any()
    # an unfiltered search probes nprobe lists
    assert (index.search(q, K, nprobe=2, return_probed=True)[2] == 2).all()


def test_filtered_refine_and_pretransform_return_only_allowed_ids(blobs):
    x, q = _data(blobs)
    index = vq.index_factory(x.shape[1], "OPQ8,IVF16,PQ8,RFlat")
    index.train(x)
    index.add(x)
    allowed = _allowed(x.shape[0], 0.02, seed=6)
    D, I = index.search(q, K, allowed=allowed, nprobe=2)
    assert (I >= 0).all() and np.isin(I, allowed).all()
    assert (np.diff(D, axis=1) >= 0).all()


def test_fewer_allowed_ids_than_k_pad_with_minus_one(built, blobs):
    _, q = _data(blobs)
    for name in ("flat", "pq-fs", "ivfpq"):
        index = built[name]
        allowed = index.stored_ids().numpy()[[5, 50, 500]]
        D, I = index.search(q[:4], K, allowed=allowed)
        assert (np.sort(I[:, :3], axis=1) == np.sort(allowed)).all(), name
        assert (I[:, 3:] == -1).all() and np.isinf(D[:, 3:]).all(), name


def test_bad_filters_are_refused_with_clear_errors(built, blobs):
    index = built["ivfpq"]
    _, q = _data(blobs)
    n = index.ntotal
    top = int(index.stored_ids().max())
    with pytest.raises(TypeError, match="integer ids or a boolean mask"):
        index.search(q, K, allowed=np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match="flat array"):
        index.search(q, K, allowed=np.zeros((2, 2), np.int64))
    with pytest.raises(ValueError, match=f"length >= {top + 1}"):
        index.search(q, K, allowed=np.ones(n, bool))
    with pytest.raises(ValueError, match=">= 0"):
        index.search(q, K, allowed=[-1, 3])
    with pytest.raises(TypeError, match="expected an id array"):
        index.search(q, K, allowed="1,2,3")
    with pytest.raises(TypeError, match="return_probed=True is for IVF"):
        built["flat"].search(q, K, return_probed=True)
    with pytest.raises(ValueError, match="max_codes"):
        index.search(q, K, allowed=[7], max_codes=0)
    with pytest.raises(ValueError, match="IDSelectorBitmap"):
        vq.IdFilter.from_bitmap(np.zeros(2, np.uint8), 100)
    assert index.ntotal == n  # nothing changed


# (faiss's IndexPQ refuses search parameters: no selector there)
@pytest.mark.parametrize("name", ["flat", "ivfflat", "ivfpq", "ivfpq-fs"])
def test_filtered_search_equals_faiss_with_id_selectors_on_imported_indexes(built, blobs, name):
    faiss = pytest.importorskip("faiss")
    _, q = _data(blobs)
    source = built[name].to_faiss()  # a faiss index, imported back: faiss and vq hold the same
    index = vq.index.from_faiss(source)
    ids = index.stored_ids().numpy()
    allowed = ids[_allowed(ids.shape[0], 0.01, seed=7)]
    mask = np.zeros(ids.max() + 1, bool)
    mask[allowed] = True
    ivf = "ivf" in name
    bitmap = np.packbits(mask, bitorder="little")
    for sel in (faiss.IDSelectorBatch(allowed), faiss.IDSelectorBitmap(bitmap)):
        if ivf:
            params = faiss.SearchParametersIVF(sel=sel, nprobe=3)
        else:
            params = faiss.SearchParameters(sel=sel)
        Df, If = source.search(q, K, params=params)
        D, I = index.search(q, K, allowed=allowed, **({"nprobe": 3} if ivf else {}))
        full = (If >= 0).all(axis=1)  # where faiss returns k results, the same ones
        np.testing.assert_array_equal(I[full], If[full])
        tol = 2e-2 if "fs" in name else 1e-4  # fast-scan: each quantizes its tables its own way
        np.testing.assert_allclose(D[full], Df[full], rtol=tol, atol=1e-3)
        assert (I >= 0).all(), "vq returns k results for every query (30 allowed exist)"
        if ivf:
            assert (~full).sum() > 0, "at 1% selectivity faiss returns fewer for some queries"


@numba.njit
def _counts(bits, ranges):
    out = np.empty(ranges.shape[0], np.int64)
    for r in range(ranges.shape[0]):
        out[r] = rows_allowed(bits, ranges[r, 0], ranges[r, 1])
    return out


def test_bit_words_and_fast_scan_block_bits_hold_the_row_mask():
    rng = np.random.default_rng(8)
    n = 1000
    mask = (rng.random(n) < 0.3).astype(np.uint8)
    bits = pack_rows(mask)
    assert bits.dtype == np.uint64 and bits.shape == (16,)
    rows = np.arange(n)
    np.testing.assert_array_equal((bits[rows >> 6] >> (rows & 63).astype(np.uint64)) & 1, mask)
    assert bits[-1] >> np.uint64(n - 960) == 0  # nothing past n
    ranges = [(0, 1), (0, 64), (63, 65), (5, 999), (128, 192), (700, 1000), (999, 1000)]
    counts = _counts(bits, np.array(ranges, np.int64))
    np.testing.assert_array_equal(counts, [int(mask[lo:hi].sum()) for lo, hi in ranges])
    # a block's bits: its stored rows (not the padding past a list's end) that are allowed
    sizes = np.array([0, 31, 32, 33, 100, 7, 797])
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    list_blocks = np.concatenate([[0], np.cumsum(-(-sizes // 32))]).astype(np.int64)
    out = np.empty(list_blocks[-1], np.uint32)
    block_bits(bits, offsets, list_blocks, out)
    expected = []
    for lst in range(sizes.shape[0]):
        for b in range(list_blocks[lst + 1] - list_blocks[lst]):
            row0 = offsets[lst] + 32 * b
            v = [int(mask[r]) if r < offsets[lst + 1] else 0 for r in range(row0, row0 + 32)]
            expected.append(sum(bit << i for i, bit in enumerate(v)))
    np.testing.assert_array_equal(out, np.array(expected, np.uint32))


@pytest.mark.parametrize("name", ["ivfpq", "ivfpq-fs"])
def test_a_filter_kept_across_calls_follows_the_index_when_it_changes(blobs, name):
    """The arrays a filter derives per index (bit words, blocks, allowed rows per list) are
    recomputed when vectors are added or removed."""
    x, q = _data(blobs)
    index = _kinds(x.shape[1])[name]()
    index.train(x)
    index.add(x[:2000])
    f = vq.IdFilter(_allowed(3000, 0.2, seed=9))
    index.search(q, K, allowed=f, nprobe=16)
    index.add(x[2000:])
    index.remove_ids(np.arange(0, 3000, 5))
    D, I = index.search(q, K, allowed=f, nprobe=16)
    D0, I0 = _only(index, f.ids).search(q, K, nprobe=16)
    np.testing.assert_array_equal(I, I0)
    assert np.isin(I[I >= 0], f.ids).all()


@pytest.mark.parametrize("desc", sorted(set(KINDS.values())))
def test_every_registered_kind_returns_only_allowed_ids_on_both_engines(blobs, desc):
    """Every kind of the registry (tests/index_kinds.py, a toy kind included): a filtered
    search, numba and torch, returns allowed ids alone, and some for every query."""
    x, q = _data(blobs, n=1200, nq=8)
    index = vq.index_factory(x.shape[1], desc)
    index.train(x)
    index.add_with_ids(x, np.arange(x.shape[0]) * 3 + 7)
    ids = index.stored_ids().numpy()
    allowed = ids[_allowed(ids.shape[0], 0.3, seed=5)]
    for engine in (contextlib.nullcontext, _cpu.torch_only):
        with engine():
            _, I = index.search(torch.from_numpy(q), K, allowed=torch.from_numpy(allowed))
        I = np.asarray(I)
        assert np.isin(I[I >= 0], allowed).all(), desc
        assert (I >= 0).any(axis=1).all(), desc
