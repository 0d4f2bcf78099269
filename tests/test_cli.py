"""The ``vq`` console command through its entry point: build → search → recall, and errors."""

import re

import numpy as np
import pytest

from vq import cli
from vq.datasets import anisotropic_vectors, ground_truth, read_ivecs, write_fvecs, write_ivecs


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
        (["build", "--data", "{d}/base.fvecs", "--index", "HNSW32", "-o", "{d}/x.vq"], "supported"),
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
