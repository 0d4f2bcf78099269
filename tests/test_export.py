"""vq.export: every quantizer and index kind exports its own static function (the one its torch
path runs), and the graphs equal the torch path in torch and in ONNX Runtime; every layer
option exports with the eager codes (or is refused with a reason)."""

import json

import numpy as np
import pytest
import torch
from export_helpers import (
    ALLOWED_OPS,
    DIM,
    INDEXES,
    _filled,
    _with_codebooks,
    assert_same_search,
    fixture_data,  # noqa: F401 (a fixture)
    fixture_exported,  # noqa: F401 (a fixture)
    fixture_indexes,  # noqa: F401 (a fixture)
    fixture_ort,  # noqa: F401 (a fixture)
    fixture_quantizers,  # noqa: F401 (a fixture)
    fixture_queries,  # noqa: F401 (a fixture)
    torch_path,
)
from index_kinds import EXPORTED

import vq
from vq.export import OnnxRunner, audit, export_module, pad_batch, to_onnx


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


ONNX_INDEXES = [
    "Flat-ip-ids",
    "PQ-l2",
    "IVFFlat-ip",
    "IVFPQ-l2",
    "IVFPQ-ip-ids",
    "IVFPQ-direct-l2",
    "OPQ-IVFPQ-RFlat-l2",
    "PCA-IVFFlat-l2-ids",
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


# -- every layer option through ONNX Runtime: the eager codes -----------------------------------
def _clustered(n, dim, seed):
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(32, dim, generator=g) * 3
    return centers[torch.randint(32, (n,), generator=g)] + 0.1 * torch.randn(n, dim, generator=g)


#: a layer per option of the README's "Quantizer layers" section, FSQ and residual stages
LAYERS = {
    "codebook_dim": lambda: vq.VectorQuantizer(64, 128, learning="ema", codebook_dim=8),
    "codebook_dim-residual": lambda: vq.ResidualVQ(64, 3, 32, learning="ema", codebook_dim=8),
    "cosine": lambda: vq.VectorQuantizer(DIM, 32, learning="ema", cosine=True),
    "cosine-product": lambda: vq.ProductQuantizer(DIM, 4, nbits=4, learning="ema", cosine=True),
    "learning-ema": lambda: vq.VectorQuantizer(
        DIM, 32, learning=vq.EMA(decay=0.8, dead_code_threshold=1.0)
    ),
    "learning-grad": lambda: vq.ProductQuantizer(
        DIM, 4, nbits=4, learning=vq.Gradient(kmeans_init=False)
    ),
    "commitment_weight": lambda: vq.VectorQuantizer(
        DIM, 32, learning="ema", commitment_weight=0.25
    ),
    "rotation_trick": lambda: vq.VectorQuantizer(DIM, 32, learning="grad", rotation_trick=True),
    "channel_first": lambda: vq.ResidualVQ(DIM, 2, 16, learning="ema", channel_first=True),
    "residual-stages": lambda: vq.ResidualVQ(DIM, 4, 16, learning="ema"),
    "beam_size": lambda: vq.ResidualVQ(DIM, 3, 16, beam_size=4, learning="ema"),
    "quantizer_dropout": lambda: vq.ResidualVQ(
        DIM, 4, 16, learning="ema", quantizer_dropout=0.5, dropout_min_stages=2
    ),
    "mask": lambda: vq.VectorQuantizer(DIM, 32, learning="ema"),
    "fsq": lambda: vq.FSQ([8, 5, 5, 5]),
    "fsq-projections": lambda: vq.FSQ([4, 4, 3], dim=DIM),
    "lfq": lambda: vq.LFQ(DIM, 2**10),
    "lfq-projections": lambda: vq.LFQ(DIM, num_bits=6),
    "residual-fsq": lambda: vq.ResidualFSQ([8, 5, 5, 5], 3, dim=DIM, quantizer_dropout=0.5),
    "residual-lfq": lambda: vq.ResidualLFQ(DIM, 3, num_bits=5, quantizer_dropout=0.5),
    "grouped-rvq": lambda: vq.GroupedResidualVQ(DIM, 2, 3, 16, learning="ema", beam_size=2),
    "simvq": lambda: vq.VectorQuantizer(DIM, 64, learning="simvq", codebook_dim=8),
    "simvq-residual": lambda: vq.ResidualVQ(DIM, 3, 16, learning="simvq"),
    "cosine-residual": lambda: vq.ResidualVQ(DIM, 3, 16, learning="ema", cosine=True),
}


def _trained_layer(name):
    """The layer of ``name`` after three training steps (optimizer included), in eval mode."""
    torch.manual_seed(0)
    layer = LAYERS[name]()
    x = _clustered(512, layer.dim, seed=1).reshape(4, 128, layer.dim)
    if layer.channel_first:
        x = x.transpose(1, 2).contiguous()
    mask = torch.rand(4, 128) > 0.2 if name == "mask" else None
    params = list(layer.parameters())
    optimizer = torch.optim.SGD(params, lr=0.05) if params else None
    for step in range(3):
        out = layer(x + 0.01 * step, mask=mask)
        loss = out.loss + out.quantized.square().mean()
        if optimizer is not None:
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    return layer.eval()


@pytest.mark.parametrize("name", list(LAYERS))
def test_onnx_layer_option_gives_the_eager_codes(ort, tmp_path, name):
    layer = _trained_layer(name)
    x = _clustered(40, layer.dim, seed=2).numpy()
    encoder = OnnxRunner(to_onnx(layer, tmp_path / "encode.onnx", batch_size=8, what="encode"))
    decoder = OnnxRunner(to_onnx(layer, tmp_path / "decode.onnx", batch_size=8, what="decode"))
    codes, eager = encoder(x), layer.encode(x)
    assert codes.dtype == eager.dtype and codes.shape == eager.shape
    np.testing.assert_array_equal(codes, eager)
    with torch.no_grad():  # eval forward (channel-first layers take [B, dim, T])
        rows = torch.from_numpy(x)
        out = layer(rows.T[None] if layer.channel_first else rows)
    np.testing.assert_array_equal(codes, out.codes.reshape(codes.shape).numpy())
    assert torch.equal(export_module(layer, "encode")(rows), torch.from_numpy(eager))
    decoded = decoder(codes)
    np.testing.assert_allclose(decoded, layer.decode(codes), rtol=0, atol=1e-5)
    quantized = out.quantized[0].T if layer.channel_first else out.quantized
    np.testing.assert_allclose(decoded, quantized, rtol=0, atol=1e-5)
    assert audit(encoder.path).clean and audit(decoder.path).clean


def test_a_layer_not_yet_initialised_is_refused_with_what_to_do():
    layer = vq.VectorQuantizer(64, 128, learning="ema", codebook_dim=8)  # k-means on batch 1
    with pytest.raises(ValueError, match="not trained; call fit.*first training-mode forward"):
        export_module(layer, "encode")
    layer(_clustered(256, 64, seed=3))
    export_module(layer.eval(), "encode")  # now it exports


@pytest.mark.parametrize("desc", sorted(set(EXPORTED.values())))
def test_every_registered_kind_with_a_static_search_exports_its_torch_path(data, queries, desc):
    """Every kind of the registry that has a static search (tests/index_kinds.py, a toy kind
    included): its search graph gives the index's torch path."""
    x = torch.from_numpy(np.tile(data[:600], (1, 2)))  # (32 dimensions: every example fits)
    q = torch.from_numpy(np.tile(queries, (1, 2)))
    index = vq.index_factory(x.shape[1], desc)
    index.train(x)
    index.add(x)
    module = export_module(index, k=5)
    assert_same_search(*module(q), *torch_path(index, "search", q, k=5))
