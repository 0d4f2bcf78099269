"""Spilled inverted lists (SOAR): more recall at equal nprobe, each id once in the results,
the results those of an exact scan of what the probed lists hold, vectors (not copies)
counted, removed and saved."""

import numpy as np
import pytest
import torch
from export_helpers import assert_same_search, fixture_exported, fixture_ort  # noqa: F401

import vq
from vq import kernels
from vq._cpu import torch_only
from vq.datasets import clustered_vectors
from vq.distances import nearest
from vq.export import OnnxRunner
from vq.index.ivf.spill import nearest_and_spill, soar_assign, spill_lists
from vq.kernels.common.bundles import FlatLists, TopK

DIM = 16


@pytest.fixture(scope="module", name="data")
def fixture_data():
    return clustered_vectors(6000, DIM, n_clusters=60, seed=11)


@pytest.fixture(scope="module", name="queries")
def fixture_queries():
    return clustered_vectors(200, DIM, n_clusters=60, seed=12)


def _built(data, spill, kind="Flat", metric="l2"):
    index = vq.index_factory(DIM, f"IVF32{'(soar)' if spill else ''},{kind}", metric)
    index.coarse_niter = 6
    index.train(data)
    index.add(data)
    return index


@pytest.fixture(scope="module", name="pair")
def fixture_pair(data):
    return _built(data, False), _built(data, True)


def _recall(I, truth):
    return np.mean([len(set(a) & set(b)) / truth.shape[1] for a, b in zip(I, truth, strict=True)])


def test_spilling_raises_recall_at_equal_nprobe(pair, data, queries):
    truth = ((queries[:, None] - data[None]) ** 2).sum(-1).argsort(1)[:, :10]
    plain, spilled = pair
    for nprobe in (1, 2, 4):
        r_plain = _recall(plain.search(queries, 10, nprobe=nprobe)[1], truth)
        r_spill = _recall(spilled.search(queries, 10, nprobe=nprobe)[1], truth)
        assert r_spill >= r_plain + 0.02, (nprobe, r_plain, r_spill)


def _no_repeats(I):
    return all(len(set(row[row >= 0])) == int((row >= 0).sum()) for row in I)


@pytest.mark.parametrize("kind", ["Flat", "SQ8", "PQ4x6"])
@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_each_id_once_and_the_torch_path_agrees(data, queries, kind, metric):
    index = _built(data, True, kind, metric)
    assert index.ntotal == len(data) and index.n_rows == 2 * len(data)
    for nprobe in (1, 3, 32):
        D, I = index.search(queries, 10, nprobe=nprobe)
        assert _no_repeats(I) and (I >= 0).all()
        with torch_only():
            D_ref, I_ref = index.search(queries, 10, nprobe=nprobe)
        assert _no_repeats(I_ref)
        assert_same_search(D, I, D_ref, I_ref)
        D_few, I_few = index.search(queries[:3], 10, nprobe=nprobe)  # a few queries, one path
        assert_same_search(D_few, I_few, D_ref[:3], I_ref[:3])


def test_results_are_an_exact_scan_of_the_probed_lists(pair, data, queries):
    index = pair[1]
    nprobe, k = 3, 10
    _, I = index.search(queries, k, nprobe=nprobe)
    c = index.quantizer.codebook.numpy()
    probed = ((queries[:, None] - c[None]) ** 2).sum(-1).argsort(1)[:, :nprobe]
    offsets, ids = index.offsets.numpy(), index.ids.numpy()
    for q, lists, got in zip(queries, probed, I, strict=True):
        held = np.unique(np.concatenate([ids[offsets[lst] : offsets[lst + 1]] for lst in lists]))
        want = held[((data[held] - q) ** 2).sum(-1).argsort(kind="stable")[:k]]
        assert set(got) == set(want)


@pytest.mark.parametrize("inner_product, prune", [(False, False), (False, True), (True, False)])
@pytest.mark.parametrize("k", [1, 10, 64])
def test_a_scan_given_row_ids_finds_the_best_k_distinct_ids(inner_product, prune, k):
    rng = np.random.default_rng(5)
    n, nlist, dim = 300, 8, DIM
    x = rng.standard_normal((n, dim)).astype(np.float32)
    x[:, :4] *= 4.0  # most of the variance in the heads (what the pruned scan tests first)
    first = rng.integers(0, nlist, n)
    second = (first + rng.integers(1, nlist, n)) % nlist  # another list, as a spill is
    lists = np.concatenate([first, second])
    order = np.argsort(lists, kind="stable")
    row_ids = np.concatenate([np.arange(n), np.arange(n)])[order]  # two copies of each vector
    vectors = np.ascontiguousarray(x[row_ids])
    offsets = np.searchsorted(lists[order], np.arange(nlist + 1)).astype(np.int64)
    q = rng.standard_normal((30, dim)).astype(np.float32)
    probes = np.stack([rng.choice(nlist, 3, replace=False) for _ in range(30)]).astype(np.int64)
    probes[0, 1:] = -1  # one list only: fewer ids than k for k = 64
    dist, rows = np.empty((30, k), np.float32), np.empty((30, k), np.int64)
    no_filter = np.zeros(0, np.uint8)
    lists = FlatLists(vectors, offsets, prune, row_ids, None)
    kernels.ivf_flat_scan(q, lists, probes, no_filter, inner_product, TopK(dist, rows))
    for i in range(30):
        held = [row_ids[offsets[lst] : offsets[lst + 1]] for lst in probes[i] if lst >= 0]
        held = np.unique(np.concatenate(held))
        score = -(x[held] @ q[i]) if inner_product else ((x[held] - q[i]) ** 2).sum(-1)
        best = np.argsort(score, kind="stable")[:k]
        found = rows[i][rows[i] >= 0]
        got = row_ids[found]
        assert len(set(got)) == len(got) == min(k, len(held))  # each id once, none missing
        np.testing.assert_allclose(dist[i, : len(got)], score[best], rtol=1e-5, atol=1e-5)
        assert (dist[i, len(got) :] == np.inf).all() and (rows[i, len(got) :] == -1).all()
        ties = np.isclose(score[best][-1], score, rtol=1e-6, atol=1e-6)  # the k-th's ties
        assert set(got) - set(held[best]) <= set(held[ties])


def test_soar_assignment():
    x = clustered_vectors(500, DIM, n_clusters=10, seed=3)
    c = torch.from_numpy(clustered_vectors(8, DIM, n_clusters=8, seed=4))
    xt = torch.from_numpy(x)
    d2 = torch.cdist(xt, c) ** 2
    primary = d2.argmin(1)
    second = soar_assign(xt, c, primary, 0.0)  # λ = 0: the second-nearest list
    np.testing.assert_array_equal(second, d2.argsort(1)[:, 1])
    spilled = soar_assign(xt, c, primary, 4.0)
    assert not (spilled == primary).any() and (spilled != second).any()
    r = xt - c[primary]  # by hand, for one vector
    loss = d2[0] + 4.0 * ((r[0] * (xt[0] - c)).sum(1) ** 2) / (r[0] @ r[0])
    loss[primary[0]] = float("inf")
    assert int(spilled[0]) == int(loss.argmin())


def test_the_kernel_gives_the_lists_of_the_torch_loss():
    # 4,096 lists: 256 rows a chunk, so 700 rows cross chunks; a centroid far from the data
    # and λ = 1.5 so that the parallel term decides some lists
    g = torch.Generator().manual_seed(5)
    x = torch.randn(700, DIM, generator=g) * 2 + 0.5
    c = torch.randn(4096, DIM, generator=g) * 2
    c[7] += 50.0
    primary = torch.cdist(x, c).argmin(1)
    expected = soar_assign(x, c, primary, 1.5)  # the whole batch, torch operations
    assert torch.equal(spill_lists(x, c, primary, 1.5), expected)  # BLAS + numba, by chunks
    with torch_only():
        assert torch.equal(spill_lists(x, c, primary, 1.5), expected)
    # both lists from one product: the nearest centroid as an unspilled add routes it
    first, second = nearest_and_spill(x, c, 1.5)
    assert torch.equal(first, nearest(x, c).indices) and torch.equal(first, primary)
    assert torch.equal(second, expected)
    nearest_other = torch.cdist(x, c).scatter(1, primary[:, None], float("inf")).argmin(1)
    assert (expected != nearest_other).any() and not (expected == primary).any()


def test_ids_removal_and_persistence(tmp_path, data, queries):
    index = vq.IVFSQ(DIM, 16, 8, spill=True, soar_lambda=0.5, coarse_niter=4)
    index.train(data)
    ids = np.arange(len(data)) * 7 + 1
    index.add_with_ids(data, ids)
    with pytest.raises(ValueError, match="already in the index"):
        index.add_with_ids(data[:2], ids[:2])
    assert index.remove_ids(ids[:100]) == 100 and index.ntotal == len(data) - 100
    assert not np.isin(index.ids.numpy(), ids[:100]).any()
    _, I = index.search(queries, 10, nprobe=4)
    assert not np.isin(I, ids[:100]).any() and _no_repeats(I)
    index.save(tmp_path / "s.vq")
    loaded = vq.load_index(tmp_path / "s.vq")
    assert loaded.spill and loaded.soar_lambda == 0.5 and loaded.ntotal == index.ntotal
    np.testing.assert_array_equal(loaded.search(queries, 10, nprobe=4)[1], I)
    built = vq.index_factory(DIM, "IVF16(soar=0.5),SQ8")
    assert built.config()["spill"] is True and built.soar_lambda == 0.5
    with pytest.raises(ValueError, match="no faiss counterpart"):
        index.to_faiss()
    with pytest.raises(ValueError, match="nlist >= 2"):
        vq.IVFFlat(DIM, 1, spill=True)


def test_refine_over_spilled_lists(data, queries):
    index = vq.index_factory(DIM, "IVF32(soar),PQ4x6,RFlat")
    index.train(data)
    index.add(data)
    D, I = index.search(queries, 10, nprobe=4, k_factor=4)
    assert _no_repeats(I) and index.ntotal == len(data)
    with torch_only():
        assert_same_search(D, I, *index.search(queries, 10, nprobe=4, k_factor=4))


def test_onnx_search_of_spilled_lists(exported, pair, queries):
    index = pair[1]
    runner = OnnxRunner(exported(index, batch_size=8, k=10, nprobe=3))
    with torch_only():
        D_ref, I_ref = index.search(queries[:24], 10, nprobe=3)
    D, I = runner(queries[:24])
    assert _no_repeats(I)
    assert_same_search(D, I, D_ref, I_ref)
