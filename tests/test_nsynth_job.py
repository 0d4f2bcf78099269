"""The main job end to end, at a tiny size."""

import pytest

pytest.importorskip("faiss")
pytest.importorskip("torchaudio")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """One synthetic set (and embedding cache) for the module's runs."""
    return tmp_path_factory.mktemp("nsynth-job")


def test_main_job_runs_end_to_end(data_dir, capsys):
    from vq.apps import nsynth

    # one thread: the test workers already fill the cores (faiss's OpenMP teams would spin)
    args = ["--data-dir", str(data_dir), "--instruments", "33", "--quiet", "--nprobe", "4"]
    args += ["--threads", "1"]
    assert nsynth.main(args) == 0
    out = capsys.readouterr().out
    assert "330 database notes, 30 queries" in out
    for desc in ("Flat", "PQ16x5", "IVF8,PQ16x5", "OPQ16,IVF8,PQ16x5"):  # 5 bits for 330 notes
        assert f"| {desc} | vq |" in out and f"| {desc} | faiss |" in out
    assert "| Flat | vq | 1.0000 | 1.0000 | 1.0000 |" in out  # exact search is exact
    assert "FAIL" not in out and out.rstrip().endswith("all checks passed")
    # the data set and its embeddings are reused, not rebuilt
    built = sorted(p.name for p in data_dir.rglob("*") if p.is_file())
    assert any(name.endswith(".safetensors") for name in built)
    assert nsynth.main([*args, "--skip-validation"]) == 0
    assert sorted(p.name for p in data_dir.rglob("*") if p.is_file()) == built


def test_missing_real_dataset_is_a_one_line_error(tmp_path, capsys):
    from vq.apps import nsynth

    assert nsynth.main(["--nsynth-root", str(tmp_path / "nowhere"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "examples.json" in err and err.count("\n") == 1


def test_console_command(capsys):
    from vq.apps import cli

    assert cli.main(["--help"]) == 0
    assert "nsynth" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["nsynth", "--instruments", "3"])
    assert exit_info.value.code == 2
    assert "--instruments must be at least 11" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["frobnicate"])
    assert "invalid choice: 'frobnicate'" in capsys.readouterr().err


def test_max_notes_embeds_only_a_sample(data_dir, capsys):
    from vq.apps import nsynth

    args = ["--data-dir", str(data_dir), "--instruments", "33", "--quiet", "--skip-validation"]
    args += ["--threads", "1"]
    assert nsynth.main([*args, "--max-notes", "300"]) == 0
    assert "300 database notes, 30 queries" in capsys.readouterr().out
