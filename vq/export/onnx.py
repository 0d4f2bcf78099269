"""``to_onnx``: quantizers and indexes to ONNX files with static shapes (``pip install
'vq[export]'``: onnx, onnxscript; onnxruntime to run them)."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch

from vq._checks import check_positive
from vq.export.base import ExportModule, require
from vq.export.modules import export_module

#: ONNX opset used unless ``opset`` says otherwise (what torch 2.11's exporter targets)
DEFAULT_OPSET = 20


def to_onnx(
    obj,
    path: str | os.PathLike,
    *,
    batch_size: int,
    what: str | None = None,
    k: int | None = None,
    nprobe: int | None = None,
    k_factor: int | None = None,
    capacity: int | None = None,
    code_dtype: torch.dtype | str | None = None,
    dynamic_batch: bool = False,
    opset: int | None = None,
    filtered: bool = False,
) -> Path:
    """Write the ``what`` graph of a quantizer or index to an ONNX file.

    Every shape in the graph is static: inputs ``[batch_size, …]``, inverted lists padded to a
    fixed capacity and masked with +inf, ids gathered from a padded table; the ops are
    Gemm/MatMul, Gather, ArgMin, TopK and elementwise ones (check with :func:`vq.export.audit`).
    The model carries metadata (``vq_version``, ``what``, ``source``, ``dim``, ``batch_size``,
    and for search ``k``, ``nprobe``, ``capacity``, ``metric``, ``ntotal``, the index config),
    readable with ``onnx.load(path).metadata_props`` or ONNX Runtime's
    ``session.get_modelmeta().custom_metadata_map``.

    Inputs and outputs are named: encode ``vectors`` → ``codes``; decode ``codes`` →
    ``vectors``; search ``queries`` → ``distances``, ``ids``; a filtered search (``filtered``)
    ``queries``, ``allowed`` (bool [id_space], no batch axis) → ``distances``, ``ids``.

    Args:
        obj: a trained quantizer or a trained, filled index (see :func:`export_module`).
        path: the ``.onnx`` file to write (a model over 2 GiB also writes ``<path>.data``).
        batch_size: rows per call (pad smaller batches with :func:`vq.export.pad_batch`).
        what: "encode" / "decode" (quantizers, default "encode") or "search" (indexes).
        k, nprobe, k_factor, capacity, code_dtype: as :func:`export_module`.
        dynamic_batch: make the batch axis symbolic ("batch") for runtimes that handle it;
            shapes that depend on it are then dynamic too (the audit lists them).
        opset: ONNX opset version (default 20).
        filtered: search only: take the mask ``allowed`` as a second input (see
            :func:`vq.export.search.search_module`).

    Returns:
        The path written.
    """
    require("vq.export.to_onnx", "onnx", "onnxscript")
    import onnx

    batch_size = check_positive(batch_size, "batch_size")
    opset = DEFAULT_OPSET if opset is None else check_positive(opset, "opset")
    options = {"k": k, "nprobe": nprobe, "k_factor": k_factor, "capacity": capacity}
    module = export_module(obj, what, code_dtype=code_dtype, filtered=filtered, **options)
    program = _program(module, batch_size, dynamic_batch, opset)
    program.model.metadata_props.update(
        {
            "vq_version": _version(),
            **module.metadata,
            "batch_size": "dynamic" if dynamic_batch else str(batch_size),
            "opset": str(opset),
        }
    )
    program.model.producer_name = "vq"
    program.model.producer_version = _version()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    nbytes = sum(b.numel() * b.element_size() for b in module.buffers())
    program.save(path, external_data=nbytes > (1 << 31) - (1 << 26))
    onnx.checker.check_model(str(path))
    return path


def _program(module: ExportModule, batch_size: int, dynamic_batch: bool, opset: int):
    """The ONNX program of ``module`` traced at ``batch_size`` rows (a symbolic batch axis
    named "batch" when ``dynamic_batch``), inputs and outputs named after its specs."""
    # a symbolic batch cannot be traced from 1 row (torch.export specialises sizes 0 and 1)
    examples = module.example_inputs(max(batch_size, 2) if dynamic_batch else batch_size)
    dynamic_shapes = None
    if dynamic_batch:
        batch = torch.export.Dim("batch", min=1)
        first, *rest = ({0: batch} if s.batched else None for s in module.inputs)
        dynamic_shapes = (first, tuple(rest)) if rest else (first,)  # forward(x, *extra)
    with _quiet(), torch.no_grad():
        program = _export(
            module,
            examples,
            input_names=[spec.name for spec in module.inputs],
            output_names=[spec.name for spec in module.outputs],
            opset_version=opset,
            dynamic_shapes=dynamic_shapes,
            optimize=True,
            verbose=False,
        )
    if dynamic_batch:  # name the symbolic batch axis "batch" wherever it appears
        program.rename_axes({program.model.graph.inputs[0].shape[0]: "batch"})
    return program


def _export(module: torch.nn.Module, args: tuple, **options):
    """``torch.onnx.export(module, args, dynamo=True, **options)``, with the exporter's table of
    ONNX translations built once per process and opset: torch rebuilds it on every call (from
    the source of ~500 functions), which costs more than exporting a vq graph. Falls back to
    the public call when torch's internals differ from 2.11's."""
    try:
        from torch.onnx._internal.exporter import _constants, _core, _registration
    except ImportError:
        _core = None
    opset = options["opset_version"]
    if _core is None or not hasattr(_core, "export") or opset < _constants.TORCHLIB_OPSET:
        return torch.onnx.export(module, args, dynamo=True, **options)
    return _core.export(module, args, registry=_registry(_registration, opset), **options)


@functools.cache
def _registry(registration, opset: int):
    return registration.ONNXRegistry.from_torchlib(opset_version=opset)


def _version() -> str:
    import vq

    return vq.__version__


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence the exporter's progress lines and its notes about optional packages."""
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with (
            open(os.devnull, "w") as sink,
            contextlib.redirect_stdout(sink),
            warnings.catch_warnings(),
        ):
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)
