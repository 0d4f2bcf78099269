"""Searching memory-mapped IVF indexes (``load_index(path, mmap=True)``): the probed lists are
read with ``pread`` (vq.index.core.mapped), so a search maps none of the file's pages, even from a
warm page cache, and returns what the in-memory load returns."""

import mmap
import os
import sys
from pathlib import Path

import numpy as np
import pytest

import vq
from vq.index import IVFPQ, IVFSQ, IVFFlat
from vq.index.core import fileformat
from vq.index.core.mapped import file_range
from vq.index.ivf import ivf_lists as ivf_module

DIM, N, K = 32, 10_000, 10


@pytest.fixture(autouse=True)
def map_small_tensors(monkeypatch):
    """Tensors from 64 KiB on mapped (the row buffers here; not only those from SMALL_BYTES)."""
    monkeypatch.setattr(fileformat, "SMALL_BYTES", 64 << 10)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((N, DIM)).astype(np.float32)
    return x, rng.standard_normal((40, DIM)).astype(np.float32)


KINDS = {
    "ivfflat": lambda: IVFFlat(DIM, nlist=32, nprobe=6),
    "ivfpq": lambda: IVFPQ(DIM, nlist=32, M=8, nprobe=6, niter=4),
    # (M=16: blocks of 8 bytes a vector, mapped from 64 KiB)
    "ivfpq-fs": lambda: IVFPQ(DIM, nlist=32, M=16, nbits=4, fast_scan=True, nprobe=6, niter=4),
    "ivfsq": lambda: IVFSQ(DIM, 32, 8, nprobe=6),
    "ivfpq-spilled": lambda: IVFPQ(DIM, nlist=32, M=8, nprobe=6, niter=4, spill=True),
    "ivfpq-hnsw-coarse": lambda: vq.index_factory(DIM, "IVF32_HNSW8,PQ8"),
}


def _saved(name, x, path):
    index = KINDS[name]()
    index.train(x)
    index.add_with_ids(x, np.arange(N) * 3 + 5)
    index.save(path)
    return path


def _mapped_kib(path) -> int:
    """KiB of ``path``'s mappings resident in this process (/proc/self/smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split(maxsplit=1)[0]
        if "-" in head and not head.endswith(":"):  # a mapping's first line
            inside = line.endswith(str(path))
        elif inside and head == "Rss:":
            total += int(line.split()[1])
    return total


@pytest.mark.parametrize("name", sorted(KINDS))
def test_a_mapped_ivf_index_searches_as_the_in_memory_load_in_one_block_or_many(
    name, data, tmp_path, monkeypatch
):
    x, q = data
    path = _saved(name, x, tmp_path / "index.vq")
    loaded, mapped = vq.load_index(path), vq.load_index(path, mmap=True)
    rows = mapped.row_buffers[0] if mapped.row_buffers else "packed_codes"  # (fast-scan: blocks)
    assert file_range(getattr(mapped, rows)) is not None
    allowed = np.arange(5, 3 * N + 5, 9)  # every third vector
    for block in (ivf_module.FILE_SCAN_BYTES, 1):  # 1 byte: a block per query
        monkeypatch.setattr(ivf_module, "FILE_SCAN_BYTES", block)
        for nq, options in ((1, {}), (3, {"nprobe": 32}), (40, {}), (40, {"allowed": allowed})):
            for a, b in zip(loaded.search(q[:nq], K, **options),
                            mapped.search(q[:nq], K, **options), strict=True):  # fmt: skip
                np.testing.assert_array_equal(a, b)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")
def test_a_mapped_search_from_a_warm_page_cache_maps_none_of_the_files_pages(data, tmp_path):
    x, q = data
    big = np.concatenate([x + 0.01 * j for j in range(6)])  # 60k vectors
    index = IVFPQ(DIM, nlist=64, M=8, nprobe=4, niter=4)
    index.train(x)
    index.add(big)
    path = tmp_path / "big.vq"
    index.save(path)
    path.read_bytes()  # every page in the page cache (mapped, a fault maps its whole folio)
    mapped = vq.load_index(path, mmap=True)
    d, i = mapped.search(q, K)
    assert _mapped_kib(path) == 0
    for a, b in zip((d, i), index.search(q, K), strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_mapped_index_written_to_searches_its_own_copy_and_the_file_is_not_read(data, tmp_path):
    x, q = data
    path = _saved("ivfpq", x, tmp_path / "index.vq")
    mapped, loaded = vq.load_index(path, mmap=True), vq.load_index(path)
    for index in (mapped, loaded):
        index.remove_ids(np.arange(5, 300, 3))
    assert file_range(mapped.codes) is None and file_range(mapped.ids) is None
    path.write_bytes(b"")  # (the copy no longer needs the file)
    for a, b in zip(mapped.search(q, K), loaded.search(q, K), strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_mapped_index_whose_file_is_truncated_in_place_raises_a_clear_error(data, tmp_path):
    x, q = data
    path = _saved("ivfpq", x, tmp_path / "index.vq")
    mapped = vq.load_index(path, mmap=True)
    with open(path, "r+b") as f:  # (never do this to a file in use: index.save renames)
        f.truncate(1024)
    with pytest.raises(OSError, match="shorter than when it was mapped"):
        mapped.search(q, K, nprobe=32)


def _drop_cached(path) -> bool:
    """Drop ``path``'s pages from the page cache; False where they stay (tmpfs)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        with mmap.mmap(fd, 0, prot=mmap.PROT_READ) as probe:
            probe.madvise(mmap.MADV_RANDOM)
            probe[len(probe) // 2]
            return _mapped_kib(path) <= 16
    finally:
        os.close(fd)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")
def test_a_mapped_index_from_a_cold_cache_loads_and_searches_mapping_almost_nothing(data, tmp_path):
    x, q = data
    big = np.concatenate([x + 0.01 * j for j in range(6)])  # 60k vectors, a 1 MB file
    index = IVFPQ(x.shape[1], nlist=64, M=8, nprobe=1, niter=4)  # the kernels of the others
    index.train(x)
    index.add(big)
    path = tmp_path / "big.vq"
    index.save(path)
    if not _drop_cached(path):
        pytest.skip("this file system keeps the file's pages in memory (tmpfs)")
    mapped = vq.load_index(path, mmap=True)
    after_load = _mapped_kib(path)
    d, i = mapped.search(q[:1], K)  # one list of ~940 rows, read with pread: nothing mapped
    assert after_load < path.stat().st_size / 1024 / 16 and _mapped_kib(path) <= after_load
    for a, b in zip((d, i), index.search(q[:1], K), strict=True):
        np.testing.assert_array_equal(a, b)
    assert mapped._tables.filled.sum() == 1  # one row of the precomputed table
