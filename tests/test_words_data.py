"""The short-text set's vocabulary (vq.datasets.words): which words and phrases are kept, in what
order, the error, and the cache."""

from __future__ import annotations

import numpy as np
import pytest

import vq.datasets.text as text
import vq.datasets.words as words


def _write_sources(tmp_path):
    doc = tmp_path / "notes.txt"
    doc.write_text(
        "The index holds the vectors of the database in memory.\n\n"
        "The index answers queries from the database in batches.\n\n"
        "Each query finds the nearest vectors of the database.\n\n"
        "A x is one letter and is not kept as a word here.\n"
    )
    return [doc]


def test_words_seen_twice_come_first_then_the_most_frequent_phrases(tmp_path):
    files = _write_sources(tmp_path)
    # seen at least twice (2 to 24 letters, lower case): "a" and "x" are too short, "and" once
    twice = ["database", "in", "index", "is", "of", "the", "vectors"]
    assert sorted(words.local_words(len(twice), files=files)) == twice
    # one more item: the most frequent two-word phrase ("the database", three times)
    assert set(words.local_words(len(twice) + 1, files=files)) == {*twice, "the database"}
    # then those seen twice, ties in alphabetical order ("database in", "of the", "the index")
    got = words.local_words(len(twice) + 3, files=files)
    assert sorted(set(got) - set(twice)) == ["database in", "of the", "the database"]


def test_the_shuffle_follows_the_seed(tmp_path):
    files = _write_sources(tmp_path)
    one = words.local_words(7, files=files, seed=1)
    assert words.local_words(7, files=files, seed=1) == one
    assert len({tuple(words.local_words(7, files=files, seed=s)) for s in range(6)}) > 1


def test_asking_for_more_items_than_exist_says_how_many_there_are(tmp_path):
    with pytest.raises(ValueError, match="holds only 7 words and 5 phrases seen twice"):
        words.local_words(100, files=_write_sources(tmp_path))


def test_word_embeddings_hold_out_the_queries_and_are_cached(tmp_path, monkeypatch):
    files = _write_sources(tmp_path)
    monkeypatch.setattr(text, "_source_files", lambda: files)
    embedded = []

    def embed(items, **_):  # one distinct unit vector per item, in the items' order
        embedded.append(list(items))
        v = np.eye(len(items), 4, dtype=np.float32) + np.arange(len(items))[:, None]
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    monkeypatch.setattr(text, "embed_sentences", embed)
    xb, xq = words.word_embeddings(6, 2, cache_dir=tmp_path / "cache")
    assert xb.shape == (6, 4) and xq.shape == (2, 4)
    vectors = embed(embedded[0])
    np.testing.assert_array_equal(xq, vectors[:2])  # the first nq items are the queries
    np.testing.assert_array_equal(xb, vectors[2:])
    monkeypatch.setattr(text, "embed_sentences", lambda *a, **k: pytest.fail("not cached"))
    xb2, _ = words.word_embeddings(6, 2, cache_dir=tmp_path / "cache")
    np.testing.assert_array_equal(xb2, xb)
    stored = next((tmp_path / "cache").glob("*.txt")).read_text().splitlines()
    assert stored == embedded[0]
