"""Index persistence (vq.index.io): round trips, a fresh process, hostile and broken files,
atomic saves, file size."""

import copy
import json
import os
import pickle
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import safetensors.torch
import torch
from index_kinds import KINDS
from safetensors import safe_open

import vq
from vq.index.core.fileformat import tensors_checksum
from vq.index.ivf.ivf_index import IVFIndex
from vq.quantizers import OPQ, ProductQuantizer

#: every registered kind (tests/index_kinds.py), and configurations that store rows differently
FACTORY_STRINGS = list(
    dict.fromkeys(
        [*KINDS.values(), "PQ8x6", "OPQ8,IVF16,PQ8", "OPQ8_16,IVF16,PQ8,RFlat", "PQ8,Refine(Flat)"]
    )
)


# -- helpers ------------------------------------------------------------------------------
def build(desc: str, metric: str, blobs: np.ndarray) -> vq.index.Index:
    """A trained index; training iterations are cut down (they are part of the saved config,
    so the round trip covers them) to keep the file fast."""
    index = vq.index_factory(32, desc, metric=metric)
    for m in index.modules():
        if isinstance(m, OPQ):
            m.niter, m.niter_pq, m.niter_pq_0 = 2, 2, 2
        elif isinstance(m, ProductQuantizer):
            m.niter = 4
        elif isinstance(m, IVFIndex):
            m.coarse_niter = 4
    return index.train(blobs[:2000])


def assert_same_index(a, b, queries) -> None:
    """``b`` (loaded) is ``a``: same class, settings, stored data and search results."""
    assert type(b) is type(a)
    assert (b.ntotal, b.metric, b.dim, b.k) == (a.ntotal, a.metric, a.dim, a.k)
    assert b.config() == a.config()
    for attr in ("nprobe", "k_factor"):
        assert getattr(b, attr, None) == getattr(a, attr, None)
    assert b.is_trained == a.is_trained
    sa, sb = a.state_dict(), b.state_dict()
    assert sorted(sb) == sorted(sa)
    for name in sa:
        assert sb[name].dtype == sa[name].dtype, name
        assert torch.equal(sb[name], sa[name]), name
    np.testing.assert_array_equal(b.stored_ids().numpy(), a.stored_ids().numpy())
    if a.is_trained:
        D, I = a.search(queries, 10)
        Db, Ib = b.search(queries, 10)
        np.testing.assert_array_equal(Ib, I)
        np.testing.assert_array_equal(Db, D)


def reload(index, path: Path):
    index.save(path)
    return vq.load_index(path)


def split_file(raw: bytes) -> tuple[dict, bytes]:
    """(header JSON, tensor bytes) of a safetensors file."""
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def join_file(header, data: bytes) -> bytes:
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def forge(src: Path, dst: Path, edit_tensors=None, edit_meta=None, fix_checksum=True) -> Path:
    """Rewrite ``src`` as ``dst`` with edited tensors/metadata (the checksum recomputed, as
    anyone can: it detects corruption, not tampering)."""
    tensors = {k: v.clone() for k, v in safetensors.torch.load_file(str(src)).items()}
    with safe_open(str(src), "pt") as f:
        meta = dict(f.metadata())
    if edit_tensors is not None:
        tensors = edit_tensors(tensors) or tensors
    if fix_checksum:
        meta["checksum"] = tensors_checksum(tensors)
    if edit_meta is not None:
        edit_meta(meta)
    safetensors.torch.save_file(tensors, str(dst), metadata=meta)
    return dst


class Touch:
    """Unpickling this creates ``path``: a stand-in for a malicious payload."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return Path.touch, (self.path,)


# -- fixtures -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def queries(blobs):
    return (blobs[9000:9040] + 0.01).astype(np.float32)


@pytest.fixture(scope="module")
def ivfpq(blobs):
    """Trained IVF16,PQ8 (l2) holding 2000 vectors with non-sequential ids, nprobe 4."""
    index = build("IVF16,PQ8", "l2", blobs)
    index.add_with_ids(blobs[:2000], np.arange(2000) * 3 + 7)
    index.nprobe = 4
    return index


@pytest.fixture(scope="module")
def saved(ivfpq, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("saved") / "ivfpq.vqi"
    ivfpq.save(path)
    return path


# -- 1. round trips -----------------------------------------------------------------------
@pytest.mark.parametrize("metric", ["l2", "ip"])
@pytest.mark.parametrize("desc", FACTORY_STRINGS)
def test_round_trip(tmp_path, blobs, queries, desc, metric):
    index = build(desc, metric, blobs)
    if hasattr(index, "nprobe"):
        index.nprobe = 5  # not the default (1): must be saved
    if hasattr(index, "k_factor"):
        index.k_factor = 3  # not the default (1)
    path = tmp_path / "index.vqi"

    index.add(blobs[:600])  # sequential ids
    assert_same_index(index, reload(index, path), queries)

    custom = 10**12 + np.random.default_rng(0).permutation(900) * 7
    index.add_with_ids(blobs[600:1500], custom)
    removed = np.concatenate([np.arange(0, 600, 3), custom[::4]])
    try:
        assert index.remove_ids(removed) == len(removed)
    except ValueError as err:  # a kind that cannot remove (the graphs: faiss's HNSW neither)
        assert "cannot remove" in str(err)
        removed = removed[:0]
    loaded = reload(index, path)
    assert loaded.ntotal == 1500 - len(removed)
    assert loaded.metric == metric
    assert getattr(loaded, "nprobe", 5) == 5 and getattr(loaded, "k_factor", 3) == 3
    assert_same_index(index, loaded, queries)
    _, I = loaded.search(queries, 10)
    assert np.isin(I, custom).any()  # the caller's ids came back, ...
    assert not np.isin(I, removed).any()  # ... the removed ones did not

    # the loaded index keeps working like the original
    more_ids = np.arange(5000, 5200) * 11
    index.add_with_ids(blobs[1500:1700], more_ids)
    loaded.add_with_ids(blobs[1500:1700], more_ids)
    assert_same_index(index, loaded, queries)


def test_round_trip_untrained(tmp_path, queries):
    index = vq.index_factory(32, "OPQ8,IVF16,PQ8", metric="ip")
    index.nprobe = 3
    loaded = reload(index, tmp_path / "untrained.vqi")
    assert_same_index(index, loaded, queries)
    assert not loaded.is_trained
    with pytest.raises(RuntimeError, match="not trained"):
        loaded.search(queries, 5)


def test_round_trip_accepts_str_path(tmp_path, ivfpq, queries):
    path = str(tmp_path / "index.vqi")
    ivfpq.save(path)
    assert_same_index(ivfpq, vq.load_index(path), queries)


# -- 2. a fresh process -------------------------------------------------------------------
def test_load_in_new_process(tmp_path, blobs, queries):
    expected = {}
    for i, desc in enumerate(["IVF16,PQ8", "OPQ8_16,IVF16,PQ8,RFlat"]):
        index = build(desc, "l2" if i == 0 else "ip", blobs)
        index.nprobe = 3
        if i == 0:
            index.k = 7  # the saved default k
        else:
            index.k_factor = 2
        index.add_with_ids(blobs[:1500], np.arange(1500)[::-1] * 5 + 1)
        index.remove_ids(np.arange(0, 7500, 10) + 1)
        path = tmp_path / f"index{i}.vqi"
        index.save(path)
        expected[path] = index.search(queries)
    np.save(tmp_path / "queries.npy", queries)
    script = textwrap.dedent(
        """
        import sys
        import numpy as np, torch, vq
        torch.set_num_threads(2)
        q = np.load(sys.argv[1])
        for path in sys.argv[2:]:
            D, I = vq.load_index(path).search(q)
            np.save(path + ".D.npy", D)
            np.save(path + ".I.npy", I)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "queries.npy"), *map(str, expected)],
        cwd=tmp_path,  # not the repository root, whose vq/ is not the installed package
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    for path, (D, I) in expected.items():
        np.testing.assert_array_equal(np.load(f"{path}.I.npy"), I)
        np.testing.assert_array_equal(np.load(f"{path}.D.npy"), D)


# -- 3. hostile and broken files ----------------------------------------------------------
@pytest.mark.parametrize("writer", ["pickle", "torch.save"])
def test_pickle_is_never_unpickled(tmp_path, writer):
    def write(payload, path):
        if writer == "pickle":
            path.write_bytes(pickle.dumps({"index": payload}))
        else:
            torch.save({"weights": torch.zeros(4), "index": payload}, path)

    def unpickle(path):
        if writer == "pickle":
            return pickle.loads(path.read_bytes())
        return torch.load(path, weights_only=False)

    # the payload is live: unpickling it does create its marker
    control = tmp_path / "control-marker"
    write(Touch(control), tmp_path / "control.pkl")
    unpickle(tmp_path / "control.pkl")
    assert control.exists()

    marker = tmp_path / "marker"
    path = tmp_path / "index.vqi"
    write(Touch(marker), path)
    with pytest.raises(ValueError, match="not a vq index file"):
        vq.load_index(path)
    assert not marker.exists()


@pytest.mark.parametrize(
    "where, message",
    [
        pytest.param("length", r"only 4 bytes", id="in-length"),
        pytest.param("header", r"not a vq index file \(no safetensors header", id="in-header"),
        pytest.param("data", r"truncated or corrupted \(tensor '.*' lies past", id="in-data"),
        pytest.param("last byte", r"truncated or corrupted", id="last-byte"),
    ],
)
def test_truncated_file(tmp_path, saved, where, message):
    raw = saved.read_bytes()
    header, data = split_file(raw)
    n = len(raw) - len(data) - 8
    cut = {
        "length": 4,
        "header": 8 + n // 2,
        "data": 8 + n + len(data) // 2,
        "last byte": len(raw) - 1,
    }[where]
    path = tmp_path / "truncated.vqi"
    path.write_bytes(raw[:cut])
    with pytest.raises(ValueError, match=message):
        vq.load_index(path)


def test_flipped_byte_in_any_tensor_fails_the_checksum(tmp_path, saved):
    raw = saved.read_bytes()
    header, data = split_file(raw)
    start_of_data = len(raw) - len(data)
    flipped = []
    for name, entry in header.items():
        if name == "__metadata__" or entry["data_offsets"][0] == entry["data_offsets"][1]:
            continue
        lo, hi = entry["data_offsets"]
        broken = bytearray(raw)
        broken[start_of_data + (lo + hi) // 2] ^= 0x01
        path = tmp_path / f"{name}.vqi"
        path.write_bytes(bytes(broken))
        with pytest.raises(ValueError, match="checksum mismatch"):
            vq.load_index(path)
        flipped.append(name)
    # every stored tensor is covered
    assert sorted(flipped) == sorted(vq.load_index(saved).state_dict())


@pytest.mark.parametrize("claimed", [2**64 - 1, 2**40, (1 << 24) + 8])
def test_huge_header_size_is_refused(tmp_path, saved, claimed):
    path = tmp_path / "huge.vqi"
    path.write_bytes(struct.pack("<Q", claimed) + saved.read_bytes()[8:])
    with pytest.raises(ValueError, match=rf"no safetensors header: it claims {claimed} header"):
        vq.load_index(path)


def test_empty_file(tmp_path):
    path = tmp_path / "empty.vqi"
    path.write_bytes(b"")
    with pytest.raises(ValueError, match="not a vq index file .only 0 bytes"):
        vq.load_index(path)


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="no index file"):
        vq.load_index(tmp_path / "nothing.vqi")


@pytest.mark.parametrize(
    "metadata",
    [None, {"format": "something.else", "format_version": "1"}],
    ids=["no-metadata", "other-format"],
)
def test_plain_safetensors_file_is_not_an_index(tmp_path, metadata):
    path = tmp_path / "weights.safetensors"
    safetensors.torch.save_file({"weight": torch.ones(4, 4)}, str(path), metadata=metadata)
    with pytest.raises(ValueError, match="a safetensors file, but not a vq index"):
        vq.load_index(path)


def test_newer_format_version_is_refused(tmp_path, saved, ivfpq, queries):
    # control: rewriting tensors + unchanged metadata gives a loadable file
    same = forge(saved, tmp_path / "same.vqi", fix_checksum=False)
    assert_same_index(ivfpq, vq.load_index(same), queries)

    def newer(meta):
        meta["format_version"] = "4"

    path = forge(saved, tmp_path / "newer.vqi", edit_meta=newer, fix_checksum=False)
    with pytest.raises(ValueError, match="format version 4; .* upgrade vq"):
        vq.load_index(path)


def _set(key, value):
    def edit(meta):
        if value is None:
            del meta[key]
        else:
            meta[key] = value

    return edit


def _config(**changes):
    def edit(meta):
        meta["config"] = json.dumps({**json.loads(meta["config"]), **changes})

    return edit


@pytest.mark.parametrize(
    "edit, message",
    [
        pytest.param(_set("format_version", "one"), "no valid format_version", id="version-text"),
        pytest.param(_set("format_version", None), "no valid format_version", id="no-version"),
        pytest.param(_set("checksum", None), "checksum mismatch", id="no-checksum"),
        pytest.param(_set("checksum", "sha256:" + "0" * 64), "checksum mismatch", id="checksum"),
        pytest.param(_set("config", "{"), "no valid config", id="config-not-json"),
        pytest.param(_set("config", None), "no valid config", id="no-config"),
        pytest.param(_set("config", "[1, 2]"), "no valid config", id="config-list"),
        pytest.param(
            _config(**{"class": "os.system"}), "unknown index class 'os.system'", id="class"
        ),
        pytest.param(_config(nlist=32), "the tensors do not match a IVFPQ", id="nlist"),
        pytest.param(_config(M=4), "the tensors do not match a IVFPQ", id="M"),
        # a forged size is refused before anything of that size is allocated (2**40 floats)
        pytest.param(_config(nlist=2**30), "its configuration needs", id="huge-nlist"),
        pytest.param(_config(bogus=1), "invalid IVFPQ configuration", id="unknown-arg"),
    ],
)
def test_bad_metadata(tmp_path, saved, edit, message):
    path = forge(saved, tmp_path / "bad.vqi", edit_meta=edit)
    with pytest.raises(ValueError, match=message):
        vq.load_index(path)


def test_scalar_tensor_with_bad_checksum(tmp_path, saved):
    def scalar(tensors):
        tensors["pq.trained"] = torch.tensor(1.0)  # 0-d float: must still be checksummed

    path = forge(saved, tmp_path / "bad.vqi", edit_tensors=scalar, fix_checksum=False)
    with pytest.raises(ValueError, match="checksum mismatch"):
        vq.load_index(path)


def _entry(value):
    def edit(header):
        header["codes"] = value

    return edit


def _offsets(value):
    def edit(header):
        header["codes"]["data_offsets"] = value

    return edit


@pytest.mark.parametrize(
    "edit, message",
    [
        pytest.param(_entry("codes"), "tensor 'codes' has no offsets", id="entry-str"),
        pytest.param(_entry(["U8", [9]]), "tensor 'codes' has no offsets", id="entry-list"),
        pytest.param(_offsets(7), "tensor 'codes' has no offsets", id="offsets-int"),
        pytest.param(_offsets([0, 8, 16]), "tensor 'codes' has no offsets", id="offsets-3"),
        pytest.param(_offsets(["0", "8"]), "tensor 'codes' lies past the end", id="offsets-str"),
        pytest.param(_offsets([0, 1 << 40]), "tensor 'codes' lies past the end", id="past-end"),
        pytest.param(_offsets([-8, 0]), "tensor 'codes' lies past the end", id="negative"),
        pytest.param(
            lambda h: h["__metadata__"].update(format_version=[1]),
            "no valid format_version",
            id="version-list",
        ),
        pytest.param(
            lambda h: h["__metadata__"].update(format=None), "not a vq index", id="no-format"
        ),
        pytest.param(lambda h: [h], "not a vq index", id="header-list"),
    ],
)
def test_bad_header(tmp_path, saved, edit, message):
    header, data = split_file(saved.read_bytes())
    header = edit(header) or header
    path = tmp_path / "bad.vqi"
    path.write_bytes(join_file(header, data))
    with pytest.raises(ValueError, match=message):
        vq.load_index(path)


def test_header_that_is_not_json(tmp_path, saved):
    raw = saved.read_bytes()
    _, data = split_file(raw)
    path = tmp_path / "bad.vqi"
    junk = b"\xff\xfe{not json".ljust(16)
    path.write_bytes(struct.pack("<Q", len(junk)) + junk + data)
    with pytest.raises(ValueError, match="unreadable header"):
        vq.load_index(path)


@pytest.fixture(scope="module")
def small_indexes(blobs, ivfpq, tmp_path_factory):
    """Saved indexes of several kinds, for forging inconsistent contents."""
    d = tmp_path_factory.mktemp("small")
    pq6 = build("PQ8x6", "l2", blobs)
    pq6.add(blobs[:300])
    flat = vq.index_factory(32, "Flat")
    flat.add_with_ids(blobs[:300], np.arange(300) + 50)
    refine = vq.index_factory(32, "Flat,RFlat")
    refine.add(blobs[:300])
    paths = {}
    for name, index in [("IVFPQ", ivfpq), ("PQ8x6", pq6), ("Flat", flat), ("Refine", refine)]:
        paths[name] = d / f"{name}.vqi"
        index.save(paths[name])
    return paths


def _shift_last_offset(t):
    t["offsets"][-1] += 5


def _drop_last_code(t):
    t["codes"] = t["codes"][:-1].clone()


def _code_past_ksub(t):
    t["codes"][3, 2] = 64  # PQ8x6: codes are < 2**6


def _drop_an_id(t):
    t["ids"] = t["ids"][:-1].clone()


def _wrong_dim(t):
    t["vectors"] = torch.zeros(t["vectors"].shape[0], 16)


def _row_past_the_end(t):
    t["index.ids"] = torch.arange(300)
    t["index.ids"][5] = 300  # Refine's inner index stores row numbers of its vectors


@pytest.mark.parametrize(
    "kind, edit, message",
    [
        ("IVFPQ", _shift_last_offset, "IVFPQ has inverted-list offsets"),
        ("IVFPQ", _drop_last_code, r"IVFPQ has codes of shape \(1999, 8\)"),
        ("PQ8x6", _code_past_ksub, r"PQIndex has codes outside \[0, 64\)"),
        ("Flat", _drop_an_id, "FlatIndex has 299 ids for 300 vectors"),
        ("Flat", _wrong_dim, r"'vectors' is of shape \(300, 16\), its configuration needs"),
        ("Refine", _row_past_the_end, "Refine has a wrapped index whose rows"),
    ],
    ids=["offsets", "codes-rows", "codes-range", "ids-count", "vectors-dim", "refine-rows"],
)
def test_inconsistent_contents_with_valid_checksum(tmp_path, small_indexes, kind, edit, message):
    """A forged file whose checksum matches but whose buffers disagree (the numba scans do not
    check bounds: such a file must be refused at load, not crash a search)."""
    path = forge(small_indexes[kind], tmp_path / "forged.vqi", edit_tensors=edit)
    with pytest.raises(ValueError, match=message):
        vq.load_index(path)


# -- 4. atomic save -----------------------------------------------------------------------
@pytest.mark.parametrize("failure", ["write", "interrupt", "rename"])
def test_failed_save_keeps_the_previous_file(tmp_path, monkeypatch, ivfpq, blobs, queries, failure):
    path = tmp_path / "index.vqi"
    ivfpq.save(path)
    before = path.read_bytes()
    bigger = copy.deepcopy(ivfpq)
    bigger.add_with_ids(blobs[2000:2500], np.arange(500) + 10**6)

    temp_files = []
    real_save_file = safetensors.torch.save_file

    def failing_save_file(tensors, filename, metadata=None):
        temp_files.append(Path(filename))
        if failure == "rename":
            return real_save_file(tensors, filename, metadata=metadata)
        Path(filename).write_bytes(before[: len(before) // 3])  # a partial temporary file
        if failure == "interrupt":
            raise KeyboardInterrupt
        raise OSError(28, "No space left on device")

    def failing_replace(src, dst):
        raise OSError(13, "Permission denied")

    monkeypatch.setattr(safetensors.torch, "save_file", failing_save_file)
    if failure == "rename":
        monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(KeyboardInterrupt if failure == "interrupt" else OSError):
        bigger.save(path)
    with pytest.raises(KeyboardInterrupt if failure == "interrupt" else OSError):
        bigger.save(tmp_path / "new.vqi")
    monkeypatch.undo()

    # the save went through a temporary file beside the target, now gone
    assert len(temp_files) == 2 and all(t.parent == tmp_path for t in temp_files)
    assert all(t.name not in ("index.vqi", "new.vqi") for t in temp_files)
    assert sorted(os.listdir(tmp_path)) == ["index.vqi"]
    assert path.read_bytes() == before
    assert_same_index(ivfpq, vq.load_index(path), queries)

    # control: the same save, not failing, does replace the file
    bigger.save(path)
    assert vq.load_index(path).ntotal == ivfpq.ntotal + 500
    assert sorted(os.listdir(tmp_path)) == ["index.vqi"]


def test_two_saves_of_one_index_are_the_same_bytes_in_any_process(tmp_path, ivfpq):
    """The header in a fixed order (safetensors writes the metadata in a hash map's order, a
    different one every save): the metadata sorted by key, then the tensors by offset."""
    a, b, c = tmp_path / "a.vqi", tmp_path / "b.vqi", tmp_path / "c.vqi"
    ivfpq.save(a)
    ivfpq.save(b)
    assert a.read_bytes() == b.read_bytes()
    code = "import sys, vq; vq.load_index(sys.argv[1]).save(sys.argv[2])"  # (its own hash seeds)
    subprocess.run([sys.executable, "-c", code, str(a), str(c)], check=True, timeout=300)
    assert c.read_bytes() == a.read_bytes()
    header, _ = split_file(a.read_bytes())
    names = list(header)[1:]
    assert list(header)[0] == "__metadata__" and sorted(names) == sorted(ivfpq.state_dict())
    assert names == sorted(names, key=lambda name: header[name]["data_offsets"])
    assert list(header["__metadata__"]) == sorted(header["__metadata__"])
    with safe_open(str(a), "pt") as f:  # (and safetensors reads it)
        assert f.metadata()["format"] == "vq.index"


# -- 5. file size -------------------------------------------------------------------------
@pytest.mark.parametrize("desc, stores_ids", [("IVF16,PQ8", True), ("PQ8", False)])
def test_file_is_not_much_bigger_than_the_data(tmp_path, blobs, queries, desc, stores_ids):
    index = build(desc, "l2", blobs)
    n, M = 6000, 8
    index.add(blobs[:n])
    index.search(queries, 5)
    if isinstance(index, IVFIndex):  # its 128 KiB look-up cache is not to be saved
        assert index.precomputed_table.numel() * 4 == 16 * M * 256 * 4
    codebooks = sum(
        b.numel() * b.element_size() for name, b in index.state_dict().items() if "codebook" in name
    )
    assert codebooks == 256 * 32 * 4 + (16 * 32 * 4 if stores_ids else 0)
    data = n * (M + 8 if stores_ids else M)  # IVF keeps ids (list order); PQ's are implicit
    path = tmp_path / "index.vqi"
    index.save(path)
    size = path.stat().st_size
    assert data + codebooks <= size <= data + codebooks + 4096


@pytest.mark.parametrize("desc", ["Flat,RFlat", "OPQ8,IVF16,PQ8"])
def test_round_trip_keeps_k_of_wrappers(tmp_path, desc):
    index = vq.index_factory(32, desc)
    index.k = 7
    assert reload(index, tmp_path / "index.vqi").k == 7


def test_loading_imports_no_graph_compiler(tmp_path, blobs):
    """load_index checks shapes on the meta device, where some torch ops (eye, arange, mul)
    run through decompositions that import sympy and torch._dynamo: 1.7 s of a new process's
    first search. Every kind loads and answers without them."""
    kinds = ["Flat", "PQ8", "IVF8,Flat", "OPQ8,IVF8,PQ8", "IVF8,PQ8x4fsr,RFlat", "PQ8x4fs"]
    paths = []
    for i, desc in enumerate(kinds):
        build(desc, "l2", blobs).save(tmp_path / f"{i}.vq")
        paths.append(str(tmp_path / f"{i}.vq"))
    code = textwrap.dedent(
        """
        import sys, numpy as np, vq
        q = np.zeros((2, 32), dtype=np.float32)
        for path in sys.argv[1:]:
            vq.load_index(path).search(q, 3)
        print([m for m in ("sympy", "torch._dynamo") if m in sys.modules])
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code, *paths], capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
