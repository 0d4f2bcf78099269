"""What the loader refuses in forged files whose checksums were recomputed (so that only its
own checks stand between the file and a search): ids below 0 or of another rank, tensors of
another rank, NaN/Inf in any float tensor after its conversion to the dtype the index keeps,
on mapped loads too for what they read, NaN/Inf bit patterns in fp16/bf16 codes, conversions
to a wider dtype, stored vectors without trained parameters; every refusal a ValueError naming
what is wrong."""

from __future__ import annotations

import numpy as np
import pytest
import safetensors.torch
import torch
from safetensors import safe_open

import vq
from vq.index.core import fileformat, mapped
from vq.index.core.fileformat import config_checksum, tensors_checksum
from vq.index.core.mapped import file_range

DIM = 32


def forge(src, dst, edit):
    """``src`` rewritten as ``dst`` with its tensors edited and every checksum recomputed."""
    tensors = {k: v.clone() for k, v in safetensors.torch.load_file(str(src)).items()}
    with safe_open(str(src), "pt") as f:
        meta = dict(f.metadata())
    tensors = edit(tensors) or tensors
    meta["checksum"] = tensors_checksum(tensors)
    meta["config_checksum"] = config_checksum(meta["config"])
    safetensors.torch.save_file(tensors, str(dst), metadata=meta)
    return dst


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(11)
    return rng.standard_normal((1000, DIM)).astype(np.float32)


@pytest.fixture(scope="module")
def saved(data, tmp_path_factory):
    """Saved small indexes by name: Flat and IVF16,Flat with scattered ids, SQfp16, SQbf16,
    IVF16,SQfp16, HNSW16,SQfp16 (sequential ids)."""
    where = tmp_path_factory.mktemp("checks")
    paths = {}
    for name, desc, ids in [
        ("flat", "Flat", True),
        ("ivf", "IVF16,Flat", True),
        ("sqfp16", "SQfp16", False),
        ("sqbf16", "SQbf16", False),
        ("ivfsqfp16", "IVF16,SQfp16", False),
        ("hnswsqfp16", "HNSW16,SQfp16", False),
    ]:
        index = vq.index_factory(DIM, desc)
        index.train(data)
        if ids:
            index.add_with_ids(data[:300], np.arange(300) * 7 + 3)
        else:
            index.add(data[:300])
        paths[name] = where / f"{name}.vq"
        index.save(paths[name])
    return paths


def _set_ids(*values):
    def edit(t):
        t["ids"][: len(values)] = torch.tensor(values)

    return edit


def _ids_2d(t):
    t["ids"] = torch.stack([t["ids"], t["ids"]], dim=1)


def _ids_int32(t):
    t["ids"] = t["ids"].int()


def _vectors_3d(t):
    t["vectors"] = t["vectors"][:, :, None].clone()


def _vectors_float64_times_1e300(t):
    t["vectors"] = t["vectors"].double() * 1e300  # finite as float64, inf as float32


def _nan_vector(t):
    t["vectors"][7] = float("nan")


def _untrained(t):
    t["quantizer.trained"].zero_()


def _code_bits(bits: int, row: int = 4, column: int = 6):
    """Codes whose 16-bit value at (row, column) is ``bits`` (a NaN or an Inf)."""

    def edit(t):
        t["codes"].view(torch.int16)[row, column] = torch.tensor(bits, dtype=torch.int32).to(
            torch.int16
        )

    return edit


REFUSED = [
    pytest.param("flat", _set_ids(-1), r"FlatIndex has ids below 0 \(the smallest is -1\)",
                 id="flat-id-minus-1"),
    pytest.param("flat", _set_ids(-2, -3, -4), r"FlatIndex has ids below 0 \(the smallest is -4\)",
                 id="flat-negative-ids"),
    pytest.param("ivf", _set_ids(-1), r"IVFFlat has ids below 0 \(the smallest is -1\)",
                 id="ivf-id-minus-1"),
    pytest.param("ivf", _set_ids(-(2**63)), r"IVFFlat has ids below 0", id="ivf-id-int64-min"),
    pytest.param("flat", _ids_2d,
                 r"'ids' is of shape \(300, 2\), its configuration needs \(n,\)", id="flat-ids-2d"),
    pytest.param("ivf", _ids_2d,
                 r"'ids' is of shape \(300, 2\), its configuration needs \(n,\)", id="ivf-ids-2d"),
    pytest.param("flat", _ids_int32,
                 r"'ids' is stored as torch.int32, which it keeps as torch.int64 \(wider",
                 id="flat-ids-int32"),
    pytest.param("flat", _vectors_3d,
                 r"'vectors' is of shape \(300, 32, 1\), its configuration needs \(n, 32\)",
                 id="flat-vectors-3d"),
    pytest.param("flat", _vectors_float64_times_1e300,
                 r"tensor 'vectors' holds 9600 NaN/Inf values", id="flat-float64-1e300"),
    pytest.param("ivf", _vectors_float64_times_1e300,
                 r"tensor 'vectors' holds 9600 NaN/Inf values", id="ivf-float64-1e300"),
    pytest.param("flat", _nan_vector, r"tensor 'vectors' holds 32 NaN/Inf values", id="flat-nan"),
    pytest.param("ivf", _untrained, r"IVFFlat has 300 vectors but no trained parameters",
                 id="ivf-untrained"),
    pytest.param("sqfp16", _code_bits(0x7E00), r"SQIndex has 1 fp16 codes that are NaN/Inf",
                 id="sqfp16-nan"),
    pytest.param("sqfp16", _code_bits(0xFC00), r"SQIndex has 1 fp16 codes that are NaN/Inf",
                 id="sqfp16-minus-inf"),
    pytest.param("sqbf16", _code_bits(0x7F80), r"SQIndex has 1 bf16 codes that are NaN/Inf",
                 id="sqbf16-inf"),
    pytest.param("sqbf16", _code_bits(0x7FC1), r"SQIndex has 1 bf16 codes that are NaN/Inf",
                 id="sqbf16-nan"),
    pytest.param("ivfsqfp16", _code_bits(0x7C00), r"IVFSQ has 1 fp16 codes that are NaN/Inf",
                 id="ivfsqfp16-inf"),
    pytest.param("hnswsqfp16", _code_bits(0x7E00), r"HNSWSQ has 1 fp16 codes that are NaN/Inf",
                 id="hnswsqfp16-nan"),
]  # fmt: skip


@pytest.mark.parametrize("mmap", [False, True], ids=["read", "mapped"])
@pytest.mark.parametrize("name, edit, message", REFUSED)
def test_a_forged_file_is_refused_with_a_message_naming_what_is_wrong(
    tmp_path, saved, monkeypatch, name, edit, message, mmap
):
    """Read and mapped loads alike: the mapped one with every growing buffer mapped (its ids
    and fp16 codes read with pread for the checks) and, for the tensors it reads, the same
    NaN/Inf check after the conversion to float32."""
    path = forge(saved[name], tmp_path / "forged.vq", edit)
    if mmap and "holds" not in message:  # (NaN/Inf of mapped vectors: with verify=True only)
        monkeypatch.setattr(fileformat, "SMALL_BYTES", 1024)
    with pytest.raises(ValueError, match=message):
        vq.load_index(path, mmap=mmap)


def test_nan_in_mapped_vectors_is_refused_with_verify(tmp_path, saved, monkeypatch):
    monkeypatch.setattr(fileformat, "SMALL_BYTES", 1024)
    path = forge(saved["flat"], tmp_path / "forged.vq", _nan_vector)
    with pytest.raises(ValueError, match=r"tensor 'vectors' holds 32 NaN/Inf values"):
        vq.load_index(path, mmap=True, verify=True)
    unchecked = vq.load_index(path, mmap=True)  # (the vectors left mapped are not read)
    assert file_range(unchecked.vectors) is not None


def test_a_narrower_dtype_is_converted_and_searches_as_the_original(tmp_path, saved, data):
    """float64 vectors (finite as float32) load as the float32 ones they were."""
    path = forge(
        saved["ivf"], tmp_path / "wide.vq", lambda t: t.update(vectors=t["vectors"].double())
    )
    original = vq.load_index(saved["ivf"])
    for mmap in (False, True):
        loaded = vq.load_index(path, mmap=mmap)
        assert loaded.vectors.dtype == torch.float32
        assert torch.equal(loaded.vectors, original.vectors)
        for a, b in zip(loaded.search(data[:20], 5), original.search(data[:20], 5), strict=True):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    "name, edit, message",
    [
        pytest.param("ivf", _set_ids(*range(299), -5), r"IVFFlat has ids below 0 \(the smallest "
                     r"is -5\)", id="ivf-last-id"),
        pytest.param("ivfsqfp16", _code_bits(0x7E00, row=299, column=31),
                     r"IVFSQ has 1 fp16 codes that are NaN/Inf", id="ivfsqfp16-last-code"),
    ],
)  # fmt: skip
def test_mapped_tensors_are_checked_a_piece_at_a_time_to_their_last_value(
    tmp_path, saved, monkeypatch, name, edit, message
):
    """The pieces ``pread`` reads (here 64 bytes, so tens of them) cover every value once: the
    forged value in the last one is found, and a verified load's checksum matches."""
    monkeypatch.setattr(fileformat, "SMALL_BYTES", 1024)
    monkeypatch.setattr(mapped, "CHUNK_BYTES", 64)
    assert file_range(vq.load_index(saved[name], mmap=True, verify=True).ids) is not None
    path = forge(saved[name], tmp_path / "forged.vq", edit)
    with pytest.raises(ValueError, match=message):
        vq.load_index(path, mmap=True)
