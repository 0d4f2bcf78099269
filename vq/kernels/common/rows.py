"""In-place moves of stored rows: what ``add``, ``remove_ids`` and ``merge_from`` do to an
index's buffers without allocating copies of them.

Every buffer is seen as rows of unsigned words, [capacity, words] (a row of codes, of a vector,
an int64 id), so one kernel serves codes, vectors and ids alike. Inverted lists are CSR (list l
holds rows ``offsets[l]:offsets[l + 1]``): growing a list moves the lists after it towards the
end (last list first, so that no row is overwritten before it has moved); removing rows from
lists fills each removed row with its list's last kept row and moves each later list down by
copying only as many of its rows as were removed before it (:func:`remove_from_lists`), found
first by :func:`rows_of_ids` over the lists that hold them; a buffer without lists (Flat, PQ)
moves the rows after the first removed one down (:func:`remove_rows`).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from vq.kernels.jit import cache
from vq.kernels.jit.cache import kernel


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


@njit(inline="always")
def lower_bound(values, lo, hi, v):
    """The first position in ``lo..hi`` of ``values`` (ascending) whose value is not below v."""
    while lo < hi:
        mid = (lo + hi) >> 1
        if values[mid] < v:
            lo = mid + 1
        else:
            hi = mid
    return lo


@kernel(nogil=True)
def ids_by_list(keys, key_lists, wanted, out_pos, out_counts):
    """The entries of an id → list map (``keys`` int64 [n] ascending, ``key_lists`` int32
    [n] the list of each, -1 once removed) that hold ``wanted`` (int64 [m], ascending,
    distinct), grouped by list: their positions go to ``out_pos`` (int64; by list ascending,
    then by id) and each list's count to ``out_counts`` (int64 [nlist], zeroed here);
    returns how many (where that is more than ``out_pos`` holds, it is left unwritten). A
    binary search an id (from where the previous one ended), then a counting sort:
    O(m log n + nlist)."""
    out_counts[:] = 0
    found = np.empty(wanted.shape[0] * 2, dtype=np.int64)  # (spilled: two rows an id)
    e, lo, n = 0, 0, keys.shape[0]
    for j in range(wanted.shape[0]):
        v = wanted[j]
        lo = lower_bound(keys, lo, n, v)
        i = lo
        while i < n and keys[i] == v:
            lst = key_lists[i]
            if lst >= 0:
                if e == found.shape[0]:
                    grown = np.empty(2 * e, dtype=np.int64)
                    grown[:e] = found
                    found = grown
                found[e] = i
                e += 1
                out_counts[lst] += 1
            i += 1
    if e > out_pos.shape[0]:
        return e  # (out_pos too short: nothing written but the counts)
    cursor = np.empty(out_counts.shape[0], dtype=np.int64)
    total = 0
    for lst in range(out_counts.shape[0]):
        cursor[lst] = total
        total += out_counts[lst]
    for t in range(e):
        lst = key_lists[found[t]]
        out_pos[cursor[lst]] = found[t]
        cursor[lst] += 1
    return e


#: lists with at most this many ids to find compare each row with all of them; more go
#: into a small hash set per list
FEW_IDS = 4
#: Fibonacci hashing's multiplier (2**64 / the golden ratio, odd)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@kernel(nogil=True)
def rows_of_ids(t0, t1, ids, offsets, lists, starts, wanted, out_rows, out_found):
    """The rows to remove from touched inverted lists ``t0 <= t < t1`` (a ``parallel_for``
    body): list ``lists[t]`` (int64 [t]) holds ``starts[t + 1] - starts[t]`` rows whose id is
    one of ``wanted[starts[t]:starts[t + 1]]`` (int64, distinct within a list but where a
    spilled id has both rows in it; ``starts`` int64 [t + 1]). Its rows (``ids`` int64
    [n_rows], ``offsets`` int64 [nlist + 1] the CSR lists) are read in order until that many
    are found, each id compared with the list's wanted ones (at most :data:`FEW_IDS`) or
    looked up in a hash set of them (open addressing, at least four slots an id, small
    enough to stay in cache). The rows go to ``out_rows[starts[t]:starts[t + 1]]`` (int64,
    ascending) and their count to ``out_found[t]`` (less than asked only where the id →
    list map was wrong). Nothing of the other lists is read, nor the rest of a list once its
    rows are found."""
    widest = 1
    for t in range(t0, t1):
        widest = max(widest, starts[t + 1] - starts[t])
    bits = 1
    while (1 << bits) < 4 * widest:
        bits += 1
    keys = np.empty(1 << bits, dtype=np.int64)
    used = np.zeros(1 << bits, dtype=np.bool_)
    for t in range(t0, t1):
        lst, lo, hi = lists[t], starts[t], starts[t + 1]
        w, found = hi - lo, 0
        if w <= FEW_IDS:
            for i in range(offsets[lst], offsets[lst + 1]):
                v = ids[i]
                hit = False
                for a in range(lo, hi):
                    hit = hit or wanted[a] == v
                if hit:
                    out_rows[lo + found] = i
                    found += 1
                    if found == w:
                        break
            out_found[t] = found
            continue
        b = 1
        while (1 << b) < 4 * w:
            b += 1
        mask, shift = (1 << b) - 1, np.uint64(64 - b)
        used[: mask + 1] = False
        for a in range(lo, hi):
            h = np.int64((np.uint64(wanted[a]) * _GOLDEN) >> shift)
            while used[h] and keys[h] != wanted[a]:
                h = (h + 1) & mask
            used[h] = True
            keys[h] = wanted[a]
        for i in range(offsets[lst], offsets[lst + 1]):
            v = ids[i]
            h = np.int64((np.uint64(v) * _GOLDEN) >> shift)
            while used[h]:
                if keys[h] == v:
                    out_rows[lo + found] = i
                    found += 1
                    break
                h = (h + 1) & mask
            if found == w:
                break
        out_found[t] = found


@kernel(nogil=True)
def remove_from_lists(flat, width, offsets, rows, out_offsets):
    """Remove rows ``rows`` (int64 [r], ascending, distinct) from CSR inverted lists (list l:
    rows ``offsets[l]:offsets[l + 1]``; ``offsets`` int64 [nlist + 1]) of ``flat``
    ([capacity * width] unsigned words, rows of ``width`` words back to back), in place,
    moving few rows; the new offsets go to ``out_offsets`` (int64 [nlist + 1]); returns how
    many rows were copied.

    List by list, ascending: within a list holding removed rows, each removed row below its
    new size takes the list's last kept row (faiss's swap-with-last), so its kept rows come
    first; then a list after R removed rows moves down by R by copying only its last
    min(R, kept) rows into the R free rows before it (one copy, source and destination never
    overlap). Rows of the lists before the first touched one are not read; the copies number
    at most r + sum over the later lists of min(R_l, kept_l), whatever their sizes. The order
    of the rows within a list changes (faiss's ``remove_ids`` changes it too): a list moved by
    R < kept is rotated by R."""
    nlist = offsets.shape[0] - 1
    j, before, moves = 0, 0, 0
    out_offsets[0] = 0
    for lst in range(nlist):
        o, e = offsets[lst], offsets[lst + 1]
        j0 = j
        while j < rows.shape[0] and rows[j] < e:
            j += 1
        kept = e - o - (j - j0)
        tail, back = e - 1, j - 1  # the last kept row is found from the end
        for h in range(j0, j):
            hole = rows[h]
            if hole >= o + kept:
                break
            while back >= j0 and rows[back] == tail:
                back -= 1
                tail -= 1
            for b in range(width):
                flat[hole * width + b] = flat[tail * width + b]
            tail -= 1
            moves += 1
        if before and kept:
            n = min(before, kept)
            src, dst = (o + kept - n) * width, (o - before) * width
            for i in range(n * width):
                flat[dst + i] = flat[src + i]
            moves += n
        before += j - j0
        out_offsets[lst + 1] = e - before
    return moves


@kernel(nogil=True)
def mark_ids(stored, sorted_ids, out_drop):
    """out_drop[i] = 1 where stored[i] (int64 [n]) is in sorted_ids (int64 [m], ascending),
    else 0 (a binary search per row: O(n log m), no temporary array); returns the first row
    marked, or n where none is."""
    m = sorted_ids.shape[0]
    first = stored.shape[0]
    for i in range(stored.shape[0]):
        v = stored[i]
        lo = lower_bound(sorted_ids, 0, m, v)
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


def insertion_ahead(words) -> None:
    """Start compiling, in the background server (:func:`vq.kernels.jit.cache.prefetch`), what
    adding rows to inverted lists runs: :func:`move_lists` for rows of each unsigned dtype of
    ``words`` (as ``vq.index.core.storage.byte_rows`` views the buffers) and
    :func:`list_slots`; for an index whose first ``add`` comes after a training that compiles
    other kernels first. Nothing where they are compiled already, or compiles are not handed
    to the background."""
    offsets = np.zeros(1, np.int64)
    for word in sorted({np.dtype(w).str for w in words}):
        cache.prefetch(move_lists, np.zeros((0, 1), word), offsets, offsets, True)
    cache.prefetch(list_slots, offsets, offsets, offsets)
