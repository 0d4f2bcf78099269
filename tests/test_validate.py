import pytest

pytest.importorskip("faiss")


def test_main_job_passes_on_small_data(capsys):
    from vq.apps import validate

    # one thread: faiss's OpenMP teams spin against the other test worker's on 2 cores
    assert validate.main(["--n", "20000", "--dim", "16", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "| PQ2 codes, faiss codebooks |" in out
    assert "| IVF256,PQ2 top-10, faiss index imported | 1 |" in out
    assert "FAIL" not in out
    assert out.rstrip().endswith("13 passed, 0 failed")


def test_main_job_rejects_bad_arguments(capsys):
    from vq.apps import validate

    with pytest.raises(SystemExit):
        validate.main(["--dim", "12"])
    assert "--dim must be a positive multiple of 8" in capsys.readouterr().err
