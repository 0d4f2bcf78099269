"""bench.graph_peers' adapters at a tiny size: each skips where its library is not installed
(the test extra holds them, so ``make test`` runs them all)."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench import graph_peers
from vq.datasets import anisotropic_vectors, ground_truth, recall_at

N, NQ, DIM = 2000, 40, 16
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def data():
    both = anisotropic_vectors(N + NQ, DIM, decay=0.9, seed=3)
    x, q = np.ascontiguousarray(both[:N]), np.ascontiguousarray(both[N:])
    return x, q, ground_truth(x, q, 10)[1]


PEERS = {
    "usearch": ("usearch", lambda x, q: graph_peers.usearch_points(x, q, 16, 1, [10, 200])),
    "ngt": ("ngtpy", lambda x, q: graph_peers.ngt_points(x, q, 1, [0.0, 0.2])),
    "svs": ("svs", lambda x, q: graph_peers.svs_points(x, q, 32, 1, [10, 200], window=64)),
}


@pytest.mark.parametrize("peer", sorted(PEERS))
def test_a_graph_peer_finds_the_neighbours_and_holds_at_least_its_vectors(data, peer):
    module, build = PEERS[peer]
    pytest.importorskip(module)
    x, q, truth = data
    points, held = build(x, q)
    assert len(points) == 2
    (narrow, search_narrow), (wide, search_wide) = points
    found = search_wide()
    assert found.shape == (NQ, 10) and found.dtype.kind in "iu"
    assert recall_at(found, truth, 10) >= 0.97, wide  # the widest search is nearly exact
    assert recall_at(search_narrow(), truth, 10) <= recall_at(found, truth, 10), narrow
    per_vector = held() / N
    assert 4 * DIM <= per_vector <= 4 * DIM + 2000  # the float32 vectors and a graph's links


def test_svs_lvq_either_builds_or_says_why_not():
    pytest.importorskip("svs")
    refusal = graph_peers.svs_lvq_refusal()
    assert refusal is None or refusal.startswith("exit code ")


_LOAD_ORDER = """
import numpy as np
from bench import graph_peers
graph_peers._import_usearch()  # first (as bench.frontier builds them), and before torch or faiss
x = np.random.default_rng(0).standard_normal((300, 8)).astype(np.float32)
points, _ = graph_peers.ngt_points(x, x[:5], 1, [0.1])
assert (points[0][1]()[:, 0] == range(5)).all()
"""


def test_ngt_still_builds_in_a_process_that_loaded_usearch_first():
    pytest.importorskip("usearch")
    pytest.importorskip("ngtpy")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    done = subprocess.run([sys.executable, "-c", _LOAD_ORDER], capture_output=True, text=True,
                          env=env, cwd=ROOT)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
