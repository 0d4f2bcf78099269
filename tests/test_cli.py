"""The ``vq`` console command through its entry point: build → search → recall, and errors."""

import re

import numpy as np
import pytest

import vq
from vq.apps import cli
from vq.datasets import (
    anisotropic_vectors,
    ground_truth,
    read_fvecs,
    read_ivecs,
    write_fvecs,
    write_ivecs,
)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    x = anisotropic_vectors(3000, 32, decay=0.9, seed=0)
    q = anisotropic_vectors(60, 32, decay=0.9, seed=1)
    write_fvecs(d / "base.fvecs", x)
    write_fvecs(d / "queries.fvecs", q)
    write_ivecs(d / "gt.ivecs", ground_truth(x, q, 10)[1])
    return d


def run(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_build_then_search_reports_recall(files, capsys):
    code, out, _ = run(
        capsys,
        "build",
        "--data",
        files / "base.fvecs",
        "--index",
        "IVF16,PQ8,RFlat",
        "-o",
        files / "index.vq",
        "--nprobe",
        "4",
        "--k-factor",
        "8",
        "--quiet",
    )
    assert code == 0 and "IVF16,PQ8,RFlat: 3000 vectors of dim 32" in out
    code, out, _ = run(
        capsys,
        "search",
        files / "index.vq",
        "--queries",
        files / "queries.fvecs",
        "-k",
        "10",
        "--gt",
        files / "gt.ivecs",
        "--out",
        files / "found.ivecs",
    )
    assert code == 0 and out.startswith("60 queries, k=10")
    recall = dict(re.findall(r"recall@(\d+) ([0-9.]+)", out))
    assert set(recall) == {"1", "10"}
    found = read_ivecs(files / "found.ivecs")
    truth = read_ivecs(files / "gt.ivecs")
    exact10 = np.mean([np.intersect1d(f, t).size / 10 for f, t in zip(found, truth, strict=True)])
    assert float(recall["10"]) == pytest.approx(exact10, abs=1e-4) and exact10 > 0.7
    # the stored nprobe and k_factor are overridable per search: more of both, no less recall
    code, out2, _ = run(
        capsys,
        "search",
        files / "index.vq",
        "--queries",
        files / "queries.fvecs",
        "-k",
        "10",
        "--gt",
        files / "gt.ivecs",
        "--nprobe",
        "16",
        "--k-factor",
        "32",
    )
    assert float(re.search(r"recall@10 ([0-9.]+)", out2)[1]) >= float(recall["10"])


@pytest.mark.parametrize(
    "argv, message",
    [
        (["build", "--data", "{d}/nope.fvecs", "--index", "Flat", "-o", "{d}/x.vq"], "nope.fvecs"),
        (
            ["build", "--data", "{d}/base.txt", "--index", "Flat", "-o", "{d}/x.vq"],
            "unknown vector",
        ),
        (["build", "--data", "{d}/base.fvecs", "--index", "LSH", "-o", "{d}/x.vq"], "supported"),
        (
            [
                "build",
                "--data",
                "{d}/base.fvecs",
                "--index",
                "Flat",
                "-o",
                "{d}/x.vq",
                "--nprobe",
                "4",
            ],
            "--nprobe does not apply to FlatIndex",
        ),
        (["search", "{d}/missing.vq", "--queries", "{d}/queries.fvecs"], "no index file"),
        (["search", "{d}/queries.fvecs", "--queries", "{d}/queries.fvecs"], "not a vq index"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(files, capsys, argv, message):
    (files / "base.txt").write_text("1 2 3\n")
    code, _, err = run(capsys, *[a.format(d=files) for a in argv])
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1 and message in err


def test_help_and_unknown_commands(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(c in out for c in ("build", "search", "nsynth", "bench"))
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["build", "--help"])
    assert exit_info.value.code == 0 and "--train-size" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.main(["frobnicate"])
    assert "invalid choice" in capsys.readouterr().err


# -- vq export ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def exported_model(files):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    import vq
    from vq.datasets import read_fvecs

    index = vq.index_factory(32, "IVF16,PQ8")
    x = read_fvecs(files / "base.fvecs")
    index.train(x)
    index.add(x)
    index.save(files / "export.vq")
    return files / "export.vq"


def test_export_checks_and_audits(files, exported_model, capsys):
    onnx_path = files / "export.onnx"
    code, out, err = run(
        capsys,
        "export",
        exported_model,
        "-o",
        onnx_path,
        "--batch-size",
        "8",
        "-k",
        "5",
        "--nprobe",
        "4",
        "--check",
        files / "queries.fvecs",
    )
    assert code == 0, err
    assert "IVFPQ, 3000 vectors; queries: float32[8, 32] -> distances: float32[8, 5]" in out
    assert "audit: static" in out
    check = re.search(
        r"check: 60 queries.*identical ids ([0-9.]+), differences not explained "
        r"by ties (\d+), max \|distance difference\| (\S+)",
        out,
    )
    assert check and float(check[1]) > 0.9 and check[2] == "0" and float(check[3]) < 1e-3
    code, out, _ = run(capsys, "export", "--audit", onnx_path)
    assert code == 0 and "static: every shape is fixed" in out and "TopK" in out
    dynamic = files / "dynamic.onnx"
    code, _, err = run(
        capsys, "export", exported_model, "-o", dynamic, "--dynamic-batch", "--code-dtype", "int32"
    )
    assert code == 0, err
    code, out, _ = run(capsys, "export", "--audit", onnx_path, dynamic)
    assert code == 1 and "queries: [batch, 32]" in out  # one model is not static: exit 1


def test_export_filtered_search_checks_with_a_mask(exported_model, files, capsys):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    path = files / "filtered.onnx"
    argv = [exported_model, "-o", path, "--batch-size", "8", "-k", "5", "--nprobe", "4"]
    code, out, err = run(capsys, "export", *argv, "--filtered", "--check", files / "queries.fvecs")
    assert code == 0, err
    assert "queries: float32[8, 32], allowed: bool[3000] -> distances" in out
    check = re.search(r"identical ids ([0-9.]+), differences not explained by ties (\d+)", out)
    assert check and float(check[1]) > 0.9 and check[2] == "0"


def test_export_reads_faiss_index_files(files, capsys):
    faiss = pytest.importorskip("faiss")
    pytest.importorskip("onnxscript")
    from vq.datasets import read_fvecs

    findex = faiss.IndexFlatIP(32)
    findex.add(read_fvecs(files / "base.fvecs")[:500])
    faiss.write_index(findex, str(files / "flat.faiss"))
    code, out, err = run(
        capsys, "export", files / "flat.faiss", "-o", files / "flat.onnx", "-k", "3"
    )
    assert code == 0, err
    assert "FlatIndex, 500 vectors; queries: float32[1, 32] -> distances: float32[1, 3]" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["export", "{d}/missing.vq", "-o", "{d}/x.onnx"], "no index file"),
        (["export", "{d}/queries.fvecs", "-o", "{d}/x.onnx"], "neither a vq index nor a faiss"),
        (["export", "--audit", "{d}/queries.fvecs"], "not an ONNX model"),
        (["export", "{d}/export.vq", "-o", "{d}/x.onnx", "--batch-size", "0"], "batch_size must"),
        (["export", "{d}/export.vq", "-o", "{d}/x.onnx", "--k-factor", "2"], "k_factor applies"),
    ],
)
def test_export_bad_input_is_one_line_and_exit_2(files, exported_model, capsys, argv, message):
    pytest.importorskip("faiss")
    code, _, err = run(capsys, *[a.format(d=files) for a in argv])
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1 and message in err


def test_search_with_a_radius_runs_a_range_search_on_a_mapped_index(files, capsys):
    code, _, _ = run(
        capsys, "build", "--data", files / "base.fvecs", "--index", "IVF16,PQ8",
        "-o", files / "range.vq", "--quiet",
    )  # fmt: skip
    assert code == 0
    index = vq.load_index(files / "range.vq")
    q = read_fvecs(files / "queries.fvecs")
    radius = float(np.median(index.search(q, 5, nprobe=4)[0][:, -1]))
    code, out, _ = run(
        capsys, "search", files / "range.vq", "--queries", files / "queries.fvecs",
        "--radius", radius, "--nprobe", 4, "--mmap", "--out", files / "hits.npz",
    )  # fmt: skip
    lims, D, I = index.range_search(q, radius, nprobe=4)
    assert code == 0 and out.startswith(f"60 queries, radius {radius:g}")
    assert f"{int(lims[-1])} results" in out
    saved = np.load(files / "hits.npz")
    np.testing.assert_array_equal(saved["lims"], lims)
    np.testing.assert_array_equal(saved["I"], I)
    code, _, err = run(
        capsys, "search", files / "range.vq", "--queries", files / "queries.fvecs",
        "--radius", radius, "--gt", files / "gt.ivecs",
    )  # fmt: skip
    assert code != 0 and "does not apply to --radius" in err


def test_warmup_of_saved_indexes_and_build_without_warm_up(files, capsys, monkeypatch):
    warmed = []
    monkeypatch.setattr(vq.index.Index, "warm_up", lambda self, k=None: warmed.append(self) or 3)
    code, out, _ = run(
        capsys, "build", "--data", files / "base.fvecs", "--index", "IVF16,Flat",
        "-o", files / "warm.vq", "--quiet",
    )  # fmt: skip
    assert code == 0 and len(warmed) == 1  # build readies the search kernels
    assert "search kernels: 3 compiled" in out
    code, _, _ = run(
        capsys, "build", "--data", files / "base.fvecs", "--index", "IVF16,Flat",
        "-o", files / "cold.vq", "--quiet", "--no-warm-up",
    )  # fmt: skip
    assert code == 0 and len(warmed) == 1
    code, out, _ = run(capsys, "warmup", "--saved", files / "warm.vq", "--saved", files / "cold.vq")
    lines = out.strip().splitlines()
    assert code == 0 and len(warmed) == 3 and all(type(i).__name__ == "IVFFlat" for i in warmed)
    assert lines[0].startswith(f"{files / 'warm.vq'} (IVFFlat)")
    assert "3 kernels compiled" in lines[0]
    assert lines[-1].startswith("warm-up of 2 saved indexes: ")
    code, _, err = run(capsys, "warmup", "--saved", files / "nowhere.vq")
    assert code == 2 and err.startswith("error: ") and "nowhere.vq" in err
