"""The index loader against damaged and hostile files: hundreds of random truncations and byte
flips give a clean ValueError (or, for the few bytes no check covers, the very same index);
hostile headers and configurations are refused before anything is built; files of the older
format version still load; random forgeries of the tensors of every kind, checksums recomputed,
are refused or search correctly, read or mapped (in a child process: no signal, no numba
typing error)."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
import safetensors.torch
import torch
from safetensors import safe_open

import vq
from vq.datasets import clustered_vectors
from vq.index.core.fileformat import FORMAT_VERSION, config_checksum, tensors_checksum
from vq.quantizers import OPQ, ProductQuantizer

CUTS, FLIPS = 200, 400


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """An OPQ + IVF + PQ + re-ranking index with scattered ids (every kind of buffer and every
    level of configuration nesting), saved; its bytes."""
    x = clustered_vectors(1200, 16, n_clusters=12, seed=5)
    index = vq.index_factory(16, "OPQ4,IVF8,PQ4x4,RFlat")
    for m in index.modules():
        if isinstance(m, OPQ):
            m.niter, m.niter_pq, m.niter_pq_0 = 1, 1, 1
        elif isinstance(m, ProductQuantizer):
            m.niter = 2
    index.train(x)
    ids = np.random.default_rng(0).choice(10**9, 300, replace=False)
    index.add_with_ids(x[:300], ids)
    index.nprobe = 3
    path = tmp_path_factory.mktemp("fuzz") / "index.vqi"
    index.save(path)
    return index, path.read_bytes(), x[900:920]


def header_of(raw: bytes) -> tuple[int, dict]:
    """(bytes before the tensor data, header JSON)."""
    (n,) = struct.unpack("<Q", raw[:8])
    return 8 + n, json.loads(raw[8 : 8 + n])


def assert_same(loaded, index, queries) -> None:
    assert type(loaded) is type(index) and loaded.config() == index.config()
    a, b = index.state_dict(), loaded.state_dict()
    assert sorted(a) == sorted(b)
    assert all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)
    for got, want in zip(loaded.search(queries, 5), index.search(queries, 5), strict=True):
        np.testing.assert_array_equal(got, want)


def test_random_truncations_are_refused(tmp_path, saved):
    _, raw, _ = saved
    data_start, _ = header_of(raw)
    rng = np.random.default_rng(1)
    cuts = set(rng.integers(0, len(raw), CUTS).tolist())
    cuts |= set(range(0, 12)) | {data_start - 1, data_start, data_start + 1, len(raw) - 1}
    path = tmp_path / "cut.vqi"
    messages = Counter()
    for cut in sorted(cuts):
        path.write_bytes(raw[:cut])
        with pytest.raises(ValueError) as info:
            vq.load_index(path)
        messages[str(info.value).split(": ", 1)[1][:30]] += 1
    assert len(cuts) >= CUTS * 0.9
    # cuts in the length, the header and the data are each named as such
    assert any(m.startswith("not a vq index file (only") for m in messages)
    assert any(m.startswith("not a vq index file (no safe") for m in messages)
    assert any(m.startswith("truncated or corrupted") for m in messages)


def test_random_byte_flips_are_refused_or_harmless(tmp_path, saved):
    index, raw, queries = saved
    data_start, header = header_of(raw)
    # the only bytes no check covers: the header's padding and the informative vq_version entry
    # (its name and value)
    entry = b'"vq_version":' + json.dumps(vq.__version__).encode()
    at = raw.index(entry)
    unchecked = {i for i in range(at, at + len(entry)) if raw[i : i + 1] not in b'":'}
    unchecked |= set(range(raw.rindex(b"}", 0, data_start) + 1, data_start))  # the padding
    rng = np.random.default_rng(2)
    positions = np.concatenate(
        [rng.integers(0, data_start, FLIPS // 2), rng.integers(data_start, len(raw), FLIPS // 2)]
    )
    path = tmp_path / "flipped.vqi"
    refused, harmless = Counter(), []
    for pos, xor in zip(positions.tolist(), rng.integers(1, 256, FLIPS).tolist(), strict=True):
        broken = bytearray(raw)
        broken[pos] ^= xor
        path.write_bytes(bytes(broken))
        try:
            loaded = vq.load_index(path)
        except ValueError as err:
            refused[str(err).split(": ", 1)[1][:17]] += 1
            continue
        assert pos in unchecked, f"a flip at byte {pos} of {raw[pos - 20 : pos + 20]} loaded"
        assert_same(loaded, index, queries)
        harmless.append(pos)
    assert sum(refused.values()) + len(harmless) == FLIPS
    assert sum(refused.values()) >= FLIPS * 0.9  # nearly every byte is covered by some check
    assert refused["checksum mismatch"] >= FLIPS // 2  # every flip in the tensor data


# -- hostile files ---------------------------------------------------------------------------------
def rewrite(raw: bytes, edit) -> bytes:
    """``raw`` with its header JSON edited (data unchanged)."""
    data_start, header = header_of(raw)
    header = edit(header) or header
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + raw[data_start:]


def forge(raw: bytes, tmp_path, edit_tensors=None, edit_meta=None) -> bytes:
    """``raw`` rewritten with edited tensors/metadata and every checksum recomputed (a
    deliberate forgery rather than damage)."""
    src = tmp_path / "src.vqi"
    src.write_bytes(raw)
    tensors = {k: v.clone() for k, v in safetensors.torch.load_file(str(src)).items()}
    with safe_open(str(src), "pt") as f:
        meta = dict(f.metadata())
    if edit_tensors is not None:
        edit_tensors(tensors)
    if edit_meta is not None:
        edit_meta(meta)
    meta["checksum"] = tensors_checksum(tensors)
    meta["config_checksum"] = config_checksum(meta["config"])
    safetensors.torch.save_file(tensors, str(src), metadata=meta)
    return src.read_bytes()


def set_entry(name, **changes):
    def edit(header):
        header[name].update(changes)

    return edit


def nested_refine(depth: int):
    def edit(meta):
        config = json.loads(meta["config"])
        for _ in range(depth):
            config = {"class": "Refine", "k": 10, "k_factor": 1, "index": config}
        meta["config"] = json.dumps(config)

    return edit


def config_edit(*where: str, **changes):
    """Change entries of the configuration, or of the one nested at ``where``."""

    def edit(meta):
        config = json.loads(meta["config"])
        inner = config
        for key in where:
            inner = inner[key]
        inner.update(changes)
        meta["config"] = json.dumps(config)

    return edit


IVFPQ = ("index", "index")  # Refine → PreTransform → IVFPQ


def nan_codebook(tensors):
    tensors["index.index.pq.codebooks"][0, 0, 0] = float("nan")


def deep_json(raw: bytes) -> bytes:
    deep = b"[" * 100_000 + b"]" * 100_000
    return struct.pack("<Q", len(deep)) + deep


HOSTILE = [
    pytest.param(
        lambda raw, tmp: rewrite(raw, set_entry("vectors", shape=[2**40, 16])),
        r"corrupted vq index file \(.*invalid shape",
        id="shape-claims-16-TiB",
    ),
    pytest.param(
        lambda raw, tmp: rewrite(raw, set_entry("vectors", shape=[2**32, 2**32, 2**32])),
        r"corrupted vq index file \(.*overflow",
        id="shape-overflows",
    ),
    pytest.param(
        lambda raw, tmp: rewrite(raw, set_entry("vectors", data_offsets=[0, 2**62])),
        r"tensor 'vectors' lies past the end",
        id="offsets-past-the-end",
    ),
    pytest.param(
        lambda raw, tmp: deep_json(raw), r"unreadable header: maximum recursion", id="deep-json"
    ),
    pytest.param(
        lambda raw, tmp: forge(raw, tmp, edit_meta=config_edit(*IVFPQ, nlist=2**40)),
        r"'index.index.offsets' is of shape \(9,\), its configuration needs \(1099511627777,\)"
        r"|nlist must .* 1099511627776",  # (or the constructor's own check)
        id="config-nlist-2**40",
    ),
    pytest.param(
        lambda raw, tmp: forge(raw, tmp, edit_meta=config_edit(*IVFPQ, dim="16")),
        r"dim must be an integer, got '16'",
        id="config-dim-text",
    ),
    pytest.param(
        lambda raw, tmp: forge(raw, tmp, edit_meta=config_edit(dim=16)),
        r"settings a Refine does not take: dim \(unknown\)",
        id="config-unknown-setting",
    ),
    pytest.param(
        lambda raw, tmp: forge(raw, tmp, edit_meta=nested_refine(50)),
        r"the configuration nests more than 8 indexes",
        id="config-nested-50-deep",
    ),
    pytest.param(
        lambda raw, tmp: forge(raw, tmp, edit_meta=config_edit(**{"class": "builtins.eval"})),
        r"unknown index class 'builtins.eval'",
        id="config-class",
    ),
    pytest.param(
        lambda raw, tmp: forge(raw, tmp, edit_tensors=nan_codebook),
        r"tensor 'index.index.pq.codebooks' holds 1 NaN/Inf values",
        id="nan-codebook",
    ),
]


@pytest.mark.parametrize("make, message", HOSTILE)
def test_hostile_files_are_refused_before_anything_is_built(tmp_path, saved, make, message):
    _, raw, _ = saved
    path = tmp_path / "hostile.vqi"
    path.write_bytes(make(raw, tmp_path))
    with pytest.raises(ValueError, match=message):
        vq.load_index(path)


def test_a_changed_configuration_fails_its_checksum(tmp_path, saved):
    """The tensors' checksum is intact, the configuration edited (nprobe 3 → 9: a one-byte
    change that no shape check can see) — format 2 checksums the configuration too."""
    index, raw, queries = saved
    tweaked = raw.replace(b'\\"nprobe\\": 3', b'\\"nprobe\\": 9')
    assert tweaked != raw and len(tweaked) == len(raw)
    path = tmp_path / "tweaked.vqi"
    path.write_bytes(tweaked)
    with pytest.raises(ValueError, match="checksum mismatch in the configuration"):
        vq.load_index(path)


# -- format versions -------------------------------------------------------------------------------
def as_version(version: str, drop_config_checksum: bool):
    def edit(header):
        meta = header["__metadata__"]
        meta["format_version"] = version
        if drop_config_checksum:
            del meta["config_checksum"]

    return edit


def test_format_version_1_files_still_load(tmp_path, saved):
    """What vq 0.1.0 wrote: format version 1, no configuration checksum."""
    index, raw, queries = saved
    assert FORMAT_VERSION == 3
    path = tmp_path / "v1.vqi"
    path.write_bytes(rewrite(raw, as_version("1", drop_config_checksum=True)))
    assert_same(vq.load_index(path), index, queries)


@pytest.mark.parametrize(
    "version, message",
    [
        ("0", r"index format version 0 is older than any this vq reads \(versions 1 to 3\)"),
        ("-4", r"format version -4 is older than any this vq reads"),
        ("4", r"written by vq 0.1.0 in index format version 4; this vq reads versions 1 to 3: "),
    ],
)
def test_unreadable_format_versions_name_the_versions_needed(tmp_path, saved, version, message):
    _, raw, _ = saved
    path = tmp_path / "other.vqi"
    path.write_bytes(rewrite(raw, as_version(version, drop_config_checksum=False)))
    with pytest.raises(ValueError, match=message):
        vq.load_index(path)


def test_version_2_needs_its_configuration_checksum(tmp_path, saved):
    _, raw, _ = saved
    path = tmp_path / "no-config-checksum.vqi"
    path.write_bytes(rewrite(raw, as_version("2", drop_config_checksum=True)))
    with pytest.raises(ValueError, match="checksum mismatch in the configuration"):
        vq.load_index(path)


# -- forged tensors, every kind ----------------------------------------------------------------
#: every class the factory builds and both wrappers, on kernel configurations the suite compiles
FUZZ_KINDS = [
    "Flat", "PQ8", "PQ8x4fs", "SQ8", "SQ4", "SQfp16", "SQbf16", "HNSW16", "HNSW16,SQ8",
    "IVF16,Flat", "IVF16,PQ8", "IVF16,PQ8x4fs", "IVF16,SQ8", "IVF16,SQfp16", "IVF16(soar),PQ8",
    "OPQ8,IVF16,PQ8", "PCA16,IVF16,Flat", "PQ8,RFlat", "IVF16,PQ8,Refine(SQfp16)",
]  # fmt: skip
FORGERIES = 14  # per kind

_FUZZ = r"""
import os, sys
import numpy as np
import safetensors.torch
import torch
from safetensors import safe_open

import vq
from vq.index.core import fileformat
from vq.index.core.fileformat import config_checksum, tensors_checksum
from vq.quantizers import OPQ, ProductQuantizer

where, seed, per_kind, kinds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
rng = np.random.default_rng(seed)
x = rng.standard_normal((700, 32)).astype(np.float32)
q = rng.standard_normal((40, 32)).astype(np.float32)
DTYPES = [torch.float64, torch.float32, torch.float16, torch.int64, torch.int32, torch.uint8,
          torch.bool]
# (finite floats too large for a distance, 1e19, are add's to refuse: not forged here)
FLOATS = [float("nan"), float("inf"), -float("inf"), 1e300, 0.0, -1.0, 3.5]
INTS = [-1, -2, 2**62, -(2**63), 0, 3, 255, 2**31]
# the loads compared: read; mapped with every tensor read (small files); mapped with the
# tensors from 1 KiB mapped and verified; the same unverified (NaN/Inf of mapped tensors unread)
LOADS = [("read", {}, None), ("mapped-read", {"mmap": True}, None),
         ("mapped-verified", {"mmap": True, "verify": True}, 1024),
         ("mapped", {"mmap": True}, 1024)]
SMALL = fileformat.SMALL_BYTES


def forge(tensors, meta, path):
    meta = dict(meta, checksum=tensors_checksum(tensors))
    meta["config_checksum"] = config_checksum(meta["config"])
    safetensors.torch.save_file(tensors, path, metadata=meta)


def mutate(t):
    # one random forgery of tensor t (a new tensor; its name and the forgery in words)
    kind = rng.integers(6)
    if kind <= 1 and t.numel():  # a value (a third of the time, several)
        out = t.clone()
        flat = out.reshape(-1)
        values = FLOATS if t.is_floating_point() else INTS
        value = values[rng.integers(len(values))]
        at = rng.integers(0, flat.numel(), size=1 + 3 * int(rng.integers(3) == 0))
        try:
            flat[torch.from_numpy(at)] = torch.tensor(value, dtype=torch.float64).to(t.dtype)
        except RuntimeError:
            return None, ""
        return out, f"{at.tolist()} = {value}"
    if kind == 2:
        dtype = DTYPES[rng.integers(len(DTYPES))]
        return t.to(dtype), f"as {dtype}"
    if kind == 3 and t.is_floating_point():
        return t.double() * 1e300, "float64 x 1e300"
    shapes = [(*t.shape, 1), (t.numel(),), (max(t.shape[0] - 1, 0), *t.shape[1:]) if t.dim()
              else (1,), (t.shape[0] + 1, *t.shape[1:]) if t.dim() else (2,)]
    shape = shapes[rng.integers(len(shapes))]
    n = int(np.prod(shape))
    flat = t.reshape(-1)
    data = flat[:n] if n <= flat.numel() else torch.cat([flat, flat[: n - flat.numel()]])
    if data.numel() < n:
        return None, ""
    return data.reshape(shape).clone(), f"shape {tuple(shape)}"


def results(index):
    # what the searches give: the lean path, the general path and a filtered search
    stored = index.stored_ids().numpy()
    allowed = stored[::3]
    ids, held = np.unique(stored, return_counts=True)
    copies = max(getattr(m, "copies", 1) for m in index.modules())  # (spilled lists: 2)
    out = []
    for queries, options in ((q[:3], {}), (q, {}), (q[:4], {"allowed": allowed})):
        D, I = index.search(queries, 5, **options)
        valid = np.isin(I, stored) | (I == -1)
        assert valid.all(), f"ids not stored: {I[~valid][:5]}"
        missing = I == -1
        assert np.isinf(D[missing]).all(), "a missing result has a finite distance"
        if "allowed" in options:
            assert np.isin(I[~missing], allowed).all(), "an id not allowed"
        for row in I:  # each vector once: an id as often as vectors hold it (forged repeats)
            got, times = np.unique(row[row >= 0], return_counts=True)
            assert (times <= -(-held[np.searchsorted(ids, got)] // copies)).all(), f"{row}"
        out += [D, I]
    return out


def check(D, finite=True):
    if not finite:
        return
    found = ~np.isinf(D)
    assert np.isfinite(D[found]).all(), "NaN distances"
    assert (np.diff(np.where(found, D, np.inf), axis=1) >= 0).all(), "distances out of order"


failures, counts = [], {}
for i, desc in enumerate(kinds):
    index = vq.index_factory(32, desc)
    for m in index.modules():
        if isinstance(m, OPQ):
            m.niter, m.niter_pq, m.niter_pq_0 = 1, 1, 1
        elif isinstance(m, ProductQuantizer):
            m.niter = 2
    index.train(x)
    index.add_with_ids(x[:300], rng.choice(10**6, 300, replace=False))
    if hasattr(index, "nprobe"):
        index.nprobe = 4
    src = os.path.join(where, f"{i}.vq")
    index.save(src)
    tensors = safetensors.torch.load_file(src)
    with safe_open(src, "pt") as f:
        meta = dict(f.metadata())
    names = sorted(tensors)
    counts[desc] = {"refused": 0, "loaded": 0}
    done = 0
    while done < per_kind:
        name = names[rng.integers(len(names))]
        forged, how = mutate(tensors[name])
        if forged is None:
            continue
        done += 1
        case = f"{desc}: {name} {how}"
        path = os.path.join(where, f"{i}.forged.vq")
        forge({**tensors, name: forged}, meta, path)
        outcome = {}
        for load, options, small in LOADS:
            fileformat.SMALL_BYTES = small or SMALL
            try:
                loaded = vq.load_index(path, **options)
            except ValueError as err:
                outcome[load] = "refused"
                continue
            except Exception as err:
                failures.append(f"{case}: {load} load raised {type(err).__name__}: {err}")
                outcome[load] = "error"
                continue
            finally:
                fileformat.SMALL_BYTES = SMALL
            try:
                found = results(loaded)
                for D in found[::2]:
                    check(D, finite=load != "mapped")
                outcome[load] = found
            except Exception as err:
                failures.append(f"{case}: {load} search: {type(err).__name__}: {str(err)[:300]}")
                outcome[load] = "error"
        first = outcome["read"]
        for load in ("mapped-read", "mapped-verified"):
            other = outcome[load]
            same = (other == first if isinstance(first, str) or isinstance(other, str)
                    else all(np.array_equal(a, b) for a, b in zip(first, other)))
            if not same:
                failures.append(f"{case}: the {load} load differs from the read one")
        counts[desc]["refused" if first == "refused" else "loaded"] += 1
for line in failures:
    print("FAIL", line)
for desc, c in counts.items():
    print("KIND", desc, c["refused"], c["loaded"])
"""


def test_forged_tensors_of_every_kind_are_refused_or_search_correctly(tmp_path):
    """Random forgeries of the tensors of every kind (values: NaN, Inf, -1, 2**62...; dtypes;
    ranks and row counts; float64 x 1e300), checksums recomputed, each loaded four ways (read;
    mapped, small tensors read; mapped verified and not, tensors from 1 KiB mapped): each load
    is refused with a ValueError, or its searches (lean, general, filtered) return stored ids
    (-1 only for a missing result, at an infinite distance), each once, allowed ones, at
    finite sorted distances, the same for every load; in a child process, where a signal or
    a numba typing error would show."""
    proc = subprocess.run(
        [sys.executable, "-c", _FUZZ, str(tmp_path), "0", str(FORGERIES), *FUZZ_KINDS],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, f"the child died (rc {proc.returncode}):\n{proc.stderr[-4000:]}"
    lines = proc.stdout.splitlines()
    assert [line for line in lines if line.startswith("FAIL")] == []
    counts = {
        line.split()[1]: tuple(map(int, line.split()[2:])) for line in lines[-len(FUZZ_KINDS) :]
    }
    assert list(counts) == FUZZ_KINDS
    assert all(refused + loaded == FORGERIES for refused, loaded in counts.values())
    assert sum(refused for refused, _ in counts.values()) >= len(FUZZ_KINDS) * FORGERIES // 4
    assert sum(loaded for _, loaded in counts.values()) >= len(FUZZ_KINDS) * FORGERIES // 10
