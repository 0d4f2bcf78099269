"""The wheel installs and runs outside the source tree: built from this checkout, installed
into a new virtual environment (its dependencies taken from the test environment's own
site-packages, nothing fetched), then used from a folder that is not the checkout."""

import os
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_USE = textwrap.dedent(
    """
    import sys
    import numpy as np, torch, vq
    assert not vq.__file__.startswith(sys.argv[1]), vq.__file__  # the wheel's copy
    x = np.random.default_rng(0).standard_normal((1000, 16), dtype=np.float32)
    index = vq.index_factory(16, "IVF8,Flat")
    index.train(x)
    index.add(x)
    D, I = index.search(x[:5], 3)
    assert (I[:, 0] == np.arange(5)).all(), I
    index.save("index.vq")
    again = vq.load_index("index.vq")
    assert (again.search(x[:5], 3)[1] == I).all()
    layer = vq.VectorQuantizer(16, 32, learning="ema").train()
    z = torch.from_numpy(x[:256]).requires_grad_(True)
    out = layer(z)
    (out.quantized.square().mean() + out.loss).backward()
    assert z.grad is not None and out.codes.shape == (256,)
    import vq.index, vq.datasets, vq.export, vq.distributed  # every package is in the wheel
    print("ok", vq.__version__)
    """
)


def _run(args, **kwargs) -> subprocess.CompletedProcess:
    run = subprocess.run(args, capture_output=True, text=True, timeout=600, check=False, **kwargs)
    assert run.returncode == 0, f"{args}\n{run.stdout}\n{run.stderr}"
    return run


def test_the_wheel_installs_into_a_new_environment_and_runs_outside_the_tree(tmp_path):
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
          "--quiet", "-w", str(tmp_path / "dist"), str(ROOT)])  # fmt: skip
    (wheel,) = (tmp_path / "dist").glob("vq-*.whl")
    env_dir = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(env_dir)])
    python = env_dir / "bin" / "python"
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(_run([str(python), "-c", purelib]).stdout.strip())
    # the dependencies: the test environment's packages, but not its editable vq (a plain
    # path in a .pth file: the .pth files of that folder are not read)
    (site / "test-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", "--quiet", str(wheel)])
    version = _run([str(env_dir / "bin" / "vq"), "--version"], cwd=tmp_path).stdout.strip()
    installed = _run([str(python), "-c", "import vq; print(vq.__version__)"], cwd=tmp_path)
    assert version.endswith(installed.stdout.strip())
    # the installed copy's kernels are other files than the checkout's: with numba's compiler
    # they would all compile again for this test; it checks what the wheel holds, so they run
    # as Python (numba's debugging mode, which vq supports: tests/test_kernel_cache.py)
    env = {**os.environ, "PYTHONPATH": "", "NUMBA_DISABLE_JIT": "1"}
    used = _run([str(python), "-c", _USE, str(ROOT)], cwd=tmp_path, env=env)
    assert used.stdout.startswith("ok ")
    typed = site / "vq" / "py.typed"
    assert typed.is_file()
