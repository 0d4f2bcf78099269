"""What every export module shares: named inputs and outputs, their dtypes and trailing
shapes, and the metadata written into an exported model."""

from __future__ import annotations

import importlib.util
from typing import NamedTuple

import torch
from torch import nn


class TensorSpec(NamedTuple):
    """A named input or output: ``shape`` excludes the leading batch axis."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]


class ExportModule(nn.Module):
    """A static-shape graph built from a trained quantizer or index.

    Its constants (codebooks, rotations, padded inverted lists, id tables) are buffers copied
    or derived at construction; ``forward`` uses matmul, gather, arg-min, top-k and elementwise
    ops only, with no data-dependent shapes and no Python branch on tensor values, so it
    traces, compiles (``fullgraph=True``) and exports as one graph. Every row of the batch is
    independent of the others.

    Attributes:
        inputs: the single input (name, dtype, shape without the batch axis).
        outputs: the outputs, in ``forward``'s order.
        metadata: facts written into an exported model (``dim``, ``k``, ``nprobe``, …).
    """

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    def __init__(self) -> None:
        super().__init__()
        self.metadata: dict[str, str] = {}

    def example_input(self, batch_size: int, seed: int = 0) -> torch.Tensor:
        """A batch of ``batch_size`` rows of the input's dtype and shape on the module's device
        (standard normal vectors, or valid codes)."""
        (spec,) = self.inputs
        gen = torch.Generator().manual_seed(seed)
        shape = (batch_size, *spec.shape)
        if spec.dtype.is_floating_point:
            x = torch.randn(shape, generator=gen, dtype=spec.dtype)
        else:
            high = int(self.metadata.get("codebook_size", 2))
            x = torch.randint(0, high, shape, generator=gen).to(spec.dtype)
        return x.to(self.device)

    @property
    def device(self) -> torch.device:
        return next(self.buffers()).device


def require(what: str, *modules: str) -> None:
    """Raise ImportError naming the missing optional packages and how to install them."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise ImportError(f"{what} needs {' and '.join(missing)}: pip install 'vq[export]'")
