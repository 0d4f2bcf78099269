"""``audit``: does an ONNX model keep every shape static?

Accelerator compilers (TensorRT, NPU toolchains) build one engine per input shape; a dimension
that is symbolic, or that only the data decide, forces a rebuild or a fallback at run time. The
audit reads the graph (after ONNX shape inference) and reports:

- the count of every op type (subgraphs included);
- every tensor with a symbolic or unknown dimension, or no inferred shape at all;
- every op whose output shape depends on tensor values: NonZero, Unique, Compress,
  NonMaxSuppression, control flow (If, Loop, Scan), and the ops whose shape-giving inputs
  (Reshape/Expand/Tile targets, Slice bounds, TopK's k, Range, ConstantOfShape, OneHot depth,
  Pad widths, Resize sizes, Squeeze/Unsqueeze/Split/Reduce axes) are not constants.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from vq.export.base import require

#: ops whose output shape depends on the values of their inputs, always
DATA_DEPENDENT = {
    "NonZero": "output length is the number of non-zero elements",
    "Unique": "output length is the number of distinct values",
    "Compress": "output length is the number of true conditions",
    "NonMaxSuppression": "output length is the number of boxes kept",
    "If": "control flow: the branch taken depends on data",
    "Loop": "control flow: trip count and outputs depend on data",
    "Scan": "control flow over a sequence",
    "StringSplit": "output length depends on the strings",
}

#: op → positions of the inputs that give its output shape (they must be constants)
SHAPE_INPUTS = {
    "Reshape": (1,),
    "Expand": (1,),
    "Tile": (1,),
    "Slice": (1, 2, 3, 4),
    "Pad": (1, 3),
    "ConstantOfShape": (0,),
    "Range": (0, 1, 2),
    "TopK": (1,),
    "OneHot": (1,),
    "Resize": (2, 3),
    "Upsample": (1,),
    "Squeeze": (1,),
    "Unsqueeze": (1,),
    "Split": (1,),
    "CenterCropPad": (1,),
    **{
        op: (1,)
        for op in (
            "ReduceSum",
            "ReduceMean",
            "ReduceMax",
            "ReduceMin",
            "ReduceProd",
            "ReduceL1",
            "ReduceL2",
            "ReduceLogSum",
            "ReduceLogSumExp",
            "ReduceSumSquare",
        )
    },
}

#: ops whose output changes between runs although their inputs are constant
_RANDOM = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial"}


@dataclass
class AuditReport:
    """What :func:`audit` found.

    Attributes:
        op_counts: op type → number of nodes (subgraphs included), most frequent first.
        dynamic: ``(tensor, shape)`` for every tensor with a symbolic or unknown dimension;
            ``shape`` reads like ``"[batch, 128]"``, ``"[?, 10]"`` or ``"unknown"``.
        data_dependent: ``(node, op type, reason)`` for every op whose output shape depends
            on tensor values.
        inputs, outputs: ``"name: dtype[shape]"`` of the graph's inputs and outputs.
        opset: the default-domain opset version.
    """

    op_counts: dict[str, int]
    dynamic: list[tuple[str, str]] = field(default_factory=list)
    data_dependent: list[tuple[str, str, str]] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    opset: int | None = None

    @property
    def clean(self) -> bool:
        """True when every shape is static and no op's output shape depends on data."""
        return not self.dynamic and not self.data_dependent

    def __str__(self) -> str:
        lines = [
            f"inputs: {', '.join(self.inputs)}",
            f"outputs: {', '.join(self.outputs)}",
            f"opset: {self.opset}",
            "ops: " + ", ".join(f"{op} {n}" for op, n in self.op_counts.items()),
        ]
        if self.clean:
            lines.append("static: every shape is fixed, no op depends on data for its shape")
            return "\n".join(lines)
        lines.append(f"dynamic tensors: {len(self.dynamic)}")
        lines += [f"  {name}: {shape}" for name, shape in self.dynamic]
        lines.append(f"data-dependent ops: {len(self.data_dependent)}")
        lines += [f"  {node} ({op}): {why}" for node, op, why in self.data_dependent]
        return "\n".join(lines)


def audit(model) -> AuditReport:
    """Audit an ONNX model for dynamic shapes (see the module docstring).

    Args:
        model: a path to an ``.onnx`` file or an ``onnx.ModelProto``.

    Returns:
        An :class:`AuditReport`; ``report.clean`` is True for a fully static graph.

    Raises:
        FileNotFoundError: no file at the path.
        TypeError: neither a path nor a ModelProto.
        ValueError: the file is not a readable ONNX model.
    """
    require("vq.export.audit", "onnx")
    import onnx
    from google.protobuf.message import DecodeError

    if isinstance(model, str | os.PathLike):
        path = Path(model)
        if not path.is_file():
            raise FileNotFoundError(f"no ONNX model at {path}")
        try:
            model = onnx.load(str(path), load_external_data=False)
        except (DecodeError, ValueError, RuntimeError) as err:
            raise ValueError(f"{path}: not an ONNX model ({err})") from err
    if not isinstance(model, onnx.ModelProto):
        raise TypeError(f"audit: expected a path or an onnx.ModelProto, got {type(model).__name__}")
    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:  # noqa: BLE001 - a model shape inference rejects is audited as it is
        inferred = model
    graph = inferred.graph
    shapes = _shapes(graph)
    report = AuditReport(op_counts={})
    counts: Counter[str] = Counter()
    _walk(graph, shapes, counts, report)
    report.op_counts = dict(counts.most_common())
    report.inputs = [_signature(v) for v in graph.input if v.name not in _initializers(graph)]
    report.outputs = [_signature(v) for v in graph.output]
    report.opset = next(
        (o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None
    )
    produced = [out for node in graph.node for out in node.output if out]
    names = [v.name for v in graph.input if v.name not in _initializers(graph)] + produced
    for name in dict.fromkeys(names):
        shape = shapes.get(name)
        if shape is None or any(not isinstance(d, int) for d in shape):
            report.dynamic.append((name, _format(shape)))
    return report


def _initializers(graph) -> set[str]:
    return {t.name for t in graph.initializer} | {t.name for t in graph.sparse_initializer}


def _shapes(graph) -> dict[str, list | None]:
    """Tensor name → list of dims (int, or str for symbolic/unknown), None for unknown rank."""
    out: dict[str, list | None] = {}
    for info in (*graph.input, *graph.value_info, *graph.output):
        out[info.name] = _shape_of(info)
    for init in graph.initializer:
        out[init.name] = list(init.dims)
    return out


def _walk(graph, shapes: dict, counts: Counter, report: AuditReport) -> None:
    """Count ops and flag data-dependent ones, propagating which tensors are constants."""
    const = _initializers(graph) | {""}  # "" names an omitted optional input
    for node in graph.node:
        counts[node.op_type] += 1
        for attr in node.attribute:  # subgraphs of If / Loop / Scan
            for sub in (*([attr.g] if attr.HasField("g") else []), *attr.graphs):
                _walk(sub, {**shapes, **_shapes(sub)}, counts, report)
        name = node.name or f"{node.op_type}->{','.join(node.output)}"
        if node.op_type in DATA_DEPENDENT:
            report.data_dependent.append((name, node.op_type, DATA_DEPENDENT[node.op_type]))
        for pos in SHAPE_INPUTS.get(node.op_type, ()):
            if pos < len(node.input) and node.input[pos] not in const:
                report.data_dependent.append(
                    (
                        name,
                        node.op_type,
                        f"shape-giving input {node.input[pos]!r} is not a constant",
                    )
                )
        if _is_constant(node, const, shapes):
            const.update(node.output)


def _is_constant(node, const: set[str], shapes: dict) -> bool:
    if node.op_type in _RANDOM or node.op_type in DATA_DEPENDENT:
        return False
    if node.op_type == "Constant":
        return True
    if node.op_type in ("Shape", "Size"):  # known once the input's shape is static
        shape = shapes.get(node.input[0])
        return shape is not None and all(isinstance(d, int) for d in shape)
    return all(i in const for i in node.input)


def _format(shape: list | None) -> str:
    return "unknown" if shape is None else "[" + ", ".join(str(d) for d in shape) + "]"


def _signature(info) -> str:
    import onnx

    t = info.type.tensor_type
    dtype = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name if t.elem_type else "?"
    return f"{info.name}: {dtype}{_format(_shape_of(info))}"


def _shape_of(info) -> list | None:
    t = info.type.tensor_type
    if not t.HasField("shape"):
        return None
    return [
        int(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?") for d in t.shape.dim
    ]
