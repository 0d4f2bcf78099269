"""``vq --help``, ``vq --version`` and every command's ``--help``: plain words, exit status 0,
and answered before torch, numba or the indexes are imported. The commands come from the CLI
itself, so that a new one is covered without editing this file."""

import importlib
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import vq
from vq.apps import arguments, cli

ROOT = Path(__file__).resolve().parents[1]
#: modules that must not be imported to answer --help
HEAVY = ("torch", "numba", "numpy", "vq.index", "vq.datasets", "vq.quantizers", "vq.kernels")


def _child(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=False,
    )


def _assert_plain(text: str, where: str) -> None:
    """Help a terminal shows: no reStructuredText, no pointers to documents users do not have,
    no promises about later versions."""
    assert text.strip(), where
    for pattern in (r":\w+:`", "``", r"\bMISSION\b", r"\blands?\b", r"\bsee the project"):
        assert not re.search(pattern, text), f"{where}: {pattern!r} in\n{text}"


def test_every_command_answers_help_without_importing_torch():
    out = _child(
        """
        import contextlib, io, json, sys
        from vq.apps import cli

        def run(argv):
            buffer = io.StringIO()
            with contextlib.redirect_stdout(buffer):
                try:
                    code = cli.main(argv)
                except SystemExit as exit:
                    code = exit.code
            return [code, buffer.getvalue()]

        helps = {"": run(["--help"]), "--version": run(["--version"])}
        for name in cli.COMMANDS:
            if name != "bench":  # a process of its own: the next test
                helps[name] = run([name, "--help"])
        heavy = [m for m in sys.argv[1:] if m in sys.modules]
        print(json.dumps({"helps": helps, "heavy": heavy}))
        """,
        *HEAVY,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["heavy"] == []
    helps = result["helps"]
    assert set(helps) == {"", "--version", *cli.COMMANDS} - {"bench"}
    assert helps["--version"] == [0, f"vq {vq.__version__}\n"]
    code, text = helps.pop("")
    assert code == 0 and text.startswith("usage: vq ")
    assert all(f"  {name:<10}{c.summary}" in text for name, c in cli.COMMANDS.items())
    _assert_plain(text, "vq --help")
    del helps["--version"]
    for name, (code, text) in helps.items():
        assert code == 0 and text.startswith(f"usage: vq {name} "), name
        _assert_plain(text, f"vq {name} --help")


def test_bench_help_and_list_parse_before_importing_a_benchmark():
    out = subprocess.run(
        [sys.executable, "-m", "vq.apps.cli", "bench", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: vq bench ")
    _assert_plain(out.stdout, "vq bench --help")
    listed = _child(
        """
        import sys
        from bench.__main__ import SUITE, main
        code = main(["--list"])
        print(code, [m for m in sys.modules if m.startswith("bench.") and m != "bench.__main__"]
              + [m for m in ("torch", "faiss", "vq") if m in sys.modules])
        """
    )
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.strip().splitlines()
    assert lines[-1] == "0 []"
    assert [line.split()[0] for line in lines[:-1]][:3] == ["kmeans", "encode", "pq_search"]
    bad = subprocess.run(
        [sys.executable, "-m", "bench", "kmeans", "nope"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=False,
    )
    assert bad.returncode == 2 and "no benchmark nope in the suite" in bad.stderr


def test_the_torchrun_program_help_is_plain_too(capsys):
    from vq.apps import torchrun

    with pytest.raises(SystemExit) as exit_info:
        torchrun.main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: python -m vq.distributed {build,search}")
    _assert_plain(text, "python -m vq.distributed --help")
    for command in ("build", "search"):
        with pytest.raises(SystemExit) as exit_info:
            torchrun.main([command, "--help"])
        text = capsys.readouterr().out
        assert exit_info.value.code == 0
        assert text.startswith(f"usage: python -m vq.distributed {command} ")
        _assert_plain(text, f"python -m vq.distributed {command} --help")
    with pytest.raises(SystemExit) as exit_info:
        torchrun.main(["frobnicate"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1
    assert err.startswith("error: python -m vq.distributed: argument command: invalid choice")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["build", "--data", "x.npy", "--index", "Flat", "-o", "x.vq", "--metric", "cosin"],
         "error: vq build: argument --metric: invalid choice: 'cosin'"),
        (["build", "--data", "x.npy"],
         "error: vq build: the following arguments are required: --index, -o/--output"),
        (["search", "x.vq", "--queries", "q.npy", "--frob"],
         "error: vq search: unrecognized arguments: --frob"),
        (["-x"], "error: vq: unknown option -x; the options go after the command"),
        (["frobnicate"], "error: vq: argument COMMAND: invalid choice: 'frobnicate'"),
    ],
)  # fmt: skip
def test_usage_errors_are_one_line_and_exit_2(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert err.startswith(message) and err.count("\n") == 1
    assert err.rstrip().endswith("--help lists the options)")


def test_bad_values_are_refused_before_the_work_is_imported(monkeypatch, capsys):
    def never(name):
        raise AssertionError(f"imported the work of {name}")

    monkeypatch.setattr(cli, "_work", never)
    for argv, message in (
        (["build", "--data", "x.npy", "--index", "Flat", "-o", "x.vq", "--threads", "0"],
         "error: --threads must be positive, got 0"),
        (["search", "x.vq", "--queries", "q.npy", "-k", "0"], "error: -k must be positive, got 0"),
        (["search", "x.vq", "--queries", "q.npy", "--out", "ids.txt"],
         "error: --out ids.txt: write ids as .ivecs, .ibin, .npy (the suffix says which)"),
        (["warmup", "--jobs", "0"], "error: --jobs must be positive, got 0"),
    ):  # fmt: skip
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(message) and err.count("\n") == 1, err


def test_the_parsers_cover_every_command():
    """Each command but bench (which forwards its arguments) has a parser in vq.apps.arguments,
    and each names a function that exists."""
    for name, command in cli.COMMANDS.items():
        if name != "bench":
            assert arguments.PROGRAMS[name][0]().prog == f"vq {name}"
        module, function = command.work.split(":")
        assert callable(getattr(importlib.import_module(module), function)), command.work
