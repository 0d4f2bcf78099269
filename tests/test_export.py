"""vq.export: static-shape graphs equal the torch path, in torch, torch.compile, torch.export,
TorchScript and ONNX Runtime; the audit tells static graphs from dynamic ones."""

import json
import os

import numpy as np
import pytest
import torch

import vq
from vq._cpu import torch_only
from vq.datasets import clustered_vectors
from vq.export import (
    OnnxRunner,
    audit,
    check_compiles,
    export_module,
    pad_batch,
    to_onnx,
)

DIM = 16


# -- data, quantizers and indexes --------------------------------------------------------------
@pytest.fixture(scope="module")
def data():
    return clustered_vectors(1500, DIM, n_clusters=40, seed=3)


@pytest.fixture(scope="module")
def queries():
    q = clustered_vectors(21, DIM, n_clusters=40, seed=4)
    q[-1] += 10.0  # one query far from everything
    return q


def _with_codebooks(module, **buffers):
    """A quantizer holding the given buffers, marked trained (no k-means: fast and exact)."""
    state = {**module.state_dict(), **buffers}
    for key in state:
        if key.endswith("trained"):
            state[key] = torch.tensor(True)
    module.load_state_dict(state)
    return module


def _rows(x, n, seed, scale=1.0):
    rng = np.random.default_rng(seed)
    return torch.from_numpy(x[rng.choice(len(x), n, replace=False)] * scale)


def make_quantizers(x):
    """Every quantizer kind, with codebooks drawn from the data (deterministic)."""
    rng = np.random.default_rng(0)
    rotation, _ = np.linalg.qr(rng.standard_normal((DIM, DIM)))
    rotation = torch.from_numpy(rotation.astype(np.float32))
    pq_books = _rows(x, 32, 1).reshape(32, 4, 4).transpose(0, 1).contiguous()
    rvq_books = torch.stack([_rows(x, 16, 2), _rows(x, 16, 3, 0.3), _rows(x, 16, 4, 0.1)])
    opq_books = (_rows(x, 32, 5) @ rotation.T).reshape(32, 4, 4).transpose(0, 1).contiguous()
    return {
        "VectorQuantizer": _with_codebooks(vq.VectorQuantizer(DIM, 64), codebook=_rows(x, 64, 6)),
        "ProductQuantizer": _with_codebooks(vq.ProductQuantizer(DIM, 4, 5), codebooks=pq_books),
        "OPQ": _with_codebooks(vq.OPQ(DIM, 4, 5), rotation=rotation, **{"pq.codebooks": opq_books}),
        "ResidualVQ": _with_codebooks(vq.ResidualVQ(DIM, 3, 16), codebooks=rvq_books),
        "ResidualVQ-beam": _with_codebooks(
            vq.ResidualVQ(DIM, 3, 16, beam_size=4), codebooks=rvq_books
        ),
    }


@pytest.fixture(scope="module")
def quantizers(data):
    return make_quantizers(data)


def _filled(index, x, ids=None):
    index.train(x)
    if ids is None:
        index.add(x)
    else:
        index.add_with_ids(x, ids)
    return index


def _opq_refine(x, metric="l2"):
    opq = make_quantizers(x)["OPQ"]
    return vq.Refine(vq.PreTransform(opq, vq.IVFPQ(DIM, 8, 4, 5, metric=metric)), k_factor=4)


def make_index(name, x):
    odd_ids = np.arange(len(x)) * 3 + 7
    builders = {
        "Flat-l2": lambda: _filled(vq.FlatIndex(DIM), x),
        "Flat-ip-ids": lambda: _filled(vq.FlatIndex(DIM, "ip"), x, odd_ids),
        "PQ-l2": lambda: _filled(vq.PQIndex(DIM, 4, 6, niter=4), x),
        "PQ-ip-ids": lambda: _filled(vq.PQIndex(DIM, 4, 6, "ip", niter=4), x, odd_ids),
        "IVFFlat-l2-ids": lambda: _filled(vq.IVFFlat(DIM, 8, coarse_niter=4), x, odd_ids),
        "IVFFlat-ip": lambda: _filled(vq.IVFFlat(DIM, 8, "ip", coarse_niter=4), x),
        "IVFPQ-l2": lambda: _filled(vq.IVFPQ(DIM, 8, 4, 6, coarse_niter=4, niter=4), x),
        "IVFPQ-ip-ids": lambda: _filled(
            vq.IVFPQ(DIM, 8, 4, 6, metric="ip", coarse_niter=4, niter=4), x, odd_ids
        ),
        "IVFPQ-direct-l2": lambda: _filled(
            vq.IVFPQ(DIM, 8, 4, 6, by_residual=False, coarse_niter=4, niter=4), x
        ),
        "IVFPQ-direct-ip": lambda: _filled(
            vq.IVFPQ(DIM, 8, 4, 6, by_residual=False, metric="ip", coarse_niter=4, niter=4), x
        ),
        "PQ-fastscan-l2": lambda: _filled(vq.PQIndex(DIM, 4, 4, niter=4, fast_scan=True), x),
        "IVFPQ-fastscan-ip": lambda: _filled(
            vq.IVFPQ(DIM, 8, 4, 4, metric="ip", fast_scan=True, coarse_niter=4, niter=4), x
        ),
        "OPQ-IVFPQ-RFlat-l2": lambda: _filled(_opq_refine(x), x, odd_ids),
        "OPQ-IVFPQ-RFlat-ip": lambda: _filled(_opq_refine(x, "ip"), x),
    }
    return builders[name]()


INDEXES = [
    "Flat-l2",
    "Flat-ip-ids",
    "PQ-l2",
    "PQ-ip-ids",
    "IVFFlat-l2-ids",
    "IVFFlat-ip",
    "IVFPQ-l2",
    "IVFPQ-ip-ids",
    "IVFPQ-direct-l2",
    "IVFPQ-direct-ip",
    "PQ-fastscan-l2",
    "IVFPQ-fastscan-ip",
    "OPQ-IVFPQ-RFlat-l2",
    "OPQ-IVFPQ-RFlat-ip",
]


@pytest.fixture(scope="module")
def indexes(data):
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = make_index(name, data)
        return cache[name]

    return get


def torch_path(obj, what, x, **params):
    """The library's own torch path (no numba): the reference every graph must equal."""
    with torch_only():
        if what == "search":
            return obj.search(x, params.pop("k", 10), **params)
        return obj.encode(x) if what == "encode" else obj.decode(x)


def assert_same_search(D, I, D_ref, I_ref, tol=1e-4):
    """Distances equal to ``tol`` (relative and absolute, ±inf in the same places); ids equal
    except where two results are tied within ``tol`` (then either order is right)."""
    D, I, D_ref, I_ref = (np.asarray(a) for a in (D, I, D_ref, I_ref))
    assert D.shape == D_ref.shape and I.shape == I_ref.shape and I.dtype == np.int64
    np.testing.assert_allclose(D, D_ref, rtol=tol, atol=tol)
    for r, c in zip(*np.nonzero(I != I_ref), strict=True):
        row = D_ref[r]
        tied = np.isclose(row, row[c], rtol=tol, atol=tol).sum() > 1 or np.isclose(
            row[c], row[-1], rtol=tol, atol=tol
        )
        assert tied, f"row {r}, rank {c}: id {I[r, c]} instead of {I_ref[r, c]} (no tie)"


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


# -- the graphs in torch eager mode ------------------------------------------------------------
@pytest.mark.parametrize(
    "name", ["VectorQuantizer", "ProductQuantizer", "OPQ", "ResidualVQ", "ResidualVQ-beam"]
)
def test_codec_graphs_equal_the_quantizers(quantizers, data, name):
    q = quantizers[name]
    x = torch.from_numpy(data[:300])
    codes = export_module(q, "encode")(x)
    assert codes.dtype == q.code_dtype
    assert torch.equal(codes, torch_path(q, "encode", x))
    assert torch.equal(codes, q.encode(x))  # the numba path agrees too on this data
    decoded = export_module(q, "decode")(codes)
    torch.testing.assert_close(decoded, q.decode(codes), rtol=0, atol=1e-5)
    wide = export_module(q, "encode", code_dtype="int64")(x)
    assert wide.dtype == torch.int64 and torch.equal(wide, codes.long())
    assert torch.equal(export_module(q, "decode", code_dtype=torch.int64)(wide), decoded)


def test_beam_search_graph_beats_greedy(quantizers, data):
    x = torch.from_numpy(data[:300])
    greedy, beam = quantizers["ResidualVQ"], quantizers["ResidualVQ-beam"]
    errors = []
    for q in (greedy, beam):
        x_hat = export_module(q, "decode")(export_module(q, "encode")(x))
        errors.append(float(((x - x_hat) ** 2).sum()))
    assert errors[1] < errors[0]


@pytest.mark.parametrize("name", INDEXES)
def test_search_graphs_equal_the_torch_path(indexes, queries, name):
    index = indexes(name)
    q = torch.from_numpy(queries)
    nprobes = (1, 3) if "IVF" in name else (None,)
    for nprobe, k in [(p, k) for p in nprobes for k in (1, 10)]:
        params = {} if nprobe is None else {"nprobe": nprobe}
        module = export_module(index, k=k, **params)
        D, I = module(q)
        D_ref, I_ref = torch_path(index, "search", q, k=k, **params)
        assert_same_search(D, I, D_ref, I_ref)
        assert_same_search(*module(q[:1]), D_ref[:1], I_ref[:1])  # (one query: other gathers)
        if "RFlat" not in name and "fastscan" not in name:  # (approximate numba paths)
            assert_same_search(D, I, *index.search(q, k, **params))


def test_search_graph_pads_missing_results(data, queries):
    q = torch.from_numpy(queries)
    few = _filled(vq.IVFFlat(DIM, 8, coarse_niter=4), data[:40])
    for metric, index in (("l2", few), ("ip", _filled(vq.PQIndex(DIM, 4, 2, "ip"), data[:6]))):
        D, I = export_module(index, k=12, **({"nprobe": 2} if metric == "l2" else {}))(q)
        D_ref, I_ref = torch_path(
            index, "search", q, k=12, **({"nprobe": 2} if metric == "l2" else {})
        )
        assert (I == -1).any() and torch.equal(I == -1, I_ref == -1)
        assert torch.isinf(D[I == -1]).all() and (D[I == -1] < 0).all() == (metric == "ip")
        assert_same_search(D, I, D_ref, I_ref)


def test_code_dtype_of_search_graphs(indexes, queries):
    q = torch.from_numpy(queries)
    for name in ("PQ-ip-ids", "OPQ-IVFPQ-RFlat-l2"):
        narrow = (
            export_module(indexes(name), nprobe=2)
            if "IVF" in name
            else export_module(indexes(name))
        )
        params = {"nprobe": 2} if "IVF" in name else {}
        wide = export_module(indexes(name), code_dtype="int32", **params)
        stored = [
            b for n, b in wide.named_buffers() if n.endswith("codes_t") or n.endswith("list_codes")
        ]
        assert len(stored) == 1 and stored[0].dtype == torch.int32
        assert wide.metadata["code_dtype"] == "int32"
        assert all(torch.equal(a, b) for a, b in zip(narrow(q), wide(q), strict=True))
    with pytest.raises(
        ValueError, match="code_dtype applies to encode/decode and to indexes storing"
    ):
        export_module(indexes("IVFFlat-ip"), code_dtype="int32")


def test_capacity_pads_more_without_changing_results(indexes, queries):
    index = indexes("IVFPQ-l2")
    q = torch.from_numpy(queries)
    longest = int(index.list_sizes().max())
    base = export_module(index, nprobe=2)
    wide = export_module(index, nprobe=2, capacity=longest + 37)
    assert wide.list_codes.shape[-1] == longest + 37 and base.list_codes.shape[-1] == longest
    for a, b in zip(base(q), wide(q), strict=True):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match=f"longest inverted list \\({longest} vectors\\)"):
        export_module(index, capacity=longest - 1)


def test_graphs_are_snapshots(data, queries):
    index = _filled(vq.IVFFlat(DIM, 8, coarse_niter=4), data[:500])
    module = export_module(index, nprobe=8)
    before = module(torch.from_numpy(queries))
    index.add(data[500:])
    after = module(torch.from_numpy(queries))
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    assert module.metadata["ntotal"] == "500"


def test_export_module_errors(quantizers, indexes, data):
    pq = quantizers["ProductQuantizer"]
    index = indexes("IVFPQ-l2")
    with pytest.raises(ValueError, match="not trained; call fit"):
        export_module(vq.ProductQuantizer(DIM, 4))
    with pytest.raises(ValueError, match="not trained; call train"):
        export_module(vq.IVFPQ(DIM, 8, 4))
    empty = vq.FlatIndex(DIM)
    with pytest.raises(ValueError, match="FlatIndex is empty; add vectors"):
        export_module(empty)
    with pytest.raises(ValueError, match="what must be one of"):
        export_module(pq, "train")
    with pytest.raises(ValueError, match="search needs an index"):
        export_module(pq, "search")
    with pytest.raises(ValueError, match="export its quantizer"):
        export_module(index, "encode")
    with pytest.raises(ValueError, match="nprobe apply to what='search'"):
        export_module(pq, nprobe=4)
    with pytest.raises(ValueError, match="nprobe applies to IVF indexes, not to a FlatIndex"):
        export_module(indexes("Flat-l2"), nprobe=4)
    with pytest.raises(ValueError, match="k_factor applies to Refine"):
        export_module(index, k_factor=4)
    with pytest.raises(ValueError, match="k must be a positive integer, got 0"):
        export_module(index, k=0)
    with pytest.raises(ValueError, match="nprobe must be a positive integer"):
        export_module(index, nprobe=-1)
    with pytest.raises(ValueError, match="code_dtype must be one of"):
        export_module(pq, code_dtype=torch.float32)
    with pytest.raises(ValueError, match="cannot hold codes up to 4095"):
        big = _with_codebooks(vq.VectorQuantizer(DIM, 4096), codebook=torch.randn(4096, DIM))
        export_module(big, code_dtype="uint8")
    with pytest.raises(TypeError, match="expected a vq quantizer or index, got Linear"):
        export_module(torch.nn.Linear(2, 2))


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


# -- ONNX Runtime ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ort():
    pytest.importorskip("onnx")
    pytest.importorskip("onnxscript")
    return pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def exported(ort, tmp_path_factory):
    """``exported(obj, **to_onnx_options)`` → path, each model written once per module."""
    folder, cache = tmp_path_factory.mktemp("onnx"), {}

    def export(obj, **options):
        key = (id(obj), tuple(sorted(options.items())))
        if key not in cache:
            cache[key] = to_onnx(obj, folder / f"model{len(cache)}.onnx", **options)
        return cache[key]

    return export


CODECS = ["VectorQuantizer", "ProductQuantizer", "OPQ", "ResidualVQ", "ResidualVQ-beam"]


@pytest.mark.parametrize("name", CODECS)
def test_onnx_codecs_equal_torch(exported, quantizers, data, name):
    q = quantizers[name]
    x = data[:19]
    encoder = OnnxRunner(exported(q, batch_size=8, what="encode"))
    decoder = OnnxRunner(exported(q, batch_size=8, what="decode"))
    expected = torch_path(q, "encode", x)
    for n in (1, 5, 8, 19):  # through pad_batch: chunks of 8, the last one padded
        codes = encoder(x[:n])
        assert codes.dtype == expected.dtype and codes.shape == expected[:n].shape
        np.testing.assert_array_equal(codes, expected[:n])
        decoded = decoder(codes)
        np.testing.assert_allclose(decoded, torch_path(q, "decode", codes), atol=1e-5, rtol=0)
    assert encoder.batch_size == 8
    meta = encoder.metadata
    assert meta["what"] == "encode" and meta["source"] == name.split("-")[0]
    assert meta["dim"] == str(DIM) and meta["codebook_size"] == str(q.codebook_size)
    assert meta["vq_version"] == vq.__version__ and meta["batch_size"] == "8"
    for runner in (encoder, decoder):
        report = audit(runner.path)
        assert report.clean, str(report)
        assert set(report.op_counts) <= ALLOWED_OPS, report.op_counts


#: what the graphs may use: matmul, gather, arg-min, top-k, elementwise, and static reshapes
ALLOWED_OPS = {
    "Gemm", "MatMul", "Gather", "GatherElements", "ArgMin", "TopK", "Reshape", "Transpose",
    "Unsqueeze", "Squeeze", "Concat", "Expand", "Add", "Sub", "Mul", "Neg", "Pow", "Div", "Mod",
    "ReduceSum", "Clip", "Max", "Cast", "Where", "IsInf", "Less",
}  # fmt: skip

ONNX_INDEXES = [
    "Flat-ip-ids",
    "PQ-l2",
    "IVFFlat-ip",
    "IVFPQ-l2",
    "IVFPQ-ip-ids",
    "IVFPQ-direct-l2",
    "OPQ-IVFPQ-RFlat-l2",
]


@pytest.mark.parametrize("name", ONNX_INDEXES)
def test_onnx_search_equals_torch(exported, indexes, queries, name):
    index = indexes(name)
    params = {"nprobe": 3} if "IVF" in name else {}
    if name == "IVFPQ-direct-l2":  # code tables as int32, for runtimes without uint8 gathers
        params["code_dtype"] = "int32"
    path = exported(index, batch_size=8, k=10, **params)
    params.pop("code_dtype", None)
    runner = OnnxRunner(path)
    D_ref, I_ref = torch_path(index, "search", queries, k=10, **params)
    for n in (1, 8, 21):
        D, I = runner(queries[:n])
        assert D.dtype == np.float32
        assert_same_search(D, I, D_ref[:n], I_ref[:n])
    report = audit(path)
    assert report.clean, str(report)
    assert report.inputs == ["queries: float32[8, 16]"]
    assert report.outputs == ["distances: float32[8, 10]", "ids: int64[8, 10]"]
    assert set(report.op_counts) <= ALLOWED_OPS, report.op_counts
    meta = runner.metadata
    assert meta["k"] == "10" and meta["metric"] == index.metric and meta["what"] == "search"
    assert json.loads(meta["index"])["class"] == type(index).__name__
    if params:
        assert meta["nprobe"] == "3" and int(meta["capacity"]) >= 1


def test_onnx_buckets_with_pad_batch(exported, indexes, queries):
    """One static model per bucket; pad_batch routes each batch to its bucket."""
    index = indexes("IVFPQ-l2")
    sessions = {
        b: OnnxRunner(exported(index, batch_size=b, k=10, nprobe=3)).session for b in (1, 8)
    }
    D_ref, I_ref = torch_path(index, "search", queries, nprobe=3)
    for start, n in ((0, 1), (1, 3), (4, 8), (12, 1)):
        padded, valid = pad_batch(queries[start : start + n], sizes=(1, 8))
        D, I = sessions[len(padded)].run(None, {"queries": padded})
        assert_same_search(D[:valid], I[:valid], D_ref[start : start + n], I_ref[start : start + n])


def test_onnx_dynamic_batch(exported, indexes, queries):
    index = indexes("IVFFlat-l2-ids")
    path = exported(index, batch_size=1, nprobe=2, dynamic_batch=True)
    runner = OnnxRunner(path)
    assert runner.batch_size is None and runner.metadata["batch_size"] == "dynamic"
    D_ref, I_ref = torch_path(index, "search", queries, nprobe=2)
    for n in (1, 2, 21):
        D, I = runner.session.run(None, {"queries": queries[:n]})
        assert_same_search(D, I, D_ref[:n], I_ref[:n])
    report = audit(path)  # dynamic by request: the audit says where
    assert not report.clean
    assert ("queries", "[batch, 16]") in report.dynamic
    assert ("distances", "[batch, 10]") in report.dynamic and (
        "ids",
        "[batch, 10]",
    ) in report.dynamic


@pytest.fixture
def faiss_one_thread():
    """faiss on one OpenMP thread: on a busy 2-core machine its spinning threads make training
    these tiny indexes take seconds instead of milliseconds."""
    faiss = pytest.importorskip("faiss")
    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    yield faiss
    faiss.omp_set_num_threads(threads)


def test_onnx_faiss_index_imported(exported, data, queries, faiss_one_thread):
    faiss = faiss_one_thread
    for description, metric in (
        ("IVF8,PQ4x6np", faiss.METRIC_L2),
        ("OPQ4,IVF8,PQ4x6np,RFlat", faiss.METRIC_INNER_PRODUCT),
    ):
        findex = faiss.index_factory(DIM, description, metric)
        if description.startswith("OPQ"):
            pre = faiss.downcast_index(faiss.downcast_index(findex).base_index)
            faiss.downcast_VectorTransform(pre.chain.at(0)).niter = 4
            findex.k_factor = 4
        findex.train(data)
        findex.add(data)
        faiss.extract_index_ivf(findex).nprobe = 3
        index = vq.index.from_faiss(findex)
        path = exported(index, batch_size=8, nprobe=3)
        D, I = OnnxRunner(path)(queries)
        assert_same_search(D, I, *torch_path(index, "search", queries, nprobe=3))
        Df, If = findex.search(queries, 10)  # faiss itself, ties aside
        assert_same_search(D, I, Df, If, tol=1e-3)
        assert audit(path).clean


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
