"""Threads and crashes: searches from many threads give the sequential results; add/remove_ids
and save run safely beside them (a readers-writer lock per index); a process killed mid-save
leaves the previous file intact; numba's non-thread-safe "workqueue" layer does not abort."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import index_kinds
import numpy as np
import pytest
import torch

import vq
from vq.datasets import clustered_vectors
from vq.index.core.locking import ReadWriteLock
from vq.quantizers import OPQ, ProductQuantizer

THREADS, SEARCHES = 8, 100
#: every registered kind (tests/index_kinds.py), and a wrapper chain
KINDS = [*index_kinds.KINDS.values(), "OPQ8,IVF16,PQ8,RFlat"]


@pytest.fixture(scope="module")
def data():
    x = clustered_vectors(3000, 32, n_clusters=40, seed=7)
    return x, clustered_vectors(400, 32, n_clusters=40, seed=8)


def build(desc: str, x: np.ndarray):
    index = vq.index_factory(32, desc)
    for m in index.modules():
        if isinstance(m, OPQ):
            m.niter, m.niter_pq, m.niter_pq_0 = 2, 2, 2
        elif isinstance(m, ProductQuantizer):
            m.niter = 4
    index.train(x)
    index.add(x)
    return index


def run_threads(target, n: int) -> list[BaseException]:
    """Run ``target(i)`` in ``n`` threads started together; the exceptions they raised."""
    errors: list[BaseException] = []
    start = threading.Barrier(n)

    def body(i):
        start.wait()
        try:
            target(i)
        except BaseException as err:  # noqa: BLE001 - reported to the test
            errors.append(err)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    return errors


@pytest.mark.parametrize("desc", KINDS)
def test_threads_get_the_sequential_results(data, desc):
    x, q = data
    index = build(desc, x)
    options = {"nprobe": 4} if "IVF" in desc else {}
    batches = [q[4 * i : 4 * i + 4] for i in range(SEARCHES)]
    expected = [index.search(b, 10, **options) for b in batches]
    mismatches = []

    def searcher(t):
        for i in range(SEARCHES):
            j = (i + 13 * t) % SEARCHES  # threads search different batches at any moment
            D, I = index.search(batches[j], 10, **options)
            if not (np.array_equal(I, expected[j][1]) and np.array_equal(D, expected[j][0])):
                mismatches.append((t, j))

    assert run_threads(searcher, THREADS) == []
    assert mismatches == []


@pytest.mark.parametrize("desc", ["Flat", "IVF16,PQ8", "OPQ8,IVF16,PQ8,RFlat"])
def test_add_and_remove_beside_searches_are_atomic(data, desc):
    """One thread adds a batch and removes it again, over and over; searches running meanwhile
    always see the index before or after a whole add/remove, never half of one."""
    x, q = data
    index = build(desc, x[:2600])
    extra, extra_ids = x[2600:3000], np.arange(10**6, 10**6 + 400)
    queries = x[2600:2632] + 0.01  # near the batch: its presence changes the results
    without = index.search(queries, 5)
    index.add_with_ids(extra, extra_ids)
    with_batch = index.search(queries, 5)
    assert index.remove_ids(extra_ids) == 400
    assert not np.array_equal(with_batch[1], without[1])
    seen = {"with": 0, "without": 0}
    stop = threading.Event()

    def worker(i):
        if i == 0:
            try:
                for _ in range(15):
                    index.add_with_ids(extra, extra_ids)
                    index.remove_ids(extra_ids)
            finally:
                stop.set()
            return
        while not stop.is_set():
            D, I = index.search(queries, 5)
            if np.array_equal(I, with_batch[1]) and np.array_equal(D, with_batch[0]):
                seen["with"] += 1
            elif np.array_equal(I, without[1]) and np.array_equal(D, without[0]):
                seen["without"] += 1
            else:
                raise AssertionError("a search saw a half-done add or remove")

    assert run_threads(worker, 4) == []
    assert sum(seen.values()) > 0
    assert index.ntotal == 2600


def test_save_beside_searches_and_adds(tmp_path, data):
    x, q = data
    index = build("IVF16,PQ8", x[:2000])
    path = tmp_path / "index.vqi"
    sizes = []

    def worker(i):
        if i == 0:
            for s in range(2000, 3000, 100):
                index.add(x[s : s + 100])
        elif i == 1:
            for _ in range(5):
                index.save(path)
                sizes.append(vq.load_index(path).ntotal)
        else:
            for _ in range(30):
                index.search(q[:8], 5)

    assert run_threads(worker, 4) == []
    # each save holds a whole number of adds, consistent (load checks its CSR lists)
    assert all(s % 100 == 0 and 2000 <= s <= 3000 for s in sizes)
    index.save(path)
    loaded = vq.load_index(path)
    np.testing.assert_array_equal(loaded.search(q, 5)[1], index.search(q, 5)[1])


def test_modifying_an_index_from_inside_its_own_search_is_refused(data):
    x, _ = data
    index = vq.FlatIndex(32)
    index.add(x[:10])
    with index.lock.read(), pytest.raises(RuntimeError, match="from inside one of its own"):
        index.add(x[:1])
    index.add(x[:1])  # fine afterwards
    assert index.ntotal == 11


# -- the lock itself -----------------------------------------------------------------------------
def test_readers_share_and_writers_exclude():
    lock = ReadWriteLock()
    inside, both_read, log = threading.Event(), threading.Event(), []

    def reader(i):
        with lock.read():
            log.append(f"read {i}")
            if i == 0:
                inside.set()
                assert both_read.wait(10), "the second reader was kept out"
            else:
                assert inside.wait(10)
                both_read.set()

    assert run_threads(reader, 2) == []

    order = []
    holding, writer_waiting = threading.Event(), threading.Event()

    def mixed(i):
        if i == 0:  # reader holding the lock while a writer queues up
            with lock.read():
                holding.set()
                writer_waiting.wait(10)
                time.sleep(0.05)
                order.append("reader 0 done")
        elif i == 1:  # the writer
            holding.wait(10)
            writer_waiting.set()
            with lock.write():
                order.append("writer")
        else:  # a later reader: waits for the queued writer (no writer starvation)
            writer_waiting.wait(10)
            time.sleep(0.02)
            with lock.read():
                order.append("reader 2")

    assert run_threads(mixed, 3) == []
    assert order == ["reader 0 done", "writer", "reader 2"]


def test_lock_is_reentrant_and_copies_get_their_own():
    import copy

    lock = ReadWriteLock()
    with lock.write(), lock.write(), lock.read(), lock.read():
        pass
    with lock.read(), lock.read():
        pass
    index = vq.FlatIndex(4)
    twin = copy.deepcopy(index)
    assert twin.lock is not index.lock
    with index.lock.write():  # the copy is not locked with it
        twin.add(np.zeros((1, 4), np.float32))
    assert twin.ntotal == 1


# -- processes -----------------------------------------------------------------------------------
def child(script: str, *args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )


SAVER = """
    import os, sys, time
    import numpy as np
    import safetensors.torch as st
    import vq

    path, where = sys.argv[1], sys.argv[2]
    index = vq.FlatIndex(64)
    index.add(np.random.default_rng(1).standard_normal((20000, 64), dtype=np.float32))

    def half_then_hang(tensors, filename, metadata=None):  # a save killed mid-write
        blob = st.save(tensors, metadata=metadata)
        with open(filename, "wb") as f:
            f.write(blob[: len(blob) // 2])
            f.flush()
            os.fsync(f.fileno())
            print("killing point", len(blob), flush=True)
            time.sleep(120)

    def hang(src, dst):  # a save killed after writing, before the rename
        print("killing point", os.path.getsize(src), flush=True)
        time.sleep(120)

    if where == "mid-write":
        st.save_file = half_then_hang
    else:
        os.replace = hang
    index.save(path)
"""


def test_killed_save_leaves_the_previous_file(tmp_path):
    """Two saves killed (SIGKILL) at their most fragile points: half-way through writing the
    temporary file, and after writing it but before the rename."""
    old = vq.FlatIndex(64)
    old.add(np.random.default_rng(2).standard_normal((100, 64), dtype=np.float32))
    runs = {}
    for where in ("mid-write", "before-rename"):  # both children run at once
        (tmp_path / where).mkdir()
        path = tmp_path / where / "index.vqi"
        old.save(path)
        runs[where] = path, path.read_bytes(), child(SAVER, str(path), where)
    for where, (path, before, proc) in runs.items():
        try:
            line = proc.stdout.readline()  # blocks until the child reaches its killing point
            assert line.startswith("killing point"), proc.stderr.read()
            full_size = int(line.split()[-1])
            os.kill(proc.pid, signal.SIGKILL)
        finally:
            proc.kill()
            proc.wait(timeout=60)
        assert proc.returncode == -signal.SIGKILL

        # the target is untouched, and still loads as the old index
        assert path.read_bytes() == before
        loaded = vq.load_index(path)
        assert loaded.ntotal == 100 and torch.equal(loaded.vectors, old.vectors)
        # the dead process's temporary file is all that is left of the new one
        leftovers = [p for p in path.parent.iterdir() if p != path]
        assert [p.name.startswith(f".index.vqi.tmp-{proc.pid}-") for p in leftovers] == [True]
        partial = leftovers[0].stat().st_size
        assert partial == (full_size // 2 if where == "mid-write" else full_size)

    # the next save removes it (its writer is gone) and replaces the file
    old.add(np.zeros((1, 64), np.float32))
    path = runs["mid-write"][0]
    old.save(path)
    assert [p.name for p in path.parent.iterdir()] == ["index.vqi"]
    assert vq.load_index(path).ntotal == 101


WORKQUEUE = """
    import threading
    import numba
    import numpy as np
    import vq
    from vq.datasets import clustered_vectors

    x = clustered_vectors(1000, 32, n_clusters=30, seed=1)
    index = vq.index_factory(32, "IVF16,PQ8")
    index.pq.niter = 2
    index.train(x)
    index.add(x)
    batches = [x[i : i + 4] for i in range(0, 160, 4)]
    expected = [index.search(b, 5, nprobe=4)[1] for b in batches]
    bad = []

    def searcher(t):
        for i, b in enumerate(batches):
            if not np.array_equal(index.search(b, 5, nprobe=4)[1], expected[i]):
                bad.append(i)

    threads = [threading.Thread(target=searcher, args=(t,)) for t in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    try:
        layer = numba.threading_layer()
    except ValueError:  # never started
        layer = "unused"
    print(layer, len(bad))
"""


def test_workqueue_threading_layer_does_not_abort():
    """numba's workqueue layer aborts the whole process when two threads run parallel kernels
    at once; vq's kernels run on vq's own thread pool and never start numba's layer, so
    concurrent searches under that setting give the sequential answers."""
    proc = child(WORKQUEUE, env={"NUMBA_THREADING_LAYER": "workqueue"})
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-2000:]
    assert out.split() == ["unused", "0"]


def test_a_parallel_step_holds_none_of_its_arguments_once_it_returns():
    # A worker that wakes after the caller has run every slice still dequeues the step; were
    # the arguments in it then, the caller's arrays would be freed on that worker — during the
    # interpreter's shutdown, a numpy view of a torch tensor freed there aborts the process
    import gc
    import weakref

    from vq.kernels.common import threads

    release, busy = threading.Event(), threading.Semaphore(0)

    class Hold:  # a task that keeps a worker busy until released
        def run(self):
            busy.release()
            release.wait(10)

    class Arg:
        pass

    previous = threads._setting
    threads.set_num_threads(2)
    try:
        threads._pool.ensure(1)
        for _ in range(threads._pool.workers):  # every worker busy: the step stays queued
            threads._pool.tasks.put(Hold())
        for _ in range(threads._pool.workers):
            assert busy.acquire(timeout=10)
        arg = Arg()
        alive = weakref.ref(arg)
        seen = []
        threads.parallel_for(lambda s, e, a: seen.append((s, e)), 2, arg)
        assert seen == [(0, 1), (1, 2)]  # both slices on this thread
        del arg
        gc.collect()
        assert alive() is None, "the queued step still holds the arguments"
    finally:
        release.set()
        threads._setting = previous


def test_a_parallel_step_returns_after_its_slowest_slice_and_raises_a_slices_error():
    # the caller waits on a lock that the last slice to finish releases, whichever thread ran it
    from vq.kernels.common import threads

    previous = threads._setting
    threads.set_num_threads(2)
    try:
        for _ in range(5):  # the worker's slice last: the lock is released on the worker
            finished = []

            def body(s, e, log):  # this thread's slice waits for the worker to take the other
                main = threading.current_thread() is threading.main_thread()
                time.sleep(0.005 if main else 0.02)
                log.append(s)

            threads.parallel_for(body, 2, finished)
            assert sorted(finished) == [0, 1]

        def failing(s, e):
            if s == 1:
                raise ValueError("slice 1 failed")

        with pytest.raises(ValueError, match="slice 1 failed"):
            threads.parallel_for(failing, 2)
        seen = []
        threads.parallel_for(lambda s, e: seen.append(s), 2)  # the pool still serves
        assert sorted(seen) == [0, 1]
    finally:
        threads._setting = previous
