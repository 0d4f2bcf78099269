"""The lean search of the IVF kinds (see :mod:`vq.index.core.lean` for the lean path): the
coarse step, the scan of the probed lists and ids in one kernel call on the calling thread
(each kind's ``_lean_kernel``), and a batch of up to :data:`vq.index.core.lean.SPLIT_BATCH`
queries split between the threads where its coarse step and its whole work are small.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np

from vq import _cpu
from vq._checks import check_positive
from vq.index.core.lean import SMALL_BATCH
from vq.index.core.searching import NO_IDS
from vq.kernels.common.bundles import Coarse, finish_bundle, plain
from vq.kernels.common.constants import metric as kernel_metric
from vq.kernels.common.dots import PANEL
from vq.kernels.common.select import unique_rows, unique_rows_range
from vq.kernels.common.threads import parallel_for
from vq.kernels.exact.coarse_probe import BOUND_RATIO, BOUND_SPARE, column_panels, probe_lists

#: an IVF search of more than SMALL_BATCH queries takes the lean path, its queries split between
#: the threads, where its coarse step is small (at most SPLIT_COARSE products of centroid and
#: query components: the lean kernels scan the centroids, with no matrix product; fewer where a
#: bound rules most centroids out, see vq.kernels.exact.coarse_probe.probe_bounded) and so is its
#: whole estimated work (SPLIT_WORK ns): there the general path's fixed costs (the coarse step
#: split on its own, torch tensors, two pool wake-ups) are most of the time
SPLIT_COARSE = 1 << 16
SPLIT_WORK = 20_000_000
#: a Coarse's bound fields where there is no bound (r = 0: the full coarse step)
NO_BOUND = (
    np.zeros((0, 0, PANEL), np.float32),
    np.zeros((0, 0, PANEL), np.float32),
    np.zeros(0, np.float32),
    np.zeros((0, 0), np.float32),
)


def coarse_arrays(index, ip: bool) -> tuple:
    """What the lean kernels' coarse step reads, a :class:`vq.kernels.common.bundles.Coarse` as
    a plain tuple: ``(panels float32 [ceil(nlist / 16), d, 16], norms float32 [nlist], *bound)``
    (the centroids as :func:`vq.kernels.exact.coarse_probe.column_panels` lays them out, their
    squared norms, and the bound of :func:`vq.kernels.exact.coarse_probe.probe_bounded`, L2
    only), kept until the centroids change."""
    c = index.quantizer.codebook
    panels = index.derived("centroid_panels", (c,), lambda: column_panels(c.float().T.numpy()))
    bound = NO_BOUND if ip else index._coarse_bound()  # (L2: see probe_bounded)
    return plain(Coarse(panels, index._centroid_norms(), *bound))


def cost_model(index, coarse: tuple) -> tuple[float, float, Callable[[int], int]]:
    """``(fixed, per_probe, coarse_products)``: ``search_work``'s estimate of a query, ``fixed
    + nprobe * per_probe`` ns, and the products of the coarse step per query at an nprobe (as
    ``probe_few`` computes them)."""
    nlist = index.nlist
    per_probe = index.ntotal / nlist * index.vector_ns()
    fixed = index.search_work(1, 1, nprobe=1) - per_probe
    d, r = index.dim, Coarse(*coarse).proj.shape[1]

    def coarse_products(nprobe: int) -> int:
        if r and nlist >= BOUND_RATIO * (nprobe + BOUND_SPARE):
            return d * r + nlist * r + (nprobe + BOUND_SPARE) * d
        return nlist * d

    return fixed, per_probe, coarse_products


def ivf_lean_search(index, refine: tuple | None) -> Callable:
    """The lean search of an IVF index (``index._lean_kernel``: the coarse step, the scan of
    the probed lists and ids in one kernel call on the calling thread), and with ``refine`` =
    (vectors, ids, k_factor) that of a re-ranking wrapper around it, in the same call (see
    ``Index.build_refined_lean_search``). The closure returns None for a call whose estimated
    work is not small (the general, parallel path)."""
    mapped = refine is None and index.rows_mapped()
    kernel, args = (None, ()) if mapped else index._lean_kernel(index)
    ip = kernel_metric(index.metric == "ip")  # (a static: each metric compiles its own kernel)
    coarse = coarse_arrays(index, ip)
    # spilled lists: the best k distinct ids among the best 2 k rows (made unique below),
    # unless the kind's scan keeps each id once itself
    distinct = not mapped and index.scans_distinct_ids()
    repeats = index.copies > 1 and not distinct
    ids = index.ids.numpy() if index.ids.shape[0] == index.ntotal or distinct else NO_IDS
    row_ids = None
    if repeats:
        if refine is not None:
            raise ValueError("the lean search of spilled lists takes no re-ranking")
        ids = NO_IDS  # (the kernel's ids: rows, made unique below)
        row_ids = None if mapped else index.ids.numpy()
    ref_x, ref_ids, k_factor = refine or (None, None, None)
    finish = plain(finish_bundle(ids, ref_x, ref_ids))  # (one type with or without: a value)
    nlist, serial_work = index.nlist, _cpu.SERIAL_WORK
    fixed, per_probe, coarse_products = cost_model(index, coarse)
    read_from_file = mapped_scan(index, coarse, ip) if mapped else None

    def search(q: np.ndarray, k: int, ranked: bool, params: dict):
        nprobe = params.get("nprobe")
        nprobe = min(index.nprobe if nprobe is None else check_positive(nprobe, "nprobe"), nlist)
        max_codes = params.get("max_codes")  # (a filter's cap: checked, then unused here)
        if max_codes is not None and (type(max_codes) is not int or max_codes < 1):
            return None  # the general path says what is wrong
        nq = q.shape[0]
        kc = k
        if k_factor is not None:  # candidates for the re-ranking
            factor = params.get("k_factor")
            factor = k_factor() if factor is None else factor
            if type(factor) is not int or factor < 1:
                return None  # the general path says what is wrong
            kc = k * factor
        work = nq * (fixed + nprobe * per_probe)
        if nq > SMALL_BATCH and (coarse_products(nprobe) > SPLIT_COARSE or work >= SPLIT_WORK):
            return None
        if nq <= SMALL_BATCH and work >= serial_work:
            return None
        split_up = nq > SMALL_BATCH and work >= serial_work  # else on the calling thread
        # spilled lists: the best copies * k rows (k_candidates), made unique below
        width = min(k * index.copies, index.n_rows) if repeats else k
        out_dist = np.empty((nq, width), np.float32)
        found = np.empty((nq, width), np.int64)  # ids, or rows where mapped or spilled
        ranked = ranked or repeats
        if read_from_file is not None:
            done = read_from_file(q, nprobe, kc, width, repeats, out_dist, found, ranked, split_up)
            if done is None:
                return None
            at, stored = done
        else:
            run = partial(split_queries, kernel) if split_up else kernel
            kept = width if repeats else kc  # the kernel's k_candidates
            if not run(q, coarse, *args, finish, ip, nprobe, kept, (out_dist, found), ranked):
                return None  # (not finite: the general path says)
            if not repeats:
                return out_dist, found
            at, stored = found, row_ids
        if repeats:  # each id's first row, as the general path keeps them (unique_rows)
            first_dist, first = np.empty((nq, k), np.float32), np.empty((nq, k), np.int64)
            if split_up:
                unique_rows(out_dist, at, stored, first_dist, first)
            else:
                unique_rows_range(0, nq, out_dist, at, stored, first_dist, first)
            out_dist, at = first_dist, first
        return out_dist, np.where(at >= 0, stored[np.maximum(at, 0)], -1)

    search.splits = coarse_products(1) <= SPLIT_COARSE
    return search


def mapped_scan(index, coarse: tuple, ip: bool) -> Callable:
    """The lean scan of an index whose rows are mapped from its file: the lists the kernel may
    probe (:func:`near_lists`) read with ``pread`` first, then the kind's lean kernel over
    them; it returns the found rows' ``(positions, stored ids)``, or None for a query that is
    not finite."""
    panels, c_sq = coarse[0], coarse[1]
    nlist = index.nlist
    finish = plain(finish_bundle(NO_IDS))  # (no re-ranking of mapped rows)

    def scan(q, nprobe: int, kc: int, width: int, repeats: bool, out_dist, found, ranked, split_up):
        lists = near_lists(q, panels, c_sq, ip, nprobe)
        local = index.read_probed_lists(np.arange(nlist) if lists is None else lists)
        local_kernel, rest = index._lean_kernel(local)
        run = partial(split_queries, local_kernel) if split_up else local_kernel
        kept = width if repeats else kc  # the kernel's k_candidates
        if not run(q, coarse, *rest, finish, ip, nprobe, kept, (out_dist, found), ranked):
            return None
        return index._ids_of(local.stored_rows(found))

    return scan


def split_queries(kernel, q: np.ndarray, *rest):
    """``kernel(q, *rest)`` (a lean IVF kernel: the queries first, ``(out_dist, out_ids)``
    and ``ranked`` last) with the queries cut into one slice per thread
    (:func:`vq.kernels.common.threads.parallel_for`); whether every slice was done (False: a slice
    held a query that is not finite)."""
    *rest, (out_dist, out_ids), ranked = rest
    refused = []

    def body(q0: int, q1: int) -> None:
        if not kernel(q[q0:q1], *rest, (out_dist[q0:q1], out_ids[q0:q1]), ranked):
            refused.append(q0)

    parallel_for(body, q.shape[0], grain=SMALL_BATCH)
    return not refused


def near_lists(q, panels, c_sq, inner_product: bool, nprobe: int) -> np.ndarray | None:
    """Every list a lean search of ``q`` (float32 [nq, d]) may probe (the lean kernels run
    :func:`vq.kernels.exact.coarse_probe.probe_lists` over the centroids' ``panels`` themselves):
    the lists whose score, as computed here (the same kernel, on the calling thread), is within a
    rounding bound of the ``nprobe``-th smallest (int64, any shape), or None for all of them
    (``c_sq``: float32 [nlist], the centroids' squared norms). Each score is a float32 dot product
    of d terms, within ``δ = (d + 3) · 2⁻²⁴ · (‖q‖² + ‖c‖²)`` of the exact value wherever it is
    computed, so a list the lean kernel picks lies within 4 δ of this ``nprobe``-th value; the band
    is twice that wide (None where it reaches past the ``2 nprobe + 8`` nearest)."""
    nlist = c_sq.shape[0]
    wide = min(nlist, 2 * nprobe + 8)
    scores = np.empty((q.shape[0], wide), dtype=np.float32)
    lists = np.empty((q.shape[0], wide), dtype=np.int64)
    probe_lists(q, panels, c_sq, kernel_metric(inner_product), scores, lists)
    bound = (q.shape[1] + 8) * 2.0**-21 * ((q * q).sum(1) + c_sq.max(initial=0.0))
    with np.errstate(invalid="ignore"):  # NaN queries match nothing (the kernel refuses them)
        near = scores <= (scores[:, nprobe - 1] + bound)[:, None]
    if wide < nlist and near[:, -1].any():
        return None
    return lists[near]
