"""How many bytes an index holds: its buffers and parameters (what ``save`` writes) and the
arrays its searches keep derived from them (norms, transposed centroids, an id order, padded
lists of the torch path), each region of memory
counted once however many tensors, views and caches share it.

The walk starts at the index's module and follows what its modules hold: tensors, numpy
arrays, containers, functions' closures (the lean searches), and vq's own objects (caches,
searchers); nothing else. Regions are keyed by device, so CUDA bytes are counted apart from
host bytes and added to them.
"""

from __future__ import annotations

import functools
import types

import numpy as np
import torch
from numpy.lib.array_utils import byte_bounds
from torch import nn

#: regions per device: [(start, end)] byte addresses
Regions = dict[str, list[tuple[int, int]]]


def held_bytes(module: nn.Module) -> int:
    """Bytes of memory (on every device, summed) that ``module`` holds: buffers, parameters,
    and the arrays kept in its modules' caches, overlapping regions counted once."""
    regions: Regions = {}
    _walk(module, regions, set())
    return sum(_union_length(spans) for spans in regions.values())


def _walk(obj, regions: Regions, seen: set[int]) -> None:
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        if obj.layout == torch.strided and obj.untyped_storage().nbytes():
            storage = obj.untyped_storage()
            start = storage.data_ptr()
            regions.setdefault(str(obj.device), []).append((start, start + storage.nbytes()))
    elif isinstance(obj, np.ndarray):
        if obj.nbytes:
            start, end = byte_bounds(obj)
            regions.setdefault("cpu", []).append((start, end))
    elif isinstance(obj, (tuple, list, set, frozenset)):
        for item in obj:
            _walk(item, regions, seen)
    elif isinstance(obj, dict):
        for item in obj.values():
            _walk(item, regions, seen)
    elif isinstance(obj, types.FunctionType):
        for cell in obj.__closure__ or ():
            try:
                _walk(cell.cell_contents, regions, seen)
            except ValueError:  # an empty cell
                pass
    elif isinstance(obj, functools.partial):
        _walk((obj.func, obj.args, obj.keywords), regions, seen)
    elif isinstance(obj, nn.Module) or type(obj).__module__.startswith("vq."):
        _walk(vars(obj) if hasattr(obj, "__dict__") else (), regions, seen)


def _union_length(spans: list[tuple[int, int]]) -> int:
    total, reach = 0, -1
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


__all__ = ["held_bytes"]
