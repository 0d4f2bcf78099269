"""Values the kernels compile in as constants (vq.kernels.common.constants): each metric and each
scalar-quantizer kind compiles its own code, and the calls that share a configuration share
one compiled kernel."""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit, types
from numba.core.errors import TypingError

import vq
from vq import kernels
from vq.index.core.searching import NO_IDS
from vq.kernels.common import select
from vq.kernels.common.bundles import SQCodes, TopK, finish_bundle
from vq.kernels.common.constants import IP, L2, Static, StaticType, constant_metric, metric
from vq.kernels.exact import exact_scans as exact
from vq.kernels.graph import graph_search as graph
from vq.kernels.sq import sq_scans as sq


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
    ones = np.ones(8, np.float32)
    codes = SQCodes(np.zeros((4, 8), np.uint8), ones, ones)
    out = TopK(np.empty((1, 2), np.float32), np.empty((1, 2), np.int64))
    with pytest.raises(TypingError, match=r"pass vq.kernels.sq.sq_scans.sq_kind\(kind\)"):
        sq.sq_flat_range(0, 1, ones[None], codes, sq.SQ8, np.zeros(0, np.uint8), False, out)


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
    float_l2 = [  # (walk = Walk(store, data): a float traversal reads data itself)
        sig
        for sig in graph.hnsw_search_range.signatures
        if sig[4].types[0] == sig[4].types[1] and sig[5] == L2._numba_type_
    ]
    assert len(float_l2) == 1, float_l2
    assert all(t.mutable for t in _arrays(float_l2[0]))


def _arrays(types_: tuple) -> list:
    """The array types in a signature, those in (named) tuples too."""
    found = []
    for t in types_:
        if isinstance(t, types.BaseTuple):
            found += _arrays(t.types)
        elif isinstance(t, types.Array):
            found.append(t)
    return found


@njit
def _l2_sum(x):
    return _signed_sum(L2, x)  # a static named inside a kernel (a global constant)


def test_a_kernel_may_name_a_static_metric():
    x = np.arange(4, dtype=np.float64)
    assert _l2_sum(x) == 6.0
    assert {sig[0] for sig in _signed_sum.signatures} >= {L2._numba_type_}


def test_the_wrappers_hand_the_kernels_a_static_metric_not_a_bool():
    rng = np.random.default_rng(1)
    q, x = rng.standard_normal((3, 8)).astype(np.float32), rng.standard_normal((40, 8))
    products = q @ x.astype(np.float32).T
    norms = (x * x).sum(1).astype(np.float32)
    dist, idx = np.empty((3, 4), np.float32), np.empty((3, 4), np.int64)
    for inner_product in (True, False):
        kernels.smallest_k_rows(products, q, norms, inner_product, dist, idx)
        ranked = (
            -products if inner_product else (q * q).sum(1, keepdims=True) + norms - 2 * products
        )
        np.testing.assert_array_equal(idx, np.argsort(ranked, axis=1, kind="stable")[:, :4])
    metrics = {sig[5] for sig in select.smallest_k_range.signatures}
    assert metrics == {IP._numba_type_, L2._numba_type_}, metrics  # no run-time bool


def test_a_lean_search_compiles_its_last_step_once_with_or_without_reranking():
    # the re-ranking is a value of the Finish bundle: none, float32 vectors and fp16 bits share
    # finish_lean's one signature (and so every lean kernel's), each giving its own results
    dist = np.array([[0.5, 1.0, np.inf]], np.float32)
    rows = np.array([[2, 0, -1]], np.int64)
    ids = np.array([10, 11, 12], np.int64)
    q = np.array([[1.0, 0.0]], np.float32)
    vectors = np.array([[0.0, 0.0], [1.0, 0.5], [3.0, 0.0]], np.float32)  # rows 10..12 -> 0..2
    results, signatures = [], []
    for bundle in (
        finish_bundle(ids),
        finish_bundle(ids - 10, vectors, np.array([7, 8, 9], np.int64)),
        finish_bundle(ids - 10, vectors.astype(np.float16).view(np.uint16), NO_IDS),
    ):
        out_dist, out_ids = np.empty((1, 4), np.float32), np.empty((1, 4), np.int64)
        exact.finish_lean(q, dist.copy(), rows.copy(), bundle, L2, out_dist, out_ids)
        results.append((out_dist, out_ids))
        signatures.append(len(exact.finish_lean.signatures))
    np.testing.assert_array_equal(results[0][1], [[12, 10, -1, -1]])
    np.testing.assert_array_equal(results[0][0], [[0.5, 1.0, np.inf, np.inf]])
    # re-ranked: candidates rows 2 and 0 by their exact distances to q (4.0 and 1.0)
    np.testing.assert_array_equal(results[1][1], [[7, 9, -1, -1]])
    np.testing.assert_array_equal(results[1][0], [[1.0, 4.0, np.inf, np.inf]])
    np.testing.assert_array_equal(results[2][1], [[0, 2, -1, -1]])
    np.testing.assert_array_equal(results[2][0], [[1.0, 4.0, np.inf, np.inf]])
    assert signatures[0] == signatures[1] == signatures[2], exact.finish_lean.signatures
    with pytest.raises(TypeError, match="float32 or uint16"):
        finish_bundle(ids, vectors.astype(np.float64), ids)
