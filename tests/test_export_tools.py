"""vq.export's tools: pad_batch buckets, OnnxRunner's checks and torch I/O, the ONNX audit,
and the message when an optional package is missing."""

import numpy as np
import pytest
import torch
from export_helpers import (
    DIM,
    fixture_data,  # noqa: F401 (a fixture)
    fixture_exported,  # noqa: F401 (a fixture)
    fixture_ort,  # noqa: F401 (a fixture)
    fixture_quantizers,  # noqa: F401 (a fixture)
)

from vq.export import OnnxRunner, audit, pad_batch, to_onnx


# -- pad_batch ----------------------------------------------------------------------------
def test_pad_batch_picks_the_smallest_bucket_and_keeps_rows():
    x = np.arange(15, dtype=np.float32).reshape(5, 3)
    padded, n = pad_batch(x, sizes=(8, 1, 64))
    assert n == 5 and padded.shape == (8, 3) and padded.dtype == np.float32
    np.testing.assert_array_equal(padded[:5], x)
    assert not padded[5:].any()
    same, n = pad_batch(x[:1])  # default buckets (1, 8, 64, 256): already a bucket, no copy
    assert same is not None and n == 1 and same.shape == (1, 3)
    codes = torch.ones(9, 4, dtype=torch.uint8)
    padded, n = pad_batch(codes)
    assert n == 9 and padded.shape == (64, 4) and padded.dtype == torch.uint8
    assert int(padded.sum()) == 36
    empty, n = pad_batch(np.zeros((0, 3), np.float32), sizes=(2,))
    assert n == 0 and empty.shape == (2, 3)


def test_pad_batch_errors():
    with pytest.raises(ValueError, match="300 rows exceeds the largest size 256; split"):
        pad_batch(np.zeros((300, 2)))
    with pytest.raises(ValueError, match="positive integers"):
        pad_batch(np.zeros((3, 2)), sizes=(0, 8))
    with pytest.raises(ValueError, match="positive integers"):
        pad_batch(np.zeros((3, 2)), sizes=())
    with pytest.raises(TypeError, match="numpy array or torch tensor, got list"):
        pad_batch([[1.0, 2.0]])
    with pytest.raises(ValueError, match="scalar"):
        pad_batch(np.zeros(()))


def test_runner_errors_and_torch_io(exported, quantizers, data, tmp_path):
    q = quantizers["ProductQuantizer"]
    runner = OnnxRunner(exported(q, batch_size=8, what="encode"))
    with pytest.raises(ValueError, match=r"vectors: expected shape \[n, 16\], got \[3, 8\]"):
        runner(np.zeros((3, 8), np.float32))
    x = torch.from_numpy(data[:6])
    codes = runner(x)
    assert isinstance(codes, torch.Tensor) and torch.equal(codes, q.encode(x))
    assert runner(np.zeros((0, DIM), np.float32)).shape == (0, 4)
    decoder = OnnxRunner(exported(q, batch_size=8, what="decode"))
    with pytest.raises(
        ValueError, match=r"codes: codes must lie in \[0, 32\), got values in \[0, 300\]"
    ):
        decoder(np.array([[0, 1, 2, 300]]))  # would wrap to 44 as uint8
    with pytest.raises(TypeError, match="codes: expected integer codes, got float32"):
        decoder(np.zeros((2, 4), np.float32))
    np.testing.assert_array_equal(decoder(codes.long()), q.decode(codes))  # int64 in: fine
    with pytest.raises(ValueError, match="batch_size must be a positive integer, got 0"):
        to_onnx(q, tmp_path / "e.onnx", batch_size=0)


# -- the audit --------------------------------------------------------------------------------
def _model(nodes, inputs, outputs, initializers=()):
    import onnx
    from onnx import TensorProto, helper

    def value(name, shape, dtype=TensorProto.FLOAT):
        return helper.make_tensor_value_info(name, dtype, shape)

    graph = helper.make_graph(
        nodes,
        "g",
        [value(*i) for i in inputs],
        [value(*o) for o in outputs],
        initializer=list(initializers),
    )
    return onnx.helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


def test_audit_flags_data_dependent_and_dynamic_shapes(ort):
    from onnx import TensorProto, helper, numpy_helper

    nodes = [
        helper.make_node("NonZero", ["x"], ["nz"], name="nonzero"),
        helper.make_node("Shape", ["nz"], ["nz_shape"]),
        helper.make_node("Reshape", ["x", "nz_shape"], ["reshaped"], name="reshape_by_data"),
        helper.make_node("Reshape", ["x", "flat"], ["flat_x"], name="reshape_const"),
        helper.make_node("Relu", ["y"], ["y_out"]),
    ]
    flat = numpy_helper.from_array(np.array([-1], np.int64), "flat")
    model = _model(
        nodes,
        [("x", [4, 3]), ("y", ["batch", 3])],
        [
            ("nz", None, TensorProto.INT64),
            ("reshaped", None),
            ("flat_x", [12]),
            ("y_out", ["batch", 3]),
        ],
        [flat],
    )
    report = audit(model)
    assert not report.clean
    flagged = {(node, op) for node, op, _ in report.data_dependent}
    assert flagged == {("nonzero", "NonZero"), ("reshape_by_data", "Reshape")}
    dynamic = dict(report.dynamic)
    assert dynamic["y"] == "[batch, 3]" and dynamic["y_out"] == "[batch, 3]"
    assert "nz" in dynamic and "flat_x" not in dynamic
    assert report.op_counts == {"Reshape": 2, "NonZero": 1, "Shape": 1, "Relu": 1}
    text = str(report)
    assert "nonzero (NonZero): output length is the number of non-zero elements" in text
    assert "y: [batch, 3]" in text


def test_audit_passes_a_static_graph_and_checks_its_input(ort, tmp_path):
    from onnx import helper, numpy_helper

    shape = numpy_helper.from_array(np.array([2, 6], np.int64), "shape")
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),  # of a static tensor: a constant
        helper.make_node("Expand", ["x", "s"], ["e"]),
        helper.make_node("Reshape", ["e", "shape"], ["out"]),
    ]
    model = _model(nodes, [("x", [4, 3])], [("out", [2, 6])], [shape])
    report = audit(model)
    assert report.clean and report.dynamic == [] and report.data_dependent == []
    assert "static: every shape is fixed" in str(report)
    with pytest.raises(FileNotFoundError, match="no ONNX model at"):
        audit(tmp_path / "missing.onnx")
    (tmp_path / "junk.onnx").write_bytes(b"\xff\x00junk")
    with pytest.raises(ValueError, match="not an ONNX model"):
        audit(tmp_path / "junk.onnx")
    with pytest.raises(TypeError, match="expected a path or an onnx.ModelProto, got int"):
        audit(3)


def test_missing_optional_packages_say_how_to_install(monkeypatch, tmp_path, quantizers):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "onnxscript" else real(name, *a),
    )
    with pytest.raises(ImportError, match=r"to_onnx needs onnxscript: pip install 'vq\[export\]'"):
        to_onnx(quantizers["ProductQuantizer"], tmp_path / "x.onnx", batch_size=1)
