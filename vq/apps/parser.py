"""The parser every vq program's command line is read with, and what their options share.

:class:`Parser` prints a usage error as one line, ``error: <program>: <what is wrong>``, and
exits with status 2; :class:`Formatter` lays the descriptions out as paragraphs, examples and
list items. Standard library only: ``vq --help`` must not import torch.
"""

from __future__ import annotations

import argparse
import re
import sys
import textwrap
from typing import NoReturn

from vq.apps.errors import InputError

#: the metrics an index searches by (``--metric``)
METRICS = ("l2", "ip", "cosine")
#: what ``--data`` / ``--queries`` may be
VECTOR_FILES = ".fvecs, .bvecs, .npy, .fbin, .u8bin, .i8bin or .hdf5 (ann-benchmarks)"
#: what ``--gt`` may be
NEIGHBOR_FILES = ".ivecs, .ibin, integer .npy, or .hdf5 (its neighbors)"
#: what ``search --out`` may write
ID_FILES = (".ivecs", ".ibin", ".npy")
METRIC_HELP = (
    "distance: l2 (squared Euclidean), ip (inner product, largest first) or cosine; "
    "default: what an .hdf5 file says (its angular is cosine), else l2"
)

_ITEM = r"- |\d+\. "  # how a list item starts


class Formatter(argparse.HelpFormatter):
    """Descriptions as paragraphs (separated by blank lines) filled to the terminal's width;
    lines that start with spaces (examples) are kept as they are, and a line starting with
    "- " or "1. " starts a list item, filled with a hanging indent."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        paragraphs = []
        for paragraph in text.strip("\n").split("\n\n"):
            items: list[str] = []
            for line in paragraph.splitlines():
                in_list = bool(items) and re.match(_ITEM, items[-1]) is not None
                if not items or re.match(_ITEM, line) or (line[:1] == " " and not in_list):
                    items.append(line)
                else:
                    items[-1] += " " + line.strip()
            filled = []
            for item in items:
                if item.startswith(" "):
                    filled.append(indent + item)
                    continue
                marker = (re.match(_ITEM, item) or re.match("", item)).group(0)
                filled.append(
                    textwrap.fill(
                        " ".join(item.split()),
                        min(width, 100),
                        initial_indent=indent,
                        subsequent_indent=indent + " " * len(marker),
                        break_on_hyphens=False,
                    )
                )
            paragraphs.append("\n".join(filled))
        return "\n\n".join(paragraphs)


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line on stderr,
    ``error: <prog>: <message> (<prog> --help lists the options)``, and exit status 2; its
    descriptions are laid out by :class:`Formatter`."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        line = message.strip().splitlines()[0] if message.strip() else "bad arguments"
        print(f"error: {self.prog}: {line} ({self.prog} --help lists the options)", file=sys.stderr)
        sys.exit(2)


def add_threads(p: argparse.ArgumentParser, default: int | None, what: str = "CPU threads") -> None:
    """Add ``--threads`` (default ``default``; None: all cores)."""
    shown = f"default {default}" if default is not None else "default: all cores"
    p.add_argument("--threads", type=int, default=default, help=f"{what} ({shown})")


def require_positive(value: int | None, flag: str) -> None:
    """InputError unless ``value`` (the parsed ``flag``) is None or positive."""
    if value is not None and value <= 0:
        raise InputError(f"{flag} must be positive, got {value}")
