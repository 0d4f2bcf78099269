"""Top-k selection on int64 keys (``value << bits | row``, so that ties go to the lower row): a
max-heap of the k smallest keys, and a selection of the k smallest of an array of keys.

The kernels use these instead of ``np.sort``/``np.partition``, whose numba implementations
take several seconds each to compile into every kernel that calls them. The ``_row`` variants
work on one row of a 2-D array in place: a row view taken in a hot loop costs an atomic
reference-count increment and decrement each time (a kernel called from Python holds
reference-counted arrays).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from vq.kernels.cache import kernel


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
