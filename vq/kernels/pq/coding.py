"""Numba kernels for coding: arg-min, PQ encode/decode, additive decode, k-means++ steps.

Exact arg-min without branches
------------------------------
A branchy arg-min does not vectorise, and on PQ encoding it costs more than the distances
themselves. Instead each candidate is turned into one int64 key whose order is the order of
``(distance, index)`` (:func:`vq.kernels.common.heaps.float_key`). A plain integer ``min`` over the
keys (which LLVM vectorises) gives the smallest distance and, among exact ties, the lowest
index — the same answer as ``numpy.argmin``.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import njit

from vq.kernels.common.heaps import EMPTY_KEY, INDEX_MASK, float_key
from vq.kernels.common.simd import borrow
from vq.kernels.common.threads import parallel_for
from vq.kernels.jit import cache
from vq.kernels.jit.cache import kernel, specialise


@njit(inline="always")
def _argmin_row(dots, bits, i):
    """The key (:func:`vq.kernels.common.heaps.float_key`) of the smallest entry of row i of
    ``dots`` (``bits``: its int32 view): the entry is ``key & INDEX_MASK``."""
    best = EMPTY_KEY
    for j in range(dots.shape[1]):
        best = min(best, float_key(bits[i, j], j))
    return best


def argmin_rows(dots, bias, out_index, out_value, out_second):
    """Row-wise arg-min of ``dots + bias``, in place.

    Args:
        dots: float32 [n, k], overwritten with ``dots + bias``.
        bias: float32 [k], added to every row (e.g. squared centroid norms).
        out_index: int64 [n] receives the arg-min (lowest index among exact ties).
        out_value: float32 [n] receives the minimum.
        out_second: float32 [n] receives the second smallest value (+inf when k = 1); pass an
            empty array to skip that work.

    Threads split the rows.
    """
    parallel_for(argmin_range, dots.shape[0], dots, bias, out_index, out_value, out_second)


def argmin_ahead() -> None:
    """Start compiling :func:`argmin_rows`'s kernel in the background server (see
    :func:`vq.kernels.common.rows.insertion_ahead`)."""
    f32, i64 = np.zeros(0, np.float32), np.zeros(0, np.int64)
    cache.prefetch(argmin_range, 0, 0, np.zeros((0, 1), np.float32), f32, i64, f32, f32)


@kernel(fastmath=True, nogil=True)
def argmin_range(i0, i1, dots, bias, out_index, out_value, out_second):
    """:func:`argmin_rows` for rows ``i0..i1`` on the calling thread."""
    n, k = dots.shape
    want_second = out_second.shape[0] == n
    bits = dots.view(np.int32)  # one view: a row view per row costs two atomics
    for i in range(i0, i1):
        for j in range(k):
            dots[i, j] += bias[j]
        j = _argmin_row(dots, bits, i) & INDEX_MASK
        out_index[i] = j
        out_value[i] = dots[i, j]
        if want_second:
            dots[i, j] = np.inf
            out_second[i] = dots[i, _argmin_row(dots, bits, i) & INDEX_MASK]


def spill_argmin_rows(scores, rdots, x_norms, r_dot_x, r_norms, primary, lam, out):
    """The SOAR spill list of each row after the matrix products (the loss of
    :func:`vq.index.ivf.spill.soar_assign`, term for term and in its order, so that the list is
    the same), in place.

    Args:
        scores: float32 [n, k], ``|c_j|² - 2⟨x_i, c_j⟩`` (what :func:`argmin_rows` leaves of
            the nearest-centroid products; overwritten with the loss).
        rdots: float32 [n, k], ``⟨r_i, c_j⟩`` for the residual ``r_i = x_i - c_{primary_i}``.
        x_norms, r_dot_x, r_norms: float32 [n]: ``|x_i|²``, ``⟨r_i, x_i⟩`` and ``|r_i|²``
            (clamped above 0).
        primary: int64 [n], each row's own list (never its spill list).
        lam: float32, the weight λ of the parallel term.
        out: int64 [n] receives the list of the smallest loss (ties: the lowest index).

    Threads split the rows.
    """
    parallel_for(
        spill_argmin_range,
        scores.shape[0],
        scores,
        rdots,
        x_norms,
        r_dot_x,
        r_norms,
        primary,
        lam,
        out,
    )


@kernel(nogil=True)
def spill_argmin_range(i0, i1, scores, rdots, x_norms, r_dot_x, r_norms, primary, lam, out):
    """:func:`spill_argmin_rows` for rows ``i0..i1`` on the calling thread (no fastmath: each
    operation rounds as torch's does)."""
    scores, rdots = borrow(scores), borrow(rdots)
    k = scores.shape[1]
    bits = scores.view(np.int32)
    for i in range(i0, i1):
        xn, s, rn = x_norms[i], r_dot_x[i], r_norms[i]
        for j in range(k):
            parallel = s - rdots[i, j]
            scores[i, j] = (xn + scores[i, j]) + lam * parallel * parallel / rn
        scores[i, primary[i]] = np.inf
        out[i] = _argmin_row(scores, bits, i) & INDEX_MASK


#: rows per block of :func:`assign_accumulate` (each block its own partial sums)
ASSIGN_BLOCK = 4096


def assign_accumulate(dots, bias, x, x_norms, out_index, sums, counts, errors):
    """One Lloyd assignment step after the matrix product: each row's nearest centroid, and the
    cluster sums, counts and squared errors, in blocks of :data:`ASSIGN_BLOCK` rows shared by
    the threads (each block sums on its own, so the totals do not depend on the thread count).

    Args:
        dots: float32 [n, k], ``-2 ⟨x_i, c_j⟩`` (overwritten with ``dots + bias``).
        bias: float32 [k], the centroids' squared norms.
        x: float32 [n, d], the rows; x_norms: float32 [n], their squared norms.
        out_index: int64 [n] receives each row's nearest centroid (ties: the lowest index).
        sums: float32 [blocks, k, d], counts: float32 [blocks, k], errors: float64 [blocks],
            zeroed: block b's sums of its rows per centroid, their counts, and the sum of
            its rows' squared distances to their centroid (clamped at 0), where blocks is
            ``ceil(n / ASSIGN_BLOCK)``.
    """
    parallel_for(
        assign_accumulate_range,
        sums.shape[0],
        dots,
        bias,
        x,
        x_norms,
        out_index,
        sums,
        counts,
        errors,
    )


@kernel(fastmath=True, nogil=True)
def assign_accumulate_range(b0, b1, dots, bias, x, x_norms, out_index, sums, counts, errors):
    """:func:`assign_accumulate` for blocks ``b0..b1`` on the calling thread."""
    dots, x, sums, counts = borrow(dots), borrow(x), borrow(sums), borrow(counts)
    n, k = dots.shape
    d = x.shape[1]
    bits = dots.view(np.int32)
    for b in range(b0, b1):
        err = 0.0
        for i in range(b * ASSIGN_BLOCK, min(n, (b + 1) * ASSIGN_BLOCK)):
            for j in range(k):
                dots[i, j] += bias[j]
            c = _argmin_row(dots, bits, i) & INDEX_MASK
            out_index[i] = c
            err += max(dots[i, c] + x_norms[i], np.float32(0.0))
            counts[b, c] += 1.0
            for j in range(d):
                sums[b, c, j] += x[i, j]
        errors[b] = err


_PQ_BLOCK = 32
#: relative rounding error allowed for ``|c|² - 2⟨x, c⟩`` in float32 (a generous bound: a few
#: units in the last place of each of the terms, which are at most ``|x|² + |c|²``)
_EXPANSION_ERROR = np.float32(1e-5)


@functools.cache  # a dictionary hit per call, not specialise()'s checks
def _code_module(dsub: int):
    """The module of ``vq.kernels.pq.pq_code_template`` specialised for ``dsub``."""
    return specialise("vq.kernels.pq.pq_code_template", DSUB=int(dsub))


def pq_encoder(dsub: int):
    """The PQ encoding kernel specialised for sub-vectors of ``dsub`` dimensions.

    ``dsub`` is a compile-time constant of the returned kernel (a closure; numba keys its disk
    cache on the closure's values), so the inner loop unrolls and each distance stays in a
    register until it is stored. Compiled once per process and size, then loaded from cache.

    The kernel ``pq_encode(x, codebooks_t, norms, codes, sq_err)`` takes:
        x: float32 [n, M * dsub], C-contiguous.
        codebooks_t: float32 [M, dsub, ksub], the codebooks transposed and multiplied by -2
            (an exact scaling: the kernel recovers the centroids from it).
        norms: float32 [M, ksub], squared norms of the sub-centroids.
        codes: integer [n, M] (uint8/int16/int32) receives the codes.
        sq_err: float32 [n] receives each vector's squared reconstruction error; pass an empty
            array to skip that work.

    Codes are those of the smallest exact squared distance (ties: lowest index): candidates
    are ranked by the fast expanded form, and those within its rounding error of the best are
    compared on ``Σ (x_j - c_j)²``, so data far from the origin encodes as faiss's direct
    computation does.
    """
    return _code_module(dsub).pq_encode


def pq_encoder_ahead(dsub: int, M: int, code_dtype) -> None:
    """Start compiling :func:`pq_encoder`'s kernel for ``M`` sub-vectors of ``dsub`` dimensions
    and codes of ``code_dtype`` in the background server (see
    :func:`vq.kernels.common.rows.insertion_ahead`), for a step that encodes after others
    compile (an IVF index's coarse k-means)."""
    module = _code_module(dsub)
    f32 = np.float32
    x, err = np.zeros((0, M * dsub), f32), np.zeros(0, f32)
    books, norms, norm_max = np.zeros((M, dsub, 1), f32), np.zeros((M, 1), f32), np.zeros(M, f32)
    codes = np.zeros((0, M), code_dtype)
    cache.prefetch(module.encode_range, 0, 0, x, books, norms, norm_max, codes, err)


def pq_encoder_lean(dsub: int):
    """:func:`pq_encoder`'s kernel for a few vectors on the calling thread (the lean path of
    ``encode``): ``encode_lean(x, codebooks_t, norms, norm_max, codes)`` with the arguments of
    ``pq_encode`` (no errors) and ``norm_max`` float32 [M], the largest of each row of
    ``norms``; returns False (and does nothing) if a vector is not finite."""
    return _code_module(dsub).encode_lean


def pq_decoder(dsub: int):
    """The PQ decoding kernel for sub-vectors of ``dsub`` dimensions (a compile-time constant,
    as in :func:`pq_encoder`): ``pq_decode(codes, codebooks, out)`` concatenates sub-centroids,
    codes [n, M] (any integer dtype), codebooks float32 [M, ksub, dsub] → out float32
    [n, M * dsub]."""
    return _code_module(dsub).pq_decode


def additive_decode(codes, codebooks, out):
    """Sum one codeword per stage: codes [n, Q], codebooks float32 [Q, K, d]
    → out float32 [n, d]. Threads split the rows."""
    parallel_for(additive_decode_range, codes.shape[0], codes, codebooks, out)


@kernel(nogil=True)
def additive_decode_range(i0, i1, codes, codebooks, out):
    """:func:`additive_decode` for rows ``i0..i1`` on the calling thread."""
    n_stages = codes.shape[1]
    d = codebooks.shape[2]
    for i in range(i0, i1):
        for j in range(d):
            out[i, j] = codebooks[0, codes[i, 0], j]
        for q in range(1, n_stages):
            c = codes[i, q]
            for j in range(d):
                out[i, j] += codebooks[q, c, j]


@kernel(nogil=True)
def kmeanspp_sample(d2, uniforms, out):
    """D² sampling: for each u in ``uniforms`` (sorted ascending, in [0, 1)) the first index
    whose running sum of ``d2`` exceeds ``u · Σ d2`` (uniform over all points when Σ d2 = 0).

    Args:
        d2: float32 [n], squared distance of each point to its nearest chosen centroid.
        uniforms: float64 [t], sorted ascending.
        out: int64 [t] receives the sampled indices.
    """
    n = d2.shape[0]
    total = 0.0
    for i in range(n):
        total += d2[i]
    if total <= 0.0:
        for j in range(uniforms.shape[0]):
            out[j] = min(n - 1, int(uniforms[j] * n))
        return
    j, running = 0, 0.0
    for i in range(n):
        running += d2[i]
        while j < uniforms.shape[0] and uniforms[j] * total < running:
            out[j] = i
            j += 1
    while j < uniforms.shape[0]:
        out[j] = n - 1
        j += 1


@kernel(nogil=True, fastmath=True)
def kmeanspp_pick(dots, pool_norms, cand_norms, d2):
    """Greedy k-means++ step: the candidate whose addition lowers the potential most; ``d2`` is
    updated in place with it.

    Args:
        dots: float32 [n, t], inner products of the pool with the t candidates.
        pool_norms: float32 [n]; cand_norms: float32 [t]; d2: float32 [n] (updated).

    Returns:
        The index (in [0, t)) of the chosen candidate.
    """
    n, t = dots.shape
    potential = np.zeros(t, np.float64)
    for i in range(n):
        for j in range(t):
            v = max(pool_norms[i] + cand_norms[j] - 2.0 * dots[i, j], np.float32(0.0))
            potential[j] += min(v, d2[i])
    best = 0
    for j in range(1, t):
        if potential[j] < potential[best]:
            best = j
    for i in range(n):
        v = max(pool_norms[i] + cand_norms[best] - 2.0 * dots[i, best], np.float32(0.0))
        d2[i] = min(v, d2[i])
    return best
