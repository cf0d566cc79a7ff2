"""No import cycle in the package, function-local and type-checking imports included.

A function-local import hides a cycle from Python (the import runs late, so nothing fails) but not from a
reader: two modules that import each other are one module split in two, and neither can be understood,
tested or moved alone. So every ``import muarl...`` / ``from muarl... import`` anywhere in a module (at
module level, in a function, under ``if TYPE_CHECKING``) is an edge here, and the graph's strongly
connected components must all be single modules.

:data:`KNOWN_CYCLES` is the debt left: the components that existed when this test was written and are
not yet broken. It can only shrink: a new cycle fails, and so does an entry that no longer matches a
component (delete it, or write the smaller one that remains).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).parents[1] / "src" / "muarl"

#: components not yet broken (each a set of module names); see the module docstring
KNOWN_CYCLES: set[frozenset[str]] = {
    frozenset({"muarl.domain", "muarl.env", "muarl.users.base"}),
}


def modules(package: Path) -> dict[str, Path]:
    """Every module of ``package`` by dotted name (a package by its own name, for its ``__init__``)."""
    found = {}
    for path in package.rglob("*.py"):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def import_graph(package: Path = PACKAGE) -> dict[str, dict[str, int]]:
    """Each module's imports of the package's modules: the imported module -> the line of its first import.

    ``from muarl.x import y`` is an edge to ``muarl.x.y`` when that is a module, else to ``muarl.x``;
    relative imports are resolved. Imports through ``importlib`` (plugins, bridges, commands by name) are
    not seen: they name modules at run time, not in the code."""
    known = modules(package)
    graph: dict[str, dict[str, int]] = {name: {} for name in known}
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    kept = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(kept + ([node.module] if node.module else []))
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                           for alias in node.names]
            else:
                continue
            for target in targets:
                while target and target not in known:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].setdefault(target, node.lineno)
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph[step]))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


def describe(component: frozenset[str], graph: dict[str, dict[str, int]]) -> str:
    """One component's edges, each with the line of the import, e.g. ``muarl.a:12 -> muarl.b``."""
    edges = [f"{a}:{line} -> {b}" for a in sorted(component)
             for b, line in sorted(graph[a].items()) if b in component]
    return "{" + ", ".join(sorted(component)) + "}: " + "; ".join(edges)


def test_the_package_has_no_new_import_cycle() -> None:
    graph = import_graph()
    found = cycles(graph)
    new = [describe(c, graph) for c in found if c not in KNOWN_CYCLES]
    assert not new, "import cycles (break them by moving the shared piece into a module both import):\n" + \
        "\n".join(new)
    gone = sorted(sorted(c) for c in KNOWN_CYCLES - set(found))
    assert not gone, f"KNOWN_CYCLES lists cycles that no longer exist; remove them: {gone}"


def test_the_graph_sees_function_local_and_type_checking_imports(tmp_path) -> None:
    """The detector itself: a cycle closed by a function-local import and a TYPE_CHECKING one is found and
    named; a relative import and ``from package import module`` are edges too."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg.sub import b\n")
    (package / "sub" / "b.py").write_text("def f():\n    from . import c\n")
    (package / "sub" / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.a\n")
    (package / "d.py").write_text("from .a import x\n")
    graph = import_graph(package)
    assert graph["pkg.a"] == {"pkg.sub.b": 1} and graph["pkg.sub.b"] == {"pkg.sub.c": 2}
    assert graph["pkg.d"] == {"pkg.a": 1}
    assert cycles(graph) == [frozenset({"pkg.a", "pkg.sub.b", "pkg.sub.c"})]
    assert describe(cycles(graph)[0], graph) == \
        "{pkg.a, pkg.sub.b, pkg.sub.c}: pkg.a:1 -> pkg.sub.b; pkg.sub.b:2 -> pkg.sub.c; pkg.sub.c:3 -> pkg.a"


def test_no_engine_imports_the_trainer() -> None:
    """Inference does not know training (docs/architecture.md, "Orchestrator, trainer, inference"): no module
    under ``policies/`` imports one under ``train/``, at any depth; the trainer hands an engine the weights."""
    graph = import_graph()
    arrows = [f"{a}:{line} -> {b}" for a, targets in sorted(graph.items()) if a.startswith("muarl.policies")
              for b, line in sorted(targets.items()) if b == "muarl.train" or b.startswith("muarl.train.")]
    assert not arrows, "engines importing the trainer:\n" + "\n".join(arrows)
