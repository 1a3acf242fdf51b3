"""The plan reference (docs/plan.md, issue 20): every field described, the page what the generator writes today,
and every environment variable pglab reads named in it. Nothing here starts a server."""

from __future__ import annotations

import ast

import pytest
from pydantic import BaseModel

from conftest import REPO, pglab
from pglab.plan import reference
from pglab.plan.schema import Plan

DOC = REPO / "docs" / "plan.md"
SRC = REPO / "src" / "pglab"


def test_every_field_has_a_description() -> None:
    missing = reference.undescribed()
    assert not missing, f"fields without a description in src/pglab/plan/schema/: {', '.join(missing)}"


def test_undescribed_finds_a_field_without_description(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above can fail: take one description away and it is named."""
    field = Plan.model_fields["probes"]
    monkeypatch.setattr(field, "description", None)
    assert reference.undescribed() == ["probes"]


def test_every_field_is_listed() -> None:
    """Each model's fields reach the reference: count them by walking the models the plan holds."""
    paths = [r.path for r in reference.rows()]
    assert len(paths) == len(set(paths))
    for expected in ("name", "target.local.resources.write_iops", "target.kubernetes.storage.class",
                     "matrix.workload[].scripts[].weight", "matrix.scenario[].max_rate", "run.repeats.target_ci",
                     "tenants.arrangements[].tiers[].resources.cpus", "cost.breakdown"):
        assert expected in paths


def test_types_and_defaults_are_the_schemas() -> None:
    row = {r.path: r for r in reference.rows()}
    assert (row["run.warmup"].type, row["run.warmup"].default) == ("duration", "`0.0`")
    assert (row["storage.size"].type, row["storage.size"].default) == ("size", '`"1GiB"`')
    assert row["target.external.conninfo"].default == "required"
    assert row["target"].default == '`{"local": {}}`'
    assert row["run.order"].type == "one of `interleaved`, `sequential`"
    assert row["matrix.cpus"].type == "list of number or null"


def test_docs_plan_md_is_what_the_generator_writes() -> None:
    """docs/plan.md never goes stale: regenerate it with `pglab plan reference > docs/plan.md`."""
    assert DOC.read_text() == reference.markdown(), "docs/plan.md is stale: run pglab plan reference > docs/plan.md"


def test_the_command_prints_the_reference() -> None:
    proc = pglab("plan", "reference", check=True)
    assert proc.stdout == reference.markdown()


def _env_reads(tree: ast.AST) -> set[str]:
    """Names read through os.environ.get / os.environ[...] / os.getenv / "X" in os.environ, as literal strings."""
    def is_environ(node: ast.AST) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "environ") or (
            isinstance(node, ast.Name) and node.id == "environ")

    names: set[str] = set()
    for node in ast.walk(tree):
        key: ast.AST | None = None
        if isinstance(node, ast.Call) and node.args:
            f = node.func
            environ_method = isinstance(f, ast.Attribute) and (
                (f.attr in ("get", "pop", "setdefault") and is_environ(f.value)) or f.attr == "getenv")
            if environ_method or (isinstance(f, ast.Name) and f.id == "getenv"):
                key = node.args[0]
        elif isinstance(node, ast.Subscript) and is_environ(node.value):
            key = node.slice
        elif isinstance(node, ast.Compare) and any(is_environ(c) for c in node.comparators):
            key = node.left
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            names.add(key.value)
        elif key is not None:
            raise AssertionError(f"an environment variable read by a computed name ({ast.unparse(node)}): name it "
                                 "literally so that this test can check it is documented")
    return names


def test_env_reads_are_found() -> None:
    code = ('import os\nfrom os import environ, getenv\nos.environ.get("A")\nos.environ["B"]\nos.getenv("C")\n'
            'getenv("D")\n"E" in os.environ\nenviron.get("F", "")\n{**os.environ}\n')
    assert _env_reads(ast.parse(code)) == {"A", "B", "C", "D", "E", "F"}


def test_every_environment_variable_read_is_documented() -> None:
    read: dict[str, list[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        for name in _env_reads(ast.parse(path.read_text(), str(path))):
            read.setdefault(name, []).append(str(path.relative_to(REPO)))
    assert {"PGLAB_STATE_DIR", "PGLAB_PG_BINDIR", "PGLAB_RUN_AS", "PGLAB_TOXIPROXY"} <= set(read)  # the scan works
    undocumented = {name: where for name, where in read.items() if name not in reference.ENVIRONMENT}
    assert not undocumented, f"read in src/ but not in reference.ENVIRONMENT (docs/plan.md): {undocumented}"
    text = DOC.read_text()
    assert all(f"| `{name}` |" in text for name in read)


def test_models_reach_the_reference_only_through_the_plan() -> None:
    """A model class the schema defines but the plan never holds would escape the description check."""
    import importlib
    import pkgutil

    from pglab.plan import schema

    reached = {model for _, model in _walk(Plan)}
    parts = [importlib.import_module(f"{schema.__name__}.{m.name}") for m in pkgutil.iter_modules(schema.__path__)]
    assert len(parts) > 5  # the grammar's modules, one per domain
    defined = {v for part in parts for v in vars(part).values() if isinstance(v, type) and issubclass(v, BaseModel)
               and v.__module__ == part.__name__ and v.__name__ != "Strict"}
    assert Plan in defined and defined - reached == set()


def _walk(model: type[BaseModel]) -> list[tuple[str, type[BaseModel]]]:
    found = [("", model)]
    for field in model.model_fields.values():
        for _, sub in reference._models(field.annotation):
            found += _walk(sub)
    return found
