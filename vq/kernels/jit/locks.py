"""Locks between the processes that share a kernel cache folder."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path


@contextmanager
def locked(path: str) -> Iterator[None]:
    """An exclusive lock on ``path`` between processes (none where the platform has no flock:
    the hashed names of the cache entries alone still keep every entry's code its own)."""
    try:
        import fcntl
    except ImportError:  # (Windows)
        yield
        return
    with open(path, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextmanager
def compiling(folder: Path, key: str) -> Iterator[None]:
    """Held while this process compiles the kernel signature ``key`` (its module, name and
    argument types) into the cache ``folder``: an exclusive lock, shared by every process using
    the folder, on a file named by the key. Processes that start together on a cold cache
    (torchrun's, pytest's workers, ``vq warmup --jobs``) would each compile the same kernel at
    once; with the lock one compiles and saves it, and the others, waiting, then load it (the
    caller looks in the cache again once it holds the lock). Other kernels and other argument
    types compile side by side. The file goes when its compile is done (a process that opened
    it before then still waits for the compile, one that opens it after finds the kernel); no
    lock where the folder cannot hold one."""
    path = folder / "compiling" / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.lock"
    held = ExitStack()
    try:
        path.parent.mkdir(exist_ok=True)
        held.enter_context(locked(str(path)))
    except OSError:  # (the folder went read-only: compile unlocked, as without a cache)
        held.close()
        yield
        return
    with held:
        try:
            yield
        finally:
            with suppress(OSError):
                path.unlink()
