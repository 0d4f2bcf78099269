"""Every fenced Python block of README.md and docs/**/*.md runs.

The blocks of one page run in order in one namespace (a page's later blocks use what its
earlier ones built), in a temporary working directory (a snippet may save files). Shell blocks
(``bash``, ``console``, text) are not run. A Python block that cannot run here (it needs
torchrun, TensorRT, a GPU or a file of the reader's) is marked on the line before its fence::

    <!-- not-run: needs torchrun -->
    ```python
    ...

The reason is required; the marker is an HTML comment, so the rendered page does not show it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+|~~~+)\s*(?P<info>[^\n`]*)$")
NOT_RUN = re.compile(r"^\s*<!--\s*not-run:\s*(?P<reason>.*?)\s*-->\s*$")
MARKER = re.compile(r"<!--\s*not-run\b")


def python_blocks(text: str) -> list[tuple[int, str, str | None]]:
    """``(line, code, reason)`` for each fenced block whose info string is ``python`` or
    ``py``: its first code line (1-based), its code (dedented by the fence's indent) and the
    not-run reason, if the line before the fence marks it. A ``not-run`` marker without a
    reason, or one not followed by a Python block, is a ``ValueError``."""
    lines, blocks, i = text.split("\n"), [], 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            if MARKER.search(lines[i]) and not _marks_python(lines, i):
                raise ValueError(f"line {i + 1}: a not-run marker must precede a python fence")
            i += 1
            continue
        indent, fence = len(match["indent"]), match["fence"]
        language = (match["info"].split() or [""])[0].lower()
        end = i + 1
        while end < len(lines) and not lines[end].strip().startswith(fence):
            end += 1
        if language in ("python", "py"):
            marker = NOT_RUN.match(lines[i - 1]) if i else None
            if i and MARKER.search(lines[i - 1]) and not (marker and marker["reason"]):
                raise ValueError(f"line {i}: a not-run marker needs a reason")
            code = "\n".join(line[indent:] for line in lines[i + 1 : end])
            blocks.append((i + 2, code, marker["reason"] if marker else None))
        i = end + 1
    return blocks


def _marks_python(lines: list[str], i: int) -> bool:
    match = FENCE.match(lines[i + 1]) if i + 1 < len(lines) else None
    return bool(match) and (match["info"].split() or [""])[0].lower() in ("python", "py")


def _pages_with_code() -> list[Path]:
    return [p for p in PAGES if python_blocks(p.read_text())]


@pytest.mark.parametrize("page", _pages_with_code(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_python_block_of_the_page_runs(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("VQ_BACKGROUND_COMPILE", "0")
    namespace = {"__name__": "__main__"}
    name = str(page.relative_to(ROOT))
    ran = 0
    for line, code, reason in python_blocks(page.read_text()):
        if reason is not None:
            continue
        # blank lines in front keep the tracebacks' line numbers those of the page
        exec(compile("\n" * (line - 1) + code, name, "exec"), namespace)  # noqa: S102
        ran += 1
    assert ran, f"{name}: every python block is marked not-run"


def test_the_collector_reads_fences_markers_and_indented_blocks():
    text = "\n".join(
        [
            "```python",
            "a = 1",
            "```",
            "<!-- not-run: needs torchrun -->",
            "```python",
            "b = 2",
            "```",
            "```bash",
            "echo no",
            "```",
            "- item",
            "",
            "    ```py",
            "    c = 3",
            "    ```",
        ]
    )
    assert python_blocks(text) == [(2, "a = 1", None), (6, "b = 2", "needs torchrun"),
                                   (14, "c = 3", None)]  # fmt: skip
    with pytest.raises(ValueError, match="needs a reason"):
        python_blocks("<!-- not-run: -->\n```python\nx = 1\n```")
    with pytest.raises(ValueError, match="must precede a python fence"):
        python_blocks("<!-- not-run: no -->\n```bash\nls\n```")


def test_the_readme_quickstarts_are_short_and_the_readme_too():
    readme = (ROOT / "README.md").read_text()
    blocks = python_blocks(readme)
    assert len(blocks) == 3 and all(reason is None for _, _, reason in blocks)
    assert all(len(code.strip().split("\n")) <= 15 for _, code, _ in blocks)
    assert len(readme.split("\n")) <= 250
    first = re.search(r"```(\w+)\n(.*?)```", readme, re.S)
    assert first[1] == "bash" and first[2].startswith("pip install .")  # install comes first
