"""The package's import graph: no cycles, and every module imports only its own layer or the layers below.

The layers follow the data flow of a sweep: the plan → what measures (probes, workloads) → where it runs (targets,
scenarios) → what a run returns (engine.types, engine.driver) → one driver per target → the store → the engine
that records → analysis → report → the command line. So, among others: targets never import the engine or a
driver; nothing below the engine imports the store (the recorder is the only writer of runs); analysis never
imports report. A new module must be given a layer here.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"

# (module or package prefix, layer): the longest matching prefix decides
LAYERS: list[tuple[str, int]] = [
    ("pglab", 0), ("pglab.errors", 0), ("pglab.units", 0), ("pglab.metrics", 0), ("pglab.artifacts", 0),
    ("pglab.extras", 0), ("pglab.interrupts", 0),
    ("pglab.plan", 1),
    ("pglab.probes", 2), ("pglab.workloads", 2), ("pglab.environment", 2),
    # below what measures: endpoints (what pgbench connects to), and the bookkeeping of the processes, cgroups and
    # files pglab starts (fio's scratch files are registered too, so a killed pglab's are reaped)
    ("pglab.targets.base", 2), ("pglab.targets.local.registry", 2), ("pglab.targets.local.leftovers", 2),
    ("pglab.targets.local.procs", 2), ("pglab.targets.local.cgroups", 2), ("pglab.targets.local.removal", 2),
    ("pglab.targets", 3), ("pglab.scenarios", 3),
    ("pglab.engine.types", 4), ("pglab.engine.driver", 4),
    ("pglab.drivers", 5), ("pglab.storage", 5),
    ("pglab.preflight", 5),  # what a plan needs from the host, asked of the targets' finders before a driver exists
    ("pglab.store", 6),
    ("pglab.engine", 7),
    ("pglab.analysis", 8), ("pglab.analysis.stats", 0),  # pure statistics: the engine's adaptive repeats use it
    ("pglab.report", 9),
    ("pglab.cli", 10), ("pglab.cluster_cli", 10), ("pglab.__main__", 10),
]


def modules() -> dict[str, Path]:
    out = {}
    for f in (SRC / "pglab").rglob("*.py"):
        parts = list(f.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = f
    return out


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The pglab modules ``name`` imports, anywhere in it (also inside functions and TYPE_CHECKING blocks)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            for a in node.names:
                found.add(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base)
    return {m for m in found if m in known and m != name}


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imports(name, path, known) for name, path in mods.items()}


def layer(module: str) -> int | None:
    matches = [(len(prefix), rank) for prefix, rank in LAYERS if module == prefix or module.startswith(prefix + ".")]
    return max(matches)[1] if matches else None


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return found


def test_the_walk_sees_the_imports_it_must() -> None:
    """The checks below are only as good as the graph: it holds the package and edges known to exist."""
    g = graph()
    assert len(g) > 40
    assert "pglab.engine.sweep" in g["pglab.cli"] or "pglab.engine.sweep" in set().union(*g.values())
    assert "pglab.store.sqlite" in g["pglab.engine.recorder"]
    assert "pglab.engine.types" in g["pglab.drivers.local"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles() -> None:
    assert cycles(graph()) == []


def test_every_module_has_a_layer() -> None:
    assert [m for m in graph() if layer(m) is None] == []


def test_no_module_imports_a_layer_above_its_own() -> None:
    g = graph()
    upward = [f"{m} (layer {layer(m)}) imports {d} (layer {layer(d)})" for m, deps in sorted(g.items())
              for d in sorted(deps) if (layer(d) or 0) > (layer(m) or 0)]
    assert upward == []


@pytest.mark.parametrize(("below", "never"), [
    ("pglab.targets", "pglab.engine"), ("pglab.targets", "pglab.drivers"), ("pglab.targets", "pglab.store"),
    ("pglab.drivers", "pglab.store"), ("pglab.drivers", "pglab.engine.sweep"),
    ("pglab.drivers", "pglab.engine.recorder"), ("pglab.engine", "pglab.drivers"), ("pglab.engine", "pglab.targets"),
    ("pglab.analysis", "pglab.report"), ("pglab.report", "pglab.drivers"), ("pglab.report", "pglab.engine"),
    # the dataset's building blocks: a load needs no copy, a copy no snapshot
    ("pglab.targets.local.dataset.load", "pglab.targets.local.dataset.copytree"),
    ("pglab.targets.local.dataset.load", "pglab.targets.local.dataset.snapshots"),
    ("pglab.targets.local.dataset.copytree", "pglab.targets.local.dataset.snapshots"),
])
def test_layering_rules(below: str, never: str) -> None:
    """The rules the layers exist for, spelled out (the layer table could be edited into allowing them)."""
    g = graph()
    offenders = [f"{m} imports {d}" for m, deps in sorted(g.items()) if m == below or m.startswith(below + ".")
                 for d in sorted(deps) if d == never or d.startswith(never + ".")]
    if below == "pglab.engine":  # the exchange types are the drivers' and the engine's alike
        offenders = [o for o in offenders if not o.startswith(("pglab.engine.types ", "pglab.engine.driver "))]
    assert offenders == []


def test_only_the_recorder_and_readers_open_the_store() -> None:
    """Runs are written by the engine's recorder alone; report, analysis and the CLI read."""
    g = graph()
    users = sorted(m for m, deps in g.items() if any(d.startswith("pglab.store") for d in deps)
                   and not m.startswith("pglab.store"))
    allowed = ("pglab.engine.recorder", "pglab.engine.sweep", "pglab.report", "pglab.analysis", "pglab.cli")
    assert [m for m in users if not m.startswith(allowed)] == []


STORE_WRITES = {"begin_sweep", "reopen_sweep", "recover", "set_sweep_info", "end_sweep", "add_points", "start_run",
                "finish_run", "add_events", "save_fio"}


def store_writes(path: Path) -> list[str]:
    """Calls of the store's writing methods in a module: ``x.finish_run(…)`` where ``x`` is not a module it
    imported (``pgbench.finish_run`` is pgbench's own function)."""
    tree = ast.parse(path.read_text())
    modules = {a.asname or a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    modules |= {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    return [f"{path.name}:{n.lineno} .{n.func.attr}()" for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in STORE_WRITES
            and not (isinstance(n.func.value, ast.Name) and n.func.value.id in modules)]


def test_the_recorder_is_the_only_writer_of_the_store() -> None:
    mods = modules()
    assert store_writes(mods["pglab.engine.recorder"])  # the check sees the writes that are there
    writers = {m: w for m, p in sorted(mods.items()) if not m.startswith("pglab.store")
               and m != "pglab.engine.recorder" and (w := store_writes(p))}
    assert writers == {}


LABS = {"pglab.targets.local.cluster", "pglab.targets.local.ha"}
BELOW_THE_LABS = ["pglab.units", "pglab.errors", "pglab.targets.local.registry", "pglab.targets.local.leftovers",
                  "pglab.targets.local.procs", "pglab.targets.local.cgroups", "pglab.targets.local.removal",
                  "pglab.targets.local.toxiproxy",
                  "pglab.targets.local.limits", "pglab.targets.local.lab_base", "pglab.workloads.fio"]


def reachable(g: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        for dep in g[todo.pop()] - seen:
            seen.add(dep)
            todo.append(dep)
    return seen


@pytest.mark.parametrize("module", BELOW_THE_LABS)
def test_what_the_labs_are_made_of_reaches_no_lab(module: str) -> None:
    """The registry cleans a lab a killed pglab left from its lab.json alone (leftovers), so cleaning never loads a
    lab's code, and the labs' parts can be used without them."""
    g = graph()
    assert "pglab.targets.local.registry" in g["pglab.targets.local.cluster"]  # the walk sees the labs' imports
    assert {d for d in reachable(g, module) if any(d == lab or d.startswith(lab + ".") for lab in LABS)} == set()


# what a measured run is made of, by the functions that do it on some target
RUN_PARTS = {
    "load": {"_pgbench_once", "_all_at_once", "run_job", "run_load_job", "finish_job", "through_scenario"},
    "probes": {"Sampler", "close_window", "_scraper", "_node_scrapes"},
    "summary": {"pgbench_metrics", "finish_run", "collect", "one_pod", "load_pods"},
}


def hand_written_runs(source: str, where: str) -> list[str]:
    """Functions that call a load, the probes and a summary themselves: a measured run written outside the engine's
    skeleton (``pglab.engine.run.measure``), which calls each target's steps in one order."""
    found = []
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        called = {n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", "")
                  for n in ast.walk(fn) if isinstance(n, ast.Call)}
        if all(called & names for names in RUN_PARTS.values()):
            found.append(f"{where}:{fn.lineno} {fn.name}()")
    return found


def test_the_measured_run_is_written_once_in_the_engine() -> None:
    """No driver calls the load, the probes and the summary in sequence itself (issue 30): each supplies the steps
    of its target's run, and the engine's skeleton runs them (its order: tests/test_engine.py)."""
    hand_written = ("def one_run(self):\n    sampler = Sampler([])\n    proc = self._pgbench_once()\n"
                    "    close_window(sampler, 1)\n    return pgbench_metrics(finish_run(proc))\n")
    assert hand_written_runs(hand_written, "example") == ["example:1 one_run()"]  # the check sees one
    mods = modules()
    drivers = {m: p for m, p in mods.items() if m.startswith(("pglab.drivers", "pglab.targets", "pglab.scenarios"))}
    assert len(drivers) > 20
    assert [f for m, p in sorted(drivers.items()) for f in hand_written_runs(p.read_text(), m)] == []


# a third of pglab's start-up once (psycopg a fifth of the rest): only reading logs and stores, and servers, need them
HEAVY = ("numpy", "polars", "scipy", "psycopg", "scipy.stats")


def heavy_imported(statement: str) -> list[str]:
    """The heavy libraries in sys.modules after ``statement``, in a fresh interpreter."""
    code = f"import sys\n{statement}\nprint(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return out.split()


def test_the_command_line_starts_without_numpy_polars_scipy_or_psycopg() -> None:
    """`pglab --help`, a plan's errors and every other command start without numpy, polars, scipy or psycopg (issue
    32: the tests start pglab hundreds of times); the commands that read logs or stores, or reach a server, import
    them when they do."""
    assert heavy_imported("import pglab.workloads.txlog") == ["numpy"]  # the check sees them; the logs need no polars
    assert "polars" in heavy_imported("import pglab.report.export")
    assert heavy_imported("import pglab.cli") == []
    # the Kubernetes driver loads the log summary's beside the Cluster's start (a thread), not before asking for it
    assert not {"numpy", "polars"} & set(heavy_imported("import pglab.drivers.kubernetes"))
    # a run's statistics: scipy's t quantile when there are repeats to spread, not before
    assert "scipy" not in heavy_imported("import pglab.engine.sweep\nfrom pglab.analysis.stats import estimate\n"
                                         "estimate([1.0])")
    assert "scipy" in heavy_imported("from pglab.analysis.stats import estimate\nestimate([1.0, 2.0])")
    # …and then scipy.special's function only: scipy.stats costs a second more at the end of every sweep
    assert "scipy.stats" not in heavy_imported("from pglab.analysis.stats import contrast\n"
                                               "from pglab.analysis.noise import noise_floor\n"
                                               "contrast([1.0, 2.0, 3.5], [2.0, 3.0, 5.0])")


def test_no_test_module_imports_another() -> None:
    """What tests share lives in the support modules (conftest, helpers, k8s_support, kube_lab_support, pg_server):
    a test module importing another runs that module's fixtures and module-level code where it is not meant to."""
    tests = Path(__file__).resolve().parent
    found = []
    for f in sorted(tests.glob("test_*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{f.name} imports {n}" for n in names if n.split(".")[0].startswith("test_")]
    assert found == []
