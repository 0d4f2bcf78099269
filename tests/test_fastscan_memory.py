"""Fast-scan indexes hold their codes once, as faiss's blocks: bytes per vector within faiss's
serialized size + 8 (ids), and the same codes, results, updates, files and mapped loads as a
plain 4-bit index holding one byte per code (the oracle: same codebooks, same lists)."""

import copy
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import vq
from vq.index import IVFPQ, PQIndex, Refine
from vq.index.core import fileformat
from vq.index.core.fileformat import write_index_file
from vq.kernels.fastscan import fastscan_scans as fastscan

faiss = pytest.importorskip("faiss")

DIM, N, K = 64, 4000, 10


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(7)
    centers = rng.standard_normal((40, DIM)).astype(np.float32) * 3
    x = centers[rng.integers(0, 40, N)] + rng.standard_normal((N, DIM)).astype(np.float32)
    q = centers[rng.integers(0, 40, 40)] + rng.standard_normal((40, DIM)).astype(np.float32)
    return np.ascontiguousarray(x), np.ascontiguousarray(q)


def _pair(nlist: int, M: int, x: np.ndarray, spill: bool = False):
    """A fast-scan index and a plain 4-bit index (one byte per code) with the same trained
    parameters: their codes are equal row for row after the same calls."""
    if nlist:
        options = {"by_residual": False, "nprobe": 4, "niter": 4, "spill": spill}
        fs = IVFPQ(DIM, nlist, M, 4, fast_scan=True, **options)
        fs.train(x)
        plain = IVFPQ(DIM, nlist, M, 4, **options)
        plain.quantizer = copy.deepcopy(fs.quantizer)
    else:
        fs = PQIndex(DIM, M, 4, fast_scan=True, niter=4)
        fs.train(x)
        plain = PQIndex(DIM, M, 4, niter=4)
    plain.pq = copy.deepcopy(fs.pq)
    return fs, plain


def _by_list(index):
    """(codes, ids) with each IVF list's rows in id order (a removal orders them differently
    in the two layouts: the plain one swaps each removed row with its list's last)."""
    codes, ids = index.codes, index.stored_ids()
    if isinstance(index, IVFPQ):
        lists = np.repeat(np.arange(index.nlist), index.list_sizes().numpy())
        order = torch.from_numpy(np.lexsort((ids.numpy(), lists)))
        codes, ids = codes[order], ids[order]
    return codes, ids


def _same_codes(fs, plain):
    assert not fs.row_buffers and "codes" not in fs._buffers  # (held as blocks alone)
    for a, b in zip(_by_list(fs), _by_list(plain), strict=True):
        assert torch.equal(a, b)
    if isinstance(fs, IVFPQ):
        assert torch.equal(fs.offsets, plain.offsets)
    fs.check_consistent()


def _same_results(a, b, q, **options):
    for x, y in zip(a.search(q, K, **options), b.search(q, K, **options), strict=True):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("nlist", [0, 16, 64])
@pytest.mark.parametrize("M", [16, 32])
@pytest.mark.parametrize("with_ids", [False, True])
def test_bytes_per_vector_are_at_most_faiss_serialized_bytes_plus_8(data, nlist, M, with_ids):
    x, q = data
    fs, _ = _pair(nlist, M, x)
    if with_ids:
        fs.add_with_ids(x, np.arange(N) * 3 + 1)
    else:
        fs.add(x)
    fs.search(q, K)  # (what the scans derive is counted too)
    theirs = faiss.serialize_index(fs.to_faiss()).nbytes / N
    mine = fs.nbytes() / N
    assert mine <= theirs + 8, (mine, theirs)
    codes = fastscan.BLOCK * M // 2 * -(-N // fastscan.BLOCK) / N  # M / 2 bytes, whole blocks
    assert mine >= (codes if not nlist else M / 2)


@pytest.mark.parametrize("nlist", [0, 16])
def test_searches_equal_faiss_fast_scan_with_the_same_codebooks_and_codes(data, nlist):
    x, q = data
    fs, _ = _pair(nlist, 16, x)
    fs.add(x)
    fs.remove_ids(np.arange(0, N, 7))
    ref = fs.to_faiss()
    if nlist:
        faiss.extract_index_ivf(ref).nprobe = 4
    D, I = fs.search(q, K)
    Df, If = ref.search(q, K)
    np.testing.assert_allclose(D, Df, rtol=1e-5, atol=1e-4)  # same quantized distances
    assert np.mean([len(set(a) & set(b)) for a, b in zip(I, If, strict=True)]) >= 9.5
    back = vq.index.from_faiss(ref)
    assert torch.equal(back.codes, fs.codes) and torch.equal(back.packed_codes, fs.packed_codes)


@pytest.mark.parametrize("nlist,spill", [(0, False), (16, False), (16, True)])
def test_adds_removals_and_merges_store_the_codes_a_plain_index_stores(data, nlist, spill):
    x, q = data
    fs, plain = _pair(nlist, 16, x, spill)
    for index in (fs, plain):
        index.add(x[:1000])
        index.add_with_ids(x[1000:2500], np.arange(1000, 2500) * 5)
    _same_codes(fs, plain)
    for gone in (np.arange(0, 900, 4), np.array([5 * 1700, 3, 7]), np.arange(100, 140)):
        assert fs.remove_ids(gone) == plain.remove_ids(gone)
        _same_codes(fs, plain)
    other_fs, other_plain = copy.deepcopy(fs), copy.deepcopy(plain)
    for index in (other_fs, other_plain):
        index.reset()
        index.add_with_ids(x[2500:], np.arange(2500, N) + 10**6)
    fs.merge_from(other_fs)
    plain.merge_from(other_plain)
    _same_codes(fs, plain)
    fresh, starts = fastscan.pack_lists(
        fs.codes.numpy(), fs.offsets.numpy() if nlist else np.array([0, fs.ntotal])
    )
    np.testing.assert_array_equal(fs.packed_codes.numpy().reshape(-1, 32), fresh)  # padding 0
    ids = fs.stored_ids()[::97].numpy()
    np.testing.assert_array_equal(fs.reconstruct(ids), plain.reconstruct(ids))


def test_a_failed_add_leaves_the_blocks_as_they_were(data, monkeypatch):
    x, q = data
    for fs in (_pair(16, 16, x)[0], _pair(0, 16, x)[0]):
        fs.add(x[:1001])
        before, ids = fs.packed_codes.clone(), fs.stored_ids().clone()
        results = fs.search(q, K)
        calls, real = [], fs.pq.encode_rows

        def failing(t, real=real, calls=calls):
            calls.append(1)
            if len(calls) == 2:
                raise RuntimeError("encode failed")
            return real(t)

        monkeypatch.setattr(fs.pq, "encode_rows", failing)
        monkeypatch.setattr(fs, "add_batch_size", 256)
        with pytest.raises(RuntimeError, match="encode failed"):
            fs.add(x[1001:2000])
        assert torch.equal(fs.packed_codes, before) and torch.equal(fs.stored_ids(), ids)
        fs.check_consistent()
        _same_results(fs, fs, q)
        np.testing.assert_array_equal(fs.search(q, K)[1], results[1])


@pytest.mark.parametrize("nlist", [0, 16])
def test_the_torch_search_over_the_blocks_equals_the_plain_index_s(data, nlist):
    x, q = data
    fs, plain = _pair(nlist, 16, x)
    for index in (fs, plain):
        index.add(x)
    options = {"nprobe": 4} if nlist else {}
    for copy_ in (True, False):
        a = fs.searcher(K, copy=copy_, **options)
        b = plain.searcher(K, copy=copy_, **options)
        for u, v in zip(a(torch.from_numpy(q)), b(torch.from_numpy(q)), strict=True):
            assert torch.equal(u, v)


@pytest.mark.parametrize("nlist", [0, 16])
def test_save_load_and_mapped_load_give_the_same_blocks_and_results(data, nlist, tmp_path):
    x, q = data
    fs, _ = _pair(nlist, 32, x)
    fs.add(x)
    fs.remove_ids(np.arange(0, N, 11))
    path = tmp_path / "fs.vqi"
    fs.save(path)
    with fileformat.IndexFile(path) as f:
        assert f.meta["format_version"] == 3  # (blocks: files of vq reading 1-2 hold codes)
    for mmap in (False, True):
        loaded = vq.load_index(path, mmap=mmap)
        assert torch.equal(loaded.packed_codes, fs.packed_codes)
        _same_results(loaded, fs, q)
        loaded.add_with_ids(x[:50], np.arange(50) + 10**6)  # (a mapped buffer: copied first)
        fs2 = copy.deepcopy(fs)
        fs2.add_with_ids(x[:50], np.arange(50) + 10**6)
        _same_results(loaded, fs2, q)


def _plain_tensors(index) -> dict[str, torch.Tensor]:
    """The index's tensors as the format-2 files of vq before blocks held them: the codes one
    per byte, [n, M], in list order (no ``packed_codes``, no ``code_rows``)."""
    out = {}
    for prefix, m in index.named_modules():
        if getattr(m, "fast_scan", False):
            out[f"{prefix}.codes" if prefix else "codes"] = m.codes.contiguous()
    for name, t in index.state_dict().items():
        if name.rsplit(".", 1)[-1] not in ("packed_codes", "code_rows"):
            out[name] = t.detach().cpu().contiguous()
    return out


@pytest.mark.parametrize("desc", ["PQ16x4fs", "IVF16,PQ16x4fs", "IVF16,PQ16x4fs,RFlat"])
def test_a_file_of_the_old_layout_loads_packed(data, desc, tmp_path):
    x, q = data
    index = vq.index_factory(DIM, desc)
    index.train(x)
    index.add(x)
    path = tmp_path / "old.vqi"
    write_index_file(path, _plain_tensors(index), {"class": type(index).__name__, **index.config()})
    with fileformat.IndexFile(path) as f:
        assert f.meta["format_version"] == 2
    inner = index.index if isinstance(index, Refine) else index
    for mmap in (False, True):
        loaded = vq.load_index(path, mmap=mmap)
        core = loaded.index if isinstance(loaded, Refine) else loaded
        assert "codes" not in core._buffers
        assert torch.equal(core.packed_codes, inner.packed_codes)
        _same_results(loaded, index, q)


def test_an_old_file_with_codes_out_of_range_is_refused(data, tmp_path):
    x, _ = data
    index = vq.index_factory(DIM, "IVF16,PQ16x4fs")
    index.train(x)
    index.add(x[:500])
    tensors = _plain_tensors(index)
    tensors["codes"] = tensors["codes"].clone()
    tensors["codes"][3, 2] = 16
    path = tmp_path / "bad.vqi"
    write_index_file(path, tensors, {"class": "IVFPQ", **index.config()})
    with pytest.raises(ValueError, match=r"outside|\[0, 16\)"):
        vq.load_index(path)


def _mapped_kib(path) -> int:
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split(maxsplit=1)[0]
        if "-" in head and not head.endswith(":"):
            inside = line.endswith(str(path))
        elif inside and head == "Rss:":
            total += int(line.split()[1])
    return total


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")
def test_a_mapped_fast_scan_search_reads_its_lists_blocks_without_mapping_them(data, tmp_path):
    x, q = data
    big = np.concatenate([x + 0.01 * j for j in range(40)])  # 160k vectors: 2.5 MiB of blocks
    index = IVFPQ(DIM, 64, 32, 4, fast_scan=True, nprobe=4, niter=4)
    index.train(x)
    index.add(big)
    path = tmp_path / "big.vqi"
    index.save(path)
    path.read_bytes()  # every page in the page cache
    mapped = vq.load_index(path, mmap=True)
    assert mapped.rows_mapped()
    for nq in (1, 40):  # the lean path and the general one
        for a, b in zip(mapped.search(q[:nq], K), index.search(q[:nq], K), strict=True):
            np.testing.assert_array_equal(a, b)
    assert _mapped_kib(path) == 0
