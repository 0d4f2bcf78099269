"""vq.kernels.jit.numba_compat: the one module that uses numba's internals, and what vq does
under a numba outside the releases it was checked against."""

import ast
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from vq.kernels.jit import numba_compat

ROOT = Path(__file__).resolve().parents[1]
#: numba.core modules of numba's documented extension API, which any kernel may import
EXTENSION_API = {"cgutils", "datamodel", "errors", "imputils", "types", "config"}


@pytest.mark.parametrize(
    ("version", "ok"),
    [
        ("0.59.0", True),
        ("0.68.1", True),
        ("0.60.0rc1", True),
        ("0.58.1", False),
        ("0.69.0", False),
        ("0.69.0rc1", False),
        ("1.0.0", False),
        ("unknown", False),
    ],
)
def test_supported_is_the_half_open_range(version, ok):
    assert numba_compat.supported(version) is ok


def test_the_range_is_the_one_pyproject_pins():
    text = (ROOT / "pyproject.toml").read_text()
    (pin,) = re.findall(r'"numba([^"]*)"', text)
    low, high = numba_compat.NUMBA_RANGE
    assert pin == f">={low},<{high}"


def test_only_numba_compat_reaches_numbas_internals():
    """Every module of vq imports from numba.core only the extension API; the dispatcher,
    cache, inliner and event modules are numba_compat's alone."""
    found = []
    for path in sorted((ROOT / "vq").rglob("*.py")):
        if path.name == "numba_compat.py":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                parts = name.split(".")
                if parts[:2] == ["numba", "core"] and len(parts) > 2:
                    if parts[2] not in EXTENSION_API:
                        found.append(f"{path.relative_to(ROOT)}: {name}")
    assert found == []


_OUTSIDE = textwrap.dedent(
    """
    import json, warnings
    import numba
    numba.__version__ = "0.70.0"  # what numba_compat reads
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import numpy as np
        from vq.kernels.jit import cache, numba_compat
        from vq.kernels.common import heaps
        keys, out = np.array([5, 3, 9, 1], dtype=np.int64), np.empty(2, dtype=np.int64)
        heaps.smallest_keys(keys, out)
    print(json.dumps({
        "warnings": [str(w.message) for w in caught if "outside" in str(w.message)],
        "supported": numba_compat.SUPPORTED,
        "folder": str(cache.folder()),
        "plain": type(heaps.smallest_keys) is numba_compat.Dispatcher,
        "inliner": numba_compat.install_inliner(),
        "out": out.tolist(),
    }))
    """
)


def test_a_numba_outside_the_range_compiles_plainly_after_one_warning(tmp_path):
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    run = subprocess.run(
        [sys.executable, "-c", _OUTSIDE], capture_output=True, text=True, env=env, timeout=600
    )
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout.strip().splitlines()[-1])
    (warning,) = report["warnings"]
    assert "numba 0.70.0" in warning and "numba>=0.59,<0.69" in warning
    assert report["supported"] is False and report["folder"] == "None"
    assert report["plain"] and report["inliner"] is False  # numba's own dispatcher, inliner
    assert report["out"] == [1, 3]
    assert not (tmp_path / "vq").exists()  # nothing written to the cache


def test_pretyped_gives_a_tuple_numba_types_in_python_its_type_once():
    import numba
    import numpy as np

    from vq.kernels.common.constants import IP

    @numba.njit
    def first(t):
        return t[0][0] + (1 if t[1] else 0)

    plain = (np.arange(3.0), True)
    assert numba_compat.pretyped(plain) is plain  # (numba types it in C already)
    with_static = (np.arange(3.0), IP)
    typed = numba_compat.pretyped(with_static)
    assert typed == with_static and typed._numba_type_ == numba.typeof(with_static)
    assert first(typed) == first(with_static) == 1.0
    assert len(first.signatures) == 1  # (typed ahead or in Python: the same type)
