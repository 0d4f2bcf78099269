"""The IVF kinds to and from faiss's ``IndexIVF`` family: what IVFFlat, IVFPQ and IVFSQ share
(the coarse quantizer, flat or an HNSW graph over the centroids, and the CSR lists); each kind
adds what its lists store (its ``empty_faiss`` one way, its ``from_faiss`` the other)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from vq.faiss_interop import kmeans_index_from_centroids
from vq.index.core.faiss_build import (
    faiss_bytes,
    faiss_metric,
    fill_inverted_lists,
    import_faiss,
    keep_alive,
)
from vq.index.graph.hnsw import HNSW
from vq.kernels.fastscan import fastscan_scans as packed4


def ivf_to_faiss(index):
    """The faiss IVF index of an IVF ``index`` of any kind: a flat coarse quantizer holding the
    same centroids (or the faiss twin of its graph-routed one), the same lists, ids and
    nprobe; the kind's ``_empty_faiss`` says which faiss class and what each row stores."""
    if index.spill:
        raise ValueError(
            "a spilled IVF index has no faiss counterpart (faiss stores each vector once); "
            "build it with spill=False to convert"
        )
    quantizer = import_faiss().IndexFlat(index.dim, faiss_metric(index.metric))
    quantizer.add(index.quantizer.codebook.float().cpu().numpy())
    quantizer = index.coarse_graph.to_faiss() if index.coarse_hnsw else quantizer
    out, data = index._empty_faiss(quantizer)
    keep_alive(out, quantizer)
    out.is_trained = True
    out.nprobe = index.nprobe
    fill_inverted_lists(out, data, index.offsets.cpu().numpy(), index.ids.cpu().numpy())
    out.ntotal = index.ntotal
    return out


class FaissLists(NamedTuple):
    """What a faiss ``IndexIVF`` holds besides its encoder: ``routed`` the IVF constructor's
    graph option (``{"coarse_hnsw": M}`` or empty), ``graph`` the :class:`vq.HNSW` over the
    centroids (or None), ``centroids`` float32 [nlist, d], ``codes`` one array per list (its
    stored bytes; [size, M] codes for fast-scan lists), ``ids`` int64 [ntotal] and ``offsets``
    int64 [nlist + 1]."""

    routed: dict
    graph: HNSW | None
    centroids: np.ndarray
    codes: list
    ids: torch.Tensor
    offsets: torch.Tensor

    def joined(self) -> np.ndarray:
        """Every list's bytes in list order, uint8 (empty where nothing is stored)."""
        return np.concatenate(self.codes) if self.codes else np.zeros(0, np.uint8)

    def fill(self, out):
        """``out`` (an IVF index of this nlist, its codes or vectors set) with the coarse
        quantizer, the ids and the offsets."""
        if self.graph is not None:
            out.coarse_graph = self.graph
        out.quantizer = kmeans_index_from_centroids(self.centroids)
        out.ids, out.offsets = self.ids, self.offsets
        return out


def lists_from_faiss(f, metric: str, fast_scan: bool = False) -> FaissLists:
    """The coarse quantizer and the lists of the faiss ``IndexIVF`` ``f`` (its quantizer an
    ``IndexFlat`` or an ``IndexHNSWFlat``); ``fast_scan``: block-packed 4-bit lists
    (``IndexIVFPQFastScan``), unpacked."""
    faiss = import_faiss()
    quantizer = faiss.downcast_index(f.quantizer)
    graph = (
        HNSW.from_faiss(quantizer, metric) if isinstance(quantizer, faiss.IndexHNSWFlat) else None
    )
    if graph is None and not isinstance(quantizer, faiss.IndexFlat):
        raise ValueError(
            "only IVF indexes with a flat or HNSW-flat coarse quantizer convert, got "
            f"{type(quantizer).__name__}"
        )
    centroids = graph.vectors.numpy() if graph is not None else quantizer.reconstruct_n(0, f.nlist)
    invlists = f.invlists
    sizes = np.array([invlists.list_size(i) for i in range(f.nlist)], dtype=np.int64)
    if fast_scan:  # block-packed lists, 32 vectors a block: 16 bytes per pair of codes
        pairs = -(-f.pq.M // 2)
        codes = [
            packed4.unpack_codes(
                faiss_bytes(invlists.get_codes(i), -(-int(s) // 32) * 32 * pairs).reshape(
                    -1, pairs, 32
                ),
                int(s),
            )
            for i, s in enumerate(sizes)
        ]
    else:
        size = invlists.code_size
        codes = [faiss_bytes(invlists.get_codes(i), int(s) * size) for i, s in enumerate(sizes)]
    ids = [
        faiss.rev_swig_ptr(invlists.get_ids(i), int(s)).copy() if s else np.zeros(0, np.int64)
        for i, s in enumerate(sizes)
    ]
    return FaissLists(
        {"coarse_hnsw": graph.M} if graph is not None else {},
        graph,
        centroids,
        codes,
        torch.from_numpy(np.concatenate(ids).astype(np.int64)),
        torch.from_numpy(np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)),
    )
