"""Distributed training, sharded indexes, restarts, and the group a layer's training syncs over.

The two-process checks run tests/distributed_jobs.py under torchrun (``python -m
torch.distributed.run --standalone --nproc_per_node=2 tests/distributed_jobs.py <job> <dir>``,
gloo on CPU, one thread per process) and compare what the workers wrote with single-process runs
here. Each launch costs seconds (torch import, process group), so each one checks several things.
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
from distributed_jobs import (
    DIM,
    IVF,
    N,
    database,
    dataset,
    layer_training,
    lfq_entropy,
    queries,
    training_jobs,
)

import vq
from vq.distributed import ShardedIndex, merge_topk

JOBS = Path(__file__).with_name("distributed_jobs.py")  # what the torchrun workers run


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
        # inductor compiles in the worker itself: no pool of compile subprocesses whose reader
        # threads outlive the job (a fresh-clone CI run once saw rank 0 abort at exit with
        # "terminate called without an active exception"), and none to start on 2 cores
        "TORCHINDUCTOR_COMPILE_THREADS": "1",
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
    torchrun(str(JOBS), "train", str(out))
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


def test_layer_training_syncs_over_the_default_group_and_not_under_use_group_none(
    two_process_run,
):
    """A layer's training forward follows the rule fit follows: over the default group the
    processes end with the same buffers though their data differ; inside use_group(None) each
    process's buffers are those of a process training alone on its data (compiled too)."""
    _, (r0, r1), _ = two_process_run
    alone = [layer_training(0), layer_training(1)]
    assert {"vq.learner.embed_sum", "rvq.learner.embed_sum", "rvq.codebooks"} <= alone[0].keys()
    for key in alone[0]:
        np.testing.assert_array_equal(r0[f"synced {key}"], r1[f"synced {key}"], err_msg=key)
        for r, ref in zip((r0, r1), alone, strict=True):
            np.testing.assert_array_equal(r[f"local {key}"], ref[key], err_msg=key)
            if key.startswith("vq."):
                np.testing.assert_allclose(r[f"compiled {key}"], ref[key], atol=1e-5, err_msg=key)
    assert {"simvq.codebook_transform", "rvq-beam.codebooks", "rvq-cosine.codebooks"} <= set(
        alone[0]
    )
    for key in (
        "vq.codebook",
        "vq.learner.embed_sum",
        "rvq.codebooks",
        "rvq-beam.codebooks",
        "rvq-cosine.codebooks",
        "simvq.codebook_transform",
        "vq-simvq.codebook_transform",
    ):
        assert not np.allclose(r0[f"local {key}"], r1[f"local {key}"], atol=1e-3), key
        assert not np.allclose(r0[f"synced {key}"], alone[0][key], atol=1e-3), key


def test_lfq_codebook_entropy_is_over_every_process_batch(two_process_run):
    """LFQ's batch code distribution is all-reduced in training: both processes see the entropy
    of the concatenated batches; inside use_group(None), that of their own."""
    _, ranks, _ = two_process_run
    rows = np.concatenate([r["synced lfq x"].reshape(-1, 8) for r in ranks])
    layer = vq.ResidualLFQ(8, 2, num_bits=8, inv_temperature=10.0)
    everyone = layer(torch.from_numpy(rows)).codebook_entropy.detach().numpy()
    for rank, r in enumerate(ranks):
        np.testing.assert_allclose(r["synced lfq entropy"], everyone, rtol=1e-5)
        np.testing.assert_allclose(r["local lfq entropy"], lfq_entropy(rank)["entropy"], rtol=1e-6)
    assert not np.allclose(ranks[0]["local lfq entropy"], everyone, rtol=1e-3)


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


# -- one process: the pieces ----------------------------------------------------------------------


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


def test_warm_up_warms_every_shard_of_this_process(monkeypatch):
    calls = []
    monkeypatch.setattr(vq.index.Index, "warm_up", lambda self, k=None: calls.append(k) or 2)
    sharded = ShardedIndex(vq.FlatIndex(DIM))
    sharded.shards.append(vq.FlatIndex(DIM))  # as ShardedIndex.load gives one process two
    assert sharded.warm_up(5) == 4 and calls == [5, 5]


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
    with pytest.raises(SystemExit) as usage:  # (a usage error: argparse's exit, as vq's CLI)
        main(["frobnicate"])
    assert usage.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: python -m vq.distributed: argument command: invalid choice")


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


def test_sharded_range_search_and_filtered_search_equal_one_index_holding_every_shard():
    x, q = database()[:600], queries()
    a, b, whole = vq.FlatIndex(DIM), vq.FlatIndex(DIM), vq.FlatIndex(DIM)
    a.add_with_ids(x[:250], np.arange(250))
    b.add_with_ids(x[250:], np.arange(250, 600))
    whole.add(x)
    sharded = ShardedIndex(a)
    sharded._init([a, b], [0, 1], 2, None)  # two shards on this process (as load does)
    radius = float(np.median(whole.search(q, 20)[0][:, -1]))
    lims, D, ids = sharded.range_search(q, radius)
    lims0, D0, ids0 = whole.range_search(q, radius)
    np.testing.assert_array_equal(lims, lims0)
    for j in range(len(lims) - 1):
        got, want = ids[lims[j] : lims[j + 1]], ids0[lims0[j] : lims0[j + 1]]
        np.testing.assert_array_equal(np.sort(got), np.sort(want))
    allowed = np.arange(0, 600, 7)
    D1, I1 = sharded.search(q, 5, allowed=allowed)
    assert_same_neighbours(D1, I1, *whole.search(q, 5, allowed=allowed))
    assert np.isin(I1, allowed).all()
