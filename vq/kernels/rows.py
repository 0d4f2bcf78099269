"""In-place moves of stored rows: what ``add``, ``remove_ids`` and ``merge_from`` do to an
index's buffers without allocating copies of them.

Every buffer is seen as rows of unsigned words, [capacity, words] (a row of codes, of a vector,
an int64 id), so one kernel serves codes, vectors and ids alike. Inverted lists are CSR (list l
holds rows ``offsets[l]:offsets[l + 1]``): growing a list moves the lists after it towards the
end (last list first, so that no row is overwritten before it has moved), removing rows moves
the rows after them towards the start.
"""

from __future__ import annotations

import numpy as np

from vq.kernels.cache import kernel


@kernel(nogil=True)
def move_lists(buf, src, dst, backward):
    """Move list l's rows ``src[l]:src[l + 1]`` to start at ``dst[l]``, in place, for every l
    (buf [capacity, words], unsigned; src, dst int64 [nlist + 1]). ``backward``: the lists
    move towards the end (dst[l] >= src[l] for every l: a list grows), so the last list moves
    first and each list's rows last to first; otherwise towards the start, first to last."""
    nlist = src.shape[0] - 1
    width = buf.shape[1]
    for j in range(nlist):
        lst = nlist - 1 - j if backward else j
        s, d, n = src[lst], dst[lst], src[lst + 1] - src[lst]
        if s == d:
            continue
        for i in range(n):
            r = n - 1 - i if backward else i
            for b in range(width):
                buf[d + r, b] = buf[s + r, b]


#: words a :func:`remove_rows` copy moves at a time (through a buffer in the L1 cache)
CHUNK_WORDS = 4096


@kernel(nogil=True)
def remove_rows(flat, width, rows, n):
    """Remove rows ``rows`` (int64 [r], ascending, distinct, below n) from the first ``n`` rows
    of ``flat`` ([capacity * width] unsigned words, rows of ``width`` words back to back), in
    place: the rows between two removed ones move down together, in order, so the kept rows
    end up first; returns how many (``n - r``). Rows before ``rows[0]`` are not touched.
    Each run moves ``CHUNK_WORDS`` at a time through a small buffer (source and destination
    of one copy never overlap, so it runs at memory speed whatever the distance moved)."""
    r = rows.shape[0]
    if r == 0:
        return n
    tmp = np.empty(CHUNK_WORDS, dtype=flat.dtype)
    w = rows[0] * width
    for k in range(r):
        s = (rows[k] + 1) * width
        e = (rows[k + 1] if k + 1 < r else n) * width
        while s < e:
            c = min(CHUNK_WORDS, e - s)
            for j in range(c):
                tmp[j] = flat[s + j]
            for j in range(c):
                flat[w + j] = tmp[j]
            s += c
            w += c
    return n - r


#: Fibonacci hashing's multiplier (2**64 / the golden ratio, odd)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@kernel(nogil=True)
def rows_in_lists(ids, offsets, lists, wanted, out_rows):
    """The rows of inverted lists ``lists`` (int64 [t], ascending, distinct) whose id is in
    ``wanted`` (int64 [m], distinct): ``ids`` int64 [n_rows] the id of each row, ``offsets``
    int64 [nlist + 1] the CSR lists; written to ``out_rows`` (int64, at least the touched
    lists' rows long) ascending; returns how many. ``wanted`` goes into a hash set (open
    addressing, at least four slots an id), so each row of the touched lists costs about one
    probe: O(m + rows scanned), nothing of the other lists read."""
    m = wanted.shape[0]
    bits = 1
    while (1 << bits) < 4 * m:
        bits += 1
    mask = (1 << bits) - 1
    shift = np.uint64(64 - bits)
    keys = np.empty(mask + 1, dtype=np.int64)
    used = np.zeros(mask + 1, dtype=np.bool_)
    for j in range(m):
        v = wanted[j]
        h = np.int64((np.uint64(v) * _GOLDEN) >> shift)
        while used[h] and keys[h] != v:
            h = (h + 1) & mask
        used[h] = True
        keys[h] = v
    count = 0
    for t in range(lists.shape[0]):
        lst = lists[t]
        for i in range(offsets[lst], offsets[lst + 1]):
            v = ids[i]
            h = np.int64((np.uint64(v) * _GOLDEN) >> shift)
            while used[h]:
                if keys[h] == v:
                    out_rows[count] = i
                    count += 1
                    break
                h = (h + 1) & mask
    return count


@kernel(nogil=True)
def mark_ids(stored, sorted_ids, out_drop):
    """out_drop[i] = 1 where stored[i] (int64 [n]) is in sorted_ids (int64 [m], ascending),
    else 0 (a binary search per row: O(n log m), no temporary array); returns the first row
    marked, or n where none is."""
    m = sorted_ids.shape[0]
    first = stored.shape[0]
    for i in range(stored.shape[0]):
        v = stored[i]
        lo, hi = 0, m
        while lo < hi:
            mid = (lo + hi) >> 1
            if sorted_ids[mid] < v:
                lo = mid + 1
            else:
                hi = mid
        hit = lo < m and sorted_ids[lo] == v
        out_drop[i] = np.uint8(1) if hit else np.uint8(0)
        if hit and i < first:
            first = i
    return first


@kernel(nogil=True)
def list_slots(lists, cursors, out_rows):
    """out_rows[j] = cursors[lists[j]], then that cursor moves on by one: the rows new vectors
    (routed to ``lists`` int64 [n]) take at the ends of their lists, in order (cursors int64
    [nlist], updated)."""
    for j in range(lists.shape[0]):
        lst = lists[j]
        out_rows[j] = cursors[lst]
        cursors[lst] += 1
