"""``vq build`` and ``vq search``: the work, given the arguments :mod:`vq.apps.arguments`
parsed.

Everything that can be checked cheaply is checked before the long part: the output can be
written, the index description parses, the data file's headers fit its format, the queries
have the index's dimension, the ground truth has a row per query and the index's metric, and
``-k`` fits the index and the machine's memory.
"""

from __future__ import annotations

import argparse

import numpy as np

import vq
from vq.apps.common import (
    InputError,
    check_k,
    check_writable,
    metric_for,
    open_input,
    read_truth,
    report_search,
    set_threads,
    timed,
    writing,
)
from vq.kernels.jit import cache


def _compile_notice(what: str):
    """A context printing one line on stderr before the first kernel compilation inside (the
    kernels are then kept for every later process)."""
    where = cache.folder()
    kept = f"kept in {where}" if where is not None else "in memory: the cache is not writable"
    return cache.announce(f"vq: compiling {what}, once per machine ({kept})")


def build(args: argparse.Namespace) -> int:
    """Train an index on ``args.data``, add the vectors, save it to ``args.output``."""
    check_writable(args.output, "-o")
    source = open_input(args.data, "train")
    n, dim = source.shape
    index = vq.index_factory(dim, args.index, metric=metric_for(args.metric, source))
    if args.nprobe is not None:  # checked before the (long) training
        _set(index, "nprobe", args.nprobe)
    if args.k_factor is not None:
        _set(index, "k_factor", args.k_factor)
    set_threads(args.threads)
    for inner in index.modules():
        if isinstance(inner, vq.index.Index):
            inner.verbose = not args.quiet
    x = source.read()
    train = x
    if args.train_size is not None and args.train_size < n:
        rng = np.random.default_rng(args.seed)
        train = x[np.sort(rng.choice(n, args.train_size, replace=False))]
    with _compile_notice(f"the kernels of {args.index} (dim {dim})"):
        _, t_train = timed(lambda: index.train(train))
        _, t_add = timed(lambda: index.add(x))
    writing(args.output, lambda: index.save(args.output))
    print(
        f"{args.index}: {index.ntotal} vectors of dim {dim}, trained on {len(train)} in "
        f"{t_train:.1f} s, added in {t_add:.1f} s; saved {args.output} "
        f"({args.output.stat().st_size / 2**20:.1f} MiB)"
    )
    if not args.no_warm_up:  # so that the first `vq search` (a service…) compiles nothing
        with _compile_notice(f"the search kernels of {args.index}"):
            compiled, seconds = timed(index.warm_up)
        if compiled:
            print(f"search kernels: {compiled} compiled in {seconds:.1f} s, kept for later runs")
    return 0


def _set(index, name: str, value: int) -> None:
    if not hasattr(index, name):
        raise InputError(f"--{name.replace('_', '-')} does not apply to {type(index).__name__}")
    setattr(index, name, value)


def search(args: argparse.Namespace) -> int:
    """Search the index ``args.index`` for the queries ``args.queries``; print QPS (and recall
    with ``args.gt``), write the ids to ``args.out``."""
    if args.out is not None:
        check_writable(args.out, "--out")
    index = vq.load_index(args.index, mmap=args.mmap)
    queries = open_input(args.queries, "test")
    nq, dim = queries.shape
    if dim != index.dim:
        raise InputError(
            f"queries: expected vectors of dim {index.dim}, got {dim} in {args.queries}"
        )
    truth = None if args.gt is None else read_truth(args.gt, nq, index)
    if args.radius is not None:
        return _range_search(index, queries.read(), args)
    if args.nprobe is not None:
        _set(index, "nprobe", args.nprobe)
    if args.k_factor is not None:
        _set(index, "k_factor", args.k_factor)
    check_k(args.k, index.ntotal, nq)
    set_threads(args.threads)
    q = queries.read()
    kind = f"{type(index).__name__} of dim {index.dim}"
    with _compile_notice(f"search kernels for this {kind}"):
        (_, ids), seconds = timed(lambda: index.search(q, args.k))
    line = f"{nq} queries, k={args.k}: {seconds:.3f} s, {nq / seconds:.0f} QPS"
    report_search(line, ids, args.k, truth, args.out)
    return 0


def _range_search(index, q: np.ndarray, args: argparse.Namespace) -> int:
    set_threads(args.threads)
    params = {} if args.nprobe is None else {"nprobe": args.nprobe}
    try:
        (lims, dist, ids), seconds = timed(lambda: index.range_search(q, args.radius, **params))
    except (ValueError, TypeError, NotImplementedError) as err:
        raise InputError(str(err)) from err
    print(
        f"{len(q)} queries, radius {args.radius:g}: {seconds:.3f} s, {len(q) / seconds:.0f} QPS, "
        f"{int(lims[-1])} results ({lims[-1] / max(1, len(q)):.1f} per query)"
    )
    if args.out is not None:
        writing(args.out, lambda: np.savez(args.out, lims=lims, D=dist, I=ids))
    return 0
