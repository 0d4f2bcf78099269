"""Compile the kernels of the common configurations ahead of time (``vq warmup``).

Every kernel compiles once per machine and configuration and is kept in the user's cache
directory (:mod:`vq.kernels.jit.cache`); this runs the calls that compile them (train, add, the
searches of ``Index.warm_up``: one query, a batch, a large batch; filtered and range searches;
encode and decode) on a small random set for each index description, so that no later process
(a command, a notebook, a service, a test) waits for a compiler. Kernels are specialised by the
shape of the codes (sub-vector size, number of sub-quantizers), so warm up at the dimension you
use. ``vq warmup --saved FILE`` warms the searches of a saved index instead.

:func:`warmup` is the library function; :func:`run` is ``vq warmup`` (its arguments parsed by
:mod:`vq.apps.arguments`, where :data:`COMMON`, the kinds it compiles by default, is defined).
"""

from __future__ import annotations

import argparse
import multiprocessing
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from vq import kernels
from vq._checks import check_int
from vq.apps.arguments import COMMON
from vq.apps.common import timed
from vq.index import HNSW, IdFilter, index_factory, load_index
from vq.kernels.common.threads import set_num_threads
from vq.kernels.jit import cache
from vq.quantizers import VectorQuantizer


@dataclass(frozen=True)
class Warmed:
    """One description's warm-up: ``seconds`` spent, ``compiled`` kernels compiled (0: all
    of them were in the cache already)."""

    description: str
    seconds: float
    compiled: int


def warmup(
    descriptions: Iterable[str] = COMMON,
    dim: int = 128,
    metrics: Iterable[str] = ("l2",),
    layer: bool = True,
    report: Callable[[Warmed], None] | None = None,
    processes: int = 1,
) -> list[Warmed]:
    """Compile (or load from the cache) every kernel the given index kinds use.

    Args:
        descriptions: faiss-style index descriptions (see :func:`vq.index_factory`).
        dim: the vector dimension to compile for (sub-vector sizes follow from it).
        metrics: "l2" and/or "ip".
        layer: also one training step of an EMA ``VectorQuantizer`` layer.
        report: called after each item, e.g. to print progress.
        processes: warm up this many items at a time, each in a process of its own (numba
            compiles on one core); 1: in this process, one after another.

    Returns:
        One :class:`Warmed` per description and metric (and the layer last), in order.
    """
    dim = check_int(dim, "dim", 1)
    processes = check_int(processes, "processes", 1)
    items = [(d, m) for m in metrics for d in descriptions]
    for description, _ in items:  # refuse a bad description before compiling anything
        index_factory(dim, description)
    if layer:
        items.append((_LAYER, "l2"))
    if processes == 1:
        done = []
        for description, metric in items:
            done.append(_warm_one(description, metric, dim))
            if report is not None:
                report(done[-1])
        return done
    context = multiprocessing.get_context("spawn")  # no fork of a process holding threads
    with ProcessPoolExecutor(min(processes, len(items)), mp_context=context) as pool:
        futures = [pool.submit(_warm_one, d, m, dim, 1) for d, m in items]
        done = []
        for future in futures:  # in order; each reported once finished
            done.append(future.result())
            if report is not None:
                report(done[-1])
    return done


_LAYER = "VectorQuantizer layer step"


def _warm_one(description: str, metric: str, dim: int, threads: int | None = None) -> Warmed:
    """Run the calls of one item (in a worker process: on ``threads`` threads)."""
    if threads is not None:
        torch.set_num_threads(threads)
        set_num_threads(threads)
    x = np.random.default_rng(0).standard_normal((2048, dim), dtype=np.float32)
    start, before = time.perf_counter(), cache.compiles()
    if description == _LAYER:
        _layer_step(torch.from_numpy(x[:512]))
        return Warmed(description, time.perf_counter() - start, cache.compiles() - before)
    index = index_factory(dim, description, metric=metric)
    index.train(x)
    index.add(x)
    index.warm_up(10)  # each search path: one query, a batch IVF splits, large batches
    _filtered_and_range(index, x)
    if description == "Flat":  # the lean path's scan split between threads (large indexes)
        heap_d = np.full((2, 1, 10), np.inf, np.float32)
        heap_i = np.full((2, 1, 10), -1, np.int64)
        kernels.flat_parts(x[:1], x, np.zeros(len(x), np.float32), metric == "ip", heap_d, heap_i)
    name = description if metric == "l2" else f"{description} (ip)"
    return Warmed(name, time.perf_counter() - start, cache.compiles() - before)


def _filtered_and_range(index, x: np.ndarray) -> None:
    """The filtered searches (an id filter, a bitmap) and the range search, where the kind
    has them (HNSW: its int8 traversal too)."""
    if type(index) is HNSW:
        int8 = HNSW(index.dim, index.M, index.metric, traversal="int8")
        int8.add(x)
        int8.warm_up(10)
    for allowed in (IdFilter(np.arange(0, len(x), 3)), np.arange(len(x)) % 2 == 0):
        for batch in (x[:64], x[:1]):
            index.search(batch, 10, allowed=allowed)
    tenth = index.search(x[:64], 10)[0][:, -1]  # ±inf where a probed list held fewer than 10
    tenth = tenth[np.isfinite(tenth)]
    radius = float(tenth.mean()) if tenth.size else 0.0  # about 10 hits per query
    try:
        index.range_search(x[:64], radius)
    except NotImplementedError:  # a kind without range search
        pass


def _layer_step(x: torch.Tensor) -> None:
    """One training step of an EMA vector-quantizer layer (k-means init, dead codes)."""
    layer = VectorQuantizer(x.shape[1], 256, learning="ema").train()
    z = x.clone().requires_grad_(True)
    out = layer(z)
    (out.quantized.square().mean() + out.loss).backward()


def run(args: argparse.Namespace) -> int:
    """``vq warmup``: the saved indexes (``--saved``) and the kinds (``--index``, default
    :data:`COMMON`) warmed up, a line for each and a summary."""
    metrics = ("l2", "ip") if args.metric == "both" else (args.metric,)

    def report(item: Warmed) -> None:
        state = f"{item.compiled} kernels compiled" if item.compiled else "all cached"
        print(f"{item.description:28s} {item.seconds:6.1f} s  ({state})", flush=True)

    start = time.perf_counter()
    indexes = [(path, load_index(path)) for path in args.saved or ()]  # all read first
    done = []
    for path, index in indexes:
        compiled, seconds = timed(index.warm_up)
        done.append(Warmed(f"{path} ({type(index).__name__})", seconds, compiled))
        report(done[-1])
    what = [f"{len(done)} saved indexes"] if done else []
    if args.index or not args.saved:
        kinds = args.index or COMMON
        n = len(done)
        done += warmup(kinds, args.dim, metrics, not args.no_layer, report, args.jobs)
        what.append(f"{len(done) - n} kinds at dim {args.dim}")
    compiled = sum(item.compiled for item in done)
    print(
        f"warm-up of {' and '.join(what)}: {time.perf_counter() - start:.1f} s, "
        f"{compiled} kernels compiled; kept in {cache.folder() or 'memory only'}"
    )
    return 0
