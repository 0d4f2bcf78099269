"""Loading a path while another process saves to it: ``index.save`` renames a new file over the
path, and ``load_index`` reads one file through one descriptor (header, tensors, mapping), so
every load succeeds and gives one of the versions written, whole (it opened the file several
times, and mixed two versions' header and tensors: "checksum mismatch")."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import numpy as np
import torch

import vq

DIM = 64

_WRITER = """
import sys
import numpy as np
import vq

def version(n, seed):  # (as the test builds them)
    x = np.random.default_rng(seed).standard_normal((n, 64)).astype(np.float32)
    index = vq.FlatIndex(64)
    index.add_with_ids(x, np.arange(n) * 3 + seed)
    return index

path, saves = sys.argv[1], int(sys.argv[2])
versions = [version(6000, 1), version(4000, 2)]
print("ready", flush=True)
for i in range(saves):
    versions[i % 2].save(path)
print("done", flush=True)
"""


def _version(n: int, seed: int) -> vq.FlatIndex:
    x = np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)
    index = vq.FlatIndex(DIM)
    index.add_with_ids(x, np.arange(n) * 3 + seed)
    return index


def test_loads_beside_a_process_saving_the_same_path_never_fail_nor_mix_versions(tmp_path):
    versions = [_version(6000, 1), _version(4000, 2)]  # 1.5 and 1 MB of vectors: mapped
    path = tmp_path / "index.vq"
    versions[0].save(path)
    writer = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_WRITER), str(path), "200"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert writer.stdout.readline() == "ready\n", writer.stderr.read()
        loads, failures, seen = 0, [], set()
        deadline = time.monotonic() + 60
        while writer.poll() is None and time.monotonic() < deadline:
            try:
                loaded = vq.load_index(path, mmap=bool(loads % 2))
            except Exception as err:  # (any failure counts; none is expected)
                failures.append(f"{type(err).__name__}: {err}")
                continue
            finally:
                loads += 1
            match = [
                i
                for i, v in enumerate(versions)
                if loaded.ntotal == v.ntotal
                and torch.equal(loaded.ids, v.ids)
                and torch.equal(loaded.vectors, v.vectors)
            ]
            assert match, f"load {loads} is neither version (ntotal {loaded.ntotal})"
            seen.add(match[0])
        assert writer.wait(timeout=120) == 0, writer.stderr.read()
    finally:
        writer.kill()
    assert failures == [], f"{len(failures)} of {loads} loads failed: {failures[:3]}"
    assert loads >= 20 and seen == {0, 1}
