"""The docs' benchmark tables and plots are rendered from result files (bench.render), result
files record their machine (bench.common.write_csv), every table a page names exists, and the
link checker of the built site finds broken links and anchors."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

import bench.common
from bench import render

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "bench_results"
MARKER = re.compile(r"^<!--\s*bench-(table|plot):\s*([\w.-]+)\s*-->[ \t]*$", re.MULTILINE)


def test_a_measured_table_is_formatted_as_the_benches_print_and_captioned_with_its_machine():
    text = render.table_markdown("sweep", FIXTURES)
    lines = text.split("\n")
    assert lines[0] == "| index | param | recall@10 | vq QPS | faiss QPS | vq / faiss |"
    assert lines[1] == "|---|---|---|---|---|---|"
    assert lines[2] == "| IVF64,PQ8 | nprobe=1 | 0.31 | 1.235e+04 | 6000 | 2.058 |"
    assert len([line for line in lines if line.startswith("| IVF64")]) == 4
    caption = lines[-2]
    for part in ("Test CPU 9000 (avx2 kernels)", "2 threads per system", "2026-12-01",
                 "`python -m bench.fastscan --n 1000`", "faiss 1.15.1"):  # fmt: skip
        assert part in caption, caption
    assert "Source" not in caption  # a measured result names no other source


def test_a_transcribed_table_keeps_its_cells_as_written_and_says_where_they_come_from():
    text = render.table_markdown("transcribed", FIXTURES)
    assert "| kind | vq \\| faiss | time |" in text  # a | in a header is escaped
    assert "| HNSW32 | 1.50 | 0.0610 s |" in text  # not reformatted to 1.5 or 0.061
    assert "| IVF1024,Flat | 12,993 (nprobe 48) | 1.000 |" in text
    assert "AMD EPYC (Zen 3, AVX2 only), 2 cores, 2 threads per system; 2026-11-29" in text
    assert "Source: transcribed from README.md at commit c472b89." in text
    assert "A shared machine." in text


def test_the_plot_draws_each_groups_frontier_as_png():
    png = render.plot_png("sweep", FIXTURES)
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 5_000
    points = [(0.31, 12345.0), (0.52, 8000.0), (0.61, 3000.0), (0.60, 1000.0)]
    assert render._frontier(points) == [(0.31, 12345.0), (0.52, 8000.0), (0.61, 3000.0)]
    with pytest.raises(ValueError, match="no 'plot' entry"):
        render.plot_png("transcribed", FIXTURES)


def test_render_writes_every_table_and_plot_and_the_command_line_reports_missing_results(
    tmp_path, capsys
):
    written = render.render(FIXTURES, tmp_path)
    assert sorted(p.name for p in written) == ["sweep.md", "sweep.png", "transcribed.md"]
    assert (tmp_path / "sweep.md").read_text() == render.table_markdown("sweep", FIXTURES)
    assert render.main(["--results", str(FIXTURES), "--out", str(tmp_path), "nothere"]) == 2
    err = capsys.readouterr().err
    assert "no result file" in err and "nothere.csv" in err and "sweep, transcribed" in err


def test_write_csv_records_the_machine_beside_the_csv_and_publish_copies_both(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(bench.common, "RESULTS", tmp_path)
    rows = [{"system": "vq", "seconds": 1.23456789}, {"system": "faiss", "seconds": 2.0}]
    path = bench.common.write_csv("demo", rows, ["system", "seconds"], threads=2, title="t")
    meta = json.loads(path.with_suffix(".json").read_text())
    assert meta["name"] == "demo" and meta["title"] == "t" and meta["source"] == "measured"
    machine = meta["machine"]
    assert machine["threads"] == 2 and machine["cores"] >= 1 and machine["cpu"]
    assert machine["kernels"] in ("avx512", "avx2", "portable")
    assert isinstance(machine["features"], list) and machine["libraries"]["vq"]
    assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", machine["date"])
    published = tmp_path / "published"
    render.publish(["demo"], tmp_path, published)
    table = render.table_markdown("demo", published)
    assert "| vq | 1.235 |" in table and machine["cpu"] in table


def test_every_table_and_plot_the_docs_name_is_published_and_every_published_result_cited():
    pages = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]
    named = {(kind, name) for p in pages for kind, name in MARKER.findall(p.read_text())}
    published = set(render.names())
    assert {name for _, name in named} == published, "results not cited, or citations missing"
    for kind, name in named:
        result = render.load(name)
        for key in ("title", "command", "machine", "source"):
            assert result.meta.get(key), f"{name}.json has no {key}"
        assert result.meta.get("date") or result.meta["machine"].get("date"), name
        assert result.rows and all(len(r) == len(result.columns) for r in result.rows), name
        if kind == "plot":
            assert result.meta.get("plot"), f"{name} is plotted but its JSON has no plot entry"


def _check_links():
    spec = importlib.util.spec_from_file_location("check_links", ROOT / "docs/hooks/check_links.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_link_checker_reports_missing_pages_and_anchors_and_passes_good_links(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "index.html").write_text(
        '<h2 id="top">x</h2><a href="a/">ok</a><a href="a/#sec">ok</a><a href="#top">ok</a>'
        '<a href="https://example.org/x">external</a><img src="a/missing.png">'
        '<a href="a/#nosuch">bad anchor</a><a href="b/">bad page</a>'
    )
    (tmp_path / "a" / "index.html").write_text('<p id="sec"></p><a href="../index.html#top">ok</a>')
    problems = _check_links().broken_links(tmp_path)
    assert len(problems) == 3, problems
    assert any("a/missing.png" in p for p in problems)
    assert any("#nosuch" in p and "no anchor" in p for p in problems)
    assert any("b/" in p and "no file" in p for p in problems)


def test_the_readmes_relative_links_name_files_of_the_repository():
    readme = (ROOT / "README.md").read_text()
    targets = [m[1] for m in re.finditer(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme)]
    local = [t for t in targets if "://" not in t]
    assert len(local) >= 10, local  # the docs links are there
    missing = [t for t in local if not (ROOT / t).exists()]
    assert not missing, f"README links to files that do not exist: {missing}"
