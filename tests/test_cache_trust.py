"""The kernel cache is trusted only when nobody but its user can write it (vq.kernels.jit.trust):
a pickle planted where others can write never runs, a changed specialised source is never
imported, and an entry that cannot be read is compiled again (never an error)."""

import json
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

_TOY = textwrap.dedent(
    """
    from vq.kernels.jit.cache import kernel

    @kernel(nogil=True)
    def add_one(x):
        for i in range(x.shape[0]):
            x[i] += 1.0
    """
)
_RUN_TOY = textwrap.dedent(
    """
    import json, warnings
    warnings.simplefilter("always")
    import numpy as np
    from vq.kernels.jit import cache
    import toy_kernels
    x = np.zeros(3)
    toy_kernels.add_one(x)
    print(json.dumps({"x": x.tolist(), "folder": str(cache.folder()), "loads": cache.loads()}))
    """
)


class _Planted:
    """Unpickling this creates the folder ``marker``: proof that a planted pickle ran."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (str(self.marker),))


def _run(code: str, tmp_path: Path, cache: Path) -> tuple[dict, str]:
    (tmp_path / "toy_kernels.py").write_text(_TOY)
    run = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={
            **os.environ,
            "XDG_CACHE_HOME": str(cache),
            "NUMBA_CACHE_DIR": "",
            "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
        },
    )
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1]), run.stderr


def _toy_entry(tmp_path: Path, cache: Path, suffix: str) -> Path:
    """Compile the toy kernel into ``cache``; its index (.nbi) or data (.nbc) file."""
    report, _ = _run(_RUN_TOY, tmp_path, cache)
    (found,) = Path(report["folder"]).rglob(f"toy_kernels*{suffix}")
    return found


def test_a_planted_pickle_in_a_cache_others_can_write_never_runs(tmp_path):
    cache = tmp_path / "cache"
    entry = _toy_entry(tmp_path, cache, ".nbi")
    marker = tmp_path / "planted-pickle-ran"
    entry.write_bytes(pickle.dumps(_Planted(marker)))
    for shared, mode in ((cache / "vq", 0o777), (cache, 0o777)):
        os.chmod(shared, mode)
        report, stderr = _run(_RUN_TOY, tmp_path, cache)
        assert not marker.exists()
        assert report["folder"] == "None" and report["x"] == [1.0] * 3
        assert "not using the kernel cache" in stderr and "writable by other users" in stderr
        os.chmod(shared, 0o700)


def test_a_cache_under_a_sticky_shared_folder_is_used_and_made_private(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)  # as /tmp
    report, stderr = _run(_RUN_TOY, tmp_path, shared)
    assert report["folder"] != "None", stderr
    assert (shared / "vq").stat().st_mode & 0o777 == 0o700
    assert Path(report["folder"]).stat().st_mode & 0o777 == 0o700


def test_a_garbage_entry_is_compiled_again_and_replaced(tmp_path):
    cache = tmp_path / "cache"
    for suffix in (".nbi", ".nbc"):
        entry = _toy_entry(tmp_path, cache, suffix)
        entry.write_bytes(b"\x80\x05garbage, not a pickle" * 3)
        report, stderr = _run(_RUN_TOY, tmp_path, cache)
        assert report["x"] == [1.0] * 3 and report["loads"] == 0  # compiled again
        assert "holds an entry that cannot be read" in stderr and str(cache) in stderr
        report, stderr = _run(_RUN_TOY, tmp_path, cache)
        assert report["loads"] == 1 and "cannot be read" not in stderr  # replaced


def test_a_changed_specialised_source_is_written_again_before_it_is_imported(tmp_path):
    cache = tmp_path / "cache"
    code = textwrap.dedent(
        """
        import json
        from vq.kernels.jit import cache
        module = cache.specialise("vq.kernels.fastscan.fastscan_flat_template", DSUB=4,
        ISA="portable",
                                  N_PAIRS=2, N_QUERIES=1)
        print(json.dumps({"file": module.__file__, "folder": str(cache.folder())}))
        """
    )
    report, _ = _run(code, tmp_path, cache)
    source = Path(report["file"])
    original = source.read_bytes()
    marker = tmp_path / "planted-source-ran"
    source.write_text(f"import os\nos.mkdir({str(marker)!r})\n")
    again, _ = _run(code, tmp_path, cache)
    assert again["file"] == report["file"]
    assert not marker.exists()
    assert source.read_bytes() == original
