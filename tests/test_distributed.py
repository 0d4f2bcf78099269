"""Distributed training, sharded indexes and restarts (issue 8).

The two-process checks run this file as a torchrun worker (``python -m torch.distributed.run
--standalone --nproc_per_node=2 tests/test_distributed.py <job> <dir>``, gloo on CPU, one thread
per process) and compare what the workers wrote with single-process runs here. Each launch costs
seconds (torch import, process group), so each one checks several things.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import vq
from vq.datasets import clustered_vectors
from vq.distributed import ShardedIndex, Shards, checkpoints, merge_topk
from vq.distributed.checkpoint import TrainingRun

N, DIM = 6000, 32
SPLIT = 2500  # rank 0 holds rows [0, 2500), rank 1 rows [2500, 6000): uneven on purpose
IVF = "IVF16,PQ8x6"  # 64 codewords per sub-space, fewer than the blobs


def dataset() -> np.ndarray:
    """100 tight, well-separated blobs: every codebook below has fewer codewords than blobs, so
    the boundaries between cells run through empty space. (On data with points within float
    rounding of a boundary, the sums' rounding — which differs with the number of processes —
    can move such a point, and Lloyd then follows another, equally good path.)"""
    return clustered_vectors(N, DIM, n_clusters=100, spread=0.1, seed=5)


def database() -> np.ndarray:
    """Wider blobs for the search checks (few exact ties among PQ distances)."""
    return clustered_vectors(N, DIM, n_clusters=40, spread=0.5, seed=7)


def queries() -> np.ndarray:
    return clustered_vectors(50, DIM, n_clusters=40, spread=0.6, seed=7)


def assert_same_neighbours(D, ids, D_ref, ids_ref, exact=True):
    """Same distances (exactly, or to float rounding) and the same ids, ties aside: in each row
    the ids closer than the k-th distance agree as sets (which of several vectors tied at the
    k-th distance make the cut is arbitrary)."""
    if exact:
        np.testing.assert_array_equal(D, D_ref)
    else:
        np.testing.assert_allclose(D, D_ref, rtol=1e-5, atol=1e-4)
    for r in range(len(D)):
        inner = D_ref[r] < D_ref[r, -1] * (1 - 1e-6)
        assert set(ids[r][inner]) == set(ids_ref[r][inner]), f"row {r}"


@pytest.fixture(autouse=True)
def _one_thread():
    """One thread: these problems are small, and threads only contend on a shared machine."""
    import numba

    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # numpy's BLAS keeps its own threads
        from contextlib import nullcontext as threadpool_limits
    torch_threads, numba_threads = torch.get_num_threads(), numba.get_num_threads()
    torch.set_num_threads(1)
    numba.set_num_threads(1)
    with threadpool_limits(1):
        yield
    torch.set_num_threads(torch_threads)
    numba.set_num_threads(numba_threads)


def training_jobs(x) -> dict[str, np.ndarray]:
    """What the workers train on their shards and this process trains on all rows: name ->
    centroids / codebooks / rotation."""
    out = {
        "kmeans++ bounded": vq.kmeans(x, 80, niter=8).centroids,
        "kmeans random": vq.kmeans(x, 20, niter=8, init="random").centroids,
        "kmeans subsampled": vq.kmeans(x, 10, niter=6, max_points_per_centroid=64).centroids,
        "lbg": vq.lbg(x, 16, niter=4).centroids,
        "pq": vq.ProductQuantizer(DIM, 4, 6, niter=6).fit(x).codebooks,
        "pq random": vq.ProductQuantizer(DIM, 4, 5, niter=4, init="random").fit(x).codebooks,
        "rvq beam 2": vq.ResidualVQ(DIM, 2, 32, 2, niter=4, refine_iters=1).fit(x).codebooks,
    }
    opq = vq.OPQ(DIM, 4, 5, niter=2, niter_pq=2, niter_pq_0=3, pq_niter=3).fit(x)
    out["opq rotation"], out["opq codebooks"] = opq.rotation, opq.pq.codebooks
    ivfpq = vq.index_factory(DIM, IVF)
    ivfpq.train(x)
    out["ivfpq coarse"], out["ivfpq pq"] = ivfpq.quantizer.codebook, ivfpq.pq.codebooks
    return {name: np.asarray(v) for name, v in out.items()}


# -- the torchrun worker ------------------------------------------------------------------------
def _worker_train(out: Path) -> None:
    """Launch 1: training on shards, sharded search, errors raised on every process."""
    import torch.distributed as dist
    from safetensors.numpy import save_file

    rank = dist.get_rank()
    x, q = dataset(), queries()
    results = training_jobs(x[:SPLIT] if rank == 0 else x[SPLIT:])
    results["kmeans, rank 0 empty"] = vq.kmeans(x[:0] if rank == 0 else x, 70, niter=5).centroids
    # sharded indexes, on the rows the CLI test's build gives each process (an even split):
    # global ids, global top-k, saved per shard
    xb = database()
    mine = xb[: N // 2] if rank == 0 else xb[N // 2 :]
    for name, description in (("flat", "Flat"), ("ivfpq", IVF)):
        sharded = ShardedIndex(vq.index_factory(DIM, description))
        sharded.train(mine)
        sharded.add(mine)
        assert sharded.ntotal == N and sharded.local_ntotal == len(mine)
        params = {"nprobe": 4} if name == "ivfpq" else {}
        results[f"{name} D"], results[f"{name} I"] = sharded.search(q, 10, **params)
        sharded.save(out / f"{name}-shards")
    results["sharded coarse"] = sharded.index.quantizer.codebook.numpy()
    results["sharded pq"] = sharded.index.pq.codebooks.numpy()
    errors = []
    try:  # different queries on the two processes: an error on both, no hang
        sharded.search(q[: 10 + rank], 5)
    except ValueError as err:
        errors.append(str(err))
    try:  # a bad input on one process only: an error on both
        sharded.add(mine[:5, :-1] if rank == 1 else mine[:5])
    except ValueError as err:
        errors.append(str(err))
    save_file(results, str(out / f"rank{rank}.safetensors"))
    (out / f"errors{rank}.json").write_text(json.dumps(errors))


def _worker(argv: list[str]) -> None:
    import torch.distributed as dist

    from vq.distributed import init_process_group

    torch.set_num_threads(1)
    assert init_process_group("gloo")
    _worker_train(Path(argv[1]))
    dist.barrier()  # nobody tears the group down while another process still uses it
    dist.destroy_process_group()


def torchrun(*args: str, restarts: int = 0, env: dict | None = None, timeout: int = 240):
    """Run ``python -m torch.distributed.run`` with 2 CPU processes; returns the completed
    process (stdout and stderr as text)."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        f"--max-restarts={restarts}",
        *args,
    ]
    run_env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "NUMBA_NUM_THREADS": "1",
        "PYTHONWARNINGS": "ignore",
        **(env or {}),
    }
    # a session of its own, so that a timeout stops the workers too, not only torchrun
    proc = subprocess.Popen(
        cmd,
        env=run_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"torchrun timed out after {timeout} s:\n{stderr[-12000:]}")
    assert proc.returncode == 0, f"torchrun failed ({proc.returncode}):\n{stderr[-12000:]}"
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


# -- two processes ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def two_process_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist-train")
    torchrun(__file__, "train", str(out))
    from safetensors.numpy import load_file

    ranks = [load_file(str(out / f"rank{r}.safetensors")) for r in (0, 1)]
    errors = [json.loads((out / f"errors{r}.json").read_text()) for r in (0, 1)]
    return out, ranks, errors


def test_two_processes_train_what_one_process_trains_on_all_rows(two_process_run):
    _, (r0, r1), _ = two_process_run
    x = dataset()
    single = training_jobs(x)
    single["kmeans, rank 0 empty"] = vq.kmeans(x, 70, niter=5).centroids
    for name, ref in single.items():
        # every process holds the same bits...
        np.testing.assert_array_equal(r0[name], r1[name], err_msg=name)
        # ...equal to one process on the concatenated data, up to the rounding of the sums
        np.testing.assert_allclose(r0[name], ref, rtol=0, atol=2e-5, err_msg=name)


def test_sharded_search_equals_one_index_holding_every_vector(two_process_run):
    out, (r0, r1), _ = two_process_run
    xb, q = database(), queries()
    for name in ("flat D", "flat I", "ivfpq D", "ivfpq I"):  # the same answer on every process
        np.testing.assert_array_equal(r0[name], r1[name])
    flat = vq.FlatIndex(DIM)
    flat.add(xb)
    assert_same_neighbours(r0["flat D"], r0["flat I"], *flat.search(q, 10), exact=False)
    # IVFPQ: one index with the shards' trained parameters (learned from all rows) holding every
    # vector: the same codes, hence the same distances and ids
    single = vq.load_index(out / "ivfpq-shards" / "shard-00000.index")
    single.remove_ids(np.arange(N))
    single.add(xb)
    assert_same_neighbours(r0["ivfpq D"], r0["ivfpq I"], *single.search(q, 10, nprobe=4))


def test_shards_saved_by_two_processes_load_into_one(two_process_run):
    out, (r0, _), _ = two_process_run
    manifest = json.loads((out / "ivfpq-shards" / "manifest.json").read_text())
    assert manifest["num_shards"] == 2 and manifest["ntotal"] == N
    assert [s["ntotal"] for s in manifest["shards"]] == [N // 2, N // 2]
    both = ShardedIndex.load(out / "ivfpq-shards")  # no process group: one process, two shards
    assert both.shard_ids == [0, 1] and both.ntotal == N and both.local_ntotal == N
    D, ids = both.search(queries(), 10, nprobe=4)
    np.testing.assert_array_equal(ids, r0["ivfpq I"])
    np.testing.assert_array_equal(D, r0["ivfpq D"])
    with pytest.raises(ValueError, match="one shard per process"):
        both.add(dataset()[:3])


def test_errors_are_raised_on_every_process(two_process_run):
    _, _, (e0, e1) = two_process_run
    assert len(e0) == len(e1) == 2
    assert "same queries on every process" in e0[0] and "rank 0: 10, rank 1: 11" in e1[0]
    assert "could not add" in e0[1] and "rank [1]" in e0[1]
    assert "expected vectors of dim 32, got 31" in e1[1]


def test_a_worker_killed_mid_training_restarts_and_resumes(two_process_run, tmp_path):
    """torchrun --max-restarts=1 -m vq.distributed build, rank 1 exiting after k-means
    iteration 5 on the first attempt: the group restarts, resumes from the checkpoint of
    iteration 4, and the shards equal those of the uninterrupted training."""
    _, (r0, _), _ = two_process_run
    from vq.datasets import write_fvecs

    xb = database()
    write_fvecs(tmp_path / "x.fvecs", xb)
    write_fvecs(tmp_path / "q.fvecs", queries())
    argv = ["-m", "vq.distributed", "build", "--data", str(tmp_path / "x.fvecs")]
    argv += ["--index", IVF, "-o", str(tmp_path / "shards"), "--checkpoint-every", "2"]
    fault = {"VQ_FAULT_ITERATION": "5", "VQ_FAULT_RANK": "1"}
    proc = torchrun(*argv, "--quiet", "--keep-checkpoints", restarts=1, env=fault)
    log = proc.stdout + proc.stderr
    assert log.count("fault injection: rank 1 exits after iteration 5") == 1
    assert "kmeans resumed from" in log and "at iteration 4 of 10" in log
    assert "6000 vectors of dim 32 in 2 shard(s)" in log
    both = ShardedIndex.load(tmp_path / "shards")
    shard0, shard1 = both.shards
    for shard in (shard0, shard1):  # bit for bit the codebooks of the uninterrupted run
        np.testing.assert_array_equal(shard.quantizer.codebook.numpy(), r0["sharded coarse"])
        np.testing.assert_array_equal(shard.pq.codebooks.numpy(), r0["sharded pq"])
    assert (tmp_path / "shards" / "checkpoints" / "0000-kmeans.safetensors").exists()
    # the search entry point, in this process (no torchrun: one process takes both shards)
    from vq.datasets import read_ivecs
    from vq.distributed.__main__ import main

    rc = main(
        ["search", str(tmp_path / "shards"), "--queries", str(tmp_path / "q.fvecs")]
        + ["-k", "5", "--nprobe", "3", "--out", str(tmp_path / "ids.ivecs")]
    )
    assert rc == 0
    D, ids = both.search(queries(), 5, nprobe=3)
    np.testing.assert_array_equal(read_ivecs(tmp_path / "ids.ivecs"), ids)
    single = vq.load_index(tmp_path / "shards" / "shard-00000.index")
    single.remove_ids(np.arange(N))
    single.add(xb)  # the build's ids are the row numbers
    assert_same_neighbours(D, ids, *single.search(queries(), 5, nprobe=3))


# -- one process: checkpoints and resume ----------------------------------------------------------
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


# -- one process: the pieces ----------------------------------------------------------------------
def test_whole_shards_are_the_single_process_sample(blobs):
    x = torch.from_numpy(blobs)
    s = Shards.whole(x)
    assert s.n == 10_000 and s.offset == 0 and not s.distributed
    from vq.clustering import _sample_rows

    a = s.subsample(500, torch.Generator().manual_seed(1)).local
    b = _sample_rows(x, 500, torch.Generator().manual_seed(1))
    assert torch.equal(a, b)
    assert torch.equal(
        s.sample(7, torch.Generator().manual_seed(2)),
        _sample_rows(x, 7, torch.Generator().manual_seed(2)),
    )
    assert s.subsample(10**6, torch.Generator()).local is x
    assert Shards.of(x).distributed is False  # no process group


def test_merge_topk_orders_by_distance_then_id_and_puts_missing_last():
    inf = float("inf")
    d = torch.tensor([[[0.5, 2.0, inf]], [[0.5, 1.0, inf]]])
    i = torch.tensor([[[7, 3, -1]], [[4, 9, -1]]])
    D, ids = merge_topk(d, i, 5, "l2")
    assert ids.tolist() == [[4, 7, 9, 3, -1]]
    assert D.tolist() == [[0.5, 0.5, 1.0, 2.0, inf]]
    D, ids = merge_topk(-d, i, 3, "ip")  # inner products: largest first
    assert ids.tolist() == [[4, 7, 9]]
    assert D.tolist() == [[-0.5, -0.5, -1.0]]
    D, ids = merge_topk(d[:, :, :1], i[:, :, :1], 4, "l2")  # fewer than k: padded
    assert ids.tolist() == [[4, 7, -1, -1]] and D[0, 2:].tolist() == [inf, inf]


def test_one_process_sharded_index_saves_loads_and_refuses_mixed_files(tmp_path):
    x, q = database()[:500], queries()
    sharded = ShardedIndex(vq.FlatIndex(DIM))  # no process group: one shard, this process
    sharded.add(x[:300])
    sharded.add_with_ids(x[300:], np.arange(1000, 1200))
    assert sharded.ntotal == 500 and sharded.remove_ids([0, 1, 1000]) == 3
    ref = vq.FlatIndex(DIM)
    ref.add_with_ids(x, np.r_[np.arange(300), np.arange(1000, 1200)])
    ref.remove_ids([0, 1, 1000])
    D, ids = sharded.search(q, 7)
    assert_same_neighbours(D, ids, *ref.search(q, 7))
    sharded.save(tmp_path / "a")
    loaded = ShardedIndex.load(tmp_path / "a")
    assert loaded.ntotal == 497 and np.array_equal(loaded.search(q, 7)[1], ids)
    other = ShardedIndex(vq.FlatIndex(DIM))
    other.add(x[:10])
    other.save(tmp_path / "b")
    (tmp_path / "a" / "shard-00000.index").write_bytes(
        (tmp_path / "b" / "shard-00000.index").read_bytes()
    )
    with pytest.raises(ValueError, match="not the shard the manifest lists"):
        ShardedIndex.load(tmp_path / "a")
    (tmp_path / "b" / "manifest.json").write_text('{"format": "something else"}')
    with pytest.raises(ValueError, match="not a vq sharded-index manifest"):
        ShardedIndex.load(tmp_path / "b")
    with pytest.raises(FileNotFoundError, match="no sharded index at"):
        ShardedIndex.load(tmp_path / "c")
    with pytest.raises(ValueError, match="k must be a positive integer"):
        sharded.search(q, 0)


def test_entry_point_reports_bad_input_in_one_line(tmp_path, capsys):
    from vq.distributed.__main__ import main

    assert (
        main(["build", "--data", str(tmp_path / "none.fvecs"), "--index", "Flat", "-o", "x"]) == 2
    )
    assert capsys.readouterr().err.strip() == f"error: {tmp_path / 'none.fvecs'}: no such file"
    (tmp_path / "x.txt").write_text("1 2 3")
    assert main(["search", str(tmp_path), "--queries", str(tmp_path / "x.txt")]) == 2
    assert "no sharded index at" in capsys.readouterr().err
    assert main(["frobnicate"]) == 2


def test_benchmark_runs_at_a_tiny_size(tmp_path, monkeypatch):
    pytest.importorskip("faiss")  # the benchmark header names faiss's version
    import bench.common
    from bench import distributed_kmeans

    monkeypatch.setattr(bench.common, "RESULTS", tmp_path)
    rows = distributed_kmeans.main("--n 3000 --dim 8 --k 16 --niter 3 --rounds 1".split())
    assert [r["processes x threads"] for r in rows] == ["1 x 2", "1 x 1", "2 x 1"]
    two = rows[2]
    assert two["all_reduce KiB / iteration"] >= 16 * 9 * 4 / 1024  # at least k·(d+1)·4 bytes
    assert two["max abs centroid diff"] < 1e-4 and abs(two["objective / 1 x 2"] - 1) < 1e-5
    assert (tmp_path / "distributed_kmeans.csv").exists()
    assert (tmp_path / "distributed_kmeans_projection.csv").exists()


if __name__ == "__main__":
    _worker(sys.argv[1:])
