"""The lean search of the HNSW kinds (see :mod:`vq.index.core.lean` for the lean path): the
descent and the beam of each query in one kernel call (``hnsw_search_lean``), on the calling
thread for a few queries, each thread claiming chunks of queries from one counter for more."""

from __future__ import annotations

import numpy as np

from vq._checks import check_positive
from vq.index.core.lean import SMALL_BATCH
from vq.index.core.searching import NO_IDS
from vq.kernels.common.bundles import Graph, plain
from vq.kernels.common.constants import metric
from vq.kernels.common.simd import NO_CLAIM
from vq.kernels.common.threads import parallel_for
from vq.kernels.graph import graph_search as graph

#: a split lean search's threads claim its queries this many at a time (a few µs each: the
#: claims cost nothing beside them, and the threads finish within a chunk of each other)
CLAIM_CHUNK = 8


def hnsw_lean_search(index):
    """The lean search of an HNSW index: a few queries in one kernel call on the calling
    thread, to ids; more split between the threads. The graph's arrays, entry point and top
    level are read once here (the lean search is rebuilt when the index changes), so that a
    single query costs the kernel and little else."""
    ip, n = metric(index.metric == "ip"), index.ntotal
    ids = index.ids.numpy() if index.ids.shape[0] == n else NO_IDS
    data, nbr0, up_off, up_nbr, *codes = index._arrays()
    arrays = plain(Graph(nbr0, up_off, up_nbr, int(index.entry_point[0]), index.max_level))
    walk = plain(graph.traversal(data, tuple(codes) or None))
    pool = index._seen_pool

    def search(q: np.ndarray, k: int, ranked: bool, params: dict):
        ef = params.get("efSearch")
        ef = index.efSearch if ef is None else check_positive(ef, "efSearch")
        if n == 0:
            return None
        out_dist, out_ids = (
            np.empty((q.shape[0], k), np.float32),
            np.empty((q.shape[0], k), np.int64),
        )
        out = (out_dist, out_ids)
        if q.shape[0] > SMALL_BATCH:  # each thread its own visit stamps, claiming chunks
            refused, claim = [], np.zeros(1, np.int64)  # of queries from one counter

            def body(t0: int, t1: int) -> None:
                seen = pool.take(1, n)
                try:
                    if not graph.hnsw_search_lean(
                        q, arrays, walk, ip, int(ef), seen, ids, claim, CLAIM_CHUNK, out
                    ):
                        refused.append(t0)
                finally:
                    pool.give_back(seen)

            parallel_for(body, -(-q.shape[0] // CLAIM_CHUNK))
            return None if refused else (out_dist, out_ids)
        seen = pool.take(1, n)
        try:
            done = graph.hnsw_search_lean(
                q, arrays, walk, ip, int(ef), seen, ids, NO_CLAIM, CLAIM_CHUNK, out
            )
        finally:
            pool.give_back(seen)
        return (out_dist, out_ids) if done else None  # (not finite: the general path says)

    # batches of more than SMALL_BATCH queries too: there the general path's fixed costs
    # (torch tensors, ids mapped in another pass) are a large part of the time
    search.splits = True
    return search
