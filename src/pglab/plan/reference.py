"""The plan reference (docs/plan.md), generated from the schema so that it cannot drift from what is validated.

``pglab plan reference`` prints it; tests/test_plan_reference.py fails when a field has no description, when the
committed page differs from this output, or when pglab reads an environment variable ``ENVIRONMENT`` omits."""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, BeforeValidator, PlainValidator
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from pglab.plan.schema import Plan, base, kubernetes, run

# Every environment variable pglab itself reads (libraries read their own: libpq's PG*, KUBECONFIG …).
ENVIRONMENT: dict[str, str] = {
    "PGLAB_STATE_DIR": "where pglab keeps its registry of local labs (kept, in use, or left behind by a pglab that "
                       "died); default `$XDG_STATE_HOME/pglab`",
    "XDG_STATE_HOME": "base of the default state folder when PGLAB_STATE_DIR is not set; default `~/.local/state`",
    "PGLAB_PG_BINDIR": "PostgreSQL's bin directory when the plan names none (`target.local.bindir`, "
                       "`target.external.bindir`); default: the newest `/usr/lib/postgresql/*/bin`, else `PATH`",
    "PGLAB_RUN_AS": "as root, the unprivileged user the local servers run as when the plan names none "
                    "(`target.local.run_as`); default `postgres`",
    "PGLAB_PLAN_USER": "as root, the unprivileged user the plan's code (pgbench, a custom script's `\\shell`) runs as "
                       "on a local lab; default `pglab-run`, which `./setup.sh` creates",
    "PGLAB_TOXIPROXY": "the `toxiproxy-server` executable that shapes replication links (`target.local.network`); "
                       "default: the one `./setup.sh install toxiproxy` builds into `.tools/bin`",
    "PGLAB_CACHE_DIR": "where the dataset cache keeps loaded datasets for later labs (`dataset.cache`, `pglab cache "
                       "list|clean`); default `$XDG_CACHE_HOME/pglab/datasets`",
    "XDG_CACHE_HOME": "base of the default dataset cache folder when PGLAB_CACHE_DIR is not set; default `~/.cache`",
    "PGLAB_CACHE": "`off` turns the dataset cache off for every plan (as `dataset.cache: false` does for one); "
                   "default `on`",
    "PGLAB_CACHE_SIZE": "the dataset cache's cap (a size such as `20GiB`): least recently used entries are evicted "
                        "to make room, a dataset larger than it is not kept; default `20GiB`",
    "PGPASSFILE": "libpq password file of an external server when `target.external.passfile` is not set; default "
                  "`~/.pgpass`",
    "COLUMNS": "terminal width for `pglab report` and `compare` tables (a number); default: the terminal's, or 120 "
               "when piped",
}

_TYPE_OF_VALIDATOR: dict[Any, str] = {base._seconds: "duration", base._size: "size", run._percent: "percentage",
                      kubernetes._cpu: "cores", base._plan_file: "file (relative to the plan)",
                      base._sync_level: "synchronous_commit level", base._positive_int: "integer",
                      base._param_value: "text, number or boolean"}


@dataclass(frozen=True)
class Row:
    """One field of the plan: its dotted path (``[]`` for a list item, ``<name>`` for a mapping key)."""

    path: str
    type: str
    default: str
    description: str


def _strip(annotation: Any) -> tuple[Any, str | None]:
    """The annotation without ``Annotated``, and the name of the value it validates when a validator says."""
    named = None
    while typing.get_origin(annotation) is typing.Annotated:
        for meta in annotation.__metadata__:
            if isinstance(meta, BeforeValidator | PlainValidator):
                named = named or _TYPE_OF_VALIDATOR.get(meta.func)
        annotation = typing.get_args(annotation)[0]
    return annotation, named


def _is_union(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (typing.Union, types.UnionType)


def _type(annotation: Any) -> str:
    annotation, named = _strip(annotation)
    if named:
        return named
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return "one of " + ", ".join(f"`{v}`" for v in typing.get_args(annotation))
    if _is_union(annotation):
        parts = [a for a in typing.get_args(annotation) if a is not type(None)]
        text = " or ".join(_type(a) for a in parts)
        return text + (" or null" if len(parts) < len(typing.get_args(annotation)) else "")
    if origin is list:
        return "list of " + _type(typing.get_args(annotation)[0])
    if origin is dict:
        key, value = typing.get_args(annotation)
        return f"mapping of {_type(key)} to {_type(value)}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "mapping"
    return {int: "integer", float: "number", str: "text", bool: "boolean"}.get(annotation, str(annotation))


def _field_type(field: FieldInfo) -> str:
    """pydantic moves a field's outer ``Annotated`` metadata to ``field.metadata``: its validator names the type."""
    for meta in field.metadata:
        if isinstance(meta, BeforeValidator | PlainValidator) and meta.func in _TYPE_OF_VALIDATOR:
            return _TYPE_OF_VALIDATOR[meta.func]
    return _type(field.annotation)


def _models(annotation: Any) -> Iterator[tuple[str, type[BaseModel]]]:
    """The models a field holds, each with the path suffix that reaches its fields."""
    annotation, _ = _strip(annotation)
    origin = typing.get_origin(annotation)
    if _is_union(annotation):
        for a in typing.get_args(annotation):
            yield from _models(a)
    elif origin is list:
        for suffix, model in _models(typing.get_args(annotation)[0]):
            yield "[]" + suffix, model
    elif origin is dict:
        for suffix, model in _models(typing.get_args(annotation)[1]):
            yield ".<name>" + suffix, model
    elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield "", annotation


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json", by_alias=True, exclude_defaults=True)
    elif value is not None and not isinstance(value, str | int | float | bool | list | dict):
        value = str(value)
    text = json.dumps(value, ensure_ascii=False, default=str)
    return "`" + ("null" if value is None else text) + "`"


def rows(model: type[BaseModel] = Plan, prefix: str = "") -> Iterator[Row]:
    """Every field under ``model``, depth first, in the schema's order."""
    for name, field in model.model_fields.items():
        path = prefix + (field.alias or name)
        yield Row(path, _field_type(field), _default(field), (field.description or "").strip())
        for suffix, sub in _models(field.annotation):
            yield from rows(sub, f"{path}{suffix}.")


def undescribed() -> list[str]:
    """Paths of the fields without a description (the reference would have an empty cell for each)."""
    return [r.path for r in rows() if not r.description]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown() -> str:
    """docs/plan.md: one table per top-level section of the plan, then the environment variables."""
    lines = ["# Plan reference", "",
             "<!-- Generated by `pglab plan reference` from src/pglab/plan/schema/: edit the schema's descriptions, "
             "then run `pglab plan reference > docs/plan.md` (tests/test_plan_reference.py checks it). -->", "",
             "A plan is one YAML file; unknown fields are refused. `pglab plan validate PLAN` checks one, `pglab plan "
             "schema` prints the JSON Schema for editors, and `examples/` holds complete plans. Paths below are "
             "dotted; `[]` is an item of a list, `<name>` a key of a mapping. Durations are seconds or text such as "
             "`30s`, `2m`, `500ms`; sizes are bytes or text with a binary unit such as `256MiB`, `1GiB`.", ""]
    sections: dict[str, list[Row]] = {"top level": []}
    for row in rows():
        top = row.path.split(".")[0]
        section = top if any(True for _ in _models(Plan.model_fields[top].annotation)) else "top level"
        sections.setdefault(section, []).append(row)
    for section, items in sections.items():
        lines += [f"## {section}", "", "| field | type | default | description |", "|---|---|---|---|"]
        lines += [f"| `{r.path}` | {_cell(r.type)} | {_cell(r.default)} | {_cell(r.description)} |" for r in items]
        lines.append("")
    lines += ["## Environment variables", "",
              "What pglab reads from its environment, in every command; where a plan field says the same, the field "
              "wins.",
              "", "| variable | what |", "|---|---|"]
    lines += [f"| `{name}` | {_cell(what)} |" for name, what in sorted(ENVIRONMENT.items())]
    lines += ["", "Client programs and libraries read their own: libpq's `PG*` variables for pglab's connections "
              "to an external server (pgbench and psql get only what pglab sets), `KUBECONFIG` for a Kubernetes "
              "target, `TMPDIR` for new labs.", ""]
    return "\n".join(lines)
