"""``_`` means private: no module reaches into an underscored name of another package.

The rule, checked on the sources of vq/, index/ and datasets/ (AST, nothing imported):

- ``self._x``, ``cls._x`` and ``super()._x`` are always fine: an object's own members, inside
  its class hierarchy (a subclass extending a hook of its base).
- ``obj._x`` on anything else is fine only where ``_x`` is *package-private* to the accessing
  module's package (its folder): introduced there — a module-level name, or a class member
  (in the class body, or ``self._x = ...`` in its methods) that no base class defines already.
  An override belongs to the package of the class that introduced the hook: kinds in other
  packages override ``Index._search_rows`` and call it on ``self``, but only ``vq/index/core``
  calls it on another index; what one package needs of another's objects is a public,
  documented method. A name the library does not introduce at all is another library's
  private API (torch's, numba's): refused too, unless it is in :data:`ALLOWED` with its
  reason. (Names are matched, not types: a name two packages introduce independently is
  each one's.)
- ``from m import _x`` is fine only where ``m`` is in the importing module's package (the same
  folder); importing an underscored *module* (``from vq import _cpu``) is fine: such modules
  are private to the library, not to a package.
- ``vq/kernels`` counts as one package: the numba kernels are one leaf layer whose subpackages
  share njit helpers (templates specialised from source import them); nothing above the
  kernels may use those helpers. ``vq/kernels/jit/numba_compat.py``, the one door to numba's
  private API, is not scanned.
- Dunder names (``__dict__``) are not private, nor are namedtuple's documented ``_replace``,
  ``_asdict``, ``_fields`` and ``_make``, nor ``os._exit``.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREES = ("vq", "index", "datasets")
#: files not scanned: the one module that holds every use of numba's private API
EXEMPT = {"vq/kernels/jit/numba_compat.py"}
#: public API with a leading underscore (namedtuple's methods, os._exit)
PUBLIC = {"_replace", "_asdict", "_fields", "_make", "_exit"}
#: other libraries' private API that the library uses on purpose: (file or "*", name) -> why
ALLOWED = {
    ("*", "_version"): "torch.Tensor._version, the in-place version counter that keeps derived "
    "arrays fresh: torch has no public name for it",
    ("vq/_tree_cache.py", "_buffers"): "torch.nn.Module's live tables, held to check the tree "
    "by identity on every lean call (no public API returns the tables themselves)",
    ("vq/_tree_cache.py", "_parameters"): "as _buffers",
    ("vq/_tree_cache.py", "_modules"): "as _buffers",
    ("vq/export/compiled.py", "_dynamo"): "torch._dynamo.reset and its counters: how torch "
    "documents counting recompilations",
    ("vq/export/onnx.py", "_constants"): "torch.onnx's exporter table, built once per process, "
    "with a fallback to the public torch.onnx.export when its internals differ",
    ("vq/export/onnx.py", "_core"): "as _constants",
    ("vq/export/onnx.py", "_registration"): "as _constants",
    ("vq/kernels/common/simd.py", "_getvalue"): "numba's cgutils struct proxy: how an "
    "@intrinsic reads the LLVM value it built",
}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and name not in PUBLIC


def _files() -> dict[str, Path]:
    found = {}
    for tree in TREES:
        for path in sorted((ROOT / tree).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel not in EXEMPT:
                found[rel] = path
    return found


def _package(rel: str) -> str:
    """The folder that a file's private names are shared within (vq/kernels as one)."""
    folder = rel.rsplit("/", 1)[0]
    return "vq/kernels" if folder.startswith("vq/kernels") else folder


def _module_folder(module: str) -> str | None:
    """The source folder of a module imported by name (None: not the library's)."""
    parts = module.split(".")
    if parts[:2] == ["vq", "index"]:
        parts = ["index", *parts[2:]]
    elif parts[:2] == ["vq", "datasets"]:
        parts = ["datasets", *parts[2:]]
    elif parts[0] not in ("vq", "index", "datasets"):
        return None
    path = ROOT.joinpath(*parts)
    if path.is_dir():
        return _package(path.relative_to(ROOT).as_posix() + "/__init__.py")
    return _package(path.relative_to(ROOT).as_posix() + ".py")


def _class_members(cls: ast.ClassDef) -> set[str]:
    """The private names a class defines: in its body, and as ``self._x = ...`` in its
    methods."""
    names = set()
    for node in cls.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    for node in ast.walk(cls):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            if _own(node.value):
                names.add(node.attr)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "register_buffer":
            if node.args and isinstance(node.args[0], ast.Constant):
                names.add(str(node.args[0].value))
    return {n for n in names if _private(n)}


def _owners(trees: dict[str, ast.Module]) -> dict[str, set[str]]:
    """Each private name -> the packages that introduce it: module-level names, and class
    members that no base class (found by name: the same file first, then anywhere) defines
    already (an override of a hook belongs to the package of the class that introduced it)."""
    classes: dict[str, list[tuple[str, ast.ClassDef]]] = defaultdict(list)
    members: dict[int, set[str]] = {}
    owners: dict[str, set[str]] = defaultdict(set)
    for rel, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                classes[node.name].append((rel, node))
                members[id(node)] = _class_members(node)
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names = [node.name]
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = [t.id for t in targets if isinstance(t, ast.Name)]
            else:
                continue
            for name in names:
                if _private(name):
                    owners[name].add(_package(rel))

    def base_classes(rel: str, cls: ast.ClassDef) -> list[ast.ClassDef]:
        found = []
        for base in cls.bases:
            name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", None)
            same = [c for r, c in classes.get(name, ()) if r == rel and c is not cls]
            found += same or [c for r, c in classes.get(name, ()) if c is not cls][:1]
        return found

    def inherited(rel: str, cls: ast.ClassDef, seen: set[int]) -> set[str]:
        names: set[str] = set()
        for base in base_classes(rel, cls):
            if id(base) not in seen:
                seen.add(id(base))
                base_rel = next(r for r, c in classes[base.name] if c is base)
                names |= members[id(base)] | inherited(base_rel, base, seen)
        return names

    for name_classes in classes.values():
        for rel, cls in name_classes:
            above = inherited(rel, cls, {id(cls)})
            for name in members[id(cls)] - above:
                owners[name].add(_package(rel))
    return owners


def _own(node: ast.AST) -> bool:
    """``self``, ``cls`` or ``super()``."""
    if isinstance(node, ast.Name):
        return node.id in ("self", "cls")
    return (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"
    )


def _is_module(module: str, name: str) -> bool:
    folder = _module_folder(f"{module}.{name}")
    if folder is None:
        return False
    parts = f"{module}.{name}".split(".")
    if parts[:2] in (["vq", "index"], ["vq", "datasets"]):
        parts = [parts[1], *parts[2:]]
    path = ROOT.joinpath(*parts)
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _absolute(node: ast.ImportFrom, rel: str) -> str:
    if not node.level:
        return node.module or ""
    parts = rel.removesuffix(".py").split("/")
    parts = parts[: len(parts) - node.level]
    if parts[0] == "index":
        parts = ["vq", *parts]
    elif parts[0] == "datasets":
        parts = ["vq", *parts]
    return ".".join([*parts, *([node.module] if node.module else [])])


def violations() -> list[str]:
    files = _files()
    trees = {rel: ast.parse(path.read_text(), filename=rel) for rel, path in files.items()}
    owners = _owners(trees)
    found = []
    for rel, tree in trees.items():
        package = _package(rel)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _private(node.attr) and not _own(node.value):
                if package in owners.get(node.attr, ()):
                    continue
                if ("*", node.attr) in ALLOWED or (rel, node.attr) in ALLOWED:
                    continue
                where = sorted(owners.get(node.attr, ())) or ["no package of the library"]
                found.append(
                    f"{rel}:{node.lineno}: {ast.unparse(node)} (defined in {', '.join(where)})"
                )
            elif isinstance(node, ast.ImportFrom):
                module = _absolute(node, rel)
                for alias in node.names:
                    if not _private(alias.name) or _is_module(module, alias.name):
                        continue
                    if (rel, alias.name) in ALLOWED:
                        continue
                    if _module_folder(module) != package:
                        found.append(f"{rel}:{node.lineno}: from {module} import {alias.name}")
    return found


def test_no_module_reaches_into_another_packages_private_names():
    found = violations()
    assert not found, "private names used across packages:\n" + "\n".join(found)


def test_the_scan_finds_a_private_access_and_a_private_import(tmp_path, monkeypatch):
    a, b = tmp_path / "index" / "a", tmp_path / "index" / "b"
    a.mkdir(parents=True)
    b.mkdir()
    (a / "one.py").write_text("class A:\n    def _hook(self):\n        return self._hook\n")
    (b / "two.py").write_text(
        "from vq.index.a.one import _helper\nfrom vq import _cpu\n\n"
        "class B(A):\n    def _hook(self):\n        self._same = 1\n\n"
        "def f(x):\n    return x._hook(), x._same, x._replace(), x.__dict__, x._torch\n"
    )
    (tmp_path / "vq").mkdir()
    (tmp_path / "vq" / "_cpu.py").write_text("")
    (a / "three.py").write_text("def h(x):\n    return x._hook()\n")
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    monkeypatch.setitem(globals(), "TREES", ("index",))
    found = violations()
    assert sorted(f.split(": ", 1)[1] for f in found) == [
        "from vq.index.a.one import _helper",
        "x._hook (defined in index/a)",
        "x._torch (defined in no package of the library)",
    ]
