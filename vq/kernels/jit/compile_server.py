"""The compile server of :mod:`vq.kernels.jit.background` (``python -m
vq.kernels.jit.compile_server``, started by a process whose calls hand their compiles over).

It reads jobs from its stdin, its parent's pipe — each a 4-byte little-endian length and a
pickle of ``(module, qualname, specialisation, argtypes)`` — compiles each kernel for those
numba types into the disk cache (:func:`vq.kernels.jit.cache.compile_types`), one after another in
the order they came, and answers ``ok N`` or ``failed N`` on its stdout (N counts the jobs from
0). It ends when its parent closes the pipe and every job read is done.
"""

from __future__ import annotations

import importlib
import os
import pickle
import struct
import sys
from collections.abc import Iterator

from vq.kernels.jit.cache import compile_types, specialise
from vq.kernels.jit.numba_compat import Dispatcher


def _jobs_from(stream) -> Iterator[tuple]:
    while True:
        head = stream.read(4)
        if len(head) < 4:
            return
        (n,) = struct.unpack("<I", head)
        yield pickle.loads(stream.read(n))  # (its parent's pipe: nothing read from the disk)


def _resolve(module: str, qualname: str, specialisation) -> Dispatcher:
    """The kernel a job names: a module's, or a specialised module's (made again here)."""
    if specialisation is not None:
        template, constants = specialisation
        owner = specialise(template, **dict(constants))
    else:
        owner = importlib.import_module(module)
    target = owner
    for part in qualname.split("."):
        target = getattr(target, part)
    return target


def serve(stdin, stdout) -> None:
    """Compile each job read from ``stdin`` into the disk cache, answering on ``stdout``."""
    for number, (module, qualname, specialisation, argtypes) in enumerate(_jobs_from(stdin)):
        try:
            compile_types(_resolve(module, qualname, specialisation), argtypes)
            word = "ok"
        except Exception:  # the caller compiles it again itself, and sees the error
            word = "failed"
        stdout.write(f"{word} {number}\n".encode())
        stdout.flush()


if __name__ == "__main__":
    try:
        os.nice(5)  # the parent's calls go on meanwhile: they keep the cores
    except OSError:
        pass
    serve(sys.stdin.buffer, sys.stdout.buffer)
