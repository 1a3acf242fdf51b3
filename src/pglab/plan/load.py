"""YAML → Plan, with errors that name the field path (``matrix.clients[2]: must be a positive integer``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from pglab.errors import PlanError
from pglab.plan.schema import BUILTIN_WORKLOADS, CustomWorkload, Plan

MAX_PLAN_BYTES = 1 << 20
MAX_ALIASES = 100


def load_plan(path: str | Path) -> tuple[Plan, str]:
    """Read and validate a plan file; return the plan and its text (stored with every run)."""
    p = Path(path)
    try:
        if not p.is_file():
            raise PlanError([f"{path}: no such plan file"])
        raw = p.read_bytes()[: MAX_PLAN_BYTES + 1]
    except OSError as exc:
        raise PlanError([f"{path}: cannot read the plan file ({exc.strerror})"]) from None
    if len(raw) > MAX_PLAN_BYTES:
        raise PlanError([f"{path}: the plan file is larger than 1 MiB"])
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PlanError([f"{path}: the plan is not UTF-8 text (bad byte at offset {exc.start})"]) from None
    plan = parse_plan(text, source=str(path), base_dir=p.resolve().parent)
    return plan, text


def parse_plan(text: str, source: str = "plan", base_dir: Path | None = None) -> Plan:
    data = _yaml(text, source)
    if not isinstance(data, dict):
        raise PlanError([f"{source}: the plan must be a YAML mapping with at least 'name'"])
    try:
        plan = Plan.model_validate(data)
    except ValidationError as exc:
        raise PlanError(format_errors(exc)) from None
    problems = _check_files(plan, base_dir or Path.cwd())
    if problems:
        raise PlanError(problems)
    return plan


def _yaml(text: str, source: str) -> Any:
    if "\x00" in text:
        raise PlanError([f"{source}: the plan contains a NUL character"])
    try:
        aliases = sum(1 for ev in yaml.parse(text, Loader=yaml.SafeLoader) if isinstance(ev, yaml.AliasEvent))
        if aliases > MAX_ALIASES:
            raise PlanError([f"{source}: the plan uses more than {MAX_ALIASES} YAML aliases; write it out"])
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise PlanError([f"{source}: not valid YAML{where}: {problem}"]) from None
    except RecursionError:
        raise PlanError([f"{source}: the plan is nested too deeply"]) from None


def field_path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "plan"


_MODEL_TAGS = {"CustomWorkload"}
_SCALAR_TAGS = {"str", "int", "float", "bool"}


def _union_tag(part: Any) -> bool:
    return isinstance(part, str) and (part in _MODEL_TAGS or part in _SCALAR_TAGS or part.startswith("literal["))


def format_errors(exc: ValidationError) -> list[str]:
    """One line per problem, each starting with the field path; union alternatives collapsed.

    For a union (a built-in workload name or a custom workload mapping), a mapping is judged against the
    mapping branch only, and anything else gets one line listing what is accepted.
    """
    lines: list[str] = []
    skipped: list[tuple[Any, ...]] = []
    for err in exc.errors(include_url=False):
        loc = tuple(err["loc"])
        cut = next((i for i, part in enumerate(loc) if i > 0 and _union_tag(part)), None)
        if cut is None:
            line = f"{field_path(loc)}: {_message(err)}"
        else:
            tag, is_mapping = loc[cut], isinstance(err.get("input"), dict) and len(loc) == cut + 1
            nested = len(loc) > cut + 1  # an error inside the branch's own fields
            if tag in _MODEL_TAGS and (nested or is_mapping):
                line = f"{field_path(loc[:cut] + loc[cut + 1:])}: {_message(err)}"
            elif tag not in _MODEL_TAGS and isinstance(err.get("input"), dict):
                skipped.append(loc[:cut])  # a mapping was given: the scalar branches do not apply
                continue
            else:
                line = f"{field_path(loc[:cut])}: {_union_message(loc[:cut])}"
        if line not in lines:
            lines.append(line)
    for loc in skipped:
        path = field_path(loc)
        if not any(line.startswith(path + ":") or line.startswith(path + ".") for line in lines):
            lines.append(f"{path}: {_union_message(loc)}")
    return lines


def _union_message(loc: tuple[Any, ...]) -> str:
    if "workload" in loc:
        return (f"must be one of {', '.join(BUILTIN_WORKLOADS)}, or a custom workload "
                "{name: ..., scripts: [{file: ..., weight: ...}]}")
    if "parameters" in loc:
        return "must be a string, a number or a boolean"
    return "has the wrong type"


def _message(err: Any) -> str:
    kind = err["type"]
    if kind == "missing":
        return "is required"
    if kind == "extra_forbidden":
        return "unknown field; remove it or check its spelling"
    msg = str(err["msg"])
    for prefix in ("Value error, ", "Assertion failed, "):
        msg = msg.removeprefix(prefix)
    msg = msg.replace("Input should be", "must be").replace("Input should have", "must have")
    if kind in ("model_type", "dict_type") or (kind.endswith("_type") and "dictionary" in msg):
        return "must be a mapping (key: value)"
    if kind == "list_type":
        return "must be a list"
    return msg


def _check_files(plan: Plan, base_dir: Path) -> list[str]:
    problems = []
    for i, wl in enumerate(plan.matrix.workload):
        if not isinstance(wl, CustomWorkload):
            continue
        for j, script in enumerate(wl.scripts):
            if script.file is None:
                continue
            f = resolve_path(script.file, base_dir)
            if not f.is_file():
                problems.append(f"matrix.workload[{i}].scripts[{j}].file: no such file '{script.file}' "
                                "(relative paths are relative to the plan's folder)")
            elif f.stat().st_size > MAX_PLAN_BYTES:
                problems.append(f"matrix.workload[{i}].scripts[{j}].file: '{script.file}' is larger than 1 MiB")
    if plan.storage is not None:
        for i, name in enumerate(plan.storage.job_files):
            if not resolve_path(name, base_dir).is_file():
                problems.append(f"storage.job_files[{i}]: no such file '{name}' "
                                "(relative paths are relative to the plan's folder)")
    return problems


def resolve_path(value: str, base_dir: Path) -> Path:
    p = Path(value).expanduser()
    return p if p.is_absolute() else (base_dir / p)
