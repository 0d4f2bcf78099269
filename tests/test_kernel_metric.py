"""The metric as a type (vq.kernels.metric): each metric compiles its own code, a constant in
it, and the calls that share a configuration share one compiled kernel."""

from __future__ import annotations

import numpy as np
from numba import njit, types

import vq
from vq.kernels import graph
from vq.kernels.metric import IP, L2, MetricType, constant_metric, metric


@njit
def _scaled_sum(m, x):
    total = 0.0
    for v in x:
        total += -v if m else v
    return total


def test_each_metric_is_a_type_of_its_own_whose_truth_is_the_metric():
    assert metric(True) is IP and metric(False) is L2 and metric(IP) is IP
    assert bool(IP) and not bool(L2)
    x = np.arange(4, dtype=np.float64)
    assert _scaled_sum(IP, x) == -6.0 and _scaled_sum(L2, x) == 6.0
    kinds = {sig[0] for sig in _scaled_sum.signatures}
    assert kinds == {MetricType(True), MetricType(False)}
    assert constant_metric(MetricType(True)) is True and constant_metric(MetricType(False)) is False


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
        if sig[4] == sig[3] and sig[7] == MetricType(False)
    ]
    assert len(float_l2) == 1, float_l2
    assert all(t.mutable for t in float_l2[0] if isinstance(t, types.Array))
