"""Kernels compiled in a background process while the calls that need them take another path.

A kernel that is neither loaded nor in the disk cache compiles when first called: seconds to
tens of seconds of numba's compiler on a machine that has compiled nothing yet. Inside
:func:`not_waiting` (``Index.search`` enters it), such a call does not wait for the compiler:
the kernel and its argument types go to a *compile server*
(:mod:`vq.kernels.jit.compile_server`: one child process per process, started on the first such
call), and the call raises :class:`KernelNotReady`, which the
caller answers by another path (a search: its torch path, the one CUDA tensors and exported
graphs take). The server compiles what it is sent, one kernel after another, into the disk
cache (:mod:`vq.kernels.jit.cache`), where a later call of the same kernel finds and loads it.
The server runs at a lower priority, so that the calls going on meanwhile keep the cores, in a
session of its own, and outlives its parent until it has compiled everything it was sent: a
short script leaves the kernels it asked for to the next process.

A step that will need a kernel later may ask for it ahead (:func:`vq.kernels.jit.cache.prefetch`):
an HNSW build hands over its linking kernels while it compiles its insertion kernel itself, so
that the two compile on two cores; the call that needs the kernel then waits for the server
(the disk cache's lock on the signature) rather than compiling it a second time.

What is never handed over: a kernel the server failed on, or compiled without leaving it in
the cache (the next call compiles in the calling process, which reports any error), one whose
module cannot be imported by name, and every call outside :func:`not_waiting` (training,
adding, ``warm_up``: they wait, as before). Nothing is handed over where the cache is in
memory only, or with ``VQ_BACKGROUND_COMPILE=0`` in the environment (or
:func:`set_enabled`). The server reads its jobs from a pipe of its parent: nothing is read
from the disk but the kernels' own modules.
"""

from __future__ import annotations

import os
import pickle
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from vq.kernels.jit.numba_compat import Dispatcher


class KernelNotReady(RuntimeError):
    """A kernel called inside :func:`not_waiting` is compiling in the background."""


class _Local(threading.local):
    waiting = True  # False inside not_waiting(): a call that would compile raises instead
    pinned = False  # inside waiting(): not_waiting() changes nothing


local = _Local()
_enabled = os.environ.get("VQ_BACKGROUND_COMPILE", "1").strip() not in ("0", "false", "no")
_lock = threading.Lock()
_changed = threading.Condition(_lock)  # notified whenever a job finishes
#: (module, qualname, argtypes) -> "pending", "done" or "failed"
_jobs: dict[tuple, str] = {}
_server: _Server | None = None


def set_enabled(enabled: bool) -> None:
    """Whether calls inside :func:`not_waiting` may hand their compiles to the server (the
    default unless ``VQ_BACKGROUND_COMPILE=0``); False: every call compiles where it is."""
    global _enabled
    _enabled = bool(enabled)


def enabled() -> bool:
    return _enabled


@contextmanager
def not_waiting() -> Iterator[None]:
    """Inside, on this thread (and the pool threads of its parallel steps), a kernel call that
    would compile raises :class:`KernelNotReady` after handing the compile to the server
    (unless inside :func:`waiting`)."""
    previous = stop_waiting()
    try:
        yield
    finally:
        local.waiting = previous


def stop_waiting() -> bool:
    """:func:`not_waiting` without a context manager (for hot paths): returns the previous
    state, which the caller puts back into ``local.waiting``."""
    previous = local.waiting
    if not local.pinned:
        local.waiting = False
    return previous


@contextmanager
def waiting() -> Iterator[None]:
    """Inside, on this thread, every kernel call that must compile compiles here, even inside
    :func:`not_waiting` (``Index.warm_up``: its point is to compile)."""
    previous = local.waiting, local.pinned
    local.waiting, local.pinned = True, True
    try:
        yield
    finally:
        local.waiting, local.pinned = previous


def hand_over(dispatcher: Dispatcher, argtypes: tuple, specialisation, ahead: bool = False) -> bool:
    """Queue ``dispatcher``'s compile for ``argtypes`` (numba types) on the server, unless
    it was queued already; False where the caller must compile it itself (see the module
    docstring). ``specialisation``: ``(template, constants)`` of a specialised module, or
    None. ``ahead``: a compile asked for before the call that needs it
    (:func:`vq.kernels.jit.cache.prefetch`), queued even on a thread that waits."""
    if (local.waiting and not ahead) or not _enabled:
        return False
    func = dispatcher.py_func
    if "<locals>" in func.__qualname__:
        return False
    key = (func.__module__, func.__qualname__, argtypes)
    with _lock:
        status = _jobs.get(key)
        if status is not None:
            return status == "pending"
        try:
            job = pickle.dumps((func.__module__, func.__qualname__, specialisation, argtypes))
            _ensure_server().send(key, job)
        except (OSError, pickle.PicklingError, TypeError, AttributeError):
            return False
        _jobs[key] = "pending"
    return True


def wait_for(dispatcher: Dispatcher, argtypes: tuple, timeout: float = 600.0) -> None:
    """Return once the server is no longer compiling ``dispatcher`` for ``argtypes`` (at once
    where that compile was never handed over), or after ``timeout`` seconds: a call that
    needs a kernel asked for ahead then loads it rather than compiling it a second time."""
    func = dispatcher.py_func
    key = (func.__module__, func.__qualname__, argtypes)
    with _changed:
        _changed.wait_for(lambda: _jobs.get(key) != "pending", timeout)


def pending() -> int:
    """How many handed-over compiles the server has not finished."""
    with _lock:
        return sum(status == "pending" for status in _jobs.values())


def wait(timeout: float | None = None) -> bool:
    """Wait until the server has finished every compile handed to it (True), or ``timeout``
    seconds (False)."""
    server = _server
    return server is None or server.idle.wait(timeout)


class _Server:
    """The compile server of this process: a child reading pickled jobs from its stdin and
    answering ``ok N`` / ``failed N`` lines, N counting the jobs from 0."""

    def __init__(self):
        env = {**os.environ, "VQ_BACKGROUND_COMPILE": "0"}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "vq.kernels.jit.compile_server"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        self.keys: list[tuple] = []
        self.idle = threading.Event()
        threading.Thread(target=self._read, name="vq-compile-server", daemon=True).start()

    def send(self, key: tuple, job: bytes) -> None:
        if self.process.poll() is not None:
            raise OSError("the compile server has exited")
        self.idle.clear()
        self.keys.append(key)
        self.process.stdin.write(struct.pack("<I", len(job)) + job)
        self.process.stdin.flush()

    def _read(self) -> None:
        for line in self.process.stdout:
            word, _, number = line.decode().partition(" ")
            self._finish(self.keys[int(number)], "done" if word == "ok" else "failed")
        with _lock:  # the server has gone: whatever it had left, the callers compile
            for key in self.keys:
                if _jobs.get(key) == "pending":
                    _jobs[key] = "failed"
            _changed.notify_all()
            self.idle.set()

    def _finish(self, key: tuple, status: str) -> None:
        with _lock:
            _jobs[key] = status
            _changed.notify_all()
            if not any(s == "pending" for s in _jobs.values()):
                self.idle.set()


def _ensure_server() -> _Server:
    global _server
    if _server is None or _server.process.poll() is not None:
        _server = _Server()
    return _server


def _reset_after_fork() -> None:  # a forked child shares neither the pipe nor the reader
    global _server, _lock, _changed
    _server, _lock = None, threading.Lock()
    _changed = threading.Condition(_lock)
    _jobs.clear()


os.register_at_fork(after_in_child=_reset_after_fork)
