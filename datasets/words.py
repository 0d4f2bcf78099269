"""A short-text embedding set built offline: single English words and two-word phrases from the
same local prose as :mod:`vq.datasets.text`, embedded with the same all-MiniLM-L6-v2 model.

Sentence embeddings spread over the sphere; embeddings of one or two words crowd into fewer,
denser clusters (many near-synonyms, many inflections of one stem), which is where graph indexes
and quantizers are known to rank differently. This machine has no word list
(``/usr/share/dict/words``), so the vocabulary comes from the sentences
:func:`vq.datasets.text.local_sentences` reads: every distinct lower-case word of 2 to 24 letters
seen at least twice (once could be a typo), then the two-word phrases (consecutive words of one
sentence) seen at least twice, the most frequent first, until there are enough. The items are
shuffled with a seed; the first ``nq`` are the held-out queries (no query is in the database).
:func:`word_embeddings` caches the vectors (safetensors) beside the sentence set's, under a key made
of the source files' names and sizes, ``n``, ``nq`` and ``seed``.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from vq._checks import check_int
from vq.datasets import text

#: bumped when the vocabulary's rules change, so that old cache files are not reused
_WORDS_VERSION = 1
_WORD = re.compile(r"[A-Za-z]+")
_LENGTHS = (2, 24)  # letters per word
_MIN_COUNT = 2  # a word or phrase seen once may be a typo or a name


def _counts(files: list[Path], verbose: bool) -> tuple[Counter, Counter]:
    """(word counts, two-word phrase counts) over the distinct prose sentences of ``files``."""
    seen: dict[str, None] = {}
    for path in tqdm(files, desc="reading text", disable=not verbose):
        for chunk in text._file_text(path):
            seen.update(dict.fromkeys(text._prose(chunk)))
    words, pairs = Counter(), Counter()
    lo, hi = _LENGTHS
    for sentence in seen:
        tokens = [t.lower() for t in _WORD.findall(sentence)]
        ok = [lo <= len(t) <= hi for t in tokens]
        words.update(t for t, good in zip(tokens, ok, strict=True) if good)
        pairs.update(
            f"{a} {b}"
            for a, b, ga, gb in zip(tokens, tokens[1:], ok, ok[1:], strict=False)
            if ga and gb
        )
    return words, pairs


def local_words(
    n: int, *, seed: int = 0, files: list[Path] | None = None, verbose: bool = False
) -> list[str]:
    """``n`` distinct words and two-word phrases of the local prose (see the module docstring):
    all words seen at least twice, then the most frequent phrases seen at least twice (ties in
    alphabetical order).

    Args:
        n: how many; a ValueError says how many there are when fewer exist.
        seed: the shuffle of the chosen items (same files and seed: same list).
        files: the files to read (default: those of :func:`vq.datasets.text.local_sentences`).
        verbose: progress bar over the files.
    Returns:
        list of ``n`` str, lower case, shuffled.
    """
    n, seed = check_int(n, "n", 1), check_int(seed, "seed", 0)
    words, pairs = _counts(files or text._source_files(), verbose)
    vocabulary = sorted(w for w, c in words.items() if c >= _MIN_COUNT)
    frequent = [p for p, c in pairs.items() if c >= _MIN_COUNT]
    frequent.sort(key=lambda p: (-pairs[p], p))  # the most frequent first, ties alphabetical
    if len(vocabulary) + len(frequent) < n:
        raise ValueError(
            f"asked for {n} words and phrases but the installed text holds only "
            f"{len(vocabulary)} words and {len(frequent)} phrases seen twice; ask for fewer"
        )
    items = vocabulary + sorted(frequent[: max(0, n - len(vocabulary))])
    order = np.random.default_rng(seed).permutation(len(items))[:n]
    return [items[i] for i in order]


def word_embeddings(
    n: int = 300_000,
    nq: int = 1_000,
    *,
    seed: int = 0,
    cache_dir: str | os.PathLike | None = None,
    verbose: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """The short-text benchmark set: ``n`` database and ``nq`` held-out query vectors.

    The first call reads the installed text (as :func:`vq.datasets.text.sentence_embeddings`
    does) and embeds ``n + nq`` items of :func:`local_words` (a transformer forward over a few
    tokens each); the vectors and the items (one a line, a .txt beside the cache file) are
    cached in ``cache_dir`` (default :func:`vq.datasets.text.default_cache_dir`), and later
    calls read the cache.

    Returns:
        (database float32 [n, 384], queries float32 [nq, 384]), unit-norm rows.
    """
    return text.cached_embeddings("minilm-words", _WORDS_VERSION, local_words, n, nq, seed=seed,
                                  cache_dir=cache_dir, verbose=verbose)  # fmt: skip
