"""Render the docs' benchmark tables and plots from result files (``python -m bench.render``).

    python -m bench.render [--results DIR] [--out DIR] [NAME ...]
    python -m bench.render --publish NAME [NAME ...]

A result is ``<name>.csv`` (a header row, then one row per measurement) with ``<name>.json``
beside it: ``title``, ``command``, ``machine`` (``cpu``, ``threads``, and for runs written by
:func:`bench.common.write_csv` also ``features``, ``kernels``, ``cores``, ``libraries`` and
``date``), ``date``, ``source`` ("measured", or where the numbers were transcribed from),
optional ``notes`` and ``plot``. ``bench/results/published/`` holds the results the docs cite;
the docs build (``docs/hooks/bench_tables.py``) replaces ``<!-- bench-table: NAME -->`` in a
page with :func:`table_markdown` and ``<!-- bench-plot: NAME -->`` with the plot
:func:`plot_png` draws, so no table in the docs is written by hand. Without ``--publish``
this writes every table (``NAME.md``) and plot (``NAME.png``) to ``--out`` (default
``bench/results/rendered/``).

A ``plot`` entry draws recall against QPS (log scale), one line per ``lines`` entry and per
value of the ``group`` column: ``{"x": "recall@10", "group": "index", "lines": [{"x":
"recall@10 vq", "y": "vq QPS", "label": "vq", "style": "-"}, ...]}`` (a line's ``x`` defaults
to the plot's); each line is its points' frontier (those no other point beats in both
recall and QPS).
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from bench.common import RESULTS, markdown_table

PUBLISHED = RESULTS / "published"


@dataclass(frozen=True)
class Result:
    """One result file: its metadata, columns and rows (cells as the CSV holds them)."""

    name: str
    meta: dict
    columns: list[str]
    rows: list[dict]


def names(root: Path = PUBLISHED) -> list[str]:
    """The results under ``root`` (each a CSV with its JSON beside it), sorted."""
    return sorted(p.stem for p in root.glob("*.csv") if p.with_suffix(".json").is_file())


def load(name: str, root: Path = PUBLISHED) -> Result:
    """The result ``name`` under ``root``; a ``FileNotFoundError`` names what is missing, a
    ``ValueError`` a repeated column name (a CSV row is read as a dict)."""
    path = root / f"{name}.csv"
    meta_path = path.with_suffix(".json")
    for p in (path, meta_path):
        if not p.is_file():
            known = ", ".join(names(root)) or "none"
            raise FileNotFoundError(f"no result file {p} (results in {root}: {known})")
    meta = json.loads(meta_path.read_text())
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
        columns = list(reader.fieldnames or [])
    repeated = sorted({c for c in columns if columns.count(c) > 1})
    if repeated:
        raise ValueError(f"{path}: column names must be unique, {repeated} repeat")
    return Result(name, meta, columns, rows)


def _number(cell: str):
    """A measured cell as a float where it is one (formatted like the benches' own tables)."""
    try:
        return float(cell)
    except ValueError:
        return cell


def _float(cell: str) -> float:
    """A plotted cell as a number (thousands separators allowed: "4,613")."""
    return float(cell.replace(",", ""))


def _frontier(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The points no other point beats in both recall (x) and QPS (y), by increasing x."""
    kept, best = [], float("-inf")
    for x, y in sorted(points, key=lambda p: (-p[0], -p[1])):
        if y > best:
            kept.append((x, y))
            best = y
    return kept[::-1]


def _escape(cell):
    """A cell as a Markdown table holds it (a ``|`` escaped)."""
    return cell.replace("|", "\\|") if isinstance(cell, str) else cell


def caption(meta: dict) -> str:
    """One line: the machine, threads, date, command and source of a result."""
    machine = meta.get("machine", {})
    cpu = machine.get("cpu", "machine not recorded")
    if machine.get("kernels"):
        cpu += f" ({machine['kernels']} kernels)"
    threads = machine.get("threads")
    parts = [cpu + (f", {threads} thread{'s' * (threads != 1)} per system" if threads else "")]
    date = meta.get("date") or machine.get("date")
    parts.append(str(date) if date else "date not recorded")
    if meta.get("command"):
        parts.append(f"`{meta['command']}`")
    libraries = machine.get("libraries")
    if libraries:
        parts.append(", ".join(f"{k} {v}" for k, v in libraries.items()))
    text = "Measured on " + "; ".join(parts) + "."
    if meta.get("source") and meta["source"] != "measured":
        text += f" Source: {meta['source']}."
    if meta.get("notes"):
        text += f" {meta['notes'][0].upper()}{meta['notes'][1:]}."
    return text


def table_markdown(name: str, root: Path = PUBLISHED) -> str:
    """The result ``name`` as a Markdown table followed by its :func:`caption`. Cells of
    measured runs are formatted as the benches print them (4 significant digits); cells of
    transcribed results are kept as written."""
    result = load(name, root)
    measured = result.meta.get("source", "measured") == "measured"
    columns = [_escape(c) for c in result.columns]
    rows = [
        {_escape(c): _escape(_number(r[c]) if measured else r[c]) for c in result.columns}
        for r in result.rows
    ]
    return markdown_table(rows, columns) + "\n\n" + caption(result.meta) + "\n"


def plot_png(name: str, root: Path = PUBLISHED) -> bytes:
    """The result's ``plot`` (recall against QPS) drawn as PNG bytes; a ``ValueError`` if its
    metadata has no ``plot`` entry."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    result = load(name, root)
    spec = result.meta.get("plot")
    if not spec:
        raise ValueError(f"result {name} has no 'plot' entry in {name}.json")
    group = spec.get("group")
    groups = list(dict.fromkeys(r[group] for r in result.rows)) if group else [None]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, g in enumerate(groups):
        rows = [r for r in result.rows if group is None or r[group] == g]
        for line in spec["lines"]:
            x_col = line.get("x", spec.get("x"))
            points = _frontier([(_float(r[x_col]), _float(r[line["y"]])) for r in rows])
            label = " ".join(s for s in (g, line.get("label")) if s)
            ax.plot(*zip(*points, strict=True), line.get("style", "-"), marker="o",
                    markersize=3, color=colors[i % len(colors)], label=label)  # fmt: skip
    ax.set_xlabel(spec.get("xlabel", spec.get("x", "recall")))
    ax.set_ylabel(spec.get("ylabel", "queries per second"))
    ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(spec.get("title", result.meta.get("title", name)), fontsize=9)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, metadata={"Software": None})
    plt.close(fig)
    return buffer.getvalue()


def render(root: Path, out: Path, selected: list[str] | None = None) -> list[Path]:
    """Write ``NAME.md`` (and ``NAME.png`` where the result has a plot) for each result of
    ``root`` (or those ``selected``) into ``out``; returns the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name in selected or names(root):
        path = out / f"{name}.md"
        path.write_text(table_markdown(name, root))
        written.append(path)
        if load(name, root).meta.get("plot"):
            png = out / f"{name}.png"
            png.write_bytes(plot_png(name, root))
            written.append(png)
    return written


def publish(selected: list[str], results: Path = RESULTS, published: Path = PUBLISHED) -> None:
    """Copy the runs ``selected`` (CSV and JSON) from ``results`` to ``published``, keeping a
    ``plot`` entry the published copy had."""
    published.mkdir(parents=True, exist_ok=True)
    for name in selected:
        new = load(name, results)
        old = published / f"{name}.json"
        meta = dict(new.meta)
        if old.is_file() and "plot" in json.loads(old.read_text()) and "plot" not in meta:
            meta["plot"] = json.loads(old.read_text())["plot"]
        shutil.copyfile(results / f"{name}.csv", published / f"{name}.csv")
        old.write_text(json.dumps(meta, indent=1, ensure_ascii=False) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.render", description=__doc__.split("\n")[0])
    p.add_argument("names", nargs="*", metavar="NAME", help="results to render (default: all)")
    p.add_argument("--results", type=Path, default=PUBLISHED, help="where the results are")
    p.add_argument("--out", type=Path, default=RESULTS / "rendered", help="where to write")
    p.add_argument(
        "--publish", action="store_true", help="copy the runs NAME from results/ to published/"
    )
    args = p.parse_args(argv)
    try:
        if args.publish:
            if not args.names:
                p.error("--publish needs the names of the runs to publish")
            publish(args.names)
            return 0
        for path in render(args.results, args.out, args.names or None):
            print(path)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
