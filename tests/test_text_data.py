"""The real-embedding set's text: which sentences are kept, determinism, and the errors."""

from __future__ import annotations

import gzip

import numpy as np
import pytest

from vq.datasets.text import _prose, local_sentences


def test_prose_keeps_sentences_and_drops_code_and_fragments():
    text = (
        "Return the indices of the maximum values along an axis.\n"
        "See also the minimum.  >>> np.argmax(a, axis=0) gives the first one.\n\n"
        "Short one. This sentence has\nits words split across two lines of the docstring.\n\n"
        "lower case start is not kept as a sentence here. x = {1: 2} is code and not kept.\n"
        "A dict {key: value} is dropped too, as is https://example.org in a sentence."
    )
    assert list(_prose(text)) == [
        "Return the indices of the maximum values along an axis.",
        "This sentence has its words split across two lines of the docstring.",
    ]


def _write_sources(tmp_path):
    py = tmp_path / "mod.py"
    py.write_text(
        '"""The module docstring holds one sentence of plain prose text."""\n'
        "# A comment block also holds a sentence of plain prose,\n"
        "# continued on a second line of the comment.\n"
        "def f():\n"
        '    """Compute the answer to the question for every row given."""\n'
        "    return 42  # Not a sentence\n"
    )
    doc = tmp_path / "changelog.gz"
    doc.write_bytes(gzip.compress(b"Fixed a crash when the input file was empty.\n"))
    return [py, doc]


def test_local_sentences_reads_docstrings_comments_and_documents(tmp_path):
    files = _write_sources(tmp_path)
    got = local_sentences(4, files=files)
    assert sorted(got) == [
        "A comment block also holds a sentence of plain prose, continued on a second line of "
        "the comment.",
        "Compute the answer to the question for every row given.",
        "Fixed a crash when the input file was empty.",
        "The module docstring holds one sentence of plain prose text.",
    ]
    # the same files and seed give the same order; another seed another order of the same set
    assert local_sentences(4, files=files) == got
    orders = {tuple(local_sentences(4, files=files, seed=s)) for s in range(6)}
    assert len(orders) > 1 and all(sorted(o) == sorted(got) for o in orders)


def test_asking_for_more_sentences_than_exist_says_how_many_there_are(tmp_path):
    expected = "asked for 5 sentences but the installed text holds only 4"
    with pytest.raises(ValueError, match=expected):
        local_sentences(5, files=_write_sources(tmp_path))


def test_sentence_embeddings_are_unit_norm_and_cached(tmp_path, monkeypatch):
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("all_minilm_l6_v2")
    import vq.datasets.text as text

    files = _write_sources(tmp_path)
    monkeypatch.setattr(text, "_source_files", lambda: files)
    xb, xq = text.sentence_embeddings(3, 1, cache_dir=tmp_path / "cache")
    assert xb.shape == (3, 384) and xq.shape == (1, 384) and xb.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(np.vstack([xb, xq]), axis=1), 1.0, rtol=1e-5)
    monkeypatch.setattr(text, "embed_sentences", lambda *a, **k: pytest.fail("not cached"))
    xb2, xq2 = text.sentence_embeddings(3, 1, cache_dir=tmp_path / "cache")
    np.testing.assert_array_equal(xb2, xb)
    np.testing.assert_array_equal(xq2, xq)


def test_the_cache_key_ignores_where_and_when_the_sources_were_installed(tmp_path, monkeypatch):
    import os

    import vq.datasets.text as text

    keys = []
    for place in ("one", "two"):  # two environments holding the same files
        root = tmp_path / place / "site-packages"
        (root / "pkg").mkdir(parents=True)
        (root / "pkg" / "a.py").write_text('"""A docstring of some length here."""\n')
        (root / "b.txt").write_text("Some text of a document.\n")
        os.utime(root / "b.txt", (1, 1 if place == "one" else 10**9))
        monkeypatch.setattr(text, "_source_roots", lambda root=root: [root])
        keys.append(text._sources_key(sorted(root.rglob("*.*"))))
    assert keys[0] == keys[1]
    (root / "b.txt").write_text("Some longer text of a document.\n")  # a changed file: a new key
    assert text._sources_key(sorted(root.rglob("*.*"))) != keys[1]


def test_vq_s_own_install_is_not_a_text_source(tmp_path, monkeypatch):
    import vq.datasets.text as text

    root = tmp_path / "site-packages"
    for name in ("vq-0.1.0.dist-info/METADATA", "__editable___vq_0_1_0_finder.py",
                 "other-1.0.dist-info/METADATA", "other/mod.py"):  # fmt: skip
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("Text.\n")
    monkeypatch.setattr(text, "_source_roots", lambda: [root])
    names = {str(p.relative_to(root)) for p in text._source_files() if root in p.parents}
    assert names == {"other-1.0.dist-info/METADATA", "other/mod.py"}
