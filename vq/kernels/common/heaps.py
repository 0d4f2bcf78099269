"""Top-k selection for the kernels: heaps, and the int64 keys that make ties go to the lower row.

Two kinds of heap, both max-heaps of the k best so far (the root is the one to beat):

- float heaps: a distance array and a row array side by side (``heap_replace_top``,
  ``heap_sorted``); among equal distances the first one scanned stays.
- key heaps: one int64 array of keys that order as (value, row), so that results do not
  depend on the order candidates arrive in (``sift_down``, ``heapify``, ``smallest_keys``).

Keys, in one place:

- ``row_key(value, row)`` = ``value << ROW_BITS | row`` for non-negative integer values
  (quantized distances); ``EMPTY_KEY`` (the largest int64) is an empty slot.
- ``float_key(bits, index)``: a float32's bits made monotonic (negative floats flipped below
  the positive ones) above a 32-bit index; the smallest key is the smallest float, ties to the
  lowest index — what ``numpy.argmin`` returns, found by an integer ``min`` that vectorises.

The kernels use these instead of ``np.sort``/``np.partition``, whose numba implementations
take several seconds each to compile into every kernel that calls them. The ``_row`` variants
work on one row of a 2-D array in place: a row view taken in a hot loop costs an atomic
reference-count increment and decrement each time (a kernel called from Python holds
reference-counted arrays).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from vq.kernels.jit.cache import kernel

#: rows below 2**40; values (quantized distances < 2**17) above them
ROW_BITS = 40
ROW_MASK = (1 << ROW_BITS) - 1
#: an empty slot of a key heap (a constant: np.iinfo inside a kernel would tie it to numba's
#: arraymath module, whose import would cost every cached load)
EMPTY_KEY = np.iinfo(np.int64).max
#: the index part of a float_key
INDEX_MASK = np.int64(0xFFFFFFFF)


@njit(inline="always")
def row_key(value, row):
    """The int64 key of (value, row): ``value << ROW_BITS | row``."""
    return (np.int64(value) << ROW_BITS) | row


@njit(inline="always")
def key_value(key):
    """The value of a :func:`row_key` key."""
    return key >> ROW_BITS


@njit(inline="always")
def key_row(key):
    """The row of a :func:`row_key` key."""
    return key & ROW_MASK


@njit(inline="always")
def float_key(bits, index):
    """The int64 key of a float32 (given by its int32 ``bits``) and a 32-bit index."""
    b = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    return (np.int64(b) << 32) | index


# -- float heaps ----------------------------------------------------------------------------


@njit(inline="always")
def sift_down_pair(dist, idx, size, pos, d, i):
    """Put (d, i) at ``pos`` of the max-heap ``dist[:size]``/``idx[:size]`` and sift it down."""
    while True:
        child = 2 * pos + 1
        if child >= size:
            break
        if child + 1 < size and dist[child + 1] > dist[child]:
            child += 1
        if dist[child] <= d:
            break
        dist[pos] = dist[child]
        idx[pos] = idx[child]
        pos = child
    dist[pos] = d
    idx[pos] = i


@njit(inline="always")
def push_pair(dist, idx, size, d, i):
    """Add (d, i) to the max-heap of ``size`` entries (room for one more: a heap that grows)."""
    pos = size
    while pos > 0:
        parent = (pos - 1) >> 1
        if dist[parent] >= d:
            break
        dist[pos] = dist[parent]
        idx[pos] = idx[parent]
        pos = parent
    dist[pos] = d
    idx[pos] = i


@njit(inline="always")
def heapify_pair(dist, idx, size):
    """Make ``dist[:size]``/``idx[:size]`` a max-heap in place."""
    for pos in range(size // 2 - 1, -1, -1):
        sift_down_pair(dist, idx, size, pos, dist[pos], idx[pos])


@njit(inline="always")
def sort_pair_heap(dist, idx, size):
    """Sort a max-heap of ``size`` entries in place, ascending (a heap sort)."""
    for end in range(size - 1, 0, -1):
        d, i = dist[end], idx[end]
        dist[end], idx[end] = dist[0], idx[0]
        sift_down_pair(dist, idx, end, 0, d, i)


@njit(inline="always")
def heap_replace_top(dist, idx, d, i):
    """Replace the root of a max-heap (``dist``/``idx``, size k) by (d, i) and sift it down."""
    sift_down_pair(dist, idx, dist.shape[0], 0, d, i)


@njit(inline="always")
def heap_replace_top_row(dist, idx, r, d, i):
    """:func:`heap_replace_top` on row r of the 2-D heaps ``dist``/``idx``, indexed in
    place: a row view taken in a hot loop costs an atomic reference count in and out (a
    kernel called from Python holds reference-counted arrays)."""
    size = dist.shape[1]
    pos = 0
    while True:
        child = 2 * pos + 1
        if child >= size:
            break
        if child + 1 < size and dist[r, child + 1] > dist[r, child]:
            child += 1
        if dist[r, child] <= d:
            break
        dist[r, pos] = dist[r, child]
        idx[r, pos] = idx[r, child]
        pos = child
    dist[r, pos] = d
    idx[r, pos] = i


@njit(inline="always")
def heap_sorted(dist, idx, out_dist, out_idx):
    """Write a max-heap's content in ascending order of distance, ties by lower index (a heap
    sort, in place and without allocation; the heap is consumed)."""
    k = dist.shape[0]
    for size in range(k, 0, -1):
        out_dist[size - 1] = dist[0]
        out_idx[size - 1] = idx[0]
        sift_down_pair(dist, idx, size - 1, 0, dist[size - 1], idx[size - 1])
    # equal distances: order by index, as a stable full sort of (distance, index) would
    j = 0
    while j < k:
        e = j + 1
        while e < k and out_dist[e] == out_dist[j]:
            e += 1
        for a in range(j + 1, e):  # insertion sort of the (short) run
            v = out_idx[a]
            b = a - 1
            while b >= j and out_idx[b] > v:
                out_idx[b + 1] = out_idx[b]
                b -= 1
            out_idx[b + 1] = v
        j = e


@njit(inline="always")
def heap_reset(dist, idx):
    """Empty a float heap: +inf distances, -1 rows (loops: slice assignments take numba
    seconds to compile)."""
    for e in range(dist.shape[0]):
        dist[e] = np.inf
        idx[e] = -1


# -- key heaps ------------------------------------------------------------------------------
@njit(inline="always")
def sift_down(heap, size, key, i=0):
    """Put ``key`` at node i (the root by default) of the int64 max-heap ``heap[:size]`` and
    sift it down."""
    while True:
        c = 2 * i + 1
        if c >= size:
            break
        if c + 1 < size:
            c += np.int64(heap[c + 1] > heap[c])  # the larger child, without a branch
        if heap[c] <= key:
            break
        heap[i] = heap[c]
        i = c
    heap[i] = key


@njit(inline="always")
def heapify(heap):
    """Make the int64 array ``heap`` a max-heap, in place."""
    k = heap.shape[0]
    for i in range(k // 2 - 1, -1, -1):
        sift_down(heap, k, heap[i], i)


@njit(inline="always")
def sift_down_row(heaps, r, size, key, i=0):
    """:func:`sift_down` on row r of the 2-D int64 array ``heaps``, indexed in place (a row
    view would cost an atomic reference count in and out in a kernel called from Python)."""
    while True:
        c = 2 * i + 1
        if c >= size:
            break
        if c + 1 < size:
            c += np.int64(heaps[r, c + 1] > heaps[r, c])
        if heaps[r, c] <= key:
            break
        heaps[r, i] = heaps[r, c]
        i = c
    heaps[r, i] = key


@njit(inline="always")
def heapify_row(heaps, r):
    """:func:`heapify` on row r of the 2-D int64 array ``heaps``."""
    k = heaps.shape[1]
    for i in range(k // 2 - 1, -1, -1):
        sift_down_row(heaps, r, k, heaps[r, i], i)


@kernel(nogil=True)
def smallest_keys(keys, out):
    """The ``out.shape[0]`` smallest of the int64 ``keys`` (at least that many), ascending,
    into ``out``: a max-heap of the k smallest so far, then sorted in place."""
    k = out.shape[0]
    if k == 0:
        return
    for j in range(k):  # a loop: an array-to-array assignment takes seconds to compile
        out[j] = keys[j]
    heapify(out)
    for j in range(k, keys.shape[0]):
        if keys[j] < out[0]:
            sift_down(out, k, keys[j])
    for size in range(k - 1, 0, -1):  # heap sort: the largest to the end, one at a time
        top = out[0]
        sift_down(out, size, out[size])
        out[size] = top
