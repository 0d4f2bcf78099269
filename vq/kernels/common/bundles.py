"""The kernels' arguments with names: named tuples of the arrays that travel together.

A kernel takes a few of these instead of a long row of positional arrays. Inside a kernel an
attribute costs nothing (numba keeps a named tuple's fields as it keeps separate arguments),
and numba caches the kernels that take them. Their fields are arrays, scalars, None or plain
tuples; never a :class:`~vq.kernels.common.constants.Static` (a metric or a scalar-quantizer
kind stays an argument of its own, which numba types without Python), and never another
named tuple. A field that may be None (numba compiles away the branch a None decides) is
passed on to the function that tests it as an argument of its own: numba decides such a
branch from the types of a function's arguments, not from the fields of a tuple. A kernel
writes into a bundle's arrays through names unpacked from it (``rows, counts = ...``), never
through a field (``hits.counts[q] = c``): for a tuple that is not an argument of the function
(one it borrowed, say), numba's dead-code pass after inlining drops a store into such a field.

Cost model of a call from Python: numba's dispatcher types a named tuple in about a
microsecond (it reads the class's name and fields on every call), a plain tuple in a few tens
of nanoseconds per field. So the kernels that answer one query at a time (the lean kernels)
take the bundles that belong to an index as plain tuples (:func:`plain`, made once per index)
and name them again on their first line (``coarse = Coarse(*coarse)``: the same
types, so the kernels they call compile once for both paths); every other kernel takes named
tuples.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from vq.kernels.jit.numba_compat import pretyped


def plain(bundle: tuple) -> tuple:
    """``bundle`` as a lean kernel takes it: a plain tuple of its fields (one numba types
    without Python: :func:`vq.kernels.jit.numba_compat.pretyped`)."""
    return pretyped(tuple(bundle))


class TopK(NamedTuple):
    """The k nearest of each query, as a scan writes them."""

    distances: np.ndarray  #: float32 [nq, k], ascending (+inf padding)
    labels: np.ndarray  #: int64 [nq, k]: stored rows (or ids), -1 padding


class RangeHits(NamedTuple):
    """Where a range search writes each query's hits: query q's hits are ``rows`` and
    ``values`` from ``starts[q]`` on (room for every row it may hit), ``counts[q]`` of
    them."""

    starts: np.ndarray  #: int64 [nq]
    thresholds: np.ndarray  #: float32 [nq]: a row is a hit when its value is below
    rows: np.ndarray  #: int64 [total]
    values: np.ndarray  #: float32 [total]: squared L2, or negated inner products
    counts: np.ndarray  #: int64 [nq]


class Coarse(NamedTuple):
    """The coarse quantizer of an IVF index as the lean kernels' coarse step reads it
    (:func:`vq.kernels.exact.coarse_probe.probe_few`)."""

    #: float32 [ceil(nlist / 16), d, 16]: the centroids as columns, in panels
    #: (:func:`vq.kernels.exact.coarse_probe.column_panels`)
    panels: np.ndarray
    norms: np.ndarray  #: float32 [nlist]: their squared norms (read for L2)
    axes: np.ndarray  #: float32 [ceil(r / 16), d, 16]: the bound's r axes as column panels
    #: float32 [ceil(nlist / 16), r, 16]: the centroids' coordinates on those axes, as column
    #: panels (r = 0: no bound)
    proj: np.ndarray
    proj_norms: np.ndarray  #: float32 [nlist]: their squared norms
    rows: np.ndarray  #: float32 [nlist, d]: the centroids (C-contiguous)


class Finish(NamedTuple):
    """What the last step of a lean IVF search reads: the stored rows' ids and the re-ranking
    of a wrapping ``Refine`` (:func:`vq.kernels.exact.exact_scans.finish_lean`). One type for
    every re-ranking (none, float32 vectors, fp16 bits): a lean kernel compiles once for an
    index with or without a ``Refine`` around it (make one with :func:`finish_bundle`)."""

    ids: np.ndarray  #: int64 [n]: the id of each stored row, or [0]: the rows are the ids
    refine: int  #: 0: no re-ranking; 1: by ``ref_vectors``; 2: by ``ref_halves``
    ref_vectors: np.ndarray  #: float32 [n', d]: the Refine's vectors ([0, 0] unless refine 1)
    ref_halves: np.ndarray  #: uint16 [n', d]: their fp16 bits ([0, 0] unless refine 2)
    ref_ids: np.ndarray  #: int64 [n'] (or [0]: the rows are the ids)


_NO_VECTORS = np.zeros((0, 0), np.float32)
_NO_HALVES = np.zeros((0, 0), np.uint16)
_NO_IDS = np.zeros(0, np.int64)


def finish_bundle(ids: np.ndarray, ref_vectors: np.ndarray | None = None, ref_ids=None) -> Finish:
    """The :class:`Finish` of a lean search: ``ids`` int64 [n] (or [0]), and the re-ranking by
    ``ref_vectors`` (float32 [n', d], or uint16 [n', d] fp16 bits; None: none) and their
    ``ref_ids`` (int64 [n'] or [0])."""
    if ref_vectors is None:
        return Finish(ids, 0, _NO_VECTORS, _NO_HALVES, _NO_IDS)
    if ref_vectors.dtype == np.uint16:
        return Finish(ids, 2, _NO_VECTORS, ref_vectors, ref_ids)
    if ref_vectors.dtype != np.float32:
        raise TypeError(
            f"re-ranking vectors must be float32 or uint16 (fp16 bits), not {ref_vectors.dtype}"
        )
    return Finish(ids, 1, ref_vectors, _NO_HALVES, ref_ids)


class FlatLists(NamedTuple):
    """The inverted lists of an IVF-Flat index (:mod:`vq.kernels.exact.ivf_flat`)."""

    vectors: np.ndarray  #: float32 [n, d] (or uint16 fp16 bits), list after list
    offsets: np.ndarray  #: int64 [nlist + 1]: list l is rows offsets[l]:offsets[l + 1]
    prune: bool  #: (L2) a row's head first, its tail only where the head may enter the heap
    row_ids: np.ndarray  #: int64 [n]: each row's id where lists are spilled, else [0]
    sketch: tuple | None  #: the rows' sketches (:mod:`vq.kernels.exact.sketch`), or None


class SQCodes(NamedTuple):
    """Scalar-quantizer codes of a flat index and their decoding (:mod:`vq.kernels.sq.sq_scans`;
    the kind is an argument of its own)."""

    codes: np.ndarray  #: uint8 [n, code_size]
    offset: np.ndarray  #: float32 [d]
    scale: np.ndarray  #: float32 [d]


class SQLists(NamedTuple):
    """The inverted lists of an IVF-SQ index (a flat index is one list: offsets [0, n])."""

    offsets: np.ndarray  #: int64 [nlist + 1]
    codes: np.ndarray  #: uint8 [n, code_size], list after list
    centroids: np.ndarray  #: float32 [nlist, d]
    by_residual: bool  #: the codes of list l encode x - centroids[l]
    offset: np.ndarray  #: float32 [d]
    scale: np.ndarray  #: float32 [d]


class Tables(NamedTuple):
    """How an IVF-PQ scan builds each query's look-up tables (the kinds:
    :func:`vq.kernels.pq.adc.ivfpq_scanner`), and whether the coarse scores are the base of
    its distances."""

    codebooks_t: np.ndarray  #: float32 [M, dsub, ksub]: the PQ codebooks transposed
    norms: np.ndarray  #: float32 [M, ksub]: their squared norms
    centroids: np.ndarray  #: float32 [nlist, d]: the coarse centroids (residual tables)
    list_tables: np.ndarray  #: float32 [nlist or 0, M * ksub]: precomputed terms per list
    kind: int  #: IP_TABLE, L2_TABLE or RESIDUAL_L2_TABLE
    alpha: float  #: the factor of IP_TABLE
    coarse_base: bool  #: the coarse scores are added to every distance of their probe


class Probes(NamedTuple):
    """The lists each query probes, and the term its distances in each start from."""

    lists: np.ndarray  #: int64 [nq, nprobe] (-1: skipped)
    base: np.ndarray  #: float32 [nq, nprobe]


class PQLists(NamedTuple):
    """The inverted lists of an IVF-PQ index (a flat code array is one list)."""

    codes: np.ndarray  #: [n, M] codes (or their uint32 view: :func:`vq.kernels.pq.adc.code_view`)
    offsets: np.ndarray  #: int64 [nlist + 1]


class PackedLists(NamedTuple):
    """The inverted lists of an IVF fast-scan index, packed in blocks of 32 vectors
    (:func:`vq.kernels.fastscan.fastscan_scans.pack_lists`)."""

    list_blocks: np.ndarray  #: int64 [nlist + 1]: list l is blocks list_blocks[l]:[l + 1]
    offsets: np.ndarray  #: int64 [nlist + 1]: its stored rows
    packed: np.ndarray  #: uint8 [nblocks * M / 2, 32]


class ScaledTopK(NamedTuple):
    """A fast-scan's results: float distances ``d / scale + offset`` of its quantized ones."""

    distances: np.ndarray  #: float32 [nq, k] (+inf padding)
    labels: np.ndarray  #: int64 [nq, k]: stored rows (-1 padding)
    scale: np.ndarray  #: float32 [nq]: each query's table scale
    offset: np.ndarray  #: float32 [nq]: and offset


class Graph(NamedTuple):
    """An HNSW graph as plain arrays (:mod:`vq.kernels.graph.graph_search`)."""

    nbr0: np.ndarray  #: int32 [n, 2M]: level-0 neighbours, -1 after the last
    up_off: np.ndarray  #: int64 [n + 1]: node v's upper levels are rows up_off[v]:up_off[v + 1]
    up_nbr: np.ndarray  #: int32 [rows, M]: of these neighbour lists
    entry: int  #: the entry point, a node of the top level
    max_level: int  #: the top level


class Walk(NamedTuple):
    """What a graph traversal reads of the nodes (:mod:`vq.kernels.graph.graph_store`)."""

    store: object  #: the vectors, (int8 codes, factors) or (SQ codes, offset, scale, kind)
    data: np.ndarray  #: float32 [n, d]: the vectors (re-ranking, neighbour choice), or [0, d]


class BeamSpace(NamedTuple):
    """One thread's working arrays for beam searches (:func:`vq.kernels.graph.graph_walk.beam`)."""

    beam_d: np.ndarray  #: float32 [cap]: the beam's distances, ascending
    beam_i: np.ndarray  #: int64 [cap]: its nodes
    nodes: np.ndarray  #: int64 [2M]: a node's unvisited neighbours
    dist: np.ndarray  #: float32 [2M]: their distances
    kept_d: np.ndarray  #: float32 [cap] (or [0] unfiltered): the allowed nodes' max-heap
    kept_i: np.ndarray  #: int64 [cap] (or [0])
    seen: np.ndarray  #: uint16 [n + 1]: visit stamps, the epoch in the last slot


class Links(NamedTuple):
    """A batch's reverse links grouped by the list they extend
    (:func:`vq.kernels.graph.graph_build.reverse_links`): group g adds
    ``sources[starts[g]:starts[g + 1]]`` to node ``targets[g]``'s list at ``levels[g]``."""

    targets: np.ndarray  #: int64 [g]
    levels: np.ndarray  #: int64 [g]
    starts: np.ndarray  #: int64 [g + 1]
    sources: np.ndarray  #: int64 [links]


class ScanState(NamedTuple):
    """The working arrays of an IVF fast-scan of one batch
    (:mod:`vq.kernels.fastscan.fastscan_ivf`)."""

    per_query: int  #: T, the tables of each query: one per probe, or one for all of them
    luts: np.ndarray  #: uint8 [nq * T, M / 2, 32]: the quantized tables
    lut_rows: np.ndarray  #: uint8 [nq * T * M / 2, 32]: the same bytes, as the blocks read them
    shifts: np.ndarray  #: int32 [nq, nprobe]: each probe's quantized base
    heaps: np.ndarray  #: int64 [nq, k]: each query's keys (quantized distance << 40 | row)
    counts: np.ndarray  #: int64 [nq]: the keys in each heap
