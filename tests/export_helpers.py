"""Shared by the vq.export tests: data, one of every quantizer and index kind, the library's
own torch path (the reference every graph must equal), the search comparison, and the ONNX
Runtime fixtures (which skip cleanly when onnx, onnxscript or onnxruntime is missing).

A test module imports the fixtures it uses (``fixture_data`` is the fixture ``data``, …).
"""

import numpy as np
import pytest
import torch

import vq
from vq._cpu import torch_only
from vq.datasets import clustered_vectors
from vq.export import to_onnx

DIM = 16


# -- data, quantizers and indexes --------------------------------------------------------------
@pytest.fixture(scope="module", name="data")
def fixture_data():
    return clustered_vectors(1500, DIM, n_clusters=40, seed=3)


@pytest.fixture(scope="module", name="queries")
def fixture_queries():
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


@pytest.fixture(scope="module", name="quantizers")
def fixture_quantizers(data):
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
        "PCA-IVFFlat-l2-ids": lambda: _filled(
            vq.PreTransform(vq.PCA(DIM, 12).fit(x), vq.IVFFlat(12, 8, coarse_niter=4)), x, odd_ids
        ),
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
    "PCA-IVFFlat-l2-ids",
]


@pytest.fixture(scope="module", name="indexes")
def fixture_indexes(data):
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


# -- ONNX Runtime ----------------------------------------------------------------------------
@pytest.fixture(scope="module", name="ort")
def fixture_ort():
    pytest.importorskip("onnx")
    pytest.importorskip("onnxscript")
    return pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module", name="exported")
def fixture_exported(ort, tmp_path_factory):
    """``exported(obj, **to_onnx_options)`` → path, each model written once per module."""
    folder, cache = tmp_path_factory.mktemp("onnx"), {}

    def export(obj, **options):
        # the entry holds ``obj`` so that its id is not reused by a later object while cached
        key = (id(obj), tuple(sorted(options.items())))
        if key not in cache:
            cache[key] = (obj, to_onnx(obj, folder / f"model{len(cache)}.onnx", **options))
        return cache[key][1]

    return export


#: what the graphs may use: matmul, gather, arg-min, top-k, elementwise, and static reshapes
ALLOWED_OPS = {
    "Gemm", "MatMul", "Gather", "GatherElements", "ArgMin", "TopK", "Reshape", "Transpose",
    "Unsqueeze", "Squeeze", "Concat", "Expand", "Add", "Sub", "Mul", "Neg", "Pow", "Div", "Mod",
    "ReduceSum", "Clip", "Max", "Cast", "Where", "IsInf", "Less",
}  # fmt: skip
