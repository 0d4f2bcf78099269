"""The floor beneath training (:mod:`vq.parallel`), in one process: checkpoints that resume to
the uninterrupted result, atomic checkpoint files, :class:`Shards` without a process group, and
``vq.distributed`` re-exporting the floor's public names. The same pieces across processes are
checked in test_distributed.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import vq
import vq.distributed
import vq.parallel
from vq.parallel import Shards, TrainingRun, checkpoints


def test_vq_distributed_re_exports_the_floor_beneath_it():
    for name in ("Shards", "checkpoints", "current_group", "use_group"):
        assert getattr(vq.distributed, name) is getattr(vq.parallel, name), name
    assert vq.parallel.current_group() is None  # no process group: this process alone
    with vq.parallel.use_group(None):
        assert vq.parallel.current_group() is None and not vq.parallel.sync.active()


# -- checkpoints and resume -----------------------------------------------------------------------
class Crash(Exception):
    pass


def crash_after(monkeypatch, step: int, name: str | None = None) -> None:
    """Make the first training loop (whose checkpoint file is called ``name``, if given) that
    gets to iteration ``step`` raise Crash right after it."""
    done = TrainingRun.iteration_done
    armed = [True]

    def iteration_done(self, centroids, total):
        done(self, centroids, total)
        if armed[0] and self.step == step and name in (None, self.path and self.path.name):
            armed[0] = False
            raise Crash

    monkeypatch.setattr(TrainingRun, "iteration_done", iteration_done)


def checkpoint_step(path: Path) -> int:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return int(f.metadata()["step"])


@pytest.mark.parametrize("k, init", [(80, "k-means++"), (12, "random")])  # bounded and plain
def test_kmeans_resumes_from_its_checkpoint_to_the_uninterrupted_result(
    blobs, tmp_path, monkeypatch, k, init
):
    ref = vq.kmeans(blobs, k, niter=9, init=init, seed=3)
    path = tmp_path / "km.safetensors"
    crash_after(monkeypatch, 5)
    with pytest.raises(Crash):
        vq.kmeans(blobs, k, niter=9, init=init, seed=3, checkpoint=path, checkpoint_every=2)
    assert checkpoint_step(path) == 4
    resumed = vq.kmeans(blobs, k, niter=9, init=init, seed=3, checkpoint=path, checkpoint_every=2)
    np.testing.assert_array_equal(resumed.centroids, ref.centroids)
    np.testing.assert_array_equal(resumed.objective, ref.objective)
    np.testing.assert_array_equal(resumed.assignments, ref.assignments)
    assert checkpoint_step(path) == 9  # the last iteration is always saved
    again = vq.kmeans(blobs, k, niter=9, init=init, seed=3, checkpoint=path, checkpoint_every=2)
    np.testing.assert_array_equal(again.centroids, ref.centroids)  # finished: nothing to redo


def test_lbg_resumes_within_a_round(blobs, tmp_path, monkeypatch):
    ref = vq.lbg(blobs, 24, niter=3)
    path = tmp_path / "lbg.safetensors"
    crash_after(monkeypatch, 7)  # rounds of 3 iterations: inside the third round
    with pytest.raises(Crash):
        vq.lbg(blobs, 24, niter=3, checkpoint=path)
    assert checkpoint_step(path) == 7
    resumed = vq.lbg(blobs, 24, niter=3, checkpoint=path)
    np.testing.assert_array_equal(resumed.centroids, ref.centroids)
    np.testing.assert_array_equal(resumed.objective, ref.objective)


def test_checkpoints_block_resumes_every_stage_of_a_quantizer(blobs, tmp_path, monkeypatch):
    def fit():
        return vq.ResidualVQ(32, 3, 16, niter=6, refine_iters=1).fit(blobs).codebooks

    ref = fit()
    crash_after(monkeypatch, 4, name="0001-kmeans.safetensors")  # in the second stage
    with checkpoints(tmp_path, every=3), pytest.raises(Crash):
        fit()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["0000-kmeans.safetensors", "0001-kmeans.safetensors"]
    assert [checkpoint_step(tmp_path / n) for n in names] == [6, 3]
    with checkpoints(tmp_path, every=3):
        resumed = fit()
    torch.testing.assert_close(resumed, ref, rtol=0, atol=0)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [f"000{i}-kmeans.safetensors" for i in range(3)]
    assert [checkpoint_step(tmp_path / n) for n in names] == [6, 6, 6]


def test_a_checkpoint_of_another_run_is_refused(blobs, tmp_path):
    path = tmp_path / "km.safetensors"
    vq.kmeans(blobs, 8, niter=2, checkpoint=path)
    with pytest.raises(ValueError, match="a checkpoint of another training"):
        vq.kmeans(blobs, 8, niter=3, checkpoint=path)
    with pytest.raises(ValueError, match="same settings but other training data"):
        vq.kmeans(blobs[::-1].copy() + 1.0, 8, niter=2, checkpoint=path)
    with pytest.raises(ValueError, match="a checkpoint of another training"):
        vq.lbg(blobs, 8, niter=2, checkpoint=path)
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(ValueError, match=r"unreadable training checkpoint .* delete"):
        vq.kmeans(blobs, 8, niter=2, checkpoint=path)
    with pytest.raises(ValueError, match="checkpoint_every must be >= 1"):
        vq.kmeans(blobs, 8, niter=2, checkpoint=path, checkpoint_every=0)


def test_checkpoint_writes_are_atomic(blobs, tmp_path, monkeypatch):
    """A crash while writing leaves the previous checkpoint whole and no temporary file."""
    import safetensors.torch

    path = tmp_path / "km.safetensors"
    vq.kmeans(blobs, 8, niter=2, checkpoint=path)
    before = path.read_bytes()

    def failing_save(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(safetensors.torch, "save_file", failing_save)
    with pytest.raises(OSError, match="disk full"):
        vq.kmeans(blobs, 8, niter=4, checkpoint=tmp_path / "other.safetensors")
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["km.safetensors"]


# -- shards without a process group ------------------------------------------------------------
def test_whole_shards_are_the_single_process_sample(blobs):
    x = torch.from_numpy(blobs)
    s = Shards.whole(x)
    assert s.n == 10_000 and s.offset == 0 and not s.distributed
    from vq.clustering.seeding import sample_rows

    a = s.subsample(500, torch.Generator().manual_seed(1)).local
    b = sample_rows(x, 500, torch.Generator().manual_seed(1))
    assert torch.equal(a, b)
    assert torch.equal(
        s.sample(7, torch.Generator().manual_seed(2)),
        sample_rows(x, 7, torch.Generator().manual_seed(2)),
    )
    assert s.subsample(10**6, torch.Generator()).local is x
    assert Shards.of(x).distributed is False  # no process group


def test_atomic_files_get_the_permissions_of_a_plain_write(tmp_path):
    from vq.parallel.atomic import write_json, write_safetensors

    plain = tmp_path / "plain"
    plain.write_text("")  # what open(path, "w") gives under this process's umask
    expected = plain.stat().st_mode & 0o777
    new = tmp_path / "codebook.safetensors"
    write_safetensors(new, {"c": torch.zeros(2)}, {"kind": "test"})
    assert new.stat().st_mode & 0o777 == expected
    new.chmod(0o640)  # a rewrite keeps the replaced file's mode
    write_safetensors(new, {"c": torch.ones(2)}, {"kind": "test"})
    assert new.stat().st_mode & 0o777 == 0o640
    write_json(tmp_path / "meta.json", {"a": 1})
    assert (tmp_path / "meta.json").stat().st_mode & 0o777 == expected
