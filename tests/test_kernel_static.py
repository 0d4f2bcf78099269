"""Values the kernels compile in as constants (vq.kernels.static): each metric and each
scalar-quantizer kind compiles its own code, and the calls that share a configuration share
one compiled kernel."""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit, types
from numba.core.errors import TypingError

import vq
from vq.kernels import graph, sq
from vq.kernels.static import IP, L2, Static, StaticType, constant_metric, metric


@njit
def _signed_sum(m, x):
    total = 0.0
    for v in x:
        total += -v if m else v
    return total


@njit
def _is_sq4(kind):
    return 1 if kind == sq.SQ4 else (2 if sq.SQ6 == kind else 0)


def test_each_metric_is_a_type_of_its_own_whose_truth_is_the_metric():
    assert metric(True) is IP and metric(False) is L2 and metric(IP) is IP
    assert bool(IP) and not bool(L2)
    x = np.arange(4, dtype=np.float64)
    assert _signed_sum(IP, x) == -6.0 and _signed_sum(L2, x) == 6.0
    assert {sig[0] for sig in _signed_sum.signatures} == {IP._numba_type_, L2._numba_type_}
    assert constant_metric(IP._numba_type_) is True and constant_metric(types.boolean) is None


def test_a_static_kind_compares_as_its_value_in_a_kernel_and_in_python():
    four, six, eight = sq.sq_kind(sq.SQ4), sq.sq_kind(sq.SQ6), sq.sq_kind(sq.SQ8)
    assert [_is_sq4(k) for k in (four, six, eight)] == [1, 2, 0]
    assert len({sig[0] for sig in _is_sq4.signatures}) == 3
    assert four == sq.SQ4 and four != sq.SQ8 and sq.sq_kind(four) is four
    assert isinstance(four._numba_type_, StaticType) and Static(2, "x") == four
    with pytest.raises(ValueError, match="unknown scalar-quantizer kind 7"):
        sq.sq_kind(7)


def test_a_scan_refuses_a_kind_that_is_not_a_compile_time_constant():
    codes = np.zeros((4, 8), np.uint8)
    ones = np.ones(8, np.float32)
    dist, idx = np.empty((1, 2), np.float32), np.empty((1, 2), np.int64)
    with pytest.raises(TypingError, match=r"pass vq.kernels.sq.sq_kind\(kind\)"):
        sq.sq_flat_range(0, 1, ones[None], codes, ones, ones, sq.SQ8, np.zeros(0, np.uint8),
                         False, dist, idx)  # fmt: skip


def test_the_lean_and_the_general_graph_search_share_one_compiled_range_kernel():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((300, 8)).astype(np.float32)
    frozen = x[:3].copy()
    frozen.setflags(write=False)  # a read-only query array runs the same code
    index = vq.HNSW(8, M=4, efConstruction=16)
    index.add(x)
    lean = index.search(frozen, 5)
    filtered = index.search(frozen, 5, allowed=np.arange(300))
    np.testing.assert_array_equal(lean[1], filtered[1])  # (numpy in, numpy out)
    float_l2 = [
        sig
        for sig in graph.hnsw_search_range.signatures
        if sig[4] == sig[3] and sig[7] == L2._numba_type_
    ]
    assert len(float_l2) == 1, float_l2
    assert all(t.mutable for t in float_l2[0] if isinstance(t, types.Array))
