"""The kernels' disk cache: compiled once per machine, loaded by every later process."""

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import vq
from vq.kernels.jit import cache, numba_compat

# a small search of every engine kind: flat (BLAS + heaps), IVF-PQ, fast-scan IVF + re-ranking
# (kernels specialised through template modules); the child prints its compile count. Dim 32
# and M 8, the configuration of tests/index_kinds.py: the kernels the rest of the suite
# compiles, so that a child on the suite's cache loads rather than compiles most of them
_SEARCH = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import vq
    from vq.kernels.jit import cache
    rng = np.random.default_rng(0)
    x = rng.standard_normal((600, 32), dtype=np.float32)
    for description in ("Flat", "IVF4,PQ8", "IVF4,PQ8x4fs,RFlat"):
        index = vq.index_factory(32, description)
        index.train(x)
        index.add(x)
        index.search(x[:5], 3)  # the lean path of small searches
        index.search(x[:40], 3)  # the general path
    compiler = [m for m in ("numba.np.arraymath", "scipy.linalg") if m in sys.modules]
    print(json.dumps({"compiles": cache.compiles(), "folder": str(cache.folder()),
                      "compiler": compiler}))
    """
)


def _child(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **env},
        check=False,
    )


def test_a_second_process_sharing_the_cache_compiles_nothing():
    first = _child(_SEARCH)  # compiles what the suite's earlier processes have not
    assert first.returncode == 0, first.stderr
    second = _child(_SEARCH)
    assert second.returncode == 0, second.stderr
    report = json.loads(second.stdout.strip().splitlines()[-1])
    assert report["folder"] == json.loads(first.stdout.strip().splitlines()[-1])["folder"]
    assert report["compiles"] == 0
    # loaded without preparing numba's compiler (its registries import scipy: 0.5 s)
    assert report["compiler"] == []


def test_warm_up_readies_every_kernel_a_later_search_runs(tmp_path):
    """A process that builds and saves without searching leaves the search kernels to the
    first process that searches; ``warm_up`` (which ``vq build`` calls) readies them all, so
    that no later search of any batch size, k or input type loads or compiles another."""
    code = textwrap.dedent(
        """
        import json
        import numpy as np, torch, vq
        from vq.kernels.jit import cache
        rng = np.random.default_rng(0)
        x = rng.standard_normal((600, 32), dtype=np.float32)
        ready = lambda: cache.loads() + cache.compiles()
        report = {}
        for description in ("Flat", "IVF4,PQ8", "IVF4,PQ8x4fs,RFlat", "HNSW16"):
            index = vq.index_factory(32, description)
            index.train(x)
            index.add(x)
            before = ready()
            index.warm_up()
            warmed = ready()
            for n in (1, 7, 16, 17, 300, 5000):
                q = rng.standard_normal((n, 32), dtype=np.float32)
                for k in (1, 10):
                    index.search(q, k)
                index.search(torch.from_numpy(q), 10)
            report[description] = [warmed - before, ready() - warmed]
        empty = vq.index_factory(32, "IVF4,Flat")
        report["untrained"] = [empty.warm_up(), 0]
        print(json.dumps(report))
        """
    )
    out = _child(code)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    untrained = report.pop("untrained")
    for description, (warmed, after) in report.items():
        assert warmed > 0 and after == 0, (description, warmed, after)
    assert untrained[0] == 0
    with pytest.raises(ValueError, match="k must be"):
        vq.index_factory(16, "Flat").warm_up(k=0)


def test_warmup_of_lists_holding_fewer_than_k_vectors():
    """`vq warmup`'s default IVF64 over 2,048 random 128-d vectors leaves a few queries with
    fewer than 10 results: its range search takes the radius from the finite distances only
    (it was +inf: "radius must be a finite number")."""
    from vq.apps.warmup import warmup

    (done,) = warmup(["IVF64,Flat"], dim=128, layer=False)
    assert done.description == "IVF64,Flat" and done.seconds > 0


@pytest.mark.parametrize("cls", ["numba", "vq"])
def test_two_processes_saving_two_signatures_at_once_never_cross_their_code(tmp_path, cls):
    """Processes A and B both read the kernel's empty index; A writes its index entry, B its
    whole entry, A its data last (an interleaving of two compiling processes, which vq's lock
    prevents; forced here): numba's numbered names point B's signature at A's code, vq's
    hashed names cannot."""
    from numba.core.caching import IndexDataCacheFile

    kind = IndexDataCacheFile if cls == "numba" else numba_compat.SharedCacheFile
    a, b, reader = (kind(str(tmp_path), "kernel-12", ("stamp", 1)) for _ in range(3))
    deferred = []
    a._save_data = lambda name, data: deferred.append((name, data))  # A's data write waits
    b._load_index = dict  # B read the index before A wrote it: empty
    a.save("signature A", "code for A")
    b.save("signature B", "code for B")
    IndexDataCacheFile._save_data(a, *deferred.pop())
    found = {key: reader.load(key) for key in ("signature A", "signature B")}
    crossed = found["signature B"] == "code for A"
    assert crossed == (cls == "numba"), found
    assert found["signature B"] in (None, "code for B") or cls == "numba"
    assert found["signature A"] in (None, "code for A")
    # and one process after the other loses no entry
    c = numba_compat.SharedCacheFile(str(tmp_path / "c"), "kernel-12", ("stamp", 1))
    (tmp_path / "c").mkdir()
    c.save("signature A", "code for A")
    c.save("signature B", "code for B")
    assert [c.load("signature A"), c.load("signature B")] == ["code for A", "code for B"]


def test_processes_needing_one_kernel_at_once_compile_it_once(tmp_path):
    """Two processes that call the same kernel together on a cold cache: one compiles it, the
    other waits for that compile and loads the kernel (``cache._compiling``)."""
    go = tmp_path / "go"
    code = textwrap.dedent(
        f"""
        import json, os, sys, time
        import numpy as np
        from vq.kernels.jit import cache
        from vq.kernels.common import rows
        open(sys.argv[1], "w").close()  # imported: ready
        while not os.path.exists({str(go)!r}):
            time.sleep(0.001)
        left = rows.remove_rows(np.arange(40, dtype=np.uint64), 4, np.array([1, 3]), 10)
        print(json.dumps({{"left": int(left), "compiles": cache.compiles()}}))
        """
    )
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    ready = [tmp_path / f"ready{i}" for i in range(2)]
    children = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(r)],
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for r in ready
    ]
    try:
        deadline = time.monotonic() + 120
        while not all(r.exists() for r in ready):
            assert all(c.poll() is None for c in children), children[0].communicate()
            assert time.monotonic() < deadline, "the children did not start"
            time.sleep(0.01)
        go.touch()  # both call the kernel now
        reports = []
        for child in children:
            out, err = child.communicate(timeout=300)
            assert child.returncode == 0, err
            reports.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for child in children:
            child.kill()
    assert [r["left"] for r in reports] == [8, 8]
    assert sorted(r["compiles"] > 0 for r in reports) == [False, True], reports
    assert list((tmp_path / "cache").glob("vq/*/compiling/*.lock")) == []  # none left behind


def test_the_cache_folder_is_keyed_by_version_and_cpu():
    folder = cache.folder()
    assert folder is not None
    assert folder.parent == cache.cache_root()
    assert vq.__version__ in folder.name
    assert cache.cpu_key() in folder.name


@pytest.mark.parametrize("variable", ["NUMBA_CACHE_DIR", "XDG_CACHE_HOME"])
def test_the_cache_root_follows_the_environment(tmp_path, variable):
    code = "from vq.kernels.jit import cache; print(cache.folder())"
    env = {variable: str(tmp_path)}
    if variable == "XDG_CACHE_HOME":
        env["NUMBA_CACHE_DIR"] = ""  # unset: NUMBA_CACHE_DIR wins where it is set
    out = _child(code, **env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().startswith(str(tmp_path / "vq" / "kernels-"))


def test_a_new_cache_folder_deletes_the_long_unused_ones(tmp_path):
    root = tmp_path / "vq"
    old, recent, unrelated = root / "kernels-0.0.1-old", root / "kernels-0.0.2-recent", root / "x"
    for folder in (old, recent, unrelated):
        (folder / "specialised").mkdir(parents=True)
    month = 31 * 86400
    os.utime(old, (os.path.getmtime(old) - month,) * 2)
    (recent / ".used").touch()
    os.utime(unrelated, (os.path.getmtime(unrelated) - month,) * 2)
    out = _child(
        "from vq.kernels.jit import cache; print(cache.folder())", NUMBA_CACHE_DIR=str(tmp_path)
    )
    assert out.returncode == 0, out.stderr
    new = out.stdout.strip()
    assert sorted(p.name for p in root.iterdir()) == sorted([Path(new).name, recent.name, "x"])
    assert (Path(new) / ".used").exists()
    stamp = os.path.getmtime(Path(new) / ".used")  # a second process does not touch it again
    assert _child("import vq.kernels", NUMBA_CACHE_DIR=str(tmp_path)).returncode == 0
    assert os.path.getmtime(Path(new) / ".used") == stamp
    kept = root / "kernels-kept"  # prune itself: by the .used stamp, never the folder kept
    kept.mkdir()
    os.utime(kept, (os.path.getmtime(kept) - month,) * 2)
    assert cache.prune(root, keep=kept) == [] and kept.exists()
    assert sorted(cache.prune(root, keep=Path(new), days=0)) == sorted([kept, recent])
    assert [p.name for p in root.glob("kernels-*")] == [Path(new).name]


def test_an_unwritable_cache_warns_once_and_compiles_in_memory(tmp_path):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    code = textwrap.dedent(
        """
        import warnings
        warnings.simplefilter("always")
        import numpy as np
        from vq.kernels.jit import cache
        from vq.kernels.common import heaps
        from vq.kernels.fastscan.fastscan_scans import flat_tables
        keys, out = np.array([5, 3, 9, 1], dtype=np.int64), np.empty(2, dtype=np.int64)
        heaps.smallest_keys(keys, out)
        build = flat_tables(2, 1)  # a specialised module, executed in memory
        print(cache.folder(), out.tolist(), build.__code__.co_filename.startswith("<"))
        """
    )
    out = _child(code, NUMBA_CACHE_DIR=str(blocked / "sub"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["None", "[1,", "3]", "True"]
    assert out.stderr.count("cannot use the kernel cache") == 1
    assert "NUMBA_CACHE_DIR" in out.stderr


@cache.kernel()
def _total(x, pair):
    return x.sum() + pair[0].sum() + pair[1][0, 0]


def test_a_read_only_array_runs_the_kernel_compiled_for_writable_ones():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    frozen = x.copy()
    frozen.setflags(write=False)
    assert _total(x, (x, x)) == 30.0
    assert _total(frozen, (frozen, x)) == 30.0
    assert _total(np.frombuffer(x.tobytes(), np.float32).reshape(2, 3), (x, frozen)) == 30.0
    (signature,) = _total.signatures  # one compilation, for writable arrays
    assert all(t.mutable for t in (signature[0], *signature[1]))


def test_specialise_gives_one_module_per_configuration():
    a = cache.specialise("vq.kernels.pq.pq_scan_template", N_TABLES=4, WORDS=True)
    assert cache.specialise("vq.kernels.pq.pq_scan_template", WORDS=True, N_TABLES=4) is a
    assert cache.specialise("vq.kernels.pq.pq_scan_template", N_TABLES=4, WORDS=False) is not a
    assert (a.N_TABLES, a.WORDS) == (4, True)
    assert os.path.dirname(a.__file__) == str(cache.folder() / "specialised")


def test_specialise_refuses_missing_or_unknown_constants():
    with pytest.raises(TypeError, match=r"specialised by \['N_TABLES', 'WORDS'\]"):
        cache.specialise("vq.kernels.pq.pq_scan_template", N_TABLES=4)
    with pytest.raises(TypeError, match="plain value"):
        cache.specialise("vq.kernels.pq.pq_scan_template", N_TABLES=4, WORDS=[2])
    with pytest.raises(ImportError, match="no kernel template"):
        cache.specialise("vq.kernels.no_such_template", M=4)


def test_the_command_line_announces_a_compile_once(tmp_path):
    code = textwrap.dedent(
        """
        from vq.kernels.jit import cache
        from vq.kernels.common import heaps
        import numpy as np
        with cache.announce("compiling now"):
            for _ in range(2):
                heaps.smallest_keys(np.arange(4), np.empty(2, dtype=np.int64))
        """
    )
    out = _child(code, NUMBA_CACHE_DIR=str(tmp_path))  # empty: it must compile
    assert out.returncode == 0, out.stderr
    assert out.stderr.count("compiling now") == 1
    again = _child(code, NUMBA_CACHE_DIR=str(tmp_path))  # cached: nothing to announce
    assert again.returncode == 0, again.stderr
    assert "compiling now" not in again.stderr


def test_vq_imports_and_searches_with_numba_jit_disabled():
    code = textwrap.dedent(
        """
        import numpy as np, vq
        x = np.random.default_rng(0).standard_normal((300, 8), dtype=np.float32)
        index = vq.index_factory(8, "IVF4,Flat")
        index.train(x)
        index.add(x)
        print(index.search(x[:2], 3)[1][:, 0].tolist())
        """
    )
    out = _child(code, NUMBA_DISABLE_JIT="1")  # numba debugging: plain Python functions
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[0, 1]"  # each query finds itself


def test_vq_warmup_reports_each_kind_and_refuses_bad_ones(capsys):
    warmup = ["warmup", "--dim", "16", "--no-layer"]
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "vq.apps.cli",
            *warmup,
            "--index",
            "Flat",
            "--index",
            "IVF4,Flat",
            "--jobs",
            "2",
        ],  # fmt: skip
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith("Flat ") and lines[1].startswith("IVF4,Flat ")
    assert lines[-1].startswith("warm-up of 2 kinds at dim 16:")
    assert str(cache.folder()) in lines[-1]
    # a bad description: refused before anything compiles (here: the command's exit status
    # and message, without a process of its own)
    from vq.apps.cli import main

    assert main([*warmup, "--index", "IVF4,Nope"]) == 2
    assert capsys.readouterr().err.startswith("error: index_factory:")
