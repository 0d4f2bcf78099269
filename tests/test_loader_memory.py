"""The in-memory load reads each tensor once, into the buffer the index keeps: a load peaks at
about the file's size (it held safetensors' mapping and a copy of every tensor at once, 2.4 to
2.8 times the file), and the header is checked as safetensors checked it."""

from __future__ import annotations

import json
import struct
import subprocess
import sys

import numpy as np
import pytest
import safetensors.torch
import torch
from safetensors import safe_open

import vq
from vq.index.core.fileformat import config_checksum, tensors_checksum

DIM = 64

_PEAK = """
import sys
import vq
def rss(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field))
vq.load_index(sys.argv[2])  # first kernel calls and lazy imports: not the load's memory
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the peak (VmHWM) reset to the current RSS (Linux >= 4.0)
before = rss("VmRSS:")
index = vq.load_index(sys.argv[1])
print(rss("VmHWM:") - before)
"""


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    where = tmp_path_factory.mktemp("memory")
    rng = np.random.default_rng(3)
    index = vq.index_factory(DIM, "IVF16,SQ8,RFlat")
    x = rng.standard_normal((2000, DIM)).astype(np.float32)
    index.train(x)
    index.add(x)
    index.save(where / "small.vqi")
    return index, where / "small.vqi", x[:20]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self")
def test_a_load_peaks_at_about_the_file_size(tmp_path, saved):
    x = np.random.default_rng(4).standard_normal((150_000, DIM)).astype(np.float32)
    big = vq.FlatIndex(DIM)
    big.add(x)  # 38 MB of vectors
    big.save(tmp_path / "big.vqi")
    size = (tmp_path / "big.vqi").stat().st_size
    out = subprocess.run(
        [sys.executable, "-c", _PEAK, str(tmp_path / "big.vqi"), str(saved[1])],
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    rise = int(out.stdout.split()[-1])
    assert rise < 1.3 * size, f"a {size}-byte file raised the peak RSS by {rise} bytes"


def test_the_loaded_buffers_are_the_tensors_read_and_search_alike(saved):
    index, path, q = saved
    loaded = vq.load_index(path)
    for name, t in index.state_dict().items():
        got = loaded.state_dict()[name]
        assert got.dtype == t.dtype and torch.equal(got, t), name
    for a, b in zip(loaded.search(q, 5), index.search(q, 5), strict=True):
        np.testing.assert_array_equal(a, b)


def _forged(path, tmp_path, edit_tensors=None, edit_header=None):
    """The file at ``path`` rewritten with edited tensors (checksums recomputed) or an edited
    header (data bytes unchanged)."""
    tensors = {k: v.clone() for k, v in safetensors.torch.load_file(str(path)).items()}
    with safe_open(str(path), "pt") as f:
        meta = dict(f.metadata())
    if edit_tensors is not None:
        edit_tensors(tensors)
        meta["checksum"] = tensors_checksum(tensors)
        meta["config_checksum"] = config_checksum(meta["config"])
    out = tmp_path / "forged.vqi"
    safetensors.torch.save_file(tensors, str(out), metadata=meta)
    if edit_header is not None:
        raw = out.read_bytes()
        (n,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8 : 8 + n])
        extra = edit_header(header) or b""
        h = json.dumps(header).encode()
        h += b" " * (-len(h) % 8)
        out.write_bytes(struct.pack("<Q", len(h)) + h + raw[8 + n :] + extra)
    return out


def test_a_tensor_stored_in_another_dtype_is_converted_as_before(tmp_path, saved):
    index, path, q = saved

    def widen(tensors):
        tensors["vectors"] = tensors["vectors"].double()

    loaded = vq.load_index(_forged(path, tmp_path, edit_tensors=widen))
    assert loaded.vectors.dtype == torch.float32
    assert torch.equal(loaded.vectors, index.vectors)
    np.testing.assert_array_equal(loaded.search(q, 5)[1], index.search(q, 5)[1])


def _overlap(header):
    """The last tensor's byte range moved 8 bytes back, over its predecessor's."""
    name = max((k for k in header if k != "__metadata__"),
               key=lambda k: header[k]["data_offsets"][1])  # fmt: skip
    start, end = header[name]["data_offsets"]
    header[name]["data_offsets"] = [start - 8, end - 8]


def _trailing(header):
    return b"\0" * 8


@pytest.mark.parametrize(
    "edit, message",
    [
        pytest.param(_overlap, r"bytes overlap another tensor's or leave a gap", id="overlap"),
        pytest.param(
            _trailing, r"corrupted vq index file \(8 bytes after the tensors\)", id="trailing"
        ),
    ],
)
@pytest.mark.parametrize("mmap", [False, True])
def test_ranges_that_do_not_tile_the_data_are_refused(tmp_path, saved, edit, message, mmap):
    _, path, _ = saved
    with pytest.raises(ValueError, match=message):
        vq.load_index(_forged(path, tmp_path, edit_header=edit), mmap=mmap)
