"""Cheaper ``inline="always"``: numba's IR inliner copies a callee's scope once per block.

To inline a call, numba deep-copies the callee's IR block by block, each block with a fresh
memo (``InlineWorker.inline_ir``, twice per call site: the copy it edits and an untouched one it
returns). Every block refers to the function's one scope, and the scope holds every variable of
the function, so each block's copy copies all of them again: a copy costs blocks × variables,
not the size of the IR (numba issue #8989). vq's kernels inline their heaps, distances and
graph steps, and on a first search this copying was about half of what numba's compiler did
(a profile of HNSW32's first query: 20.8 s of 42 s in ``copy.deepcopy``, 924,090 variables
copied for 1,130 blocks).

:func:`install` makes the blocks of one IR that share a scope share one memo for the length of
an ``inline_ir`` call, so the scope and its variables are copied once, and the copies keep the
original's structure (one scope for all blocks, as ``copy.deepcopy`` of the whole IR would
give); what the inliner does with them after is unchanged. Nothing else in numba is touched:
only the ``copy`` name inside ``numba.core.inline_closurecall`` (used there for this one copy)
and ``InlineWorker.inline_ir``, wrapped to open and close the memos. The compiled code is the
same: the IR is the same, statement for statement and name for name.

It is installed when a kernel first compiles (a process that only loads cached kernels never
imports numba's compiler for it), only where numba's inliner is laid out as above (otherwise
numba runs as shipped), and not at all with ``VQ_NUMBA_INLINE_COPY=numba``.
"""

from __future__ import annotations

import copy
import functools
import os
import threading
from typing import Any

_lock = threading.Lock()
_state = threading.local()
_installed: bool | None = None


class _BlockCopier:
    """Stands in for the ``copy`` module inside ``numba.core.inline_closurecall``: a block
    copied during ``inline_ir`` shares the memo of the other blocks of its scope; everything
    else is :mod:`copy` itself."""

    def __init__(self, block_type: type):
        self._block_type = block_type

    def deepcopy(self, x: Any, memo: dict | None = None, _nil: Any = None) -> Any:
        memos = getattr(_state, "memos", None)
        if memo is None and memos is not None and type(x) is self._block_type:
            memo = memos.setdefault(id(x.scope), {})  # the memo keeps the scope (and its id) alive
        return copy.deepcopy(x, memo)

    def __getattr__(self, name: str) -> Any:
        return getattr(copy, name)


def install() -> bool:
    """Share one memo among the blocks of a scope in numba's IR inliner (see the module);
    True where it is installed. Idempotent and thread-safe."""
    global _installed
    if _installed is not None:
        return _installed
    with _lock:
        if _installed is not None:
            return _installed
        _installed = _patch()
    return _installed


def _patch() -> bool:
    if os.environ.get("VQ_NUMBA_INLINE_COPY", "").strip().lower() == "numba":
        return False
    try:
        from numba.core import inline_closurecall, ir
    except ImportError:
        return False
    worker = getattr(inline_closurecall, "InlineWorker", None)
    original = getattr(worker, "inline_ir", None)
    block = getattr(ir, "Block", None)
    # only numba's layout this was written for: the module's `copy` is the copy module itself
    if inline_closurecall.__dict__.get("copy") is not copy or original is None or block is None:
        return False

    @functools.wraps(original)
    def inline_ir(self, *args, **kwargs):
        outer = getattr(_state, "memos", None)
        _state.memos = {}
        try:
            return original(self, *args, **kwargs)
        finally:
            _state.memos = outer

    inline_ir.__wrapped_by_vq__ = True
    worker.inline_ir = inline_ir
    inline_closurecall.copy = _BlockCopier(block)
    return True


def installed() -> bool:
    """Whether :func:`install` has patched numba's inliner in this process."""
    return bool(_installed)
