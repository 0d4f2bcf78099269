import numba
import numpy as np
import pytest

import vq
from vq import kernels
from vq.kernels.common.bundles import FlatLists, TopK
from vq.kernels.exact.ivf_flat import NO_ROW_IDS, NO_SKETCH
from vq.kernels.exact.lean_scans import all_finite

NONE = np.zeros(0, np.uint8)  # no filter


@pytest.mark.parametrize(
    "n_tables, ksub, n, k",
    [(4, 256, 3000, 10), (8, 256, 5000, 3), (8, 16, 50, 64), (3, 7, 0, 5), (2, 300, 999, 7)],
)
def test_adc_scan_matches_brute_force(n_tables, ksub, n, k):
    rng = np.random.default_rng(n_tables)
    tables = rng.random((21, n_tables, ksub)).astype(np.float32)
    codes = rng.integers(0, ksub, (n, n_tables)).astype(np.uint8 if ksub <= 256 else np.int16)
    tables[3] = 0.0  # one query where every vector ties: lowest row numbers must win
    dist = np.empty((21, k), np.float32)
    idx = np.empty((21, k), np.int64)
    view, words = kernels.code_view(codes, ksub)
    assert words == (ksub == 256 and n_tables % 4 == 0)  # both readers are exercised
    kernels.adc_scanner(n_tables, words)(tables.reshape(21, -1), view, NONE, dist, idx)
    full = tables[:, np.arange(n_tables)[None, :], codes].sum(-1) if n else np.zeros((21, 0))
    for q in range(21):
        order = np.lexsort((np.arange(n), full[q]))[:k]
        m = len(order)
        np.testing.assert_array_equal(idx[q, :m], order)
        np.testing.assert_allclose(dist[q, :m], full[q, order], rtol=1e-5)
        assert (idx[q, m:] == -1).all() and np.isinf(dist[q, m:]).all()


def test_kmeanspp_sample_follows_the_cumulative_sum():
    d2 = np.array([0.0, 1.0, 0.0, 3.0], np.float32)
    out = np.empty(4, np.int64)
    kernels.kmeanspp_sample(d2, np.array([0.0, 0.2, 0.25, 0.99]), out)
    assert out.tolist() == [1, 1, 3, 3]
    kernels.kmeanspp_sample(np.zeros(4, np.float32), np.array([0.0, 0.5]), out[:2])
    assert out[:2].tolist() == [0, 2]


@pytest.mark.parametrize("inner_product", [False, True])
@pytest.mark.parametrize("k, n", [(1, 40), (5, 40), (40, 40), (1, 301), (5, 301), (18, 301)])
def test_smallest_k_rows_is_a_stable_partial_sort(inner_product, k, n):
    """The k smallest ranked values of each row, ascending, ties by lower column (integer
    scores make ties frequent; l2 distances below 0 are clamped, so tie too). With more
    16-column chunks than k, the k-th least chunk minimum bounds the candidates."""
    rng = np.random.default_rng(k)
    scores = rng.integers(-6, 7, (9, n)).astype(np.float32)
    scores[::2] += rng.standard_normal((5, n)).astype(np.float32)  # rows with few ties too
    queries = rng.integers(-1, 2, (9, 3)).astype(np.float32)
    norms = rng.integers(0, 4, n).astype(np.float32)
    dist, idx = np.empty((9, k), np.float32), np.empty((9, k), np.int64)
    kernels.smallest_k_rows(scores, queries, norms, inner_product, dist, idx)
    q_norms = (queries**2).sum(1, keepdims=True)
    ranked = -scores if inner_product else np.maximum(q_norms + norms - 2 * scores, 0)
    order = np.argsort(ranked, axis=1, kind="stable")[:, :k]
    np.testing.assert_array_equal(idx, order)
    np.testing.assert_array_equal(dist, np.take_along_axis(ranked, order, axis=1))


def _rows_with_every_kind_of_tie(n: int) -> np.ndarray:
    """Rows of inner products: Gaussian, integer (many ties), half of them one value (a
    crowded bucket), ±0.0 mixed, all equal, quarters, one infinite value, one NaN."""
    rng = np.random.default_rng(n)
    rows = rng.standard_normal((8, n)).astype(np.float32)
    rows[1] = rng.integers(-20, 21, n)
    rows[2, : n // 2] = 0.5
    rows[3] = -np.abs(rows[3]) - 0.5  # and 24 columns of ±0.0, the least ranked values
    rows[3, rng.choice(n, 24, replace=False)] = np.tile(np.float32([0.0, -0.0]), 12)
    rows[4] = np.float32(3.0)  # all equal
    rows[5] = np.round(rows[5] * 4) / 4
    rows[6, 5] = np.inf
    rows[7, 9] = np.nan
    return rows


@pytest.mark.parametrize("k", [17, 64, 128, 300])
@pytest.mark.parametrize("inner_product", [False, True])
def test_the_histogram_selection_is_a_stable_partial_sort(k, inner_product):
    """k above the insertion path's: the columns of the histogram's first buckets (or the
    heap of keys, for rows it does not serve: one value crowding a bucket, all equal, not
    finite), the same as a stable sort, -0.0 tying with 0.0 by column."""
    n = 2048
    scores = _rows_with_every_kind_of_tie(n)
    queries = np.zeros((8, 3), np.float32)
    queries[:, 0] = 1.0
    norms = np.zeros(n, np.float32)
    dist, idx = np.empty((8, k), np.float32), np.empty((8, k), np.int64)
    kernels.smallest_k_rows(scores, queries, norms, inner_product, dist, idx)
    ranked = -scores if inner_product else np.maximum(1 - 2 * scores, 0)
    order = np.argsort(ranked[:7], axis=1, kind="stable")[:, :k]
    np.testing.assert_array_equal(idx[:7], order)
    np.testing.assert_array_equal(dist[:7], np.take_along_axis(ranked[:7], order, 1))
    assert len(set(idx[7].tolist())) == k  # a NaN column: k distinct columns still


@pytest.mark.parametrize("threads", [1, 2])
def test_unique_rows_keeps_the_first_row_of_each_id(threads):
    """Spilled lists' results: each id's first (best) row, in order, +inf / -1 padding; the
    same in slices on two threads as on one."""
    rng = np.random.default_rng(11)
    ids = rng.permutation(np.repeat(np.arange(50), 2))  # two rows per id
    nq, c, k = 150, 12, 8
    rows = rng.integers(0, 100, (nq, c))
    rows[::5, 9:] = -1  # short rows: padding after fewer than k distinct ids
    dist = np.sort(rng.random((nq, c)).astype(np.float32), axis=1)
    out_d, out_r = np.empty((nq, k), np.float32), np.empty((nq, k), np.int64)
    before = vq.get_num_threads()
    vq.set_num_threads(threads)
    try:
        kernels.unique_rows(dist, rows, ids, out_d, out_r)
    finally:
        vq.set_num_threads(before)
    for q in range(nq):
        want, seen = [], set()
        for d, r in zip(dist[q], rows[q], strict=True):
            if r < 0:
                break
            if ids[r] not in seen and len(want) < k:
                seen.add(ids[r])
                want.append((d, r))
        want += [(np.inf, -1)] * (k - len(want))
        assert out_r[q].tolist() == [r for _, r in want]
        assert out_d[q].tolist() == [np.float32(d) for d, _ in want]


@pytest.mark.parametrize("inner_product", [False, True])
@pytest.mark.parametrize("ties", [False, True])
def test_ivf_flat_scan_matches_brute_force_over_the_probed_lists(inner_product, ties):
    rng = np.random.default_rng(7)
    sizes = np.array([0, 1, 3, 4, 5, 7, 8, 9, 13, 16])  # every tail of the four-row steps
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    n, d, nq, k = int(offsets[-1]), 12, 9, 6
    if ties:  # small integers: many equal distances (then only the distances are fixed)
        x = rng.integers(-2, 3, (n, d)).astype(np.float32)
        q = rng.integers(-2, 3, (nq, d)).astype(np.float32)
    else:
        x = rng.standard_normal((n, d)).astype(np.float32)
        q = rng.standard_normal((nq, d)).astype(np.float32)
    probes = np.stack([rng.permutation(len(sizes))[:5] for _ in range(nq)]).astype(np.int64)
    probes[0, 2] = -1  # a skipped probe
    allowed = (rng.random(n) < 0.7).astype(np.uint8)
    for mask in (NONE, allowed):
        dist = np.empty((nq, k), np.float32)
        rows = np.empty((nq, k), np.int64)
        lists = FlatLists(x, offsets, False, NO_ROW_IDS, NO_SKETCH)
        kernels.ivf_flat_scan(q, lists, probes, mask, inner_product, TopK(dist, rows))
        for i in range(nq):
            seen = [r for p in probes[i] if p >= 0 for r in range(offsets[p], offsets[p + 1])]
            seen = np.array([r for r in seen if mask.size == 0 or mask[r]], np.int64)
            full = -(x[seen] @ q[i]) if inner_product else ((x[seen] - q[i]) ** 2).sum(1)
            m = min(k, len(seen))
            np.testing.assert_allclose(dist[i, :m], np.sort(full)[:m], rtol=1e-5, atol=1e-5)
            assert (rows[i, m:] == -1).all() and np.isinf(dist[i, m:]).all()
            assert set(rows[i, :m]) <= set(seen.tolist())  # rows it was allowed to scan
            if not ties:
                np.testing.assert_array_equal(rows[i, :m], seen[np.argsort(full)[:m]])


def test_all_finite_finds_every_nan_and_infinity_wherever_it_sits():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((7, 37)).astype(np.float32)
    x[2, 5], x[3, 6] = np.finfo(np.float32).max, np.finfo(np.float32).smallest_subnormal
    assert all_finite(x) and all_finite(x[:0]) and all_finite(np.zeros((3, 0), np.float32))
    for bad in (np.nan, np.inf, -np.inf):
        for i, j in ((0, 0), (6, 36), (3, 17), (5, 32)):
            y = x.copy()
            y[i, j] = bad
            # first compiled inside a fastmath kernel (Fortran order: a signature of its own)
            assert not _finite_in_a_fastmath_kernel(np.asfortranarray(y)), (bad, i, j)
            assert not all_finite(y), (bad, i, j)
            assert all_finite(y[i + 1 :]) and not all_finite(y[i : i + 1])  # row slices


@numba.njit(fastmath=True)
def _finite_in_a_fastmath_kernel(x):  # (as the lean searches call it: numba hands a callee
    return all_finite(x)  # the caller's fastmath unless it sets its own)
