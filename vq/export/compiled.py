"""``check_compiles``: compile a module with static shapes and count what torch._dynamo does.

The accelerator-deployment failure this guards against is the silent recompile: a shape or a
tensor value that changes between calls makes the compiler build a new graph (on an NPU or
TensorRT, minutes to an hour each). Here every distinct input shape should compile exactly one
graph, once; calls at a shape already seen, with any data, should compile nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class CompileReport:
    """What :func:`check_compiles` counted.

    Attributes:
        calls: calls made.
        shapes: distinct input signatures (shape, dtype, device) among them.
        graphs: graphs torch._dynamo compiled (``counters["stats"]["unique_graphs"]``).
        recompiles: graphs compiled by calls whose signature had been seen before (0 when
            the module is static).
        graph_breaks: graph breaks counted (always 0 with ``fullgraph=True``, which raises
            on the first one instead).
    """

    calls: int
    shapes: int
    graphs: int
    recompiles: int
    graph_breaks: int

    @property
    def ok(self) -> bool:
        """One graph per input signature, no recompilation, no graph break."""
        return self.recompiles == 0 and self.graph_breaks == 0 and self.graphs <= self.shapes


def check_compiles(
    module: torch.nn.Module, batches: Iterable[torch.Tensor], *, backend: str = "inductor"
) -> CompileReport:
    """Compile ``module`` with ``fullgraph=True, dynamic=False`` and call it on each batch.

    Resets torch._dynamo first (as ``torch._dynamo.reset()``: other compiled functions of the
    process recompile on their next call) so that the counts are this module's alone.

    Args:
        module: a module taking one tensor (e.g. from :func:`vq.export.export_module`).
        batches: the inputs, in call order; repeat shapes with new data to check that nothing
            recompiles (e.g. ``pad_batch`` buckets).
        backend: torch.compile backend: "inductor" (generated C++/Triton code), or "eager" /
            "aot_eager" to check tracing and guards without code generation (much faster).

    Returns:
        A :class:`CompileReport`.

    Raises:
        torch._dynamo.exc.Unsupported: the module has a graph break (fullgraph=True).
    """
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(module, fullgraph=True, dynamic=False, backend=backend)
    seen: set[tuple] = set()
    calls = recompiles = 0
    for batch in batches:
        key = (tuple(batch.shape), batch.dtype, batch.device)
        before = counters["stats"]["unique_graphs"]
        with torch.no_grad():
            compiled(batch)
        if key in seen:
            recompiles += counters["stats"]["unique_graphs"] - before
        seen.add(key)
        calls += 1
    return CompileReport(
        calls=calls,
        shapes=len(seen),
        graphs=counters["stats"]["unique_graphs"],
        recompiles=recompiles,
        graph_breaks=sum(counters["graph_break"].values()),
    )
