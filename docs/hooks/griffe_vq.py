"""Griffe extension for the docs build (mkdocs.yml names it).

Two things griffe cannot know by itself:

- the layout: ``index/`` and ``datasets/`` install as ``vq.index`` and ``vq.datasets``
  (setuptools ``package-dir``), so they are loaded from their folders and attached to ``vq``;
- two habits of the docstrings that Google-style parsing misreads: an ``Args:`` line that
  lists names inline (``Args: dim, num_quantizers, ...``: plain prose here), and a list of
  names wrapped over several lines before its colon (joined into one item);
- the docstrings' Sphinx roles (:func:`vq.kmeans`, :class:`IVFPQ`, ``:mod:``, ``:meth:``,
  ``:attr:``, ``:data:``, ``:exc:``), which Markdown would print as written: each becomes a code
  span of its target (``~`` shortens it to the last name, as Sphinx does).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import griffe

ROOT = Path(__file__).resolve().parents[2]
#: submodules of vq that live in a top-level folder of the repository
FOLDERS = {"index": ROOT / "index", "datasets": ROOT / "datasets"}
ROLE = re.compile(r":(?:py:)?(?:func|class|meth|attr|mod|data|exc|obj|const):`([^`]+)`")


def _role(match: re.Match) -> str:
    target = match.group(1)
    if "<" in target and target.endswith(">"):  # :func:`title <target>`
        target = target.split("<", 1)[0].strip()
    if target.startswith("~"):
        target = target[1:].rsplit(".", 1)[-1]
    return f"`{target}`"


def plain_roles(text: str) -> str:
    """``text`` with every Sphinx cross-reference role written as a Markdown code span."""
    return ROLE.sub(_role, text)


INLINE_ARGS = re.compile(r"^(\s*)Args: (\S)", re.MULTILINE)


def join_wrapped_names(text: str) -> str:
    """``text`` with each Args item whose names wrap over lines (``a, b,`` then ``c: ...``
    indented below it) joined onto one line."""
    lines, out, i = text.split("\n"), [], 0
    while i < len(lines):
        line = lines[i]
        if line.rstrip().endswith(",") and ":" not in line and out and _in_args(out):
            while i + 1 < len(lines) and ":" not in line:
                i += 1
                line = line.rstrip() + " " + lines[i].strip()
        out.append(line)
        i += 1
    return "\n".join(out)


def _in_args(before: list[str]) -> bool:
    """Whether the next line falls inside an ``Args:`` section (the last section header
    above it, before any blank line ending the section)."""
    for line in reversed(before):
        if not line.strip():
            return False
        if line.strip().endswith(":") and line.strip()[:-1] in ("Args", "Arguments", "Parameters"):
            return True
    return False


class VqLayout(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        if pkg.name != "vq":
            return
        for name, folder in FOLDERS.items():
            if name not in pkg.members:
                pkg.set_member(name, loader.load(str(folder)))

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            text = INLINE_ARGS.sub(r"\1The arguments: \2", obj.docstring.value)
            obj.docstring.value = plain_roles(join_wrapped_names(text))
