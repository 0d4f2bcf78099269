"""What the indexes' ``to_faiss`` methods share (``pip install 'vq[faiss]'``).

Each index kind converts itself both ways, next to its class (``faiss_counterpart`` and the
classmethod ``from_faiss``, importing faiss only when called); :func:`vq.index.from_faiss`
finds the kind of a faiss index in the registry (:mod:`vq.index.core.registry`). This module
knows no index kind: it is below them all, and faiss is imported only inside its functions.
"""

from __future__ import annotations

import numpy as np
import torch

from vq.faiss_interop import pack_codes, unpack_codes


def import_faiss():
    """The faiss module, or ImportError saying how to install it."""
    try:
        import faiss
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError("faiss is not installed: pip install 'vq[faiss]'") from err
    return faiss


def faiss_metric(metric: str) -> int:
    """faiss's metric constant for "l2" or "ip"."""
    faiss = import_faiss()
    return faiss.METRIC_L2 if metric == "l2" else faiss.METRIC_INNER_PRODUCT


def keep_alive(findex, *objects):
    """``findex``, keeping the Python objects it points to alive as long as it is."""
    findex.referenced_objects = [*getattr(findex, "referenced_objects", []), *objects]
    return findex


def with_id_map(findex, ids: torch.Tensor):
    """``findex`` wrapped in an ``IndexIDMap`` holding ``ids`` (int64 [ntotal]), or as it is
    where the ids are 0, 1, …, ntotal - 1."""
    faiss = import_faiss()
    ids = ids.cpu()
    if torch.equal(ids, torch.arange(ids.shape[0])):
        return findex
    ntotal, findex.ntotal = findex.ntotal, 0  # faiss wraps only empty indexes
    try:
        out = keep_alive(faiss.IndexIDMap(findex), findex)
    finally:
        findex.ntotal = ntotal
    faiss.copy_array_to_vector(ids.numpy().astype(np.int64), out.id_map)
    out.ntotal = ntotal
    return out


def copy_codebooks(pq, fpq) -> None:
    """A :class:`vq.ProductQuantizer`'s codebooks into a ``faiss.ProductQuantizer``."""
    import_faiss().copy_array_to_vector(pq.codebooks.float().cpu().numpy().ravel(), fpq.centroids)


def code_bytes(codes: torch.Tensor, nbits: int) -> np.ndarray:
    """[n, M] codes → faiss's packed layout, uint8 [n, code_size]."""
    return pack_codes(codes.cpu().numpy(), nbits)


def metric_of(findex) -> str:
    """ "l2" or "ip": the metric of a faiss index (ValueError for any other)."""
    faiss = import_faiss()
    if findex.metric_type == faiss.METRIC_L2:
        return "l2"
    if findex.metric_type == faiss.METRIC_INNER_PRODUCT:
        return "ip"
    raise ValueError(
        f"only L2 and inner-product faiss indexes convert, got metric {findex.metric_type}"
    )


def faiss_bytes(ptr, n: int) -> np.ndarray:
    """A copy of ``n`` bytes at a faiss (SWIG) pointer: uint8 [n]."""
    return import_faiss().rev_swig_ptr(ptr, n).copy() if n else np.zeros(0, np.uint8)


def fast_scan_M(fpq) -> int:
    """The M of a fast-scan ``faiss.ProductQuantizer`` (ValueError for an odd one: vq's
    fast-scan packs sub-quantizers in pairs)."""
    if fpq.M % 2:
        raise ValueError(
            f"vq's fast-scan packs sub-quantizers in pairs; this faiss index has M={fpq.M}"
        )
    return fpq.M


def pq_codes_from_faiss(raw: np.ndarray, fpq) -> torch.Tensor:
    """faiss's packed PQ codes (uint8, ``fpq.code_size`` bytes a vector) → [n, M] codes."""
    return torch.from_numpy(unpack_codes(raw, fpq.M, fpq.nbits))


def fill_inverted_lists(findex, data: np.ndarray, offsets: np.ndarray, ids: np.ndarray) -> None:
    """Add CSR inverted lists to an empty faiss ``IndexIVF`` (whose ``ntotal`` the caller
    sets): list l holds rows ``offsets[l]:offsets[l + 1]`` of ``data`` (uint8 [ntotal,
    code_size]) and ``ids`` (int64 [ntotal])."""
    faiss = import_faiss()
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    for lst in range(len(offsets) - 1):
        s, e = int(offsets[lst]), int(offsets[lst + 1])
        if e > s:
            block = np.ascontiguousarray(data[s:e])
            findex.invlists.add_entries(lst, e - s, faiss.swig_ptr(ids[s:e]), faiss.swig_ptr(block))
