"""The package's import graph: no cycle (counting imports placed inside functions, which can
hide one), the kernels a leaf, and nothing of the library importing the benchmarks."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: where each installed package's sources live (pyproject's package-dir mapping)
PACKAGES = {"vq": ROOT / "vq", "vq.index": ROOT / "index", "vq.datasets": ROOT / "datasets"}


def _modules() -> dict[str, Path]:
    found = {}
    for package, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((package, *parts))] = path
    return found


def _imported(node: ast.AST, module: str, is_package: bool) -> list[str]:
    """The modules an import statement names (relative imports resolved)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        anchor = module.split(".")
        anchor = anchor if is_package else anchor[:-1]
        anchor = anchor[: len(anchor) - (node.level - 1)]
        base = ".".join([*anchor, base] if base else anchor)
    return [base] + [f"{base}.{alias.name}" for alias in node.names]


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):  # every import, module level or not
            if isinstance(node, ast.Import | ast.ImportFrom):
                for target in _imported(node, name, path.name == "__init__.py"):
                    if target in modules and target != name:
                        graph[name].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _package_imports(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph with each ``__init__`` edge to its own package's modules dropped: a package
    re-exporting its modules is not a cycle with them."""
    return {v: {w for w in targets if not w.startswith(v + ".")} for v, targets in graph.items()}


def test_the_package_has_no_import_cycle():
    cycles = _cycles(_package_imports(_graph()))
    assert not cycles, "import cycles (imports inside functions included):\n" + "\n".join(
        " <-> ".join(c) for c in cycles
    )


def test_the_kernels_import_nothing_of_the_library_above_them():
    graph = _graph()
    for name, targets in graph.items():
        if name.startswith("vq.kernels"):
            above = {t for t in targets if not t.startswith("vq.kernels") and t != "vq._version"}
            assert not above, f"{name} imports {sorted(above)}"


def test_the_library_never_imports_the_benchmarks():
    for name, path in _modules().items():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = _imported(node, name, path.name == "__init__.py")
                assert not any(n == "bench" or n.startswith("bench.") for n in names), name


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
