"""Kernels compiled in the background: a search on a cold cache answers on the torch path at
once, its kernels compile in a server process into the disk cache, and later calls load them
(vq.kernels.jit.background). Each case runs in a process of its own with an empty cache."""

import json
import os
import subprocess
import sys
import textwrap

_TOY = textwrap.dedent(
    """
    from vq.kernels.jit.cache import kernel

    @kernel(nogil=True)
    def add_one(x):
        for i in range(x.shape[0]):
            x[i] += 1.0

    @kernel(nogil=True)
    def broken(x):
        return x.no_such_attribute
    """
)


def _child(code: str, tmp_path, **env: str) -> dict:
    (tmp_path / "toy_kernels.py").write_text(_TOY)
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    run = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={
            **os.environ,
            "XDG_CACHE_HOME": str(tmp_path / "cache"),
            "NUMBA_CACHE_DIR": "",
            "PYTHONPATH": path,
            "VQ_BACKGROUND_COMPILE": "1",
            **env,
        },
    )
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_a_call_that_would_compile_is_handed_to_the_server_and_later_loaded(tmp_path):
    report = _child(
        """
        import json
        import numpy as np
        from vq.kernels.jit import background
        from vq.kernels.jit import cache
        import toy_kernels
        x = np.zeros(3)
        with background.not_waiting():
            try:
                toy_kernels.add_one(x)
                raised = False
            except background.KernelNotReady:
                raised = True
        ran_before = float(x.sum())
        finished = background.wait(300)
        with background.not_waiting():
            toy_kernels.add_one(x)
        print(json.dumps({"raised": raised, "ran_before": ran_before, "finished": finished,
                          "x": x.tolist(), "compiles": cache.compiles(),
                          "loads": cache.loads(), "pending": background.pending()}))
        """,
        tmp_path,
    )
    assert report == {"raised": True, "ran_before": 0.0, "finished": True, "x": [1.0] * 3,
                      "compiles": 0, "loads": 1, "pending": 0}  # fmt: skip


def test_a_kernel_the_server_fails_on_compiles_in_the_caller_with_its_error(tmp_path):
    report = _child(
        """
        import json
        import numpy as np
        from vq.kernels.jit import background
        import toy_kernels
        x = np.zeros(3)
        errors = []
        for _ in range(2):
            with background.not_waiting():
                try:
                    toy_kernels.broken(x)
                except Exception as err:
                    errors.append(type(err).__name__)
            background.wait(300)
        print(json.dumps({"errors": errors}))
        """,
        tmp_path,
    )
    assert report == {"errors": ["KernelNotReady", "TypingError"]}


def test_waiting_compiles_in_the_caller_even_inside_not_waiting(tmp_path):
    report = _child(
        """
        import json
        import numpy as np
        from vq.kernels.jit import background
        from vq.kernels.jit import cache
        import toy_kernels
        x = np.zeros(3)
        with background.waiting(), background.not_waiting():
            toy_kernels.add_one(x)
        print(json.dumps({"x": x.tolist(), "loads": cache.loads(),
                          "pending": background.pending()}))
        """,
        tmp_path,
    )
    # compiled here: nothing was in the (empty) cache to load, nothing handed over
    assert report == {"x": [1.0] * 3, "loads": 0, "pending": 0}


def test_a_kernel_asked_for_ahead_compiles_in_the_server_and_the_call_waits_for_it(tmp_path):
    """cache.prefetch hands the compile over even where the thread waits (a build); the call
    that needs the kernel then loads the server's result instead of compiling it again."""
    report = _child(
        """
        import json
        import numpy as np
        from vq.kernels.jit import background
        from vq.kernels.jit import cache
        import toy_kernels
        x = np.zeros(3)
        first = cache.prefetch(toy_kernels.add_one, x)
        again = cache.prefetch(toy_kernels.add_one, x)  # queued already: not sent twice
        toy_kernels.add_one(x)  # (this thread waits: no KernelNotReady)
        later = cache.prefetch(toy_kernels.add_one, x)  # loaded: nothing to hand over
        print(json.dumps({"first": first, "again": again, "later": later, "x": x.tolist(),
                          "compiles": cache.compiles(), "loads": cache.loads(),
                          "pending": background.pending()}))
        """,
        tmp_path,
    )
    assert report == {"first": True, "again": True, "later": False, "x": [1.0] * 3,
                      "compiles": 0, "loads": 1, "pending": 0}  # fmt: skip


def test_nothing_is_asked_for_ahead_with_background_compiles_off(tmp_path):
    report = _child(
        """
        import json
        import numpy as np
        from vq.kernels.jit import background
        from vq.kernels.jit import cache
        import toy_kernels
        x = np.zeros(3)
        asked = cache.prefetch(toy_kernels.add_one, x)
        toy_kernels.add_one(x)
        print(json.dumps({"asked": asked, "x": x.tolist(), "loads": cache.loads(),
                          "pending": background.pending()}))
        """,
        tmp_path,
        VQ_BACKGROUND_COMPILE="0",
    )
    assert report == {"asked": False, "x": [1.0] * 3, "loads": 0, "pending": 0}


def test_nothing_is_handed_over_with_background_compiles_off(tmp_path):
    report = _child(
        """
        import json
        import numpy as np
        from vq.kernels.jit import background
        from vq.kernels.jit import cache
        import toy_kernels
        x = np.zeros(3)
        with background.not_waiting():
            toy_kernels.add_one(x)
        print(json.dumps({"x": x.tolist(), "loads": cache.loads(),
                          "pending": background.pending()}))
        """,
        tmp_path,
        VQ_BACKGROUND_COMPILE="0",
    )
    assert report == {"x": [1.0] * 3, "loads": 0, "pending": 0}


def test_a_first_search_on_a_cold_cache_answers_at_once_then_runs_on_the_kernels(tmp_path):
    """The first searches (a batch: the general path; one query: the lean path) compile
    nothing in the process and return brute force's ids; once the server is done, the same
    searches load the kernels it compiled and return the same ids, and the torch path's
    snapshot of the storage is let go."""
    report = _child(
        """
        import json
        import numpy as np
        import vq
        from vq.kernels.jit import background
        from vq.kernels.jit import cache
        rng = np.random.default_rng(0)
        x = rng.standard_normal((2000, 16), dtype=np.float32)
        q = rng.standard_normal((40, 16), dtype=np.float32)
        index = vq.index_factory(16, "Flat")
        index.add(x)
        d2 = (q * q).sum(1)[:, None] - 2 * q @ x.T + (x * x).sum(1)[None]
        exact = np.argsort(d2, axis=1, kind="stable")[:, :5]
        cold = [index.search(q, 5)[1], index.search(q[:1], 5)[1]]
        compiled_cold, handed = cache.compiles(), background.pending()
        snapshot_cold = "searcher" in index.__dict__.get("_derived_cache", {})
        finished = background.wait(600)
        warm = [index.search(q, 5)[1], index.search(q[:1], 5)[1]]
        snapshot_warm = "searcher" in index.__dict__.get("_derived_cache", {})
        print(json.dumps({
            "cold_exact": bool((cold[0] == exact).all() and (cold[1] == exact[:1]).all()),
            "warm_same": bool((warm[0] == cold[0]).all() and (warm[1] == cold[1]).all()),
            "compiled_cold": compiled_cold, "handed": handed > 0, "finished": finished,
            "compiles": cache.compiles(), "loaded": cache.loads() > 0,
            "snapshot": [snapshot_cold, snapshot_warm],
        }))
        """,
        tmp_path,
    )
    assert report == {"cold_exact": True, "warm_same": True, "compiled_cold": 0, "handed": True,
                      "finished": True, "compiles": 0, "loaded": True,
                      "snapshot": [True, False]}  # fmt: skip


def test_what_training_asks_for_ahead_is_what_the_first_add_runs(monkeypatch):
    """Index.kernels_ahead (called by train) asks for the kernels of the coarse assignment,
    the PQ encoding, the inverted lists' row moves and the fast-scan packing with the very
    types the first add then calls them with: a signature that differed would compile in the
    server for nothing while add compiled its own here."""
    import numpy as np

    import vq
    from vq.kernels.jit import cache, numba_compat

    rng = np.random.default_rng(0)
    x = rng.standard_normal((600, 16), dtype=np.float32)
    index = vq.index_factory(16, "IVF8,PQ4x4fs")
    index.train(x)
    index.add(x)
    asked = []

    def record(dispatcher, *args):
        asked.append((dispatcher, numba_compat.argtypes(dispatcher, args)))

    monkeypatch.setattr(cache, "prefetch", record)
    index.kernels_ahead()
    names = sorted(d.py_func.__qualname__ for d, _ in asked)
    assert names == ["argmin_range", "encode_range", "list_slots", "move_lists", "write_codes"]
    unused = [(d.py_func.__qualname__, t) for d, t in asked if t not in d.overloads]
    assert unused == []
