"""Compile the kernels of the common configurations ahead of time (``vq warmup``).

Every kernel compiles once per machine and configuration and is kept in the user's cache
directory (:mod:`vq.kernels.cache`); this runs the calls that compile them — train, add, a
batch search and a one-query search, encode and decode — on a small random set for each index
description, so that no later process (a command, a notebook, a service, a test) waits for a
compiler. Kernels are specialised by the shape of the codes (sub-vector size, number of
sub-quantizers), so warm up at the dimension you use.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import torch

from vq._checks import check_int
from vq.index import index_factory
from vq.kernels import cache

#: the index kinds `vq warmup` compiles by default (at the dimension given)
COMMON = (
    "Flat",
    "PQ16",
    "IVF64,Flat",
    "IVF64,PQ16",
    "OPQ16,IVF64,PQ16",
    "PQ32x4fs",
    "IVF64,PQ32x4fs",
    "IVF64,PQ32x4fsr,RFlat",
)


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
) -> list[Warmed]:
    """Compile (or load from the cache) every kernel the given index kinds use.

    Args:
        descriptions: faiss-style index descriptions (see :func:`vq.index_factory`).
        dim: the vector dimension to compile for (sub-vector sizes follow from it).
        metrics: "l2" and/or "ip".
        layer: also one training step of an EMA ``VectorQuantizer`` layer.
        report: called after each item, e.g. to print progress.

    Returns:
        One :class:`Warmed` per description and metric (and the layer last), in order.
    """
    dim = check_int(dim, "dim", 1)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2048, dim), dtype=np.float32)
    done = []
    for metric in metrics:
        for description in descriptions:
            start, before = time.perf_counter(), cache.compiles()
            index = index_factory(dim, description, metric=metric)
            index.train(x)
            index.add(x)
            for batch in (x[:64], x[:1]):  # the batched and the one-query paths
                index.search(batch, 10)
                index.search(torch.from_numpy(batch), 10)
            seconds = time.perf_counter() - start
            name = description if metric == "l2" else f"{description} (ip)"
            done.append(Warmed(name, seconds, cache.compiles() - before))
            if report is not None:
                report(done[-1])
    if layer:
        start, before = time.perf_counter(), cache.compiles()
        _layer_step(torch.from_numpy(x[:512]))
        done.append(Warmed("VectorQuantizer layer step", time.perf_counter() - start,
                           cache.compiles() - before))  # fmt: skip
        if report is not None:
            report(done[-1])
    return done


def _layer_step(x: torch.Tensor) -> None:
    """One training step of an EMA vector-quantizer layer (k-means init, dead codes)."""
    from vq.quantizers import VectorQuantizer

    layer = VectorQuantizer(x.shape[1], 256, learning="ema").train()
    z = x.clone().requires_grad_(True)
    out = layer(z)
    (out.quantized.square().mean() + out.loss).backward()
