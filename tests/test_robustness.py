"""Bad input at every public entry point: one table of calls, each with the error type and the
message it must raise (what was expected, what came); then the dtype, layout, id and chunking
policies that good input relies on."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from index_kinds import KINDS

import vq
from vq._checks import in_chunks
from vq.apps import cli
from vq.datasets import (
    clustered_vectors,
    embed_nsynth,
    ground_truth,
    read_fvecs,
    recall_at,
    synthesize_nsynth,
    write_bvecs,
    write_fvecs,
)
from vq.index.core import lean

D = 16


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """Small trained quantizers and indexes (dim 16), and a scratch directory."""
    x = clustered_vectors(2000, D, n_clusters=20, seed=3)
    flat = vq.FlatIndex(D)
    flat.add(x[:200])
    ivf = vq.IVFPQ(D, nlist=8, M=4, nbits=4, coarse_niter=2, niter=2)
    ivf.train(x)
    ivf.add(x[:200])
    refine = vq.index_factory(D, "PQ4x4,RFlat")
    refine.index.pq.niter = 2
    refine.train(x)
    refine.add(x[:200])
    custom = vq.FlatIndex(D)
    custom.add_with_ids(x[:10], np.arange(10) * 2)
    tmp = tmp_path_factory.mktemp("robustness")
    write_fvecs(tmp / "a.fvecs", x[:20])
    return SimpleNamespace(
        x=x,
        q=x[:5].copy(),
        pq=vq.ProductQuantizer(D, M=4, nbits=4, niter=2).fit(x),
        rvq=vq.ResidualVQ(D, num_quantizers=2, codebook_size=16, refine_iters=0, niter=3).fit(x),
        vqz=vq.VectorQuantizer(D, 16).fit(x),
        opq=vq.OPQ(D, M=4, nbits=4, niter=2, niter_pq=2, niter_pq_0=2, pq_niter=2).fit(x),
        flat=flat,
        ivf=ivf,
        refine=refine,
        custom=custom,
        tmp=tmp,
    )


def nan_rows(x: np.ndarray, rows, value=np.nan) -> np.ndarray:
    y = x.copy()
    y[rows, 1] = value
    return y


def fresh_flat(e):
    index = vq.FlatIndex(D)
    index.add(e.x[:20])
    return index


def case(id: str, *values):
    """One row of a table: a test id, then the call (or input) and what it must raise."""
    return pytest.param(*values, id=id)


# fmt: off
CASES = [
    # quantizers: vectors
    case("encode-dim", lambda e: e.pq.encode(e.x[:, :8]),
         ValueError, r"^x: expected vectors of dim 16, got 8$"),
    case("encode-int", lambda e: e.pq.encode(e.x.astype(np.int32)),
         TypeError, r"expected floating-point vectors .*got int32; convert"),
    case("encode-bool", lambda e: e.pq.encode(e.x > 0),
         TypeError, r"floating-point vectors .*got bool"),
    case("encode-complex", lambda e: e.pq.encode(e.x.astype(np.complex64)),
         TypeError, r"got complex64"),
    case("encode-list", lambda e: e.pq.encode(e.x[:2].tolist()),
         TypeError, r"got list; wrap it with np.asarray"),
    case("encode-scalar", lambda e: e.pq.encode(torch.tensor(1.0)),
         ValueError, r"expected vectors \[\.\.\., dim\], got a scalar"),
    case("encode-nan", lambda e: e.pq.encode(nan_rows(e.x, [3, 9])),
         ValueError, r"^x: 2 NaN/Inf values, first in row 3; remove"),
    case("encode-inf-fp16", lambda e: e.pq.encode(nan_rows(e.x, [5], np.inf).astype(np.float16)),
         ValueError, r"1 NaN/Inf values, first in row 5"),
    case("encode-float64-overflow",
         lambda e: e.pq.encode(nan_rows(e.x.astype(np.float64), [7, 8], 1e39)),
         ValueError, r"2 float64 values beyond float32's range \(±3.403e\+38\), first in row 7"),
    case("encode-sparse", lambda e: e.pq.encode(torch.from_numpy(e.x[:4]).to_sparse()),
         TypeError, r"expected a dense tensor, got layout torch.sparse_coo"),
    case("encode-meta", lambda e: e.pq.encode(torch.empty(3, D, device="meta")),
         TypeError, r"meta device holds no data"),
    case("encode-strings", lambda e: e.pq.encode(np.array([["a"] * D])),
         TypeError, r"x: unsupported numpy dtype <U1"),
    case("opq-encode-dim", lambda e: e.opq.encode(e.x[:, :12]),
         ValueError, r"expected vectors of dim 16, got 12"),
    case("tables-metric", lambda e: e.pq.distance_tables(e.q, "cos"),
         ValueError, r"metric must be 'l2' or 'ip', got 'cos'"),
    case("tables-rank", lambda e: e.pq.distance_tables(e.q[None]),
         ValueError, r"queries: expected a 2-D array \[n, dim\], got shape \(1, 5, 16\)"),
    case("encode-untrained", lambda e: vq.ProductQuantizer(D, M=4, nbits=8).encode(e.q),
         RuntimeError, r"not trained; call fit\(x\) first"),
    # quantizers: codes
    case("decode-float", lambda e: e.pq.decode(np.zeros((3, 4), np.float32)),
         TypeError, r"codes: expected integer codes, got float32"),
    case("decode-too-big", lambda e: e.pq.decode(np.full((3, 4), 16)),
         ValueError, r"codes must lie in \[0, 16\), got values in \[16, 16\]"),
    case("decode-negative", lambda e: e.pq.decode(np.full((3, 4), -1)),
         ValueError, r"got values in \[-1, -1\]"),
    case("decode-shape", lambda e: e.pq.decode(np.zeros((3, 5), np.int64)),
         ValueError, r"expected codes \[\.\.\., 4\], got shape \(3, 5\)"),
    case("rvq-decode-range", lambda e: e.rvq.decode(np.array([[0, 16]])),
         ValueError, r"codes must lie in \[0, 16\)"),
    case("vq-decode-range", lambda e: e.vqz.decode(np.array([3, 99])),
         ValueError, r"got values in \[3, 99\]"),
    # quantizers: construction and training
    case("pq-M", lambda e: vq.ProductQuantizer(D, M=5),
         ValueError, r"dim=16 must be a positive multiple of M=5"),
    case("pq-nbits", lambda e: vq.ProductQuantizer(D, M=4, nbits=0),
         ValueError, r"nbits must be between 1 and 16, got 0"),
    case("pq-fit-empty", lambda e: vq.ProductQuantizer(D, M=4, nbits=4).fit(e.x[:0]),
         ValueError, r"ProductQuantizer.fit: got an empty training set"),
    case("pq-fit-few", lambda e: vq.ProductQuantizer(D, M=4, nbits=4).fit(e.x[:10]),
         ValueError, r"needs at least k=16 training vectors, got 10"),
    case("vq-size", lambda e: vq.VectorQuantizer(D, 0),
         ValueError, r"codebook_size must be >= 1, got 0"),
    # k-means / LBG
    case("kmeans-k0", lambda e: vq.kmeans(e.x, 0),
         ValueError, r"kmeans: k must be a positive number of centroids, got 0"),
    case("kmeans-k-float", lambda e: vq.kmeans(e.x, 2.5),
         TypeError, r"kmeans: k must be an integer number of centroids, got 2.5"),
    case("kmeans-n-lt-k", lambda e: vq.kmeans(e.x[:5], 8),
         ValueError, r"kmeans: needs at least k=8 training vectors, got 5"),
    case("kmeans-niter", lambda e: vq.kmeans(e.x, 4, niter=-1),
         ValueError, r"niter must be >= 0, got -1"),
    case("kmeans-niter-float", lambda e: vq.kmeans(e.x, 4, niter=2.5),
         TypeError, r"niter must be an integer, got 2.5"),
    case("kmeans-mppc", lambda e: vq.kmeans(e.x, 4, max_points_per_centroid=0),
         ValueError, r"max_points_per_centroid must be positive"),
    case("kmeans-init", lambda e: vq.kmeans(e.x, 4, init="forgy"),
         ValueError, r"init must be 'k-means\+\+' or 'random', got 'forgy'"),
    case("kmeans-1d", lambda e: vq.kmeans(e.x[0], 4),
         ValueError, r"x: expected a 2-D array \[n, dim\], got shape \(16,\)"),
    case("kmeans-dim0", lambda e: vq.kmeans(np.zeros((10, 0), np.float32), 4),
         ValueError, r"expected vectors of dim >= 1, got shape \(10, 0\)"),
    case("kmeans-nan", lambda e: vq.kmeans(nan_rows(e.x, [11]), 4),
         ValueError, r"1 NaN/Inf values, first in row 11"),
    case("lbg-epsilon", lambda e: vq.lbg(e.x, 4, epsilon=0),
         ValueError, r"epsilon must be positive, got 0"),
    case("lbg-empty", lambda e: vq.lbg(e.x[:0], 4),
         ValueError, r"lbg: got an empty training set"),
    # indexes: construction
    case("index-dim0", lambda e: vq.FlatIndex(0),
         ValueError, r"dim must be positive, got 0"),
    case("index-dim-float", lambda e: vq.FlatIndex(16.5),
         TypeError, r"dim must be an integer, got 16.5 \(float\)"),
    case("index-metric", lambda e: vq.FlatIndex(D, metric="cos"),
         ValueError, r"metric must be 'l2', 'ip' or 'cosine', got 'cos'"),
    case("index-k0", lambda e: vq.FlatIndex(D, k=0),
         ValueError, r"k must be positive, got 0"),
    case("ivf-nlist0", lambda e: vq.IVFPQ(D, nlist=0, M=4),
         ValueError, r"nlist must be positive, got 0"),
    case("ivf-nprobe0", lambda e: vq.IVFPQ(D, nlist=8, M=4, nprobe=0),
         ValueError, r"nprobe must be a positive integer, got 0"),
    case("ivf-spill-str", lambda e: vq.IVFFlat(D, nlist=8, spill="no"),
         TypeError, r"spill must be True or False, got 'no' \(str\)"),
    case("ivf-sketch-int", lambda e: vq.IVFFlat(D, nlist=8, sketch=1),
         TypeError, r"sketch must be True or False, got 1 \(int\)"),
    case("ivfsq-by-residual-str", lambda e: vq.IVFSQ(D, nlist=8, by_residual="False"),
         TypeError, r"by_residual must be True or False, got 'False' \(str\)"),
    case("pq-fast-scan-none", lambda e: vq.PQIndex(D, 4, 4, fast_scan=None),
         TypeError, r"fast_scan must be True or False, got None \(NoneType\)"),
    case("pretransform-dims", lambda e: vq.PreTransform(vq.OPQ(D, M=4), vq.FlatIndex(8)),
         ValueError, r"the index has dim 8 but the transform outputs 16"),
    case("factory", lambda e: vq.index_factory(D, "LSH"),
         ValueError, r"cannot read 'LSH'.*supported: Flat"),
    # indexes: search
    case("search-k0", lambda e: e.flat.search(e.q, 0),
         ValueError, r"k must be a positive integer, got 0"),
    case("search-k-negative", lambda e: e.flat.search(e.q, -3),
         ValueError, r"k must be a positive integer, got -3"),
    case("search-k-bool", lambda e: e.flat.search(e.q, True),
         ValueError, r"k must be a positive integer, got True"),
    case("search-k-float", lambda e: e.flat.search(e.q, 2.0),
         ValueError, r"k must be a positive integer, got 2.0"),
    case("search-dim", lambda e: e.flat.search(e.q[:, :15], 3),
         ValueError, r"queries: expected vectors of dim 16, got 15"),
    case("search-3d", lambda e: e.flat.search(e.q[None], 3),
         ValueError, r"queries: expected a 2-D array \[n, dim\] or one query \[dim\], got "
         r"shape \(1, 5, 16\)"),
    case("search-nan", lambda e: e.ivf.search(nan_rows(e.q, [4]), 3),
         ValueError, r"queries: 1 NaN/Inf values, first in row 4"),
    case("search-int", lambda e: e.ivf.search(e.q.astype(np.int64), 3),
         TypeError, r"queries: expected floating-point vectors .*got int64"),
    case("search-option-flat", lambda e: e.flat.search(e.q, 3, nprobe=4),
         TypeError,
         r"FlatIndex.search\(\) got an unexpected keyword argument 'nprobe'; its search options: "
         "none"),
    case("search-option-typo", lambda e: e.ivf.search(e.q, 3, nprob=4),
         TypeError, r"unexpected keyword argument 'nprob'; its search options: max_codes, nprobe"),
    case("search-nprobe0", lambda e: e.ivf.search(e.q, 3, nprobe=0),
         ValueError, r"nprobe must be a positive integer, got 0"),
    case("search-k-factor0", lambda e: e.refine.search(e.q, 3, k_factor=0),
         ValueError, r"k_factor must be an integer >= 1, got 0"),
    case("search-untrained", lambda e: vq.IVFPQ(D, nlist=8, M=4).search(e.q, 3),
         RuntimeError, r"IVFPQ.search: the index is not trained; call train\(x\)"),
    # indexes: train, add, ids
    case("train-few", lambda e: vq.IVFPQ(D, nlist=8, M=4).train(e.x[:5]),
         ValueError, r"IVFPQ.train: needs at least k=8 training vectors, got 5"),
    case("train-empty", lambda e: vq.IVFPQ(D, nlist=8, M=4).train(e.x[:0]),
         ValueError, r"got an empty training set"),
    case("add-untrained", lambda e: vq.IVFPQ(D, nlist=8, M=4).add(e.x),
         RuntimeError, r"IVFPQ.add: the index is not trained"),
    case("add-dim", lambda e: fresh_flat(e).add(e.x[:, :4]),
         ValueError, r"x: expected vectors of dim 16, got 4"),
    case("ids-length", lambda e: fresh_flat(e).add_with_ids(e.x[:3], np.arange(2)),
         ValueError, r"ids: expected shape \(3,\) to match x, got \(2,\)"),
    case("ids-float", lambda e: fresh_flat(e).add_with_ids(e.x[:3], np.ones(3)),
         TypeError, r"ids: expected integers, got float64"),
    case("ids-2d", lambda e: fresh_flat(e).add_with_ids(e.x[:3], np.arange(3).reshape(3, 1)),
         ValueError, r"expected shape \(3,\) to match x, got \(3, 1\)"),
    case("ids-duplicate", lambda e: fresh_flat(e).add_with_ids(e.x[:3], np.array([50, 51, 50])),
         ValueError, r"ids: id 50 appears more than once"),
    case("ids-stored", lambda e: fresh_flat(e).add_with_ids(e.x[:3], np.array([50, 5, 51])),
         ValueError, r"ids: 1 of them are already in the index \(first: 5\)"),
    case("ids-negative", lambda e: fresh_flat(e).add_with_ids(e.x[:3], np.array([50, -1, 51])),
         ValueError, r"ids must be >= 0 \(-1 marks a missing result\), got -1"),
    case("ids-uint64", lambda e: fresh_flat(e).add_with_ids(e.x[:1], np.array([2**63], np.uint64)),
         ValueError, r"ids must be below 2\*\*63, got 9223372036854775808"),
    case("add-collides", lambda e: e.custom.add(e.x[:3]),
         ValueError, r"add: the sequential ids: 2 of them are already in the index \(first: 10\)"),
    case("remove-float", lambda e: e.flat.remove_ids(np.array([1.0])),
         TypeError, r"ids: expected integers, got float64"),
    case("remove-str", lambda e: e.flat.remove_ids("3"),
         TypeError, r"ids: expected a numpy array or torch tensor, got str"),
    # persistence
    case("load-missing", lambda e: vq.load_index(e.tmp / "missing.vqi"),
         FileNotFoundError, r"no index file at .*missing.vqi"),
    case("load-directory", lambda e: vq.load_index(e.tmp),
         FileNotFoundError, r"no index file at"),
    case("save-directory", lambda e: e.flat.save(e.tmp),
         ValueError, r"is a directory; save the index to a file inside it"),
    case("save-no-directory", lambda e: e.flat.save(e.tmp / "no" / "x.vqi"),
         FileNotFoundError, r"cannot save to .*x.vqi: no directory"),
    # datasets
    case("clustered-n", lambda e: clustered_vectors(10.5, D),
         TypeError, r"n must be an integer, got 10.5"),
    case("clustered-spread", lambda e: clustered_vectors(10, D, spread=-1.0),
         ValueError, r"spread must be a finite number >= 0, got -1.0"),
    case("gt-k", lambda e: ground_truth(e.x, e.q, 0),
         ValueError, r"k must be a positive integer, got 0"),
    case("gt-dim", lambda e: ground_truth(e.x, e.q[:, :8], 3),
         ValueError, r"xq: expected vectors of dim 16, got 8"),
    case("gt-nan", lambda e: ground_truth(nan_rows(e.x, [6]), e.q, 3),
         ValueError, r"xb: 1 NaN/Inf values, first in row 6"),
    case("recall-float", lambda e: recall_at(np.zeros((2, 3)), np.zeros((2, 3), int), 1),
         TypeError, r"found: expected integer ids, got float64"),
    case("recall-r", lambda e: recall_at(np.zeros((2, 3), int), np.zeros((2, 3), int), 4),
         ValueError, r"r must lie in \[1, 3\]"),
    case("fvecs-int", lambda e: write_fvecs(e.tmp / "a.fvecs", e.x.astype(np.int32)),
         TypeError, r"write_fvecs: expected floating-point vectors, got int32"),
    case("bvecs-range", lambda e: write_bvecs(e.tmp / "a.bvecs", np.full((2, 3), 300)),
         ValueError, r"values must lie in \[0, 255\] to fit uint8"),
    case("fvecs-no-directory", lambda e: write_fvecs(e.tmp / "no" / "a.fvecs", e.x),
         FileNotFoundError, r"cannot write .*a.fvecs: no directory"),
    case("fvecs-rows", lambda e: read_fvecs(e.tmp / "a.fvecs", rows=2.5),
         TypeError, r"rows must be None, an int"),
    case("embed-n-fft", lambda e: embed_nsynth([], n_fft=0),
         ValueError, r"n_fft must be positive, got 0"),
    case("embed-batch", lambda e: embed_nsynth([], batch_size=2.5),
         TypeError, r"batch_size must be an integer, got 2.5"),
    case("embed-mfcc", lambda e: embed_nsynth([], method="mfcc", n_mfcc=80),
         ValueError, r"n_mfcc \(80\) cannot exceed n_mels \(64\)"),
    case("synth-instruments", lambda e: synthesize_nsynth(e.tmp / "s", n_instruments=0),
         ValueError, r"n_instruments must be in 1–3300, got 0"),
    case("synth-instruments-float", lambda e: synthesize_nsynth(e.tmp / "s", n_instruments=2.5),
         TypeError, r"n_instruments must be an integer, got 2.5"),
]

NEEDS_TORCHAUDIO = [
    case("embed-nan-wave", [(torch.full((4000,), float("nan")), {})],
         ValueError, r"note 0: its waveform holds NaN/Inf"),
    case("embed-int-wave", [(torch.zeros(4000), {}), (torch.zeros(4000, dtype=torch.int16), {})],
         TypeError, r"note 1: expected a float waveform in \[-1, 1\], got torch.int16"),
    case("embed-stereo", [(torch.zeros(2, 4000), {})],
         ValueError, r"expected mono waveforms of one length, got shapes \[\(2, 4000\)\]"),
]
# fmt: on


# fmt: off
EXPORT_CASES = [
    case("export-what", lambda e, x: x.export_module(e.pq, what="search"),
         ValueError, r"a ProductQuantizer exports what='encode' or 'decode'; search needs an"),
    case("export-untrained", lambda e, x: x.export_module(vq.ProductQuantizer(D, 4), what="encode"),
         ValueError, r"the ProductQuantizer is not trained; call fit\(x\) before exporting"),
    case("export-empty-index", lambda e, x: x.export_module(vq.FlatIndex(D), what="search", k=5),
         ValueError, r"the FlatIndex is empty; add vectors before exporting its search"),
    case("onnx-batch-size",
         lambda e, x: x.to_onnx(e.pq, e.tmp / "a.onnx", batch_size=0, what="encode"),
         ValueError, r"batch_size must be a positive integer, got 0"),
    case("audit-not-onnx", lambda e, x: x.audit(e.tmp / "a.fvecs"),
         ValueError, r"a.fvecs: not an ONNX model"),
    case("pad-batch-too-big", lambda e, x: x.pad_batch(e.x[:100], sizes=[8, 64]),
         ValueError, r"a batch of 100 rows exceeds the largest size 64; split it"),
]
# fmt: on


@pytest.mark.parametrize("call, error, message", EXPORT_CASES)
def test_bad_export_input(env, call, error, message):
    pytest.importorskip("onnx")
    import vq.export

    with pytest.raises(error, match=message):
        call(env, vq.export)


@pytest.mark.parametrize("call, error, message", CASES)
def test_bad_input(env, call, error, message):
    with pytest.raises(error, match=message):
        call(env)


@pytest.mark.parametrize("dataset, error, message", NEEDS_TORCHAUDIO)
def test_bad_waveforms(dataset, error, message):
    pytest.importorskip("torchaudio")
    with pytest.raises(error, match=message):
        embed_nsynth(dataset)


# fmt: off
BUILD = "build --data {d}/base.fvecs -o {d}/x.vqi --index"
CLI_CASES = [
    case("cli-threads", f"{BUILD} Flat --threads 0", "--threads must be positive, got 0"),
    case("cli-train-size", f"{BUILD} Flat --train-size 0", "--train-size must be positive, got 0"),
    case("cli-nan-data", "build --data {d}/nan.fvecs --index Flat -o {d}/x.vqi",
         "x: 1 NaN/Inf values, first in row 2"),
    case("cli-nlist", f"{BUILD} IVF64,Flat", "needs at least k=64 training vectors, got 20"),
    case("cli-output-directory", "build --data {d}/base.fvecs --index Flat -o {d} --quiet",
         "is a directory"),
    case("cli-k", "search {d}/flat.vqi --queries {d}/base.fvecs -k 0",
         "-k must be positive, got 0"),
    case("cli-query-dim", "search {d}/flat.vqi --queries {d}/narrow.fvecs",
         "queries: expected vectors of dim 16, got 8"),
    case("cli-nprobe", "search {d}/flat.vqi --queries {d}/base.fvecs --nprobe 2",
         "--nprobe does not apply to FlatIndex"),
    case("cli-garbage-index", "search {d}/garbage.vqi --queries {d}/base.fvecs",
         "not a vq index file"),
]
# fmt: on


@pytest.fixture(scope="module")
def cli_files(env):
    d = env.tmp / "cli"
    d.mkdir()
    write_fvecs(d / "base.fvecs", env.x[:20])
    write_fvecs(d / "narrow.fvecs", env.x[:20, :8])
    write_fvecs(d / "nan.fvecs", nan_rows(env.x[:20], [2]))
    (d / "garbage.vqi").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00" + b"garbage" * 10)
    vq.FlatIndex(D).save(d / "flat.vqi")
    return d


@pytest.mark.parametrize("argv, message", CLI_CASES)
def test_cli_bad_input_is_one_line_and_exit_2(cli_files, capsys, argv, message):
    code = cli.main([a.format(d=cli_files) for a in argv.split()])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: ") and err.count("\n") == 1
    assert message in err


def test_the_table_is_large_enough():
    assert len(CASES) + len(NEEDS_TORCHAUDIO) + len(CLI_CASES) + len(EXPORT_CASES) >= 40


# -- the dtype and layout policy -------------------------------------------------------------------
def variants(x: np.ndarray) -> dict[str, object]:
    """The same vectors in other dtypes and memory layouts."""
    t = torch.from_numpy(x.copy())
    doubled = np.repeat(x, 2, axis=0)
    return {
        "float64": x.astype(np.float64),
        "fortran": np.asfortranarray(x),
        "strided": doubled[::2],
        "reversed": x[::-1].copy()[::-1],
        "big-endian": x.astype(">f4"),
        "torch-transposed": t.T.contiguous().T,
        "torch-strided": torch.from_numpy(doubled)[::2],
        "torch-float64": t.double(),
        "torch-requires-grad": t.clone().requires_grad_(True),
    }


@pytest.mark.parametrize("kind", list(variants(np.zeros((2, 2), np.float32))))
def test_other_dtypes_and_layouts_give_float32_results(env, kind):
    x = env.x[:300]
    other = variants(x)[kind]
    np.testing.assert_array_equal(np.asarray(env.pq.encode(other)), env.pq.encode(x))
    D0, I0 = env.ivf.search(x[:50], 5, nprobe=3)
    Dk, Ik = env.ivf.search(other[:50], 5, nprobe=3)
    np.testing.assert_array_equal(np.asarray(Ik), I0)
    np.testing.assert_array_equal(np.asarray(Dk), D0)
    km = vq.kmeans(other, 8, niter=3)
    np.testing.assert_array_equal(
        np.asarray(km.centroids.detach() if torch.is_tensor(km.centroids) else km.centroids),
        vq.kmeans(x, 8, niter=3).centroids,
    )
    index = vq.FlatIndex(D)
    index.add(other)
    assert torch.equal(index.vectors, torch.from_numpy(x))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_is_read_as_the_float32_it_represents(env, dtype):
    half = torch.from_numpy(env.x[:300]).to(dtype)
    np.testing.assert_array_equal(env.pq.encode(half).numpy(), env.pq.encode(half.float()).numpy())
    D16, I16 = env.ivf.search(half[:40], 5)
    D32, I32 = env.ivf.search(half[:40].float(), 5)
    assert torch.equal(I16, I32) and torch.equal(D16, D32) and D16.dtype == torch.float32


def test_nan_message_counts_every_bad_value_and_names_the_first_row(env):
    x = env.x[:100].copy()
    x[41, 3], x[41, 7], x[77, 0], x[90, 15] = np.nan, np.inf, -np.inf, np.nan
    with pytest.raises(ValueError) as info:
        env.flat.search(x, 3)
    assert str(info.value) == (
        "queries: 4 NaN/Inf values, first in row 41; remove or replace them before quantizing"
    )
    # finite values whose sum overflows float32 are not NaN/Inf: accepted
    big = np.full((4, D), 3e38, np.float32)
    assert env.pq.encode(big).shape == (4, 4)


# -- ids ------------------------------------------------------------------------------------------
def test_ids_stay_unique_across_add_remove_and_re_add(env):
    index = vq.FlatIndex(D)
    index.add_with_ids(env.x[:4], [7, 3, 11, 5])  # lists are accepted
    assert index.remove_ids([3, -1, 99]) == 1  # -1 (a missing result) and unknown ids ignored
    index.add_with_ids(env.x[4:5], np.array([3], np.int16))  # free again; any integer dtype
    with pytest.raises(ValueError, match="already in the index"):
        index.add_with_ids(env.x[5:6], torch.tensor([11]))
    assert index.remove_ids(11) == 1  # a single int
    assert sorted(index.stored_ids().tolist()) == [3, 5, 7]
    _, ids = index.search(env.x[4:5], 1)
    assert ids[0, 0] == 3


def test_failed_add_leaves_the_index_unchanged(env):
    index = fresh_flat(env)
    before = index.state_dict()
    for bad_ids in (np.array([1, 2, 3]), np.array([30, 30, 31])):
        with pytest.raises(ValueError):
            index.add_with_ids(env.x[20:23], bad_ids)
    after = index.state_dict()
    assert sorted(after) == sorted(before)
    assert all(torch.equal(after[k], before[k]) for k in before)


# -- bounded memory: chunked search, encode and decode ---------------------------------------------
def spy(monkeypatch, obj, name, seen: list[int]):
    real = getattr(obj, name)

    def wrapper(x, *args, **kwargs):
        seen.append(x.shape[0])
        return real(x, *args, **kwargs)

    monkeypatch.setattr(obj, name, wrapper)


@pytest.mark.parametrize("which", ["flat", "ivf", "refine"])
def test_search_runs_in_chunks_with_the_same_results(env, monkeypatch, which):
    index = getattr(env, which)
    queries = env.x[::7]  # 286 queries
    monkeypatch.setattr(lean, "SPLIT_BATCH", lean.SMALL_BATCH)  # (one general batch)
    D, I = index.search(queries, 6)
    seen: list[int] = []
    spy(monkeypatch, index, "search_ids", seen)
    monkeypatch.setattr(index, "search_batch_size", 50)
    Dc, Ic = index.search(queries.astype(np.float64), 6)  # converted a chunk at a time
    assert seen == [50] * 5 + [36]
    np.testing.assert_array_equal(Ic, I)
    np.testing.assert_array_equal(Dc, D)


@pytest.mark.parametrize("which", ["pq", "rvq", "vqz", "opq"])
def test_encode_and_decode_run_in_chunks_with_the_same_results(env, monkeypatch, which):
    q = getattr(env, which)
    x = env.x[:1000].reshape(10, 100, D)  # leading batch dimensions are kept
    codes, x_hat = q.encode(x), q.decode(q.encode(x))
    seen_encode: list[int] = []
    seen_decode: list[int] = []
    spy(monkeypatch, q, "_encode", seen_encode)
    spy(monkeypatch, q, "_decode", seen_decode)
    monkeypatch.setattr(q, "encode_batch_size", 300)
    codes_c = q.encode(x)
    x_hat_c = q.decode(codes_c)
    assert seen_encode == seen_decode == [300, 300, 300, 100]
    assert codes_c.dtype == codes.dtype and codes_c.shape == codes.shape
    np.testing.assert_array_equal(codes_c, codes)
    np.testing.assert_array_equal(x_hat_c, x_hat)


def test_in_chunks_is_one_call_for_small_batches():
    calls = []

    def f(t):
        calls.append(t.shape[0])
        return t * 2

    x = torch.arange(10.0).reshape(5, 2)
    assert torch.equal(in_chunks(f, x, 5), x * 2) and calls == [5]
    assert torch.equal(in_chunks(f, x, 2), x * 2) and calls == [5, 2, 2, 1]


# -- queries on another device --------------------------------------------------------------------
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_queries_on_another_device(env):
    q = torch.from_numpy(env.q).cuda()
    D, I = env.ivf.search(q, 4)  # a CPU index, CUDA queries: results on the queries' device
    assert D.device == q.device and I.device == q.device
    D0, I0 = env.ivf.search(env.q, 4)
    np.testing.assert_array_equal(I.cpu().numpy(), I0)
    gpu = vq.FlatIndex(D).to("cuda")  # a CUDA index, numpy queries: numpy results
    gpu.add(env.x[:200])
    D1, I1 = gpu.search(env.q, 4)
    assert isinstance(I1, np.ndarray)
    np.testing.assert_array_equal(I1, env.flat.search(env.q, 4)[1])
    codes = env.pq.encode(q)
    assert codes.device == q.device
    np.testing.assert_array_equal(codes.cpu().numpy(), env.pq.encode(env.q))


@pytest.mark.parametrize("desc", sorted(set(KINDS.values())))
def test_every_registered_kind_refuses_bad_input_in_its_own_words(desc):
    """Every kind of the registry (tests/index_kinds.py, a toy kind included) checks what it is
    given before any kernel sees it: the wrong dimension, NaN, an unknown option, a bad k."""
    x = clustered_vectors(800, 32, n_clusters=8, seed=11)
    index = vq.index_factory(32, desc)
    index.train(x)
    index.add(x)
    with pytest.raises(ValueError, match="dim"):
        index.search(x[:2, :16], 3)
    with pytest.raises(ValueError, match="dim"):
        index.add(x[:2, :16])
    bad = x[:2].copy()
    bad[0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        index.search(bad, 3)
    with pytest.raises(ValueError, match="NaN"):
        index.add(bad)
    with pytest.raises(TypeError, match="unexpected keyword argument 'nope'"):
        index.search(x[:2], 3, nope=1)
    with pytest.raises(ValueError, match="k must be"):
        index.search(x[:2], 0)
    with pytest.raises(ValueError, match="not in the index|cannot reconstruct"):
        index.reconstruct(10**9)
