"""What every export module shares: the object's own static-shape graph, wrapped with named
inputs and outputs, their dtypes and trailing shapes, and the metadata written into an
exported model."""

from __future__ import annotations

import copy
import importlib.util
from typing import NamedTuple

import torch
from torch import nn


class TensorSpec(NamedTuple):
    """A named input or output: ``shape`` excludes the leading batch axis, unless ``batched``
    is False (an input given once per call, e.g. a search's ``allowed`` mask)."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    batched: bool = True


class ExportModule(nn.Module):
    """A static-shape graph built from a trained quantizer or index, as an exported model
    presents it.

    ``core`` is the object's own static function, the one its torch path runs: a quantizer's
    ``static_encode`` / ``static_decode`` on a snapshot of it, or an index's ``searcher(...)``
    (constants copied at construction: codebooks, rotations, inverted lists padded to a fixed
    capacity, id tables). This module only adds what a deployment needs: the input and output
    specs (outputs are cast to their dtypes: codes to ``code_dtype``) and the metadata. The
    core's constants read through (``module.list_codes`` is ``module.core.list_codes``).

    ``forward`` uses matmul, gather, arg-min, top-k and elementwise ops only, with no
    data-dependent shapes and no Python branch on tensor values, so it traces, compiles
    (``fullgraph=True``) and exports as one graph. Every row of the batch is independent of the
    others.

    Attributes:
        core: the wrapped module (not named ``graph``: an exported program's modules have
            an fx ``graph``).
        inputs: the inputs, in ``forward``'s order: the batch (name, dtype, shape without the
            batch axis), then any per-call input (a filtered search's ``allowed`` mask).
        outputs: the outputs, in ``forward``'s order.
        metadata: facts written into an exported model (``dim``, ``k``, ``nprobe``, …).
    """

    def __init__(
        self,
        core: nn.Module,
        inputs: tuple[TensorSpec, ...],
        outputs: tuple[TensorSpec, ...],
        metadata: dict[str, str],
    ) -> None:
        super().__init__()
        self.core, self.inputs, self.outputs = core, inputs, outputs
        self.metadata: dict[str, str] = dict(metadata)

    def forward(self, x: torch.Tensor, *extra: torch.Tensor):
        out = self.core(x, *extra)
        if len(self.outputs) == 1:
            return out.to(self.outputs[0].dtype)
        return tuple(t.to(spec.dtype) for t, spec in zip(out, self.outputs, strict=True))

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            core = self.__dict__.get("_modules", {}).get("core")
            if core is None:
                raise
            return getattr(core, name)

    def example_input(self, batch_size: int, seed: int = 0) -> torch.Tensor:
        """A batch of ``batch_size`` rows of the first input's dtype and shape on the module's
        device (standard normal vectors, or valid codes)."""
        return self.example_inputs(batch_size, seed)[0]

    def example_inputs(self, batch_size: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
        """One tensor per input: the batch (:meth:`example_input`), then per-call inputs (a
        mask keeping every other id)."""
        gen = torch.Generator().manual_seed(seed)
        out = []
        for spec in self.inputs:
            shape = (batch_size, *spec.shape) if spec.batched else spec.shape
            if spec.dtype == torch.bool:
                x = torch.arange(shape[-1]).remainder(2).eq(0).expand(shape)
            elif spec.dtype.is_floating_point:
                x = torch.randn(shape, generator=gen, dtype=spec.dtype)
            else:
                high = int(self.metadata.get("codebook_size", 2))
                x = torch.randint(0, high, shape, generator=gen).to(spec.dtype)
            out.append(x.to(self.device))
        return tuple(out)

    @property
    def device(self) -> torch.device:
        return next(self.buffers()).device


class Method(nn.Module):
    """``module.<name>(x)`` as a module's ``forward`` (a quantizer's ``static_encode`` or
    ``static_decode``, whose own ``forward`` is the training step)."""

    def __init__(self, owner: nn.Module, name: str) -> None:
        super().__init__()
        self.owner, self.name = owner, name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return getattr(self.owner, self.name)(x)


def snapshot(module: nn.Module) -> nn.Module:
    """A frozen copy of ``module`` in eval mode (later training does not reach it), without the
    values the lean paths cache on it."""
    frozen = copy.deepcopy(module).eval()
    for m in frozen.modules():
        for key in [k for k in m.__dict__ if k.endswith("_cache")]:
            del m.__dict__[key]
    for p in frozen.parameters():
        p.requires_grad_(False)
    return frozen


def require(what: str, *modules: str) -> None:
    """Raise ImportError naming the missing optional packages and how to install them."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise ImportError(f"{what} needs {' and '.join(missing)}: pip install 'vq[export]'")
