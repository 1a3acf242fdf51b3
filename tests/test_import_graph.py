"""The package's imports, read from the source (every ``import``, also those inside functions): the local labs,
the workloads and the plan form no cycle, and the small modules below the labs import no lab."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
# cycles elsewhere in the package are being broken separately (issue 17); these parts must stay free of any
CYCLE_FREE = ("pglab.targets.local", "pglab.workloads", "pglab.plan", "pglab.units", "pglab.errors")
BELOW_THE_LABS = ("pglab.units", "pglab.errors", "pglab.targets.local.registry", "pglab.targets.local.leftovers",
                  "pglab.targets.local.procs", "pglab.targets.local.cgroups", "pglab.targets.local.toxiproxy",
                  "pglab.targets.local.limits", "pglab.targets.local.lab_base", "pglab.workloads.fio")
LABS = ("pglab.targets.local.cluster", "pglab.targets.local.ha")


def _graph() -> dict[str, set[str]]:
    files = {}
    for f in SRC.rglob("*.py"):
        name = ".".join(f.relative_to(SRC).with_suffix("").parts)
        files[name.removesuffix(".__init__")] = f
    graph: dict[str, set[str]] = {}
    for name, f in files.items():
        package = name if f.name == "__init__.py" else name.rsplit(".", 1)[0]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                module = node.module or ""
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    module = ".".join([*base, *([module] if module else [])])
                deps |= {f"{module}.{a.name}" if f"{module}.{a.name}" in files else module for a in node.names}
        graph[name] = {d for d in deps if d in files and d != name}
    return graph


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for dep in graph[todo.pop()]:
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen


def test_the_graph_sees_imports() -> None:
    graph = _graph()  # a walker that found nothing would pass every check below
    assert "pglab.targets.local.registry" in graph["pglab.targets.local.cluster"]
    assert "pglab.units" in graph["pglab.workloads.fio"]


def test_no_cycle_through_the_labs_the_workloads_or_the_plan() -> None:
    graph = _graph()
    cycles = sorted(m for m in graph if m.startswith(CYCLE_FREE) and m in _reachable(graph, m))
    assert cycles == [], f"these modules import themselves through others: {cycles}"


def test_the_modules_below_the_labs_import_no_lab() -> None:
    graph = _graph()
    wrong = {m: sorted(_reachable(graph, m) & set(LABS)) for m in BELOW_THE_LABS}
    assert all(not labs for labs in wrong.values()), wrong
