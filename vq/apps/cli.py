"""The ``vq`` console command: a list of commands, each parsed by :mod:`vq.apps.arguments`
before the module doing its work is imported, so that ``vq --help``, ``vq --version`` and
``vq <command> --help`` answer in a fraction of a second (no torch, numba or index import).

    vq build --data X.fvecs --index "OPQ16,IVF1024,PQ16" -o index.vq
    vq search index.vq --queries Q.fvecs -k 10 --gt GT.ivecs
    vq export index.vq -o search.onnx --batch-size 64
    vq nsynth | validate | warmup | bench ...

Bad input ends with one line ``error: …`` on stderr and exit status 2
(:func:`vq.apps.errors.run_command`).
"""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from vq._version import __version__
from vq.apps import arguments
from vq.apps.errors import InputError, run_command
from vq.apps.parser import NEIGHBOR_FILES, VECTOR_FILES, Parser


@dataclass(frozen=True)
class Command:
    """A ``vq`` command: a line of summary for ``vq --help`` and the function doing its work,
    ``"module:function"`` (called with the parsed arguments; imported only once they parse)."""

    summary: str
    work: str


#: every command, in the order ``vq --help`` lists them
COMMANDS: dict[str, Command] = {
    "build": Command(
        "train an index on a vector file, add the vectors, save it", "vq.apps.build_search:build"
    ),
    "search": Command(
        "search a saved index: QPS, and recall against exact neighbours",
        "vq.apps.build_search:search",
    ),
    "export": Command(
        "export a saved index's search to ONNX (static shapes), or audit models",
        "vq.apps.export:run",
    ),
    "nsynth": Command(
        "the main job: vq against faiss on NSynth audio embeddings", "vq.apps.nsynth:run"
    ),
    "validate": Command(
        "quantizer and index checks against faiss on generated vectors", "vq.apps.validate:run"
    ),
    "warmup": Command(
        "compile the kernels of common index kinds (or saved indexes) ahead of time",
        "vq.apps.warmup:run",
    ),
    "bench": Command(
        "run the benchmarks against faiss (from a source checkout)", "vq.apps.cli:bench"
    ),
}

_EPILOG = f"""\
files:
- vectors: {VECTOR_FILES}
- ground truth: {NEIGHBOR_FILES}

`vq COMMAND --help` lists a command's options. Bad input ends with one line
"error: ..." on stderr and exit status 2."""


def _top_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="vq",
        usage="vq [--version] [--help] COMMAND [ARGS ...]",
        description="vq: vector quantization and nearest-neighbour search in PyTorch.\n\n"
        "commands:\n" + "\n".join(f"  {name:<10}{c.summary}" for name, c in COMMANDS.items()),
        epilog=_EPILOG,
    )
    p.add_argument("--version", action="store_true", help="print vq's version and exit")
    p.add_argument("command", choices=list(COMMANDS), metavar="COMMAND", help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run ``vq`` with ``argv`` (default: the process's arguments); returns the exit status.
    ``vq --help`` and ``vq --version`` return 0; a command's ``--help`` and usage errors exit
    through SystemExit, as argparse does."""
    argv = list(sys.argv[1:] if argv is None else argv)
    top = _top_parser()
    if not argv:
        top.print_help(sys.stderr)
        return 2
    if argv[0] in ("-h", "--help"):
        top.print_help()
        return 0
    if argv[0] == "--version":
        print(f"vq {__version__}")
        return 0
    if argv[0].startswith("-"):
        top.error(f"unknown option {argv[0]}; the options go after the command")
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        top.parse_args([name])  # "invalid choice: ..." and exit status 2
    if name == "bench":
        return run_command(bench, rest)

    def parse_then_work(argv: list[str]) -> int:
        args = arguments.parse(name, argv)  # first: --help and bad values need no import
        return _work(name)(args)

    return run_command(parse_then_work, rest)


def _work(name: str):
    """The function doing command ``name``'s work (its module imported now)."""
    module, function = COMMANDS[name].work.split(":")
    return getattr(importlib.import_module(module), function)


def bench(argv: list[str]) -> int:
    """``python -m bench ARGV`` in a process of its own, with this interpreter: bench/ is a
    folder of the source checkout, not installed, and the library never imports it. The
    benchmarks parse ARGV (``--help``, names) before running anything."""
    root = _bench_root()
    if root is None:
        raise InputError(
            "the benchmarks live in the source checkout's bench/ folder: run `vq bench` (or "
            "`python -m bench`) from the repository root"
        )
    paths = [str(root), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    command = [sys.executable, "-m", "bench", *argv]
    return subprocess.run(command, env=env, check=False).returncode


def _bench_root() -> Path | None:
    """The folder holding bench/: the current directory, or the source checkout this package
    sits in (None for an installed package run elsewhere)."""
    for root in (Path.cwd(), Path(__file__).resolve().parents[2]):
        if (root / "bench" / "__main__.py").is_file():
            return root
    return None


if __name__ == "__main__":
    sys.exit(main())
