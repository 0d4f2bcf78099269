"""A mapped index (``load_index(path, mmap=True)``) whose file is cut short or written to in
place raises OSError at its next call, never faults: a read through the mapping past the end
of the file would kill the process (SIGBUS), so every kind, every call, runs in a child
process; a file replaced by a rename (what ``index.save`` does) is harmless."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import vq
from vq.index.core import fileformat
from vq.index.core.mapped import file_range

DIM = 32

#: every class the factory builds, and the wrappers (kernel configurations the suite compiles)
KINDS = [
    "Flat", "PQ8", "PQ8x4fs", "SQ8", "SQfp16", "HNSW16", "HNSW16,SQ8", "IVF16,Flat",
    "IVF16,PQ8", "IVF16,PQ8x4fs", "IVF16,SQ8", "IVF16(soar),PQ8", "OPQ8,IVF16,PQ8",
    "PCA16,IVF16,Flat", "PQ8,RFlat", "IVF16,PQ8,Refine(SQfp16)",
]  # fmt: skip

#: each call on a mapped index whose file was cut short, by name
CALLS = ("search-1", "search-40", "filtered", "range", "reconstruct", "save", "add")

_CUT_SHORT = """
import os, sys
import numpy as np
import vq
from vq.index.core import fileformat
from vq.quantizers import OPQ, ProductQuantizer

where, kinds = sys.argv[1], sys.argv[2].split(";")
rng = np.random.default_rng(0)
x = rng.standard_normal((1200, 32)).astype(np.float32)
q = rng.standard_normal((40, 32)).astype(np.float32)
fileformat.SMALL_BYTES = 1024  # every tensor mapped but the flags and offsets
for i, desc in enumerate(kinds):
    index = vq.index_factory(32, desc)
    for m in index.modules():  # (short trainings)
        if isinstance(m, OPQ):
            m.niter, m.niter_pq, m.niter_pq_0 = 1, 1, 1
        elif isinstance(m, ProductQuantizer):
            m.niter = 2
    index.train(x)
    index.add_with_ids(x[:1000], np.arange(1000) * 2 + 1)
    path = os.path.join(where, f"{i}.vq")
    index.save(path)
    mapped = vq.load_index(path, mmap=True)
    same = all(np.array_equal(a, b) for a, b in zip(mapped.search(q, 5), index.search(q, 5)))
    os.truncate(path, 1000)
    calls = {
        "search-1": lambda: mapped.search(q[:1], 3),
        "search-40": lambda: mapped.search(q, 3),
        "filtered": lambda: mapped.search(q[:2], 3, allowed=np.arange(1, 2000, 4)),
        "range": lambda: mapped.range_search(q[:2], 1.0),
        "reconstruct": lambda: mapped.reconstruct(np.array([1, 3])),
        "save": lambda: mapped.save(os.path.join(where, f"{i}.copy.vq")),
        "add": lambda: mapped.add_with_ids(x[1000:1010], np.arange(10) + 10**6),
    }
    out = []
    for name, call in calls.items():
        try:
            call()
            out.append(f"{name}:returned")
        except OSError as err:
            out.append(f"{name}:OSError" if "shorter than when it was mapped" in str(err)
                       else f"{name}:{err}")
        except Exception as err:
            out.append(f"{name}:{type(err).__name__}:{err}")
    print(desc, same, " ".join(out), flush=True)
"""


def _run(script: str, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def test_every_kind_and_every_call_on_a_file_cut_short_raises_oserror_in_place_of_a_fault(
    tmp_path,
):
    proc = _run(_CUT_SHORT, str(tmp_path), ";".join(KINDS))
    assert proc.returncode == 0, f"the child died (rc {proc.returncode}):\n{proc.stderr[-3000:]}"
    lines = proc.stdout.splitlines()
    expected = " ".join(f"{name}:OSError" for name in CALLS)
    assert lines == [f"{desc} True {expected}" for desc in KINDS]


_MIXED = """
import os, sys
import numpy as np
import vq
from vq.index.core.mapped import file_range

path = sys.argv[1]
x = np.random.default_rng(1).standard_normal((10_000, 32)).astype(np.float32)
index = vq.IVFFlat(32, nlist=16, nprobe=4, coarse_niter=4)
index.train(x)
index.add(x)  # vectors 1.28 MB: mapped; ids 80 KB: read at the load
index.save(path)
mapped = vq.load_index(path, mmap=True)
print(file_range(mapped.vectors) is not None, file_range(mapped.ids) is None,
      mapped.rows_mapped())
for a, b in zip(mapped.search(x[:40], 5), index.search(x[:40], 5)):
    np.testing.assert_array_equal(a, b)
os.truncate(path, 1000)
for queries in (x[:3], x[:40]):
    try:
        mapped.search(queries, 3)
    except OSError as err:
        print("OSError:", err)
"""


def test_a_mapped_ivf_whose_ids_were_read_and_vectors_mapped_raises_oserror_when_cut_short(
    tmp_path,
):
    """The study's case: the vectors (from 1 MiB) mapped, the ids (under 1 MiB) read, so the
    pread path was skipped and the scan read the truncated mapping (the process died of
    SIGBUS). The probed lists are now read with pread whichever buffers are mapped."""
    path = tmp_path / "index.vq"
    proc = _run(_MIXED, str(path))
    assert proc.returncode == 0, f"the child died (rc {proc.returncode}):\n{proc.stderr[-3000:]}"
    lines = proc.stdout.splitlines()
    assert lines[0] == "True True True"
    message = f"OSError: {path}: the index file is shorter than when it was mapped"
    assert len(lines) == 3 and all(line.startswith(message) for line in lines[1:])


@pytest.fixture
def mapped_flat(tmp_path, monkeypatch):
    monkeypatch.setattr(fileformat, "SMALL_BYTES", 1024)
    x = np.random.default_rng(2).standard_normal((600, DIM)).astype(np.float32)
    index = vq.FlatIndex(DIM)
    index.add(x)
    path = tmp_path / "flat.vq"
    index.save(path)
    mapped = vq.load_index(path, mmap=True)
    assert file_range(mapped.vectors) is not None
    return index, mapped, path, x[:5]


def test_a_mapped_file_written_to_in_place_raises_oserror(mapped_flat):
    """Same size, other bytes: the mapping would show data the load never checked."""
    _, mapped, path, q = mapped_flat
    time.sleep(0.01)  # (a later modification time, on file systems with a coarse clock)
    with open(path, "r+b") as f:  # (never do this to a file in use: index.save renames)
        f.seek(-4, os.SEEK_END)
        f.write(b"\xff\xff\xff\xff")
    with pytest.raises(OSError, match="was written to in place since it was mapped"):
        mapped.search(q, 3)


def test_a_mapped_file_replaced_by_a_save_is_harmless(mapped_flat):
    """``index.save`` renames a new file over the path: the mapping keeps the old file."""
    index, mapped, path, q = mapped_flat
    other = vq.FlatIndex(DIM)
    other.add(np.zeros((3, DIM), np.float32))
    other.save(path)
    for a, b in zip(mapped.search(q, 3), index.search(q, 3), strict=True):
        np.testing.assert_array_equal(a, b)
    assert vq.load_index(path).ntotal == 3


def test_a_mapped_index_that_copied_its_buffers_no_longer_checks_the_file(mapped_flat):
    index, mapped, path, q = mapped_flat
    extra = np.ones((2, DIM), np.float32)
    mapped.add(extra)  # (copies the vectors into memory)
    index.add(extra)
    assert file_range(mapped.vectors) is None
    os.truncate(path, 0)
    for a, b in zip(mapped.search(q, 3), index.search(q, 3), strict=True):
        np.testing.assert_array_equal(a, b)
