"""Values derived from a module tree, kept until the tree changes.

The lean paths (an index's small searches, a quantizer's small encodes) bind numpy views of a
module's buffers and the arrays its kernels read once, and reuse them call after call. They
must not outlive what they were built from: :func:`cached` keeps such a value with a
snapshot of the whole module tree — every buffer, parameter and submodule by identity,
every tensor by its version counter — and builds it anew when anything was replaced or
modified in place. Checking the snapshot is a short loop, two identity or integer comparisons
per entry, which is the price of that guarantee on each call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn


def snapshot(module: nn.Module) -> tuple:
    """``(table, name, value, version)`` for every buffer, parameter and submodule in the
    tree of ``module`` (version None for what is not a tensor)."""
    checks = []
    for m in module.modules():
        for table in (m._buffers, m._parameters, m._modules):
            for name, value in table.items():
                version = value._version if isinstance(value, torch.Tensor) else None
                checks.append((table, name, value, version))
    return tuple(checks)


def unchanged(checks: tuple) -> bool:
    """Whether everything a :func:`snapshot` saw is still in place and unmodified."""
    try:  # (subscripts, not .get: no method call per entry on a per-call path)
        for table, name, value, version in checks:
            if table[name] is not value or (version is not None and value._version != version):
                return False
    except KeyError:  # deleted
        return False
    return True


def cached(module: nn.Module, key: str, build: Callable[[], Any]) -> Any:
    """``build()``, kept in ``module.__dict__[key]`` until the module tree changes (see the
    module docstring); ``drop(module, key)`` forgets it at once."""
    entry = module.__dict__.get(key)
    if entry is not None and unchanged(entry[1]):
        return entry[0]
    value = build()
    module.__dict__[key] = (value, snapshot(module))
    return value


def drop(module: nn.Module, key: str) -> None:
    """Forget the value :func:`cached` keeps under ``key`` in every module of the tree (and
    the storage it holds)."""
    for m in module.modules():
        m.__dict__.pop(key, None)
