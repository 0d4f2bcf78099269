"""IVFPQ's precomputed table filled a list at a time: a search fills the rows of the lists it
probes (and no others), with the values of a whole table, so results are those of an index
whose table was filled whole — on the general path, the lean path, under threads."""

import copy
import pickle
import threading

import numpy as np
import pytest
import torch

from vq.index import IVFPQ
from vq.index.ivf.ivfpq_tables import ListTables, empty_table

K = 5


@pytest.fixture(scope="module")
def index(blobs):
    x = np.ascontiguousarray(blobs[:3000])
    out = IVFPQ(x.shape[1], nlist=64, M=8, nprobe=3, niter=4)  # (the kernels of other tests)
    out.train(x)
    out.add(x)
    return out


@pytest.fixture(scope="module")
def queries(blobs):
    return np.ascontiguousarray(blobs[-40:])


def _probed(index, q, nprobe):
    return np.unique(index.nearest_lists(torch.from_numpy(q), nprobe)[1].numpy())


def test_a_search_fills_the_rows_of_the_lists_it_probes_with_the_whole_tables_values(
    index, queries
):
    lazy, whole = copy.deepcopy(index), copy.deepcopy(index)
    full = whole.precompute_table().clone()
    q = queries[:20]  # more than the lean path takes: the general path
    d, i = lazy.search(q, K, nprobe=2)
    filled = lazy._tables.filled
    np.testing.assert_array_equal(np.flatnonzero(filled), _probed(lazy, q, 2))
    assert 0 < filled.sum() < lazy.nlist and lazy._tables.missing == lazy.nlist - filled.sum()
    assert torch.equal(lazy.precomputed_table[filled], full[filled])  # bit for bit
    d0, i0 = whole.search(q, K, nprobe=2)
    np.testing.assert_array_equal(i, i0)
    np.testing.assert_array_equal(d, d0)


def test_the_lean_path_fills_the_lists_its_kernel_may_probe_and_answers_as_a_whole_table(
    index, queries
):
    lazy, whole = copy.deepcopy(index), copy.deepcopy(index)
    whole.precompute_table()
    for s in range(0, 12, 3):
        q = queries[s : s + 3]  # a few queries: the lean path
        d, i = lazy.search(q, K)
        d0, i0 = whole.search(q, K)
        np.testing.assert_array_equal(i, i0)
        np.testing.assert_array_equal(d, d0)
        assert lazy._tables.filled[_probed(lazy, q, lazy.nprobe)].all()
    assert lazy._tables.missing > 0  # not the whole table


def test_rows_filled_on_the_thread_pool_count_as_filled_and_are_not_computed_again(index):
    whole = copy.deepcopy(index)
    table = whole.precompute_table()  # 64 lists at once: PARALLEL_LISTS, on the thread pool
    assert whole._tables.missing == 0 and whole._tables.filled.all()
    with torch.no_grad():
        table[5] = -1.0  # (a marker: a row computed again would overwrite it)
    whole.precompute_table()
    whole.search(np.zeros((20, index.dim), np.float32), K, nprobe=index.nlist)  # every list
    assert (whole.precomputed_table[5] == -1.0).all()


def test_concurrent_searches_fill_the_table_once_and_agree_with_a_whole_table(index, queries):
    lazy, whole = copy.deepcopy(index), copy.deepcopy(index)
    whole.precompute_table()
    expected = [whole.search(queries[j : j + 1], K, nprobe=4) for j in range(len(queries))]
    found = [None] * len(queries)

    def run(start):
        for j in range(start, len(queries), 4):
            found[j] = lazy.search(queries[j : j + 1], K, nprobe=4)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for (d, i), (d0, i0) in zip(found, expected, strict=True):
        np.testing.assert_array_equal(i, i0)
        np.testing.assert_array_equal(d, d0)
    assert lazy._tables.missing == lazy.nlist - lazy._tables.filled.sum()


def test_new_codebooks_start_a_new_table_and_copies_start_empty(index, queries):
    lazy = copy.deepcopy(index)
    lazy.search(queries[:20], K)
    table = lazy.precomputed_table
    assert pickle.loads(pickle.dumps(lazy._tables)).missing == 0  # (an empty ListTables)
    twin = copy.deepcopy(lazy)
    assert twin._tables.key is None
    with torch.no_grad():
        lazy.pq.codebooks.mul_(1.5)
    d, i = lazy.search(queries[:20], K)
    assert lazy.precomputed_table is not table  # rebuilt for the new codebooks
    fresh = copy.deepcopy(lazy)
    fresh.precompute_table()
    d0, i0 = fresh.search(queries[:20], K)
    np.testing.assert_array_equal(i, i0)
    np.testing.assert_array_equal(d, d0)


def test_a_large_table_is_an_anonymous_mapping_until_written():
    table = empty_table(64, 16, 256, torch.device("cpu"))  # 1 MiB
    assert table.shape == (64, 16, 256) and table.dtype == torch.float32
    assert not table.any()  # fresh anonymous pages read as zeros
    state = ListTables()
    state.reset(("key",), 64)
    assert state.missing == 64 and not state.filled.any()
