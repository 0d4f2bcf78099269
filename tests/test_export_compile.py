"""vq.export graphs in torch.compile (no graph break, no recompile), strict torch.export and
TorchScript tracing: the same results as eager mode."""

import os

import pytest
import torch
from export_helpers import (
    DIM,
    fixture_data,  # noqa: F401 (a fixture)
    fixture_indexes,  # noqa: F401 (a fixture)
    fixture_quantizers,  # noqa: F401 (a fixture)
    fixture_queries,  # noqa: F401 (a fixture)
)

from vq.export import check_compiles, export_module, pad_batch

# -- torch.compile, torch.export, TorchScript -----------------------------------------------
# Graph breaks and recompilations are decided by dynamo, before any backend: the tests compile
# with backend="aot_eager" (dynamo + AOT autograd, no code generation: seconds, not minutes).
# VQ_TEST_INDUCTOR=1 adds the inductor backend (C++ generated and compiled, ~1 min on 2 cores).
BACKENDS = ["aot_eager", *(["inductor"] if os.environ.get("VQ_TEST_INDUCTOR") else [])]


@pytest.mark.parametrize("backend", BACKENDS)
def test_compiled_search_has_no_recompiles(indexes, backend):
    gen = torch.Generator().manual_seed(0)
    for name, params in (("IVFPQ-l2", {"nprobe": 3}), ("OPQ-IVFPQ-RFlat-ip", {"nprobe": 2})):
        module = export_module(indexes(name), k=10, **params)
        rows = (1, 5, 8, 1, 3, 8, 7)  # two buckets, new data at every call
        batches = [pad_batch(torch.randn(n, DIM, generator=gen), (1, 8))[0] for n in rows]
        report = check_compiles(module, batches, backend=backend)
        assert report.ok and report.calls == 7
        assert report.graphs == report.shapes == 2 and report.recompiles == 0
    compiled = torch.compile(module, fullgraph=True, dynamic=False, backend=backend)
    for a, b in zip(compiled(batches[1]), module(batches[1]), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_compiled_codecs_have_no_recompiles(quantizers, data, backend):
    x = torch.from_numpy(data[:8])
    for name, q in quantizers.items():
        codes = export_module(q, "encode")(x)
        for what, inp, other in (("encode", x, x + 0.5), ("decode", codes, codes.flip(0))):
            module = export_module(q, what)
            report = check_compiles(module, [inp, other, inp], backend=backend)
            assert report.ok and report.graphs == 1 and report.recompiles == 0, (name, what)
    beam = export_module(quantizers["ResidualVQ-beam"], "encode")
    compiled = torch.compile(beam, fullgraph=True, dynamic=False, backend=backend)
    assert torch.equal(compiled(x), beam(x))


def test_counting_catches_a_recompiling_module():
    class ValueDependent(torch.nn.Module):  # specialises on a tensor value: recompiles
        def forward(self, x):
            return x * x.shape[0] + int(x.sum() > 0)

    class ShapeDependent(torch.nn.Module):
        def forward(self, x):
            return x.sum()

    x = torch.ones(4, 2)
    with pytest.raises(torch._dynamo.exc.Unsupported):  # a graph break, refused by fullgraph
        check_compiles(ValueDependent(), [x, -x], backend="eager")
    report = check_compiles(ShapeDependent(), [x, torch.ones(5, 2), x], backend="eager")
    assert report.shapes == 2 and report.graphs == 2 and report.recompiles == 0


#: TorchScript is deprecated in torch 2.11 (still works); tracing warns on Python-level shape math
QUIET_TRACE = pytest.mark.filterwarnings(
    "ignore::torch.jit.TracerWarning", "ignore:`torch.jit.trace:DeprecationWarning"
)


@QUIET_TRACE
@pytest.mark.parametrize("what", ["encode", "decode"])
def test_strict_torch_export_and_tracing(quantizers, data, what):
    x = torch.from_numpy(data[:8])
    for name, q in quantizers.items():
        module = export_module(q, what)
        inp = x if what == "encode" else export_module(q, "encode")(x)
        expected = module(inp)
        program = torch.export.export(module, (inp,), strict=True)
        assert torch.equal(program.module()(inp), expected), name
        traced = torch.jit.trace(module, (inp,), check_trace=False)
        other = (
            x + 0.1
            if what == "encode"
            else (inp.long() + 1).remainder(q.codebook_size).to(inp.dtype)
        )
        assert torch.equal(traced(other), module(other)), name


@QUIET_TRACE
def test_strict_torch_export_and_tracing_of_search(indexes, queries):
    q = torch.from_numpy(queries[:8])
    for name in ("IVFPQ-ip-ids", "OPQ-IVFPQ-RFlat-l2"):
        module = export_module(indexes(name), nprobe=3)
        program = torch.export.export(module, (q,), strict=True)
        traced = torch.jit.trace(module, (q,), check_trace=False)
        expected = module(q + 0.5)
        for runs in (program.module()(q + 0.5), traced(q + 0.5)):
            assert all(torch.equal(a, b) for a, b in zip(runs, expected, strict=True)), name
