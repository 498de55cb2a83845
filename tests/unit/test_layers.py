"""The package's imports point down: no import cycles, and no layer imports a higher one.

Every ``import`` and ``from ... import`` in every module counts, wherever it stands: at the
top, inside a function (a deferred import is still a dependency at run time) and under
``if TYPE_CHECKING:`` (a type from a higher layer, or a type-only cycle, ties the design just
the same), with no exception. The implicit
import of a module's parent packages never counts.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = "pyspark_abs"
ROOT = Path(__file__).resolve().parents[2] / PACKAGE

LAYERS: list[tuple[str, ...]] = [
    ("errors",),
    ("faults", "config", "runtime", "session", "logs"),
    ("operators",),
    ("storage",),
    ("manifest",),
    ("sources",),
    ("protocol",),
    ("snapshots",),
    ("upkeep",),
    ("job_ledger",),
    ("install",),
    ("job_actions",),
    ("pipeline",),
    ("job",),
    ("cli", "testing", "examples", "__main__", ""),
]
"""Lowest first: a module may import its own layer and the layers before it.

Each name is a subpackage or a top-level module of ``pyspark_abs``; ``""`` is the package's
``__init__`` (the public API). Within a layer only cycles are refused.
"""


def module_name(path: Path, root: Path = ROOT) -> str:
    """The dotted name of a module file under the package root."""
    parts = [root.name, *path.relative_to(root).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(tree: ast.AST, type_only: bool) -> list[ast.Import | ast.ImportFrom]:
    """The import statements of a module, with or without those under TYPE_CHECKING."""
    found: list[ast.Import | ast.ImportFrom] = []
    pending: list[ast.AST] = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif (
            isinstance(node, ast.If)
            and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
            and not type_only
        ):
            pending.extend(node.orelse)
        else:
            pending.extend(ast.iter_child_nodes(node))
    return found


def import_graph(root: Path = ROOT, *, type_only: bool = True) -> dict[str, set[str]]:
    """Each module of the package and the package modules it imports.

    With ``type_only=False`` the imports under ``if TYPE_CHECKING:`` are left out.
    """
    files = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        is_package = path.name == "__init__.py"
        targets: set[str] = set()
        for node in _imports(ast.parse(path.read_text(), str(path)), type_only):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = name.split(".")[: len(name.split(".")) - node.level + is_package]
                    base = ".".join([*anchor, *([base] if base else [])])
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.add(sub if sub in files else base)
        graph[name] = {t for t in targets if t in files and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles: strongly connected components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def layer(module: str) -> int:
    """The position in :data:`LAYERS` of a module of the package."""
    head = module.split(".")[1] if "." in module else ""
    for position, members in enumerate(LAYERS):
        if head in members:
            return position
    raise AssertionError(f"{module} belongs to no layer: add {head!r} to LAYERS")


def layer_listing(root: Path = ROOT) -> str:
    """The layers as docs/architecture.md lists them: number, folder or module, and its summary."""
    lines = []
    for number, members in enumerate(LAYERS):
        for name in members:
            if name in ("", "__main__"):
                continue
            folder = (root / name).is_dir()
            path = root / name / "__init__.py" if folder else root / f"{name}.py"
            doc = ast.get_docstring(ast.parse(path.read_text())) or ""
            summary = doc.splitlines()[0]
            label = f"{name}/" if folder else f"{name}.py"
            lines.append(f"{number:>2}  {label:<13} {summary}")
    return "\n".join(lines)


def test_the_architecture_document_lists_the_layers() -> None:
    document = (ROOT.parent / "docs" / "architecture.md").read_text()
    assert layer_listing() in document, "regenerate it with tests.unit.test_layers.layer_listing()"


def test_the_package_has_no_import_cycle() -> None:
    assert cycles(import_graph()) == []


def test_no_module_imports_a_higher_layer() -> None:
    upward = [
        f"{module} imports {target}"
        for module, targets in sorted(import_graph().items())
        for target in sorted(targets)
        if layer(target) > layer(module)
    ]
    assert upward == []


def test_the_walk_sees_deferred_and_type_only_imports(tmp_path: Path) -> None:
    root = tmp_path / "pkg"
    (root / "low").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "low" / "__init__.py").write_text("")
    (root / "low" / "a.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from pkg.high import H\n"
        "def f():\n"
        "    from . import b\n"
    )
    (root / "low" / "b.py").write_text("from .a import f\n")
    (root / "high.py").write_text("import pkg.low.a\nH = 1\n")
    graph = import_graph(root)
    assert graph["pkg.low.a"] == {"pkg.high", "pkg.low.b"}
    assert graph["pkg.low.b"] == {"pkg.low.a"}
    assert graph["pkg.high"] == {"pkg.low.a"}
    assert cycles(graph) == [["pkg.high", "pkg.low.a", "pkg.low.b"]]
    assert cycles(import_graph(root, type_only=False)) == [["pkg.low.a", "pkg.low.b"]]


def test_test_modules_import_only_the_test_support() -> None:
    tests = ROOT.parent / "tests"
    graph = {
        module: targets
        for module, targets in import_graph(tests).items()
        if not module.startswith("tests.support")
    }
    crossing = [
        f"{module} imports {target}"
        for module, targets in sorted(graph.items())
        for target in sorted(targets)
        if not target.startswith("tests.support") and target != "tests"
    ]
    assert crossing == []


@pytest.mark.parametrize(
    "module",
    [
        "pyspark_abs.sources.channel.stream",
        "pyspark_abs.sources.files.stream",
        "pyspark_abs.sources.delta.stream",
        # what their readers import when they first read a manifest or a Delta log
        "pyspark_abs.operators.arrow_types",
        "pyspark_abs.storage.schemas",
        "pyspark_abs.storage.store",
    ],
)
def test_the_python_data_sources_load_no_pandas(module: str) -> None:
    """Spark starts a fresh Python process for a streaming Python data source (one per
    stage of a job reading channels) that imports it: pandas would double its start-up."""
    loaded = subprocess.run(
        [sys.executable, "-c", f"import sys, {module}; print('pandas' in sys.modules)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert loaded.stdout.strip() == "False"
