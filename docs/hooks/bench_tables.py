"""MkDocs hook: the benchmark tables and plots of the docs, rendered from bench/results/.

A page writes ``<!-- bench-table: NAME -->``, alone on its line, where the table of
``bench/results/published/NAME.csv`` goes (with its caption: machine, date, command, source),
and ``<!-- bench-plot: NAME -->`` where its plot goes; :mod:`bench.render` does the rendering,
so the docs hold no table of measured numbers written by hand. Plots are generated files of the
site (``benchmarks/plots/NAME.png``), made during the build.
"""

from __future__ import annotations

import posixpath
import re
import sys
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import render  # noqa: E402

MARKER = re.compile(r"^<!--\s*bench-(table|plot):\s*([\w.-]+)\s*-->[ \t]*$", re.MULTILINE)
PLOTS = "benchmarks/plots"


def on_files(files, config):
    for name in render.names():
        if render.load(name).meta.get("plot"):
            png = render.plot_png(name)
            files.append(File.generated(config, f"{PLOTS}/{name}.png", content=png))
    return files


def on_page_markdown(markdown, page, config, files):
    here = posixpath.dirname(page.file.src_uri)

    def replace(match: re.Match) -> str:
        kind, name = match.groups()
        if kind == "table":
            return render.table_markdown(name)
        result = render.load(name)
        if not result.meta.get("plot"):
            raise ValueError(f"{page.file.src_uri}: result {name} has no plot")
        src = posixpath.relpath(f"{PLOTS}/{name}.png", here or ".")
        return f"![{result.meta['plot'].get('title', name)}]({src})"

    return MARKER.sub(replace, markdown)
