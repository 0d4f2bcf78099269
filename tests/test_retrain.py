"""``train`` on an index that holds vectors is refused (it kept codes and lists made with the
old parameters: self-hit@1 fell to 0.0-0.09), and ``reset()`` empties an index, keeping what
it learned, so that it can be filled or trained again."""

import copy

import numpy as np
import pytest
from index_kinds import KINDS, VARIANTS

import vq

#: the kinds with nothing to learn: train() is a no-op, whatever they hold (as faiss's)
NOTHING_TO_LEARN = {"Flat", "HNSW16", "HNSW16,RFlat"}


@pytest.fixture(scope="module")
def data(blobs):
    return np.ascontiguousarray(blobs[:2000])


@pytest.mark.parametrize("desc", [*KINDS.values(), *VARIANTS])
def test_train_on_a_filled_index_is_refused_and_reset_lets_it_train_again(desc, data, tmp_path):
    x = data
    index = vq.index_factory(x.shape[1], desc)
    index.train(x)
    index.add_with_ids(x[:500], np.arange(500) + 100)
    found = index.search(x[:20], 5)
    other = np.ascontiguousarray(x[::-1] * 2)
    nothing = not index.learns()  # (a kind of the registry says so itself)
    assert nothing or desc not in NOTHING_TO_LEARN
    if nothing:
        index.train(other)  # nothing changes
    else:
        name = type(index).__name__
        with pytest.raises(RuntimeError, match=rf"{name}.train: the index holds 500 vectors .*"
                           r"Call reset\(\) to empty it first"):  # fmt: skip
            index.train(other)
    for got, expected in zip(index.search(x[:20], 5), found, strict=True):
        np.testing.assert_array_equal(got, expected)

    before = copy.deepcopy(index)
    index.reset()
    assert index.ntotal == 0 and index.is_trained
    index.check_consistent()
    d, i = index.search(x[:3], 4)
    assert (i == -1).all() and np.isinf(d).all()
    index.merge_from(before)  # trained alike: reset kept what training learned
    for got, expected in zip(index.search(x[:20], 5), found, strict=True):
        np.testing.assert_array_equal(got, expected)
    index.reset()
    index.add(x[:500])  # ids from 0 again
    np.testing.assert_array_equal(np.unique(index.stored_ids().numpy()), np.arange(500))
    np.testing.assert_array_equal(index.search(x[:20], 5)[1], found[1] - 100)
    index.save(tmp_path / "index.vq")
    np.testing.assert_array_equal(vq.load_index(tmp_path / "index.vq").search(x[:20], 5)[1],
                                  found[1] - 100)  # fmt: skip

    index.reset()
    index.train(other)  # an empty index trains again
    index.add(other[:500])
    assert (index.search(other[:20], 1)[1][:, 0] == np.arange(20)).mean() >= 0.9


def test_reset_forgets_the_removal_map_and_the_packed_codes(data):
    x = data
    index = vq.index_factory(x.shape[1], "IVF16,PQ8x4fs")
    index.train(x)
    index.add(x[:500])
    assert index.remove_ids(np.arange(10)) == 10  # builds the id → list map
    index.search(x[:3], 4)  # packs the codes
    index.reset()
    index.add(x[500:600])
    assert index.remove_ids(np.arange(5)) == 5
    expected = copy.deepcopy(index)
    np.testing.assert_array_equal(index.search(x[500:520], 3)[1], expected.search(x[500:520], 3)[1])
    assert (index.search(x[505:525], 1)[1][:, 0] == np.arange(5, 25)).mean() >= 0.9
