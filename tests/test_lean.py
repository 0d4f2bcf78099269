"""The lean path of small searches (``Index._search_small``): a few queries on CPU go from numpy
(or a CPU tensor) to ids through kernels on the calling thread, with the results of the general
path, and fall back to it for everything else."""

import json
import subprocess
import sys
import textwrap
from unittest import mock

import numpy as np
import pytest
import torch

import vq
from vq.index.core import lean
from vq.index.core.base import Index
from vq.index.core.lean import SMALL_BATCH

KINDS = [
    ("Flat", "l2"),
    ("Flat", "ip"),
    ("PQ8", "l2"),
    ("PQ8", "ip"),
    ("PQ8x4fs", "l2"),
    ("PQ8x4fs", "ip"),
    ("PQ8x4fs,RFlat", "l2"),
    ("IVF16,Flat", "l2"),
    ("IVF16,Flat", "ip"),
    ("IVF16,PQ8", "l2"),
    ("IVF16,PQ8", "ip"),
    ("IVF16,PQ8x4fsr,RFlat", "l2"),
    ("IVF16,PQ8x4fs", "l2"),
    ("IVF16,PQ8x4fs,RFlat", "l2"),
    ("IVF16,PQ8x4fs,RFlat", "ip"),
    ("IVF16,PQ8,RFlat", "l2"),
    ("OPQ8,IVF16,PQ8", "l2"),
    ("HNSW16", "l2"),
    ("HNSW16", "ip"),
    ("HNSW16,SQ8", "l2"),
    ("HNSW16,SQ8,Refine(SQfp16)", "l2"),
]


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3000, 32), dtype=np.float32)
    q = rng.standard_normal((40, 32), dtype=np.float32)
    return x, q


def _build(description: str, metric: str, x: np.ndarray, ids=None) -> Index:
    index = vq.index_factory(x.shape[1], description, metric=metric)
    index.train(x)
    if ids is None:
        index.add(x)
    else:
        index.add_with_ids(x, ids)
    if hasattr(index, "nprobe"):
        index.nprobe = 4
    return index


def _general(index: Index, q: np.ndarray, k: int, **params):
    """The general path's answer, query by query (a batch above SMALL_BATCH takes it, where
    the lean path does not split batches between threads)."""
    reps = np.repeat(q, SMALL_BATCH + 1, axis=0)  # each query repeated: one general batch
    with mock.patch.object(lean, "SPLIT_BATCH", SMALL_BATCH):
        dist, ids = index.search(reps, k, **params)
    return dist[:: SMALL_BATCH + 1], ids[:: SMALL_BATCH + 1]


@pytest.mark.parametrize("description,metric", KINDS)
def test_small_searches_give_the_general_paths_results(data, description, metric):
    x, q = data
    ids = np.arange(len(x), dtype=np.int64) * 3 + 11  # ids that are not the rows
    index = _build(description, metric, x, ids)
    assert index.lean_search() is not None  # this kind has a lean path
    want_dist, want_ids = _general(index, q[:5], 10)
    for n in (1, 5):
        dist, found = index.search(q[:n], 10)
        assert dist.dtype == np.float32 and found.dtype == np.int64
        np.testing.assert_array_equal(found, want_ids[:n])
        np.testing.assert_allclose(dist, want_dist[:n], rtol=1e-4, atol=1e-3)
    # a CPU tensor: tensors back
    dist_t, found_t = index.search(torch.from_numpy(q[:2]), 10)
    assert isinstance(found_t, torch.Tensor)
    np.testing.assert_array_equal(found_t.numpy(), want_ids[:2])


def test_without_precomputed_tables_each_probe_gets_its_residual_table(data):
    x, q = data
    index = _build("IVF16,PQ8", "l2", x)
    index.precomputed_table_max_bytes = 0  # as faiss beyond its 2 GiB limit
    want_dist, want_ids = _general(index, q[:3], 10)
    dist, ids = index.search(q[:3], 10)
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_allclose(dist, want_dist, rtol=1e-4, atol=1e-3)


def test_the_lean_path_uses_no_torch_search(data, monkeypatch):
    x, q = data
    index = _build("IVF16,PQ8x4fs,RFlat", "l2", x)
    want = index.search(q[:3], 5)[1]

    def refuse(*args, **kwargs):
        raise AssertionError("the general search path ran")

    monkeypatch.setattr(Index, "search_ids", refuse)
    monkeypatch.setattr(type(index), "search_ids", refuse)
    np.testing.assert_array_equal(index.search(q[:3], 5)[1], want)


def test_a_refine_around_an_ivf_index_searches_in_the_ivf_kernel_call(data):
    x, q = data
    index = _build("IVF16,PQ8x4fs,RFlat", "l2", x, np.arange(len(x), dtype=np.int64) * 5 + 2)
    assert "ivf_lean" in index.lean_search().__qualname__  # the fused search, not a composition
    for k_factor in (1, 3):
        want_dist, want_ids = _general(index, q[:4], 7, k_factor=k_factor)
        dist, ids = index.search(q[:4], 7, k_factor=k_factor)
        np.testing.assert_array_equal(ids, want_ids)
        np.testing.assert_allclose(dist, want_dist, rtol=1e-5, atol=1e-4)
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match="k_factor must be an integer >= 1"):
            index.search(q[:1], 5, k_factor=bad)


def test_per_call_options_and_padding(data):
    x, q = data
    index = vq.index_factory(32, "IVF16,PQ8,RFlat")
    index.train(x)
    index.add(x[:40])  # few vectors: padding with -1
    dist, ids = index.search(q[:2], 50, nprobe=16, k_factor=2)
    want_dist, want_ids = _general(index, q[:2], 50, nprobe=16, k_factor=2)
    np.testing.assert_array_equal(ids, want_ids)
    assert (ids[:, 40:] == -1).all() and np.isinf(dist[:, 40:]).all()
    np.testing.assert_allclose(dist[:, :40], want_dist[:, :40], rtol=1e-4, atol=1e-3)
    for n in (1, 2, 16):  # nprobe changes the answer as on the general path
        assert (index.search(q[:1], 5, nprobe=n)[1] == _general(index, q[:1], 5, nprobe=n)[1]).all()


def test_changes_to_the_index_reach_the_lean_path(data):
    x, q = data
    index = _build("IVF16,Flat", "l2", x[:1000])
    before = index.search(q[:1], 5)[1]
    index.add(x[1000:])
    after = index.search(q[:1], 5)[1]
    np.testing.assert_array_equal(after, _general(index, q[:1], 5)[1])
    index.remove_ids(after[0, :2])
    removed = index.search(q[:1], 5)[1]
    assert not np.isin(after[0, :2], removed).any()
    np.testing.assert_array_equal(removed, _general(index, q[:1], 5)[1])
    # a buffer modified in place (no index method involved)
    flat = _build("Flat", "l2", x[:100])
    target = flat.search(q[:1], 1)[1][0, 0]
    with torch.no_grad():
        flat.vectors[target] += 100.0
    assert flat.search(q[:1], 1)[1][0, 0] != target
    assert before.shape == (1, 5)


@pytest.mark.parametrize(
    "queries,k,params,error,match",
    [
        ("nan", 5, {}, ValueError, "NaN|finite"),
        ("dim", 5, {}, ValueError, "dimension|dim"),
        ("ok", 0, {}, ValueError, "k must be a positive integer"),
        ("ok", 5, {"nprobes": 2}, TypeError, "unexpected keyword argument 'nprobes'"),
        ("ok", 5, {"nprobe": 0}, ValueError, "nprobe must be a positive integer"),
    ],
)
def test_bad_small_searches_get_the_general_paths_errors(data, queries, k, params, error, match):
    x, q = data
    index = _build("IVF16,PQ8", "l2", x)
    bad = {"nan": np.where(np.eye(1, 32, dtype=bool), np.nan, q[:1]).astype(np.float32)}
    bad["dim"], bad["ok"] = q[:1, :31], q[:1]
    with pytest.raises(error, match=match):
        index.search(bad[queries], k, **params)


@pytest.mark.parametrize(
    "queries,params,error,match",
    [
        ("nan", {}, ValueError, "NaN|finite"),
        ("inf", {}, ValueError, "NaN|finite"),
        ("ok", {"efSearch": 0}, ValueError, "efSearch must be a positive integer"),
    ],
)
def test_bad_small_graph_searches_get_the_general_paths_errors(data, queries, params, error,
                                                              match):  # fmt: skip
    """The graph's lean kernel declines queries that are not finite (nothing written), and
    the general path says what is wrong."""
    x, q = data
    index = _build("HNSW16", "l2", x)
    bad = {"ok": q[:1], "nan": q[:1].copy(), "inf": q[:1].copy()}
    bad["nan"][0, 3], bad["inf"][0, 31] = np.nan, np.inf
    with pytest.raises(error, match=match):
        index.search(bad[queries], 5, **params)
    assert index.search(q[:1], 5)[1].shape == (1, 5)


def test_a_loaded_index_answers_one_query_without_the_thread_pool(tmp_path, data):
    x, q = data
    for description in ("IVF16,PQ8", "IVF16,PQ8x4fs,RFlat"):
        _build(description, "l2", x).save(tmp_path / f"{description}.vqi")
    code = textwrap.dedent(
        f"""
        import json, sys
        import numpy as np
        import vq
        from numba.np.ufunc import parallel
        from vq.kernels.common import threads
        q = np.load({str(tmp_path / "q.npy")!r})
        out = {{}}
        for name in ("IVF16,PQ8", "IVF16,PQ8x4fs,RFlat"):
            index = vq.load_index({str(tmp_path)!r} + "/" + name + ".vqi")
            out[name] = index.search(q[:1], 5)[1].tolist()
        out["pool"] = bool(parallel._is_initialized) or threads._pool.workers > 0
        print(json.dumps(out))
        """
    )
    np.save(tmp_path / "q.npy", q)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["pool"] is False  # neither numba's threads nor vq's started
    for name in ("IVF16,PQ8", "IVF16,PQ8x4fs,RFlat"):
        index = vq.load_index(tmp_path / f"{name}.vqi")
        assert report[name] == index.search(q[:1], 5)[1].tolist()


def _quantizers(x):
    pq = vq.ProductQuantizer(32, 8, niter=4).fit(x)
    opq = vq.OPQ(32, 8, niter=2, pq_niter=4).fit(x)
    small = vq.VectorQuantizer(32, 64, niter=4).fit(x)  # uint8 codes
    large = vq.VectorQuantizer(32, 300, niter=2).fit(x)  # int16 codes
    return {"pq": pq, "opq": opq, "vq64": small, "vq300": large}


def test_small_encodes_give_the_general_paths_codes(data):
    x, q = data
    for name, quantizer in _quantizers(x).items():
        assert quantizer._encode_small(q[:1]) is not None, name  # this kind has a lean path
        want = quantizer.encode(torch.from_numpy(q[:16])).numpy()  # tensors: the general path
        for n in (1, 3, 16):
            codes = quantizer.encode(q[:n])
            assert isinstance(codes, np.ndarray) and codes.dtype == want.dtype, name
            np.testing.assert_array_equal(codes, want[:n], err_msg=name)


def test_small_encodes_follow_the_codebooks_and_refuse_bad_rows(data):
    x, q = data
    pq = vq.ProductQuantizer(32, 8, niter=4).fit(x)
    before = pq.encode(q[:1])
    with torch.no_grad():  # a codebook modified in place reaches the lean path
        pq.codebooks[0, before[0, 0]] += 100.0
    after = pq.encode(q[:1])
    assert after[0, 0] != before[0, 0]
    np.testing.assert_array_equal(after, pq.encode(torch.from_numpy(q[:1])).numpy())
    bad = q[:2].copy()
    bad[1, 3] = np.nan
    with pytest.raises(ValueError, match="NaN|finite"):
        pq.encode(bad)
    with pytest.raises(RuntimeError, match="fit"):
        vq.ProductQuantizer(32, 8).encode(q[:1])
