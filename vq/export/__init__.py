"""Deployment: quantizers and indexes as static-shape graphs for ONNX Runtime, TensorRT and NPUs.

    >>> from vq.export import to_onnx, audit, pad_batch, OnnxRunner
    >>> to_onnx(index, "ivfpq.onnx", batch_size=64, k=10, nprobe=16)   # queries → distances, ids
    >>> to_onnx(pq, "pq_encode.onnx", batch_size=256, what="encode")   # vectors → codes
    >>> audit("ivfpq.onnx").clean                                      # every shape static
    True
    >>> D, I = OnnxRunner("ivfpq.onnx")(queries)                      # any number of queries

The graphs are not written here: each quantizer and index kind writes its encode, decode or
search once, as a static-shape torch function next to its class (a quantizer's
``static_encode`` / ``static_decode``, an index's ``searcher(...)``: see
:mod:`vq.index.core.searchers`), which is also what its own torch path runs. This package wraps them
with names, dtypes, metadata, padding and checks.

- :func:`export_module`: the graph as a ``torch.nn.Module`` (for torch.compile, torch.export,
  TorchScript tracing, or your own exporter).
- :func:`to_onnx`: that module written as ONNX, with named inputs/outputs and metadata.
- :func:`audit`: op counts, dynamic tensors and data-dependent ops of any ONNX model.
- :func:`pad_batch`: variable batches padded to a few fixed sizes.
- :func:`check_compiles`: torch.compile(fullgraph=True, dynamic=False), graphs and recompiles
  counted.
- :class:`OnnxRunner`: an exported model in ONNX Runtime, any batch size.
"""

from vq.export.audit import AuditReport, audit
from vq.export.base import ExportModule, TensorSpec
from vq.export.compiled import CompileReport, check_compiles
from vq.export.modules import export_module
from vq.export.onnx import to_onnx
from vq.export.padding import pad_batch
from vq.export.runtime import OnnxRunner

__all__ = [
    "AuditReport",
    "CompileReport",
    "ExportModule",
    "OnnxRunner",
    "TensorSpec",
    "audit",
    "check_compiles",
    "export_module",
    "pad_batch",
    "to_onnx",
]
