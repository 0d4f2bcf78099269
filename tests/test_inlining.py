"""vq.kernels.jit.numba_compat.install_inliner: numba's IR inliner copies a callee's scope once
per inline call instead of once per block, and compiles the same code."""

import copy
import gc
import os
import re
import subprocess
import sys

import numba
import numpy as np
import pytest
from numba.core import inline_closurecall, ir

from vq.kernels.jit import numba_compat

pytestmark = pytest.mark.skipif(
    os.environ.get("NUMBA_DISABLE_JIT") == "1", reason="needs numba's compiler"
)


@numba.njit(inline="always")
def _clipped_sum(x, lo, hi):  # several blocks and a dozen variables: what a heap step looks like
    total = 0.0
    count = 0
    for i in range(x.shape[0]):
        v = x[i]
        if v < lo:
            v = lo
        elif v > hi:
            v = hi
        else:
            count += 1
        total += v
    return total, count


def _caller(x):
    a, n = _clipped_sum(x, -1.0, 1.0)
    b, m = _clipped_sum(x, -0.5, 0.5)
    return a + b, n + m


def _compile(x, *, vq_copies: bool, as_kernel: bool = False):
    """A fresh dispatcher of _caller compiled with the inliner as vq installs it, or as numba
    ships it, as one of vq's kernels compiles (``as_kernel``: inside
    ``numba_compat.collector_paused``) or not; returns (result, its assembly, Var copies made
    while compiling)."""
    assert numba_compat.install_inliner()
    worker = inline_closurecall.InlineWorker
    patched = worker.inline_ir
    copies = [0]
    original_var_copy = ir.Var.__deepcopy__

    def counting(self, memo):
        copies[0] += 1
        return original_var_copy(self, memo)

    try:
        ir.Var.__deepcopy__ = counting
        if not vq_copies:
            worker.inline_ir = patched.__wrapped__
        dispatcher = numba.njit(_caller)
        call = numba_compat.collector_paused(dispatcher) if as_kernel else dispatcher
        result = call(x)
    finally:
        ir.Var.__deepcopy__ = original_var_copy
        worker.inline_ir = patched
    (asm,) = dispatcher.inspect_asm().values()
    return result, asm, copies[0]


def _normalised(asm: str) -> str:
    """Assembly without what differs between two compilations of one function: its symbol
    names (they number the dispatcher), the sizes of strings that hold them and long numeric
    ids."""
    asm = re.sub(r"_ZN[\w$.]+", "SYM", asm)
    asm = re.sub(r'(SYM", )\d+', r"\1N", asm)  # (the size of a string holding a name)
    return re.sub(r"\b\d{4,}\b", "N", asm)


def test_inlining_copies_a_scope_once_and_compiles_the_same_code():
    x = np.linspace(-2.0, 2.0, 41)
    ours, ours_asm, ours_copies = _compile(x, vq_copies=True)
    theirs, theirs_asm, theirs_copies = _compile(x, vq_copies=False)
    clipped = np.clip(x, -1.0, 1.0).sum() + np.clip(x, -0.5, 0.5).sum()
    inside = int(((x >= -1.0) & (x <= 1.0)).sum() + ((x >= -0.5) & (x <= 0.5)).sum())
    assert ours == theirs
    assert ours[0] == pytest.approx(clipped) and ours[1] == inside
    assert _normalised(ours_asm) == _normalised(theirs_asm)
    # numba's copy walks the whole scope once per block; ours once per inline call
    assert 0 < ours_copies * 3 < theirs_copies, (ours_copies, theirs_copies)


def test_a_kernel_compile_skips_the_copy_numba_drops_and_compiles_the_same_code():
    x = np.linspace(-2.0, 2.0, 41)
    kernel, kernel_asm, kernel_copies = _compile(x, vq_copies=True, as_kernel=True)
    ours, ours_asm, ours_copies = _compile(x, vq_copies=True)
    assert kernel == ours
    assert _normalised(kernel_asm) == _normalised(ours_asm)
    # inline_ir's second copy (of its own copy, returned and dropped) is not made
    assert 0 < kernel_copies * 3 < ours_copies * 2, (kernel_copies, ours_copies)


def test_the_collector_is_off_during_a_compile_and_back_as_it_was_after():
    seen = []
    inner = numba_compat.collector_paused(lambda: seen.append(gc.isenabled()))
    outer = numba_compat.collector_paused(lambda: (seen.append(gc.isenabled()), inner()))
    was = gc.isenabled()
    try:
        gc.enable()
        outer()
        assert seen == [False, False] and gc.isenabled()
        gc.disable()  # a user who runs with the collector off keeps it off
        inner()
        assert seen[-1] is False and not gc.isenabled()
        gc.enable()
        with pytest.raises(ZeroDivisionError):  # an error in the compile resumes it too
            numba_compat.collector_paused(lambda: 1 / 0)()
        assert gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()


def test_install_is_idempotent_and_wraps_numbas_inliner_once():
    assert numba_compat.install_inliner() and numba_compat.install_inliner()
    assert numba_compat.inliner_installed()
    wrapped = inline_closurecall.InlineWorker.inline_ir
    assert getattr(wrapped, "__wrapped_by_vq__", False)
    assert not getattr(wrapped.__wrapped__, "__wrapped_by_vq__", False)
    # everything of the copy module but the block copy passes through
    assert inline_closurecall.copy.copy is copy.copy


def test_the_environment_keeps_numbas_own_inliner():
    code = (
        "from vq.kernels.jit import numba_compat\n"
        "from numba.core import inline_closurecall as icc\n"
        "import copy\n"
        "assert not numba_compat.install_inliner() and not numba_compat.inliner_installed()\n"
        "assert icc.copy is copy and not hasattr(icc.InlineWorker.inline_ir, '__wrapped_by_vq__')\n"
    )
    env = {**os.environ, "VQ_NUMBA_INLINE_COPY": "numba"}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
