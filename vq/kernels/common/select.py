"""The k smallest columns of each row of inner products: the coarse step of an IVF search
(the ``nprobe`` nearest lists) and of a vector quantizer's encode.

For a small k the k best are kept sorted by insertion, with one vector test skipping 16
columns at a time once the k-th value has settled; a larger k (an nprobe of 32 to 256, the
high-recall band) takes the columns of a histogram's first buckets and sorts their int64
keys (:func:`vq.kernels.common.heaps.float_key`), falling back to a heap of keys where the values
are not finite or crowd into one bucket. Every way gives the same columns in the same
order: by value (-0.0 equal to 0.0), ties by lower column.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from vq.kernels.common.constants import metric
from vq.kernels.common.heaps import INDEX_MASK, float_key, smallest_keys
from vq.kernels.common.simd import (
    borrow,
    row_at_most,
    row_below,
    row_min,
    row_min4,
    row_min8,
    trailing_zeros,
)
from vq.kernels.common.threads import parallel_for
from vq.kernels.jit.cache import kernel


def smallest_k_rows(products, queries, x_norms, inner_product, out_dist, out_idx):
    """The k nearest columns of each row of inner products: for a small k kept sorted by
    insertion (few insertions once the k-th value has settled), for a larger one selected
    among sort keys (:func:`_smallest_k_by_keys`).

    Args:
        products: float32 [nq, n], ⟨q_i, x_j⟩.
        queries: float32 [nq, dim], the q_i (their norms, for l2).
        x_norms: float32 [n], ‖x_j‖² (l2; unused for inner products).
        inner_product: rank by -⟨q, x⟩ rather than by squared L2 distance.
        out_dist: float32 [nq, k], ascending: ‖q‖² + ‖x‖² - 2⟨q, x⟩ clamped at 0 (as faiss
            computes it), or -⟨q, x⟩; out_idx: int64 [nq, k] columns; ties by lower column.
            k <= n.
    """
    parallel_for(
        smallest_k_range,
        products.shape[0],
        products,
        queries,
        x_norms,
        metric(inner_product),
        out_dist,
        out_idx,
    )


@kernel(nogil=True)
def smallest_k_range(q0, q1, products, queries, x_norms, inner_product, out_dist, out_idx):
    """:func:`smallest_k_rows` for rows ``q0..q1`` on the calling thread."""
    products, queries = borrow(products), borrow(queries)  # (views per row: simd.borrow)
    out_dist, out_idx = borrow(out_dist), borrow(out_idx)
    values = row_scratch(products.shape[1])
    for q in range(q0, q1):
        _smallest_k_row(
            products[q], queries[q], x_norms, inner_product, out_dist[q], out_idx[q], values
        )


@njit(nogil=True)
def row_scratch(n):
    """The scratch row :func:`_smallest_k_row` takes for rows of ``n`` columns."""
    return np.empty(-(-n // 16) * 16, dtype=np.float32)


@kernel(nogil=True)
def _smallest_k_row(row, query, x_norms, inner_product, dist, idx, values):
    """smallest_k_rows for one row (a disk-cached kernel of its own, not inlined: the loop
    around it compiles in a fraction of the time a loop holding all of this takes, and a
    kernel compiled later loads it); ``values`` is scratch (:func:`row_scratch`).

    Each 16 (8, 4) columns' least value is an element of the row, so the k-th least of
    those block minima bounds the k-th least value from above: columns past it are never
    looked at, and the insertions start below it (the same columns are kept, in the same
    order, as by insertion alone; k = 16 of 256 Gaussian values: about 21 candidates where
    16-column blocks left 48 and all columns 60), and the candidates of each 16 columns
    come from one vector compare."""
    n, k = row.shape[0], dist.shape[0]
    if inner_product:  # the metric a constant in each loop (see vq.kernels.exact_distance)
        _ranked_values(row, query, x_norms, True, values)
    else:
        _ranked_values(row, query, x_norms, False, values)
    if k > _INSERTION_K:
        if not _smallest_k_by_histogram(values, n, dist, idx):
            _smallest_k_by_keys(values[:n], dist, idx)
        return
    padded = values.shape[0]
    if padded // 16 >= 2 * k:  # the bound from blocks of 16, or of 8 or 4 where too few
        bound = _kth_block_min(values, k, 16, dist)
    elif padded // 8 >= 2 * k:
        bound = _kth_block_min(values, k, 8, dist)
    elif padded // 4 > k:
        bound = _kth_block_min(values, k, 4, dist)
    else:
        bound = np.float32(np.inf)
    size = 0
    threshold = np.float32(np.inf)
    for s in range(0, n, 16):
        if size == k and threshold <= bound:  # what ties the k-th value loses on its column
            m = row_below(values, s, threshold)
        else:
            m = row_at_most(values, s, bound)
        while m != 0:  # the candidates, in column order: ties go to the lower column
            j = s + np.int64(trailing_zeros(m))
            m &= m - np.uint32(1)
            if j >= n:
                break
            d = values[j]
            if size < k or d < threshold:
                size = _insert(dist, idx, size, d, j)
                threshold = dist[k - 1] if size == k else np.float32(np.inf)


@njit(inline="always")
def _kth_block_min(values, k, width, work):
    """The k-th least of the minima of the ``width``-value blocks of ``values`` (padded to
    whole blocks; k < their number), kept sorted by insertion in ``work`` [k] (overwritten):
    k blocks hold a value at most that large, so it bounds the k-th least value."""
    size = 0
    for s in range(0, values.shape[0], width):
        if width == 16:
            low = row_min(values, s)
        elif width == 8:
            low = row_min8(values, s)
        else:
            low = row_min4(values, s)
        if size == k and low >= work[k - 1]:
            continue
        pos = size if size < k else k - 1
        while pos > 0 and work[pos - 1] > low:
            work[pos] = work[pos - 1]
            pos -= 1
        work[pos] = low
        size = min(size + 1, k)
    return work[k - 1]


@njit(inline="always")
def _insert(dist, idx, size, d, j):
    """Insert value d of column j into the ascending ``dist``/``idx`` (``size`` of
    ``k = dist.shape[0]`` held; when full the last drops out), after any equal value;
    returns the new size."""
    k = dist.shape[0]
    pos = size if size < k else k - 1
    while pos > 0 and dist[pos - 1] > d:
        if pos < k:
            dist[pos] = dist[pos - 1]
            idx[pos] = idx[pos - 1]
        pos -= 1
    dist[pos] = d
    idx[pos] = j
    return size + 1 if size < k else size


@njit(inline="always", fastmath=True)
def _ranked_values(row, query, x_norms, inner_product, values):
    """values[:n] := the ranked value of each column (-⟨q, x⟩, or ‖q - x‖² as faiss computes
    it from the products, clamped at 0); +inf past n, to the 16-column padding."""
    n = row.shape[0]
    q_norm = np.float32(0.0)
    if not inner_product:
        for d in range(query.shape[0]):
            q_norm += query[d] * query[d]
    for j in range(n):
        if inner_product:
            values[j] = -row[j]
        else:
            values[j] = max((q_norm + x_norms[j]) - np.float32(2.0) * row[j], np.float32(0))
    values[n:] = np.inf


#: smallest_k_rows keeps up to this many by insertion, more through a histogram (the two break
#: even about here)
_INSERTION_K = 16
#: the bits of -0.0 as an int32
_NEGATIVE_ZERO = np.int32(-0x7FFFFFFF - 1)


#: buckets of the histogram that bounds a larger k's candidates
_BUCKETS = 512
#: a bucket of more candidates than this sends the row to the keys' selection
_BUCKET_CAP = 64


@njit(inline="always")
def _smallest_k_by_histogram(values, n, out_dist, out_idx):
    """smallest_k_rows for one row and a larger k, by a histogram of the values over
    :data:`_BUCKETS` equal intervals of their range: the buckets up to the one that holds the
    k-th value hold every candidate; one vector compare per 16 columns finds them, and a
    counting sort by bucket then an insertion sort (they are out of order only within a
    bucket) put them in the order of their keys (:func:`vq.kernels.common.heaps.float_key`: by
    value, then column). The same k as :func:`_smallest_k_by_keys` in the same order, in
    O(n + candidates). ``values`` is padded to whole 16-column blocks (+inf past ``n``).
    Returns False (nothing written) if a value is not finite, all are equal, or a bucket
    holds over :data:`_BUCKET_CAP` candidates."""
    k = out_dist.shape[0]
    bits = values.view(np.int32)
    lo_key = np.int32(0x7FFFFFFF)
    hi_key = np.int32(-0x7FFFFFFF - 1)
    special = np.int32(0)
    for j in range(n):  # on integers, so that it vectorises: the range, and inf/NaN seen
        b = bits[j]
        key = b ^ ((b >> 31) & 0x7FFFFFFF)  # ordered as the float (see float_key)
        lo_key = min(lo_key, key)
        hi_key = max(hi_key, key)
        special |= np.int32((b & 0x7F800000) == 0x7F800000)
    hist = np.zeros(_BUCKETS, dtype=np.int32)
    hist[0] = lo_key ^ ((lo_key >> 31) & 0x7FFFFFFF)  # back to the floats' bits
    hist[1] = hi_key ^ ((hi_key >> 31) & 0x7FFFFFFF)
    ends = hist[:2].view(np.float32)
    lo, hi = ends[0], ends[1]
    hist[0] = 0
    hist[1] = 0
    if special != 0 or not hi > lo:
        return False
    scale = np.float32(_BUCKETS) / (hi - lo)
    top_bucket = np.int32(_BUCKETS - 1)
    buckets = np.empty(n, dtype=np.int32)
    for j in range(n):  # monotonic in the value: a < b puts a in the same bucket or before
        buckets[j] = min(np.int32((values[j] - lo) * scale), top_bucket)
    for j in range(n):
        hist[buckets[j]] += 1
    top = 0
    total = 0
    while total + hist[top] < k:  # the bucket of the k-th value
        total += hist[top]
        top += 1
    size = 0
    for b in range(top + 1):  # counts to the first slot of each bucket
        count = hist[b]
        if count > _BUCKET_CAP:
            return False
        hist[b] = size
        size += count
    # every value of buckets <= top is at most this (half a bucket to spare for rounding)
    limit = np.float32(np.float64(lo) + (top + 1.5) / np.float64(scale))
    keys = np.empty(size, dtype=np.int64)
    found = 0
    for s in range(0, n, 16):
        m = row_at_most(values, s, limit)
        while m != 0:
            j = s + np.int64(trailing_zeros(m))
            m &= m - np.uint32(1)
            b = buckets[j] if j < n else top_bucket + 1
            if b <= top:  # (-0.0 as 0.0: equal values tie by column)
                keys[hist[b]] = float_key(bits[j] if bits[j] != _NEGATIVE_ZERO else 0, j)
                hist[b] += 1
                found += 1
    if found != size:  # (cannot happen with finite values; kept as the guard it costs)
        return False
    for i in range(1, size):
        key = keys[i]
        p = i
        while p > 0 and keys[p - 1] > key:
            keys[p] = keys[p - 1]
            p -= 1
        keys[p] = key
    for e in range(k):
        j = keys[e] & INDEX_MASK
        out_idx[e] = j
        out_dist[e] = values[j]
    return True


@njit(inline="always")
def _smallest_k_by_keys(values, out_dist, out_idx):
    """smallest_k_rows for one row and a larger k where the histogram does not serve: every
    column as an int64 key that orders as (value, column) — the float's bits made monotonic,
    above the column — then a selection of the k smallest keys and a sort of those."""
    n = values.shape[0]
    k = out_dist.shape[0]
    bits = values.view(np.int32)
    keys = np.empty(n, dtype=np.int64)
    for j in range(n):  # (-0.0 as 0.0: equal values tie by column)
        keys[j] = float_key(bits[j] if bits[j] != _NEGATIVE_ZERO else 0, j)
    best = np.empty(k, dtype=np.int64)
    smallest_keys(keys, best)
    for e in range(k):
        j = best[e] & INDEX_MASK
        out_idx[e] = j
        out_dist[e] = values[j]


def unique_rows(dist, rows, ids, out_dist, out_rows):
    """The best result of each id, in order: what a search over spilled inverted lists (a
    vector stored in two lists) returns; threads split the queries (in slices of at least
    :data:`_UNIQUE_GRAIN`: a few queries stay on the calling thread).

    Args:
        dist: float32 [nq, c] ascending (+inf padding); rows: int64 [nq, c] stored rows (-1
            padding); ids: int64 [n_rows], the id of each stored row (copies share one).
        out_dist: float32 [nq, k], out_rows: int64 [nq, k] (k <= c): the first row of each
            id in ``rows``, in order, padded with +inf and -1.
    """
    parallel_for(
        unique_rows_range, rows.shape[0], dist, rows, ids, out_dist, out_rows, grain=_UNIQUE_GRAIN
    )


#: queries per slice of unique_rows at least
_UNIQUE_GRAIN = 64


@kernel(nogil=True)
def unique_rows_range(q0, q1, dist, rows, ids, out_dist, out_rows):
    """:func:`unique_rows` for queries ``q0..q1`` on the calling thread: the ids kept so far
    in a row of their own, tested all at once (no branch, no lookup per kept row)."""
    dist, rows, out_dist, out_rows = borrow(dist), borrow(rows), borrow(out_dist), borrow(out_rows)
    k = out_rows.shape[1]
    kept_ids = np.empty(k, dtype=np.int64)
    for q in range(q0, q1):
        kept = 0
        for c in range(rows.shape[1]):
            if kept == k:
                break
            r = rows[q, c]
            if r < 0:
                break
            i = ids[r]
            seen = False
            for j in range(kept):
                seen |= kept_ids[j] == i
            if not seen:
                out_dist[q, kept] = dist[q, c]
                out_rows[q, kept] = r
                kept_ids[kept] = i
                kept += 1
        for j in range(kept, k):
            out_dist[q, j] = np.inf
            out_rows[q, j] = -1
