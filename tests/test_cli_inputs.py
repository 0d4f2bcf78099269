"""What ``vq build`` / ``vq search`` read and write: every vector format (the reader
``vq.distributed`` shares), ann-benchmarks' distance honoured, ``--metric`` passed through, and
every I/O or size error as one line ``error: …`` with exit status 2 (issue 48 #12)."""

import os
import re
import struct

import numpy as np
import pytest

import vq
from vq.apps import cli, common, torchrun
from vq.datasets import (
    read_ivecs,
    write_fbin,
    write_fvecs,
    write_i8bin,
    write_ibin,
    write_ivecs,
    write_u8bin,
)

N, NQ, D, K = 400, 20, 16, 5


def brute_force(x: np.ndarray, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Squared L2 distances [nq, k] and ids of the k nearest, in float64."""
    d = ((q.astype(np.float64)[:, None, :] - x.astype(np.float64)[None]) ** 2).sum(-1)
    ids = np.argsort(d, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(d, ids, 1), ids


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(7)
    x = rng.integers(0, 120, (N, D)).astype(np.float32)  # exact in every format below
    q = rng.integers(0, 120, (NQ, D)).astype(np.float32)
    return x, q


@pytest.fixture(scope="module")
def files(tmp_path_factory, data):
    x, q = data
    d = tmp_path_factory.mktemp("cli-inputs")
    write_fvecs(d / "base.fvecs", x)
    write_fvecs(d / "queries.fvecs", q)
    write_ivecs(d / "gt.ivecs", brute_force(x, q, K)[1])
    code = cli.main(
        ["build", "--data", str(d / "base.fvecs"), "--index", "Flat", "-o", str(d / "flat.vq")]
        + ["--quiet", "--no-warm-up"]
    )
    assert code == 0
    return d


def run(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _write(path, x: np.ndarray) -> None:
    suffix = path.suffix
    if suffix == ".npy":
        np.save(path, x)
    elif suffix == ".fbin":
        write_fbin(path, x)
    elif suffix == ".u8bin":
        write_u8bin(path, x.astype(np.uint8))
    elif suffix == ".i8bin":
        write_i8bin(path, x.astype(np.int8))
    else:
        write_fvecs(path, x)


@pytest.mark.parametrize(
    ("vectors", "gt"),
    [("float64.npy", "gt.npy"), ("x.fbin", "gt.ibin"), ("x.u8bin", "gt.ivecs"),
     ("x.i8bin", "gt-with-distances.ibin")],
)  # fmt: skip
def test_build_and_search_read_every_vector_format(files, data, capsys, vectors, gt):
    x, q = data
    if vectors.endswith(".i8bin"):  # int8: values below 128
        x, q = x - 60, q - 60
    d = files / vectors.replace(".", "-")
    d.mkdir()
    suffix = vectors[vectors.index(".") :]
    base, queries = d / f"base{suffix}", d / f"queries{suffix}"
    _write(base, x.astype(np.float64) if vectors.endswith(".npy") else x)
    _write(queries, q)
    dist, ids = brute_force(x, q, K)
    if gt.endswith(".npy"):
        np.save(d / gt, ids)
    elif gt == "gt.ibin":
        write_ibin(d / gt, ids)
    elif gt.endswith(".ibin"):  # big-ann-benchmarks' ground truth: ids, then distances
        (d / gt).write_bytes(struct.pack("<ii", NQ, K) + ids.astype("<i4").tobytes()
                             + dist.astype("<f4").tobytes())  # fmt: skip
    else:
        write_ivecs(d / gt, ids)
    code, out, err = run(
        capsys, "build", "--data", base, "--index", "Flat", "-o", d / "x.vq", "--no-warm-up"
    )
    assert code == 0, err
    assert f"Flat: {N} vectors of dim {D}" in out
    found = d / "found.npy"
    code, out, err = run(
        capsys, "search", d / "x.vq", "--queries", queries, "-k", K, "--gt", d / gt, "--out", found
    )
    assert code == 0, err
    assert out.startswith(f"{NQ} queries, k={K}")
    got = np.load(found)
    assert got.dtype == np.int64 and got.shape == (NQ, K)
    # the ids found are at the true k smallest distances (they may differ from ids only at ties)
    np.testing.assert_allclose(_distances(x, q, got), dist, rtol=1e-6)
    # and the recall printed is that of these ids against the ground-truth file's
    assert f"recall@1 {np.mean(got[:, 0] == ids[:, 0]):.4f}" in out


def _distances(x: np.ndarray, q: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Squared L2 distances [nq, k] from each query to the vectors ``ids`` [nq, k]."""
    return ((q.astype(np.float64)[:, None, :] - x.astype(np.float64)[ids]) ** 2).sum(-1)


def test_ids_written_as_ivecs_ibin_and_npy_are_the_same(files, capsys):
    outs = {}
    for suffix in (".ivecs", ".ibin", ".npy"):
        path = files / f"ids{suffix}"
        code, _, err = run(
            capsys, "search", files / "flat.vq", "--queries", files / "queries.fvecs",
            "-k", K, "--out", path,
        )  # fmt: skip
        assert code == 0, err
        outs[suffix] = vq.datasets.read_neighbors(path)
    np.testing.assert_array_equal(outs[".ibin"], outs[".ivecs"])
    np.testing.assert_array_equal(outs[".npy"], outs[".ivecs"])
    np.testing.assert_array_equal(outs[".ivecs"], read_ivecs(files / "gt.ivecs"))


# -- metrics --------------------------------------------------------------------------------------


def _hdf5(path, x, q, distance: str, k: int = K) -> None:
    h5py = pytest.importorskip("h5py")
    with h5py.File(path, "w") as f:
        f.attrs["distance"] = distance
        f.create_dataset("train", data=x)
        f.create_dataset("test", data=q)
        f.create_dataset("neighbors", data=brute_force(x, q, k)[1].astype(np.int32))
        f.create_dataset("distances", data=np.zeros((len(q), k), np.float32))


@pytest.fixture
def factory_calls(monkeypatch):
    """The metrics ``vq build`` hands ``vq.index_factory``; the index built is an l2 or ip
    one whatever the metric (the cosine metric is the index layer's own work)."""
    calls, real = [], vq.index_factory

    def record(dim, description, metric="l2"):
        calls.append(metric)
        return real(dim, description, metric="ip" if metric == "ip" else "l2")

    monkeypatch.setattr(vq, "index_factory", record)
    return calls


@pytest.mark.parametrize(
    ("distance", "metric"), [("euclidean", "l2"), ("angular", "cosine"), ("dot", "ip")]
)
def test_an_ann_benchmarks_distance_is_the_index_metric(
    tmp_path, data, capsys, factory_calls, distance, metric
):
    x, q = data
    _hdf5(tmp_path / "x.hdf5", x, q, distance)
    code, _, err = run(
        capsys, "build", "--data", tmp_path / "x.hdf5", "--index", "Flat",
        "-o", tmp_path / "x.vq", "--quiet", "--no-warm-up",
    )  # fmt: skip
    assert code == 0, err
    assert factory_calls == [metric]


@pytest.mark.parametrize("distance", ["jaccard", "hamming"])
def test_jaccard_and_hamming_files_are_refused(tmp_path, data, capsys, distance):
    x, q = data
    _hdf5(tmp_path / "x.hdf5", x, q, distance)
    code, _, err = run(
        capsys, "build", "--data", tmp_path / "x.hdf5", "--index", "Flat", "-o", tmp_path / "x.vq"
    )
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"error: {tmp_path / 'x.hdf5'}: distance='{distance}'")
    assert "which no vq index searches" in err
    assert not (tmp_path / "x.vq").exists()


def test_metric_cosine_is_passed_to_the_index_factory(files, capsys, factory_calls):
    code, _, err = run(
        capsys, "build", "--data", files / "base.fvecs", "--index", "Flat", "--metric", "cosine",
        "-o", files / "cos.vq", "--quiet", "--no-warm-up",
    )  # fmt: skip
    assert code == 0, err
    assert factory_calls == ["cosine"]


def test_metric_cosine_builds_or_is_one_error_line(files, capsys):
    """Whether the index layer takes cosine yet or not: an index, or one line and status 2."""
    code, out, err = run(
        capsys, "build", "--data", files / "base.fvecs", "--index", "Flat", "--metric", "cosine",
        "-o", files / "cos.vq", "--quiet", "--no-warm-up",
    )  # fmt: skip
    if code == 0:
        assert vq.load_index(files / "cos.vq").metric_name == "cosine"
    else:
        assert code == 2 and err.startswith("error: ") and err.count("\n") == 1
        assert "cosine" in err


def test_a_metric_contradicting_the_file_is_refused(tmp_path, data, capsys):
    x, q = data
    _hdf5(tmp_path / "x.hdf5", x, q, "angular")
    code, _, err = run(
        capsys, "build", "--data", tmp_path / "x.hdf5", "--index", "Flat", "--metric", "l2",
        "-o", tmp_path / "x.vq",
    )  # fmt: skip
    assert code == 2 and err.count("\n") == 1
    assert "the file's neighbours are by cosine distance, but --metric l2 was given" in err


def test_ground_truth_by_another_metric_than_the_index_is_refused(files, data, capsys):
    x, q = data
    _hdf5(files / "dot.hdf5", x, q, "dot")
    code, _, err = run(
        capsys, "search", files / "flat.vq", "--queries", files / "queries.fvecs",
        "--gt", files / "dot.hdf5",
    )  # fmt: skip
    assert code == 2 and err.count("\n") == 1
    assert "its neighbours are by ip distance, but the index searches by l2" in err


def test_an_hdf5_file_gives_build_its_train_set_and_search_its_test_set(tmp_path, data, capsys):
    x, q = data
    _hdf5(tmp_path / "x.hdf5", x, q, "euclidean")
    code, _, err = run(
        capsys, "build", "--data", tmp_path / "x.hdf5", "--index", "Flat",
        "-o", tmp_path / "x.vq", "--quiet", "--no-warm-up",
    )  # fmt: skip
    assert code == 0, err
    code, out, err = run(
        capsys, "search", tmp_path / "x.vq", "--queries", tmp_path / "x.hdf5", "-k", K,
        "--gt", tmp_path / "x.hdf5", "--out", tmp_path / "ids.npy",
    )  # fmt: skip
    assert code == 0, err
    assert out.startswith(f"{NQ} queries, k={K}") and vq.load_index(tmp_path / "x.vq").ntotal == N
    got = np.load(tmp_path / "ids.npy")
    np.testing.assert_allclose(_distances(x, q, got), brute_force(x, q, K)[0], rtol=1e-6)


# -- the reader vq.distributed shares ----------------------------------------------------------


@pytest.mark.parametrize("suffix", [".npy", ".fbin", ".fvecs", ".hdf5"])
def test_the_torchrun_program_reads_each_process_share_with_the_same_reader(tmp_path, data, suffix):
    x, q = data
    path = tmp_path / f"x{suffix}"
    if suffix == ".hdf5":
        _hdf5(path, x, q, "euclidean")
    else:
        _write(path, x)
    parts = [torchrun.read_rows(path, rank, 3) for rank in range(3)]
    assert [first for _, first in parts] == [0, N // 3, 2 * N // 3]
    np.testing.assert_array_equal(np.concatenate([rows for rows, _ in parts]), x)
    np.testing.assert_array_equal(torchrun.read_rows(path, 0, 1, "test")[0], common.read_vectors(
        path, "test"))  # fmt: skip


def test_the_torchrun_program_reports_bad_input_in_one_line(tmp_path, capsys):
    assert torchrun.main(["search", str(tmp_path), "--queries", str(tmp_path / "q.npy")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no sharded index at") and err.count("\n") == 1
    (tmp_path / "x.npy").write_bytes(b"garbage")
    argv = ["build", "--data", str(tmp_path / "x.npy"), "--index", "Flat", "-o", str(tmp_path)]
    assert torchrun.main(argv) == 2
    err = capsys.readouterr().err
    assert "x.npy: not a readable .npy array" in err and err.count("\n") == 1


# -- issue 48 #12: I/O and size errors are one line and status 2, never a traceback ------------


def _not_root():
    if os.geteuid() == 0:
        pytest.skip("root ignores file permissions")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ("build --data {d} --index Flat -o {d}/x.vq", "is a directory; give a vector file"),
        ("search {d}/flat.vq --queries {d}", "is a directory; give a vector file"),
        ("search {d}/flat.vq --queries {d}/queries.fvecs --gt {d}", "is a directory"),
        ("search {d} --queries {d}/queries.fvecs", "no index file at"),
        ("search {d}/flat.vq --queries {d}/queries.fvecs -k 1000000000000",
         f"-k 1000000000000 is more than the {N} vectors in the index; ask for at most {N}"),
        ("build --data {d}/base.fvecs --index Flat -o /proc/vq-test.vq",
         "-o /proc/vq-test.vq: cannot create a file in /proc"),
        ("build --data {d}/base.fvecs --index Flat -o {d}/no/such/dir/x.vq", "no directory"),
        ("build --data {d}/base.fvecs --index Flat -o {d}", "is a directory; give the path"),
        ("search {d}/flat.vq --queries {d}/queries.fvecs --out /proc/ids.ivecs",
         "--out /proc/ids.ivecs: cannot create a file in /proc"),
        ("build --data {d}/missing.fbin --index Flat -o {d}/x.vq", "missing.fbin: no such file"),
        ("build --data {d}/truncated.fbin --index Flat -o {d}/x.vq",
         "the file is truncated, or it is not a .fbin file"),
        ("build --data {d}/empty.npy --index Flat -o {d}/x.vq", "empty.npy holds no vectors"),
        ("search {d}/truncated.vq --queries {d}/queries.fvecs", "truncated.vq: "),
        ("search {d}/flat.vq --queries {d}/narrow.npy",
         "queries: expected vectors of dim 16, got 8 in "),
        ("search {d}/flat.vq --queries {d}/queries.fvecs --gt {d}/short.ivecs",
         f"short.ivecs: 3 rows of neighbours for {NQ} queries"),
        ("warmup --saved {d}", "no index file at"),
    ],
)  # fmt: skip
def test_io_and_size_errors_are_one_line_and_exit_2(files, capsys, argv, message):
    (files / "truncated.fbin").write_bytes(struct.pack("<ii", 10, D) + bytes(40))
    np.save(files / "empty.npy", np.zeros((0, D), np.float32))
    np.save(files / "narrow.npy", np.zeros((3, 8), np.float32))
    write_ivecs(files / "short.ivecs", np.zeros((3, K), np.int32))
    whole = (files / "flat.vq").read_bytes()
    (files / "truncated.vq").write_bytes(whole[: len(whole) // 2])
    code, out, err = run(capsys, *argv.format(d=files).split())
    assert code == 2, (out, err)
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert message in err, err
    assert not list(files.glob(".*.probe"))  # the writability probe cleaned up


def test_results_larger_than_memory_are_refused_before_searching(files, capsys, monkeypatch):
    monkeypatch.setattr(common, "_memory_bytes", lambda: 2 * K * NQ * 12 - 1)
    monkeypatch.setattr(vq.index.Index, "search", lambda *a, **k: pytest.fail("searched"))
    code, _, err = run(
        capsys, "search", files / "flat.vq", "--queries", files / "queries.fvecs", "-k", K
    )
    assert code == 2 and err.count("\n") == 1
    assert re.search(rf"-k {K} for {NQ} queries needs 0.0 GiB of results, more than half", err)


def test_a_save_that_fails_is_one_line(files, capsys, monkeypatch):
    from safetensors import SafetensorError

    def read_only(self, path):
        raise SafetensorError("Error while serializing: Read-only file system (os error 30)")

    monkeypatch.setattr(vq.index.Index, "save", read_only)
    code, _, err = run(
        capsys, "build", "--data", files / "base.fvecs", "--index", "Flat",
        "-o", files / "ro.vq", "--quiet", "--no-warm-up",
    )  # fmt: skip
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"error: cannot write {files / 'ro.vq'}: Error while serializing")


def test_running_out_of_memory_is_one_line(files, capsys, monkeypatch):
    def too_much(self, rows=None, dtype=np.float32):
        raise MemoryError()

    monkeypatch.setattr(vq.datasets.VectorFile, "read", too_much)
    code, _, err = run(
        capsys, "build", "--data", files / "base.fvecs", "--index", "Flat", "-o", files / "m.vq"
    )
    assert code == 2 and err.count("\n") == 1
    assert err.startswith("error: out of memory; ask for less")


def test_unreadable_and_unwritable_places_are_one_line(files, capsys):
    _not_root()
    locked = files / "locked"
    locked.mkdir(exist_ok=True)
    (locked / "x.fvecs").write_bytes((files / "base.fvecs").read_bytes())
    os.chmod(locked / "x.fvecs", 0)
    os.chmod(locked, 0o500)
    try:
        code, _, err = run(
            capsys, "build", "--data", locked / "x.fvecs", "--index", "Flat", "-o", files / "y.vq"
        )
        assert code == 2 and "Permission denied" in err and err.count("\n") == 1
        code, _, err = run(
            capsys, "build", "--data", files / "base.fvecs", "--index", "Flat",
            "-o", locked / "y.vq",
        )  # fmt: skip
        assert code == 2 and "cannot create a file in" in err and err.count("\n") == 1
    finally:
        os.chmod(locked, 0o700)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ("export {d}/flat.vq -o /proc/x.onnx", "-o /proc/x.onnx: cannot create a file in /proc"),
        ("export {d}/flat.vq -o {d}/x.onnx -k 1000000000000", "-k 1000000000000 is more than"),
        ("export {d}/flat.vq -o {d}/x.onnx --check {d}", "is a directory; give a vector file"),
        ("export {d}/flat.vq -o {d}/x.onnx --check {d}/narrow.npy",
         "vectors of dim 8, the index's are of dim 16"),
    ],
)  # fmt: skip
def test_export_io_and_size_errors_are_one_line(files, capsys, argv, message):
    np.save(files / "narrow.npy", np.zeros((3, 8), np.float32))
    code, _, err = run(capsys, *argv.format(d=files).split())
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert message in err, err
