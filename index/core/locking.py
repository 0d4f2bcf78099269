"""The readers-writer lock of every index: searches (and saves) read, ``train``, ``add``,
``add_with_ids``, ``remove_ids`` and ``load_state_dict`` write.

A waiting writer goes before new readers, so that a stream of searches cannot starve an
``add``. The lean path of small searches enters as a plain reader (:meth:`ReadWriteLock.try_read`),
without the per-thread bookkeeping that nested reads need.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class ReadWriteLock:
    """Many readers or one writer; a waiting writer goes before new readers (so a stream of
    searches cannot starve an ``add``). Both sides are reentrant per thread, and the writing
    thread may also read; a thread that reads and then asks to write gets a RuntimeError (it
    would wait for itself forever)."""

    def __init__(self):
        self._mutex = threading.Lock()  # entered directly where no wait is needed (faster)
        self._cond = threading.Condition(self._mutex)
        self._readers = 0
        self._writer: int | None = None
        self._writes = 0  # the writer's nesting depth
        self._waiting_writers = 0
        self._local = threading.local()  # this thread's read depth

    @contextmanager
    def read(self) -> Iterator[None]:
        token = self.acquire_read()
        try:
            yield
        finally:
            self.release_read(token)

    def acquire_read(self) -> tuple[int, bool]:
        """``read()`` without a context manager (a few µs less per call): the token to give
        back to :meth:`release_read`."""
        depth = getattr(self._local, "depth", 0)
        nested = depth > 0 or self._writer == threading.get_ident()
        if not nested:
            with self._mutex:
                while self._writer is not None or self._waiting_writers:
                    self._cond.wait()
                self._readers += 1
        self._local.depth = depth + 1
        return depth, nested

    def try_read(self) -> bool:
        """Enter as a plain reader if no writer holds or awaits the lock (True; leave with
        :meth:`end_read`), else False (use :meth:`acquire_read`). For a reader that runs none
        of the caller's code while it reads (a lean search): it skips the per-thread depth
        that nested reads and the write-inside-read check need."""
        mutex = self._mutex
        mutex.acquire()  # (not "with": this runs on every small search)
        free = self._writer is None and not self._waiting_writers
        if free:
            self._readers += 1
        mutex.release()
        return free

    def end_read(self) -> None:
        """Leave a read entered with :meth:`try_read`."""
        with self._mutex:
            self._readers -= 1
            if not self._readers and self._waiting_writers:  # only writers wait on readers
                self._cond.notify_all()

    def release_read(self, token: tuple[int, bool]) -> None:
        depth, nested = token
        self._local.depth = depth
        if not nested:
            with self._mutex:
                self._readers -= 1
                if not self._readers and self._waiting_writers:  # only writers wait on readers
                    self._cond.notify_all()

    @contextmanager
    def write(self) -> Iterator[None]:
        me = threading.get_ident()
        with self._cond:
            if self._writer != me:
                if getattr(self._local, "depth", 0):
                    raise RuntimeError("cannot modify an index from inside one of its own searches")
                self._waiting_writers += 1
                try:
                    while self._writer is not None or self._readers:
                        self._cond.wait()
                finally:
                    self._waiting_writers -= 1
                self._writer = me
            self._writes += 1
        try:
            yield
        finally:
            with self._cond:
                self._writes -= 1
                if not self._writes:
                    self._writer = None
                    self._cond.notify_all()

    def __reduce__(self):  # copies (deepcopy, pickling by torch) get a fresh, free lock
        return (type(self), ())
