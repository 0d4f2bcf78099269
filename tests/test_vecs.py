import os
import struct

import numpy as np
import pytest
import torch

from vq.datasets import (
    ground_truth,
    read_ann_hdf5,
    read_bvecs,
    read_fvecs,
    read_ivecs,
    vecs_shape,
    write_bvecs,
    write_fvecs,
    write_ivecs,
)

rng = np.random.default_rng(0)
FORMATS = {
    "fvecs": (write_fvecs, read_fvecs, lambda n, d: rng.standard_normal((n, d), np.float32)),
    "ivecs": (
        write_ivecs,
        read_ivecs,
        lambda n, d: rng.integers(-(2**31), 2**31, (n, d), np.int32),
    ),
    "bvecs": (write_bvecs, read_bvecs, lambda n, d: rng.integers(0, 256, (n, d), np.uint8)),
}


def _record(fmt: str, values) -> bytes:
    code = {"fvecs": "f", "ivecs": "i", "bvecs": "B"}[fmt]
    return struct.pack(f"<i{len(values)}{code}", len(values), *values)


# -- .fvecs / .ivecs / .bvecs --------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("d", [1, 3, 128])
def test_round_trip_and_row_ranges(tmp_path, fmt, d):
    write, read, make = FORMATS[fmt]
    x = make(37, d)
    path = tmp_path / f"x.{fmt}"
    write(path, x)
    assert path.stat().st_size == 37 * (4 + d * x.itemsize)
    y = read(str(path))  # str and Path both accepted
    assert y.dtype == x.dtype and y.flags.writeable and not isinstance(y, np.memmap)
    np.testing.assert_array_equal(y, x)
    assert vecs_shape(path) == (37, d)
    np.testing.assert_array_equal(read(path, rows=5), x[:5])
    np.testing.assert_array_equal(read(path, rows=slice(10, 20)), x[10:20])
    np.testing.assert_array_equal(read(path, rows=slice(30, None)), x[30:])
    np.testing.assert_array_equal(read(path, rows=slice(-4, -1)), x[-4:-1])
    assert read(path, rows=0).shape == (0, d)
    assert not list(tmp_path.glob(".*.tmp*"))  # no temporary file left behind


@pytest.mark.parametrize(
    ("fmt", "rows"),
    [
        ("fvecs", [[1.5, -2.0, 3.25], [0.0, 1e-3, -7.0]]),
        ("ivecs", [[7, -1, 2**31 - 1], [0, 5, -(2**31)]]),
        ("bvecs", [[0, 255, 9], [128, 1, 2]]),
    ],
)
def test_reads_the_texmex_layout(tmp_path, fmt, rows):
    path = tmp_path / f"hand.{fmt}"
    path.write_bytes(b"".join(_record(fmt, r) for r in rows))
    x = FORMATS[fmt][1](path)
    np.testing.assert_array_equal(x, np.array(rows, dtype=x.dtype))
    assert x.shape == (2, 3)
    # and the writer produces exactly these bytes
    FORMATS[fmt][0](tmp_path / f"out.{fmt}", x)
    assert (tmp_path / f"out.{fmt}").read_bytes() == path.read_bytes()


def test_write_converts_and_checks_dtypes(tmp_path):
    x = rng.standard_normal((4, 5))  # float64
    write_fvecs(tmp_path / "a.fvecs", x)
    np.testing.assert_array_equal(read_fvecs(tmp_path / "a.fvecs"), x.astype(np.float32))
    write_fvecs(tmp_path / "t.fvecs", torch.from_numpy(x).to(torch.bfloat16))
    assert read_fvecs(tmp_path / "t.fvecs").dtype == np.float32
    ids = np.array([[0, 5], [2**31 - 1, 3]], dtype=np.int64)
    write_ivecs(tmp_path / "i.ivecs", ids)
    np.testing.assert_array_equal(read_ivecs(tmp_path / "i.ivecs"), ids)

    with pytest.raises(TypeError, match=r"got int64; cast with x.astype\(np.float32\)"):
        write_fvecs(tmp_path / "b.fvecs", ids)
    with pytest.raises(TypeError, match="expected integer vectors, got float64"):
        write_ivecs(tmp_path / "b.ivecs", x)
    with pytest.raises(ValueError, match=r"fit int32, got values in \[1, 2147483648\]"):
        write_ivecs(tmp_path / "b.ivecs", ids + 1)
    with pytest.raises(ValueError, match=r"\[0, 255\].*got values in \[-1, 3\]"):
        write_bvecs(tmp_path / "b.bvecs", np.array([[-1, 3]]))
    with pytest.raises(ValueError, match=r"expected a 2-D array \[n, d\], got shape \(5,\)"):
        write_fvecs(tmp_path / "b.fvecs", x[0])
    with pytest.raises(ValueError, match="cannot hold an empty set"):
        write_fvecs(tmp_path / "b.fvecs", x[:0])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.fvecs", "i.ivecs", "t.fvecs"]


def test_failed_write_keeps_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "x.fvecs"
    old = rng.standard_normal((3, 2), np.float32)
    write_fvecs(path, old)

    def crash(*args):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", crash)
    with pytest.raises(OSError, match="disk full"):
        write_fvecs(path, rng.standard_normal((50, 2), np.float32))
    np.testing.assert_array_equal(read_fvecs(path), old)
    assert [p.name for p in tmp_path.iterdir()] == ["x.fvecs"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "empty file"),
        (b"\x03\x00", "2 bytes is too short"),
        (_record("fvecs", [1.0, 2.0]) + _record("fvecs", [1.0, 2.0])[:-1], "not a multiple"),
        (struct.pack("<i", 0) * 4, "first dimension header is 0, expected a positive dim"),
        (struct.pack("<if", -1, 1.0), "first dimension header is -1"),
        # dims 2, 1, 3: 36 bytes, a whole number of 12-byte records
        (
            _record("fvecs", [1, 2]) + _record("fvecs", [1]) + _record("fvecs", [1, 2, 3]),
            r"the last row has dimension header \d+, row 0 has 2",
        ),
        # a corrupt header in the middle
        (
            _record("fvecs", [1, 2]) + struct.pack("<iff", 5, 1, 2) + _record("fvecs", [3, 4]),
            "row 1 has dimension header 5, row 0 has 2",
        ),
    ],
)
def test_bad_files(tmp_path, content, message):
    path = tmp_path / "bad.fvecs"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=message):
        read_fvecs(path)


def test_bad_rows(tmp_path):
    path = tmp_path / "x.ivecs"
    write_ivecs(path, np.arange(20, dtype=np.int32).reshape(10, 2))
    with pytest.raises(ValueError, match="asks for the first 11 of 10 rows"):
        read_ivecs(path, rows=11)
    with pytest.raises(ValueError, match="asks for the first -1 of 10 rows"):
        read_ivecs(path, rows=-1)
    with pytest.raises(ValueError, match=r"out of range .* got start 5, stop 12"):
        read_ivecs(path, rows=slice(5, 12))
    with pytest.raises(ValueError, match="got start 6, stop 4"):
        read_ivecs(path, rows=slice(6, 4))
    with pytest.raises(ValueError, match="got start -1"):
        read_ivecs(path, rows=slice(-11, None))
    with pytest.raises(ValueError, match="contiguous slice"):
        read_ivecs(path, rows=slice(0, 10, 2))
    with pytest.raises(TypeError, match=r"slice\(start, stop\), got tuple"):
        read_ivecs(path, rows=(2, 4))
    with pytest.raises(TypeError, match="slice ends must be ints"):
        read_ivecs(path, rows=slice(1.0, 4))
    with pytest.raises(ValueError, match="cannot tell the format"):
        vecs_shape(tmp_path / "x.npy")


# -- ann-benchmarks HDF5 -------------------------------------------------------------------------


def test_ann_hdf5(tmp_path):
    h5py = pytest.importorskip("h5py")
    train = rng.standard_normal((50, 8), np.float32)
    test = rng.standard_normal((6, 8), np.float32)
    path = tmp_path / "toy-8-euclidean.hdf5"
    with h5py.File(path, "w") as f:
        f.attrs["distance"] = "euclidean"
        f.create_dataset("train", data=train)
        f.create_dataset("test", data=test)
        f.create_dataset("neighbors", data=np.arange(18, dtype=np.int32).reshape(6, 3))
        f.create_dataset("distances", data=np.ones((6, 3), np.float32))
    data = read_ann_hdf5(str(path))
    np.testing.assert_array_equal(data.train, train)
    np.testing.assert_array_equal(data.test, test)
    np.testing.assert_array_equal(data.neighbors, np.arange(18).reshape(6, 3))
    assert data.neighbors.dtype == np.int64 and data.distances.dtype == np.float32
    assert data.distance == "euclidean"

    with h5py.File(path, "a") as f:
        del f.attrs["distance"]
        del f["neighbors"]
    with pytest.raises(ValueError, match=r"no dataset 'neighbors' \(the file has: distances, t"):
        read_ann_hdf5(path)
    with h5py.File(path, "a") as f:
        f.create_dataset("neighbors", data=np.zeros((5, 3), np.int32))
    with pytest.raises(ValueError, match=r"expected neighbors and distances of shape \[6, k\]"):
        read_ann_hdf5(path)
    with h5py.File(path, "a") as f:
        del f["neighbors"]
        f.create_dataset("neighbors", data=np.zeros((6, 3), np.int32))
    assert read_ann_hdf5(path).distance is None


# -- exact ground truth --------------------------------------------------------------------------


def _flat_search(metric, xb, xq, k):
    faiss = pytest.importorskip("faiss")
    index = faiss.IndexFlatL2(xb.shape[1]) if metric == "l2" else faiss.IndexFlatIP(xb.shape[1])
    index.add(xb)
    return index.search(xq, k)


@pytest.mark.parametrize("metric", ["l2", "ip"])
@pytest.mark.parametrize(
    ("batch_size", "db_batch_size"), [(1024, 16384), (7, 97)]
)  # one block; blocks split both ways, with ragged ends
def test_ground_truth_matches_faiss(blobs, metric, batch_size, db_batch_size):
    xb, xq = blobs[:2000], blobs[-100:]
    want_d, want_i = _flat_search(metric, xb, xq, 10)
    d, i = ground_truth(xb, xq, 10, metric, batch_size=batch_size, db_batch_size=db_batch_size)
    assert d.dtype == np.float32 and i.dtype == np.int64 and i.shape == (100, 10)
    np.testing.assert_array_equal(i, want_i)
    np.testing.assert_allclose(d, want_d, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_ground_truth_pads_like_faiss(metric):
    xb = rng.standard_normal((5, 4), np.float32)
    xq = rng.standard_normal((3, 4), np.float32)
    want_d, want_i = _flat_search(metric, xb, xq, 8)
    d, i = ground_truth(torch.from_numpy(xb), torch.from_numpy(xq), 8, metric, db_batch_size=2)
    np.testing.assert_array_equal(i, want_i)
    assert (i[:, 5:] == -1).all() and (d[:, 5:] == (np.inf if metric == "l2" else -np.inf)).all()
    np.testing.assert_allclose(d[:, :5], want_d[:, :5], rtol=1e-4, atol=1e-5)


def test_ground_truth_ties_go_to_the_lower_id():
    # rows 0, 2, 4, 6, ... are copies of one vector, rows 1, 3, ... of another
    xb = np.tile(np.array([[1.0, 0.0], [0.0, 3.0]], np.float32), (6, 1))
    xq = np.array([[1.0, 0.0], [0.0, 3.0]], np.float32)
    for db_batch_size in (12, 5, 1):
        d, i = ground_truth(xb, xq, 4, db_batch_size=db_batch_size)
        np.testing.assert_array_equal(i, [[0, 2, 4, 6], [1, 3, 5, 7]])
        np.testing.assert_array_equal(d, np.zeros((2, 4)))
        _, i = ground_truth(xb, xq, 8, "ip", db_batch_size=db_batch_size)
        np.testing.assert_array_equal(i, [[0, 2, 4, 6, 8, 10, 1, 3], [1, 3, 5, 7, 9, 11, 0, 2]])


def test_ground_truth_takes_bytes_and_halves_without_copying_them_first():
    xb = rng.integers(0, 256, (300, 16), np.uint8)  # .bvecs data, e.g. SIFT1B
    xq = rng.integers(0, 256, (20, 16), np.uint8)
    want = ground_truth(xb.astype(np.float32), xq.astype(np.float32), 5)
    got = ground_truth(xb, xq, 5, db_batch_size=64)
    np.testing.assert_array_equal(got.ids, want.ids)
    np.testing.assert_array_equal(got.distances, want.distances)
    half = torch.from_numpy(xb).half()
    np.testing.assert_array_equal(
        ground_truth(half, half[:20], 5).ids, ground_truth(xb, xb[:20], 5).ids
    )


def test_ground_truth_checks_arguments(blobs):
    with pytest.raises(ValueError, match="xq: expected vectors of dim 32, got 16"):
        ground_truth(blobs, blobs[:5, :16], 3)
    with pytest.raises(ValueError, match='metric must be "l2" or "ip", got \'cosine\''):
        ground_truth(blobs, blobs[:5], 3, metric="cosine")
    with pytest.raises(ValueError, match="k must be a positive integer, got 0"):
        ground_truth(blobs, blobs[:5], 0)
    with pytest.raises(TypeError, match="xb: expected floating-point vectors"):
        ground_truth(blobs.astype(np.int32), blobs[:5], 3)


def test_recall_at_counts_true_neighbours_among_the_first_r():
    from vq.datasets import recall_at

    truth = np.array([[1, 2, 3, 4], [5, 6, 7, 8]])
    found = np.array([[2, 1, 9, 4], [-1, -1, 5, -1]])  # order within the first r is free
    assert recall_at(found, truth, 1) == 0.0
    assert recall_at(found, truth, 2) == 0.5  # row 0: {2, 1} = {1, 2}; row 1: nothing
    assert recall_at(found, truth, 4) == (3 / 4 + 1 / 4) / 2  # -1 never counts
    with pytest.raises(ValueError, match="r must lie in"):
        recall_at(found, truth, 5)
    with pytest.raises(ValueError, match="same nq"):
        recall_at(found[:1], truth, 1)


# -- big-ann-benchmarks .fbin / .u8bin / .i8bin / .ibin ------------------------------------------

BINS = {
    "fbin": ("<f4", lambda n, d: rng.standard_normal((n, d), np.float32)),
    "u8bin": ("u1", lambda n, d: rng.integers(0, 256, (n, d), np.uint8)),
    "i8bin": ("i1", lambda n, d: rng.integers(-128, 128, (n, d), np.int8)),
    "ibin": ("<i4", lambda n, d: rng.integers(-(2**31), 2**31, (n, d), np.int32)),
}


def _bin_bytes(x: np.ndarray, dtype: str) -> bytes:
    """The big-ann-benchmarks layout, written by hand: int32 n, int32 dim, the values."""
    return struct.pack("<ii", *x.shape) + x.astype(dtype).tobytes()


@pytest.mark.parametrize("fmt", BINS)
def test_bin_files_read_the_big_ann_layout_and_write_it_back(tmp_path, fmt):
    from vq.datasets import bigann, bin_shape

    dtype, make = BINS[fmt]
    x = make(23, 5)
    path = tmp_path / f"hand.{fmt}"
    path.write_bytes(_bin_bytes(x, dtype))
    read = getattr(bigann, f"read_{fmt}")
    y = read(path)
    assert y.dtype == np.dtype(dtype).newbyteorder("=") and y.flags.writeable
    assert not isinstance(y, np.memmap)
    np.testing.assert_array_equal(y, x)
    np.testing.assert_array_equal(read(path, rows=slice(4, 9)), x[4:9])
    np.testing.assert_array_equal(read(path, rows=3), x[:3])
    assert bin_shape(path) == (23, 5)
    getattr(bigann, f"write_{fmt}")(tmp_path / f"out.{fmt}", x)
    assert (tmp_path / f"out.{fmt}").read_bytes() == path.read_bytes()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\x01\x00", "2 bytes is too short for a .fbin file"),
        (struct.pack("<ii", 3, 2) + bytes(20), r"28 bytes, but the header says 3 x 2 values, 32 "
         r"bytes in all: the file is truncated"),
        (struct.pack("<ii", 1, 2) + bytes(12), "the file is 4 bytes too long"),
        (struct.pack("<ii", -1, 2), "the header says n=-1, dim=2"),
        (struct.pack("<ii", 2, 0), "the header says n=2, dim=0"),
    ],
)  # fmt: skip
def test_bad_bin_files(tmp_path, content, message):
    from vq.datasets import read_fbin

    path = tmp_path / "bad.fbin"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=message):
        read_fbin(path)


def test_an_ibin_ground_truth_file_with_distances_reads_as_its_ids(tmp_path):
    from vq.datasets import read_ibin, read_neighbors

    ids = rng.integers(0, 1000, (4, 3), np.int32)
    path = tmp_path / "gt.ibin"  # big-ann-benchmarks' ground truth: ids, then distances
    path.write_bytes(_bin_bytes(ids, "<i4") + np.ones((4, 3), "<f4").tobytes())
    np.testing.assert_array_equal(read_ibin(path), ids)
    truth = read_neighbors(path)
    assert truth.dtype == np.int64
    np.testing.assert_array_equal(truth, ids)


def test_bin_writers_check_dtypes_and_ranges(tmp_path):
    from vq.datasets import write_fbin, write_ibin, write_u8bin

    with pytest.raises(TypeError, match="write_fbin: expected floating-point values, got int64"):
        write_fbin(tmp_path / "x.fbin", np.zeros((2, 2), np.int64))
    with pytest.raises(ValueError, match=r"write_u8bin: values must lie in \[0, 255\]"):
        write_u8bin(tmp_path / "x.u8bin", np.array([[256]]))
    with pytest.raises(ValueError, match=r"expected a 2-D array \[n, dim\]"):
        write_ibin(tmp_path / "x.ibin", np.zeros(3, np.int32))
    assert list(tmp_path.iterdir()) == []


# -- one reader for every format -----------------------------------------------------------------


def _every_format(tmp_path, x: np.ndarray) -> dict[str, object]:
    """``x`` (small non-negative integers, exact in every dtype) in each vector format."""
    h5py = pytest.importorskip("h5py")
    from vq.datasets import write_fbin, write_i8bin, write_u8bin

    paths = {}
    for suffix, write in (
        ("fvecs", write_fvecs),
        ("bvecs", lambda p, a: write_bvecs(p, a.astype(np.uint8))),
        ("fbin", write_fbin),
        ("u8bin", lambda p, a: write_u8bin(p, a.astype(np.uint8))),
        ("i8bin", lambda p, a: write_i8bin(p, a.astype(np.int8))),
    ):
        paths[suffix] = tmp_path / f"x.{suffix}"
        write(paths[suffix], x)
    for dtype in ("float64", "float16", "int16", "uint8"):
        paths[f"npy {dtype}"] = tmp_path / f"x-{dtype}.npy"
        np.save(paths[f"npy {dtype}"], x.astype(dtype))
    paths["npy fortran"] = tmp_path / "x-f.npy"
    np.save(paths["npy fortran"], np.asfortranarray(x))
    paths["hdf5"] = tmp_path / "x.hdf5"
    with h5py.File(paths["hdf5"], "w") as f:
        f.attrs["distance"] = "euclidean"
        for key in ("train", "test"):
            f.create_dataset(key, data=x)
        f.create_dataset("neighbors", data=np.zeros((len(x), 2), np.int32))
        f.create_dataset("distances", data=np.zeros((len(x), 2), np.float32))
    return paths


def test_open_vectors_reads_every_format_as_float32_rows(tmp_path, monkeypatch):
    from vq.datasets import open_vectors, read_vectors, vector_files

    x = rng.integers(0, 100, (50, 6)).astype(np.float32)
    monkeypatch.setattr(vector_files, "_CHUNK_BYTES", 7 * 6 * 4)  # 7 rows a block: 8 blocks
    for name, path in _every_format(tmp_path, x).items():
        source = open_vectors(path)
        assert source.shape == (50, 6), name
        assert source.metric == ("l2" if name == "hdf5" else None), name
        y = source.read()
        assert y.dtype == np.float32 and y.flags.c_contiguous and y.flags.writeable, name
        np.testing.assert_array_equal(y, x, err_msg=name)
        np.testing.assert_array_equal(source.read(slice(9, 30)), x[9:30], err_msg=name)
        np.testing.assert_array_equal(read_vectors(path, rows=4), x[:4], err_msg=name)
    assert open_vectors(tmp_path / "x.hdf5", "test").dataset == "test"


def test_a_bad_header_in_a_later_block_of_an_fvecs_file_is_found(tmp_path, monkeypatch):
    from vq.datasets import open_vectors, vector_files

    rows = [_record("fvecs", [float(i), 1.0]) for i in range(10)]
    rows[6] = struct.pack("<iff", 3, 0.0, 0.0)  # same record size, wrong dimension header
    path = tmp_path / "x.fvecs"
    path.write_bytes(b"".join(rows))
    monkeypatch.setattr(vector_files, "_CHUNK_BYTES", 2 * 2 * 4)  # blocks of 2 rows
    source = open_vectors(path)
    np.testing.assert_array_equal(source.read(slice(0, 6))[:, 0], np.arange(6))
    with pytest.raises(ValueError, match="row 6 has dimension header 3, row 0 has 2"):
        source.read()


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("x.txt", b"1 2 3", r"unknown vector file type '.txt'; use .fvecs, .bvecs, .npy, .fbin"),
        ("x.npy", None, "holds bool values; expected real numbers"),
        ("x.npy", np.zeros((2, 3), np.complex64), "holds complex64 values"),
        ("x.npy", np.zeros(5, np.float32), r"expected a 2-D array \[n, dim\], got shape \(5,\)"),
        ("x.npy", np.zeros((2, 3, 4), np.float32), r"got shape \(2, 3, 4\)"),
        ("x.npy", np.array([[None]], dtype=object), "not a readable .npy array"),
        ("x.npy", b"not an array", "not a readable .npy array"),
        ("x.hdf5", b"not hdf5 at all", "not a readable HDF5 file"),
    ],
)
def test_open_vectors_refuses_what_it_cannot_read(tmp_path, name, content, message):
    from vq.datasets import open_vectors

    path = tmp_path / name
    if content is None:
        np.save(path, np.zeros((2, 3), bool))
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        np.save(path, content, allow_pickle=True)
    if name.endswith(".hdf5"):
        pytest.importorskip("h5py")
    with pytest.raises(ValueError, match=message):
        open_vectors(path)


def test_open_vectors_names_a_missing_file_and_a_directory(tmp_path):
    from vq.datasets import open_neighbors, open_vectors

    with pytest.raises(FileNotFoundError, match="nope.fbin: no such file"):
        open_vectors(tmp_path / "nope.fbin")
    (tmp_path / "d.fvecs").mkdir()
    with pytest.raises(ValueError, match="d.fvecs is a directory; give a vector file"):
        open_vectors(tmp_path / "d.fvecs")
    with pytest.raises(ValueError, match="is a directory; give a ground-truth file"):
        open_neighbors(tmp_path)
    np.save(tmp_path / "f.npy", np.zeros((2, 2), np.float32))
    with pytest.raises(ValueError, match="holds float32 values; expected integer ids"):
        open_neighbors(tmp_path / "f.npy")
    with pytest.raises(ValueError, match="unknown ground-truth file type '.fvecs'"):
        open_neighbors(tmp_path / "x.fvecs")


def test_read_neighbors_reads_every_ground_truth_format_as_int64(tmp_path):
    h5py = pytest.importorskip("h5py")
    from vq.datasets import read_neighbors, write_ibin

    ids = rng.integers(0, 10_000, (7, 4)).astype(np.int32)
    write_ivecs(tmp_path / "gt.ivecs", ids)
    write_ibin(tmp_path / "gt.ibin", ids)
    np.save(tmp_path / "gt.npy", ids.astype(np.int64))
    with h5py.File(tmp_path / "gt.hdf5", "w") as f:
        for key, data in (("train", np.zeros((3, 2))), ("test", np.zeros((7, 2)))):
            f.create_dataset(key, data=data)
        f.create_dataset("neighbors", data=ids)
        f.create_dataset("distances", data=np.zeros((7, 4)))
    for name in ("gt.ivecs", "gt.ibin", "gt.npy", "gt.hdf5"):
        truth = read_neighbors(tmp_path / name)
        assert truth.dtype == np.int64, name
        np.testing.assert_array_equal(truth, ids, err_msg=name)
        np.testing.assert_array_equal(read_neighbors(tmp_path / name, slice(2, 5)), ids[2:5])


# -- ann-benchmarks distances -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("distance", "metric"),
    [("euclidean", "l2"), ("angular", "cosine"), ("dot", "ip"), ("ip", "ip"), (None, None)],
)
def test_the_distance_attribute_becomes_the_metric(tmp_path, distance, metric):
    h5py = pytest.importorskip("h5py")
    from vq.datasets import ann_metric, open_vectors

    path = tmp_path / "x.hdf5"
    with h5py.File(path, "w") as f:
        if distance is not None:
            f.attrs["distance"] = np.bytes_(distance)  # ann-benchmarks writes bytes or str
        for key in ("train", "test", "neighbors", "distances"):
            f.create_dataset(key, data=np.zeros((4, 2), np.float32))
    assert ann_metric(distance) == metric
    assert read_ann_hdf5(path).metric == metric
    assert open_vectors(path, "test").metric == metric


@pytest.mark.parametrize("distance", ["jaccard", "hamming", "manhattan"])
def test_distances_without_a_vq_metric_are_refused(tmp_path, distance):
    h5py = pytest.importorskip("h5py")
    from vq.datasets import open_vectors

    path = tmp_path / f"x-{distance}.hdf5"
    with h5py.File(path, "w") as f:
        f.attrs["distance"] = distance
        for key in ("train", "test", "neighbors", "distances"):
            f.create_dataset(key, data=np.zeros((4, 2), np.float32))
    message = (
        "unknown distance attribute 'manhattan'"
        if distance == "manhattan"
        else f"distance='{distance}': its vectors are .*, which no vq index searches"
    )
    with pytest.raises(ValueError, match=message):
        read_ann_hdf5(path)
    with pytest.raises(ValueError, match=message):
        open_vectors(path)
