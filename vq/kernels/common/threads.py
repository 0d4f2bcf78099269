"""How the kernels use more than one core: vq's own small thread pool.

Every kernel is a serial numba function that releases the GIL. A parallel step is one Python
call, ``parallel_for(body, n, *args)``: the range ``[0, n)`` is cut into one contiguous slice
per thread and ``body(start, stop, *args)`` runs on each, the calling thread taking slices
too, the pool's worker threads the rest. The kernels themselves hold no parallel loop.

Why not numba's ``parallel=True``: its loop lowering about doubles the first-ever compile of a
search kernel, and its threading
layers bring trouble of their own — OpenMP shares libgomp with torch and resets torch's thread
count when its pool starts, "workqueue" aborts the process when two threads launch parallel
loops at once, and each parallel region pays a thread wake-up. Here a search of many queries
wakes the pool once per step, any number of threads may search at once (their slices queue
for the same workers), and nothing is set in the process's environment.

The thread count: :func:`set_num_threads` (also ``vq.set_num_threads``), else the
``NUMBA_NUM_THREADS`` environment variable, else the CPUs this process may run on.
:func:`serial` keeps the kernels of the calling thread on that thread alone (small calls, where
a wake-up costs more than a second core gains); a body running on a worker never fans out again.
"""

from __future__ import annotations

import numbers
import os
import queue
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from vq.kernels.jit import background

_setting: int | None = None


class _Local(threading.local):
    """Per thread: ``limit`` set by :func:`serial`, ``worker`` on a pool thread (defaults here,
    so that reading them raises nothing: a missing attribute's lookup costs more than the read)."""

    limit: int | None = None
    worker = False


_local = _Local()


def _default_count() -> int:
    value = os.environ.get("NUMBA_NUM_THREADS", "").strip()
    if value.isdigit() and int(value) > 0:
        return int(value)
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def get_num_threads() -> int:
    """How many threads a parallel kernel step of the calling thread uses."""
    if _local.worker:
        return 1
    limit = _local.limit
    n = _setting if _setting is not None else _default_count()
    return n if limit is None else min(n, limit)


def set_num_threads(n: int) -> None:
    """Use ``n`` threads (the calling one included) for each parallel kernel step, in every
    thread of the process (``torch.set_num_threads`` is torch's own and separate)."""
    global _setting
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise ValueError(f"the number of threads must be a positive integer, got {n!r}")
    _setting = int(n)


@contextmanager
def serial() -> Iterator[None]:
    """Inside, the calling thread's kernel steps run on that thread alone (other threads are
    unaffected)."""
    previous = _local.limit
    _local.limit = 1
    try:
        yield
    finally:
        _local.limit = previous


class _Step:
    """One ``parallel_for`` call: its slices, claimed one at a time by whoever is free."""

    __slots__ = ("body", "args", "bounds", "next", "pending", "error", "lock", "done", "waiting")

    def __init__(self, body: Callable, args: tuple, bounds: list[int]):
        self.body, self.args, self.bounds = body, args, bounds
        self.waiting = background.local.waiting  # the caller's compile rule, for every slice
        self.next = 0
        self.pending = len(bounds) - 1
        self.error: BaseException | None = None
        self.lock = threading.Lock()
        self.done = threading.Lock()  # held until the last slice is done (an Event costs
        self.done.acquire()  # several times as much to make and to wait on)

    def run(self) -> None:
        """Run slices until none is left unclaimed (under the caller's compile rule)."""
        previous, background.local.waiting = background.local.waiting, self.waiting
        try:
            self._run()
        finally:
            background.local.waiting = previous

    def _run(self) -> None:
        while True:
            with self.lock:
                s = self.next
                if s >= len(self.bounds) - 1:
                    return
                self.next = s + 1
            try:
                if self.error is None:
                    self.body(self.bounds[s], self.bounds[s + 1], *self.args)
            except BaseException as err:  # handed to the caller
                self.error = self.error or err
            finally:
                with self.lock:
                    self.pending -= 1
                    finished = self.pending == 0
                if finished:
                    self.done.release()


class _Pool:
    def __init__(self):
        self.tasks: queue.SimpleQueue = queue.SimpleQueue()
        self.workers = 0
        self.lock = threading.Lock()

    def ensure(self, n: int) -> None:
        if self.workers >= n:
            return
        with self.lock:
            while self.workers < n:
                name = f"vq-kernels-{self.workers}"
                threading.Thread(target=self._work, name=name, daemon=True).start()
                self.workers += 1

    def _work(self) -> None:
        _local.worker = True
        while True:
            self.tasks.get().run()


_pool = _Pool()


def _reset_after_fork() -> None:  # a forked child has none of the parent's threads
    global _pool
    _pool = _Pool()


os.register_at_fork(after_in_child=_reset_after_fork)


def parallel_for(body: Callable, n: int, *args, grain: int = 1) -> None:
    """Call ``body(start, stop, *args)`` over ``[0, n)`` in contiguous slices, one per thread
    (:func:`get_num_threads`), and return when every slice is done; the first error raised by
    a slice is raised here (the slices not yet started are skipped).

    Args:
        body: a kernel (or any function) taking the slice's bounds (ints) first.
        n: the size of the range.
        grain: slice bounds are multiples of it (but the last), e.g. a kernel's block size.
    """
    n = int(n)
    units = -(-n // grain) if n > 0 else 0
    slices = min(get_num_threads(), units)
    if slices <= 1:
        if n > 0:
            body(0, n, *args)
        return
    bounds = [min(n, (units * s // slices) * grain) for s in range(slices + 1)]
    bounds[-1] = n
    step = _Step(body, args, bounds)
    _pool.ensure(slices - 1)
    for _ in range(slices - 1):
        _pool.tasks.put(step)
    step.run()
    step.done.acquire()
    # every slice is done, but a worker (or the queue, for a worker that has not woken yet)
    # may still hold the step: drop its arguments here, so that the caller's arrays are freed
    # on the caller's thread, never on a worker during the interpreter's shutdown (a numpy
    # view of a torch tensor freed there aborts the process: torch's deleter takes the GIL)
    error, step.body, step.args, step.error = step.error, None, (), None  # (its frames too)
    if error is not None:
        raise error
