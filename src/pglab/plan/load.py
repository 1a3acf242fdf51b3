"""YAML → Plan, with errors that name the field path (``matrix.clients[2]: must be a positive integer``)."""

from __future__ import annotations

import difflib
import os
import re
import stat
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from pglab.errors import PlanError
from pglab.plan.schema import BUILTIN_WORKLOADS, CustomWorkload, Plan, show

MAX_PLAN_BYTES = 1 << 20
MAX_ALIASES = 100
MAX_DEPTH = 64  # a plan is about 8 levels deep
MAX_NODES = 200_000  # values in the plan once YAML aliases are expanded


def load_plan(path: str | Path) -> tuple[Plan, str]:
    """Read and validate a plan file; return the plan and its text (stored with every run)."""
    p = Path(path)
    label = str(path) if str(path).isprintable() else show(path, 200)  # the plan file, in messages
    try:
        if not p.is_file():
            raise PlanError([f"{label}: no such plan file"])
        raw = p.read_bytes()[: MAX_PLAN_BYTES + 1]
    except OSError as exc:
        raise PlanError([f"{label}: cannot read the plan file ({exc.strerror})"]) from None
    if len(raw) > MAX_PLAN_BYTES:
        raise PlanError([f"{label}: the plan file is larger than 1 MiB"])
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PlanError([f"{label}: the plan is not UTF-8 text (bad byte at offset {exc.start})"]) from None
    plan = parse_plan(text, source=label, base_dir=p.resolve().parent)
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


class _DuplicateKey(yaml.YAMLError):
    def __init__(self, path: tuple[Any, ...], line: int):
        self.path, self.line = path, line


def _refuse_tag(loader: Any, node: yaml.Node) -> Any:
    raise yaml.constructor.ConstructorError(None, None, f"the YAML tag {node.tag} is not allowed in a plan",
                                            node.start_mark)


_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when it is there: 3-4 times faster


class _PlanLoader(_Loader):
    """SafeLoader that refuses duplicate keys (naming their path) and tags a plan has no use for; dates stay text."""

    paths: dict[int, tuple[Any, ...]]  # id(mapping node) → its path, from _inspect

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            seen: set[Any] = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # '<<: *base' may be overridden by the mapping's own keys
                key = self.construct_object(key_node, deep=deep)
                try:
                    duplicate = key in seen
                    seen.add(key)
                except TypeError:
                    continue  # unhashable: the base class says so
                if duplicate:
                    raise _DuplicateKey((*self.paths.get(id(node), ()), _Key(key)), key_node.start_mark.line + 1)
        return super().construct_mapping(node, deep=deep)


_PlanLoader.add_constructor("tag:yaml.org,2002:timestamp", yaml.SafeLoader.construct_yaml_str)  # dates: text
for _tag in ("binary", "set", "omap", "pairs"):
    _PlanLoader.add_constructor(f"tag:yaml.org,2002:{_tag}", _refuse_tag)


def _yaml(text: str, source: str) -> Any:
    if "\x00" in text:
        raise PlanError([f"{source}: the plan contains a NUL character"])
    try:
        _shape(text, source)
        loader = _PlanLoader(text)
        try:
            node = loader.get_single_node()
            if node is None:
                return None
            loader.paths = _inspect(node, source)
            return loader.construct_document(node)
        finally:
            loader.dispose()
    except _DuplicateKey as exc:
        raise PlanError([f"{field_path(exc.path)}: duplicate key (line {exc.line}); keep only one"]) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = (getattr(exc, "problem", None) or str(exc).splitlines()[0]).replace("tag:yaml.org,2002:", "!!")
        raise PlanError([f"{source}: not valid YAML{where}: {show(problem, 120)[1:-1]}"]) from None
    except ValueError as exc:  # int() refuses more than 4300 digits
        what = "a number with thousands of digits" if "digits" in str(exc) else show(exc, 120)
        raise PlanError([f"{source}: the plan holds a value YAML cannot read ({what})"]) from None
    except RecursionError:
        raise PlanError([f"{source}: the plan is nested too deeply"]) from None


def _shape(text: str, source: str) -> None:
    """Refuse, from the YAML events alone (no recursion), plans nested too deeply or with too many aliases."""
    depth = aliases = 0
    for event in yaml.parse(text, Loader=_Loader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                raise PlanError([f"{source}: the plan is nested too deeply (more than {MAX_DEPTH} levels)"])
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
        elif isinstance(event, yaml.AliasEvent):
            aliases += 1
            if aliases > MAX_ALIASES:
                raise PlanError([f"{source}: the plan uses more than {MAX_ALIASES} YAML aliases; write it out"])


def _inspect(root: yaml.Node, source: str) -> dict[int, tuple[Any, ...]]:
    """Walk the node graph once: refuse an alias inside its own anchor and plans that aliases blow up
    (each node's expanded size is counted once, so this is linear); return the path of every mapping."""
    paths: dict[int, tuple[Any, ...]] = {}
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(node: yaml.Node, path: tuple[Any, ...]) -> int:
        if id(node) in sizes:
            return sizes[id(node)]
        if id(node) in active:
            line = node.start_mark.line + 1
            raise PlanError([f"{source}: the YAML anchor at line {line} is used inside itself (a loop)"])
        active.add(id(node))
        total = 1
        if isinstance(node, yaml.MappingNode):
            paths[id(node)] = path
            for key_node, value_node in node.value:
                key = _Key(key_node.value if isinstance(key_node, yaml.ScalarNode) else "?")
                total += size(key_node, path) + size(value_node, (*path, key))
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                total += size(item, (*path, i))
        active.discard(id(node))
        sizes[id(node)] = total
        if total > MAX_NODES:
            raise PlanError([f"{source}: the plan expands to more than {MAX_NODES} values through YAML aliases; "
                             "write it out"])
        return total

    size(root, ())
    return paths


_MODEL_TAGS = {"CustomWorkload"}


class _Key:
    """A mapping key in a path (a bare int in a pydantic location is a list index)."""

    def __init__(self, key: Any):
        self.key = key


_PLAIN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,62}")


def _key_text(key: Any) -> str:
    if isinstance(key, str):
        return key if _PLAIN.fullmatch(key) else show(key, 40)
    if key is None:
        return "null"
    if isinstance(key, bool):
        return "true" if key else "false"
    if isinstance(key, int | float):
        return show(key, 40)[1:-1]
    return show(key, 40)


def field_path(loc: tuple[Any, ...]) -> str:
    """``matrix.workload[0].scripts[1].file``; keys that are not plain names are quoted, e.g. ``run.'a b'``."""
    out = ""
    for part in loc:
        if isinstance(part, int) and not isinstance(part, bool):
            out += f"[{part}]"
        else:
            key = part.key if isinstance(part, _Key) else part
            out += ("." if out else "") + _key_text(key)
    return out or "plan"


def _union_cut(loc: tuple[Any, ...]) -> int | None:
    """Where the branch tag sits in an error location inside the schema's one union: matrix.workload[i] is a
    built-in name or a custom workload (matched by position, so a user's key named like a tag is no tag)."""
    if (len(loc) > 3 and loc[:2] == ("matrix", "workload") and isinstance(loc[2], int) and isinstance(loc[3], str)
            and (loc[3] in _MODEL_TAGS or loc[3].startswith("literal["))):
        return 3
    return None


def _location(err: Any) -> tuple[Any, ...]:
    """pydantic's location with mapping keys marked as keys (a bare int is a list index)."""
    loc = list(err["loc"])
    if err["type"] == "extra_forbidden" and loc:  # first: the unknown key may itself be named '[key]'
        loc[-1] = _Key(loc[-1])
    elif len(loc) > 1 and loc[-1] == "[key]":  # a dict's key failed its own validation: loc is (..., key, '[key]')
        loc[-2:] = [_Key(err.get("input", loc[-2]))]
    elif err["type"] == "invalid_key" and loc:  # a key that is not text: pydantic's loc shows it mangled
        loc[-1] = _Key(err.get("input"))
    if loc[:2] == ["run", "repeats"] and loc[2:3] in (["count"], ["adaptive"]):  # the branch's tag
        del loc[2]
    at = (err.get("ctx") or {}).get("at")
    if at:  # a list index in the path is a number: matrix.scenario[0].at
        loc += [int(part) if part.isdigit() else part for part in at.split(".")]
    return tuple(loc)


def format_errors(exc: ValidationError) -> list[str]:
    """One line per problem, each starting with the field path; union alternatives collapsed.

    For a union (a built-in workload name or a custom workload mapping), a mapping is judged against the
    mapping branch only, and anything else gets one line listing what is accepted."""
    lines: list[str] = []
    skipped: list[tuple[Any, ...]] = []
    for err in exc.errors(include_url=False):
        loc = _location(err)
        cut = _union_cut(loc)
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
        if err["type"] == "extra_forbidden" and (near := _near_field(tuple(err["loc"]))) is not None:
            line = line.replace(UNKNOWN_FIELD, f"unknown field; did you mean '{near}'?")
        if line not in lines:
            lines.append(line)
    for loc in skipped:
        path = field_path(loc)
        if not any(line.startswith(path + ":") or line.startswith(path + ".") for line in lines):
            lines.append(f"{path}: {_union_message(loc)}")
    return lines


UNKNOWN_FIELD = "unknown field; remove it or check its spelling"  # with a field close to it: "did you mean"


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The models a field's type holds: itself, or inside a list, a mapping's values, a union, Optional …"""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def _near_field(loc: tuple[Any, ...]) -> str | None:
    """For an unknown field at ``loc`` (pydantic's location, the unknown key last), the closest field name of
    the model(s) it was given to, or None when none is close (difflib's ratio ≥ 0.6)."""
    models: list[type[BaseModel]] = [Plan]
    for part in loc[:-1]:  # a list index, a mapping key or a union's tag leaves the models as they are
        inner = [m for model in models if isinstance(part, str) and part in model.model_fields
                 for m in _models_in(model.model_fields[part].annotation)]
        models = inner or models
    names = list(dict.fromkeys(f.alias or name for model in models for name, f in model.model_fields.items()))
    found = difflib.get_close_matches(str(loc[-1]), names, n=1) if loc else []
    return found[0] if found else None


def _union_message(loc: tuple[Any, ...]) -> str:
    if "workload" in loc:
        return (f"must be one of {', '.join(BUILTIN_WORKLOADS)}, or a custom workload "
                "{name: ..., scripts: [{file: ..., weight: ...}]}")
    return "has the wrong type"


def _message(err: Any) -> str:
    kind = err["type"]
    if kind == "missing":
        return "is required"
    if kind in ("extra_forbidden", "invalid_key"):
        return UNKNOWN_FIELD
    if "[key]" in err["loc"] and kind == "string_type":
        return "is not a valid name; names here are text"
    msg = str(err["msg"])
    for prefix in ("Value error, ", "Assertion failed, "):
        msg = msg.removeprefix(prefix)
    msg = msg.replace("Input should be", "must be").replace("Input should have", "must have")
    if kind in ("model_type", "dict_type") or (kind.endswith("_type") and "dictionary" in msg):
        return "must be a mapping (key: value)"
    if kind == "list_type":
        return "must be a list"
    if kind in ("too_short", "too_long"):
        ctx = err.get("ctx") or {}
        if kind == "too_short":
            low = ctx.get("min_length")
            return "must not be empty" if low == 1 else f"must have at least {low} items"
        return f"must have at most {ctx.get('max_length')} items"
    return msg


def _check_files(plan: Plan, base_dir: Path) -> list[str]:
    """Files the plan names must be readable regular files inside the plan's folder (symbolic links included)."""
    files: list[tuple[str, str]] = []
    for i, wl in enumerate(plan.matrix.workload):
        if isinstance(wl, CustomWorkload):
            files += [(f"matrix.workload[{i}].scripts[{j}].file", s.file) for j, s in enumerate(wl.scripts) if s.file]
    if plan.storage is not None:
        files += [(f"storage.job_files[{i}]", name) for i, name in enumerate(plan.storage.job_files)]
    problems = []
    for field, name in files:
        problem = _file_problem(name, base_dir)
        if problem is None and field.startswith("storage.job_files"):
            problem = fio_job_file_problem((base_dir / name).read_text(errors="replace"))
        if problem:
            problems.append(f"{field}: {problem}")
    return problems


# fio runs these as shell commands, programs or libraries; a job file that came with a plan must not run code
_FIO_CODE = re.compile(r"^\s*(?P<key>exec_prerun|exec_postrun|include)\b"
                       r"|^\s*ioengine\s*=\s*(?P<engine>exec\b|external\b)", re.MULTILINE)
_FIO_OPTION = re.compile(r"^\s*(?P<key>[A-Za-z_][\w-]*)\s*=\s*(?P<value>.*?)\s*$", re.MULTILINE)


def fio_job_file_problem(job_file_text: str) -> str | None:
    """Why a fio job file is refused, or None. Plans are code (docs/reliability.md): fio as root would run a job's
    ``exec_prerun``/``exec_postrun`` command, ``ioengine=exec`` program or ``external`` library as root (``include``
    could bring any of them in), and write or read any file an option names (``write_iolog=/etc/…``). Refused
    everywhere, at validation: a storage benchmark needs none of them, and fio writes only in its scratch folder."""
    m = _FIO_CODE.search(job_file_text)
    if m is not None:
        what = m.group("key") or f"ioengine={m.group('engine')}"
        return (f"fio job file sets {what}, which runs code on this machine with pglab's rights; remove it (pglab "
                f"refuses plan-provided commands in fio job files)")
    for m in _FIO_OPTION.finditer(job_file_text):
        for part in re.split(r"(?<!\\):", m.group("value")):
            if part.startswith("/") or ".." in Path(part).parts:
                return (f"fio job file sets {m.group('key')}={m.group('value')}, a path outside the job's scratch "
                        f"folder; use a name relative to it (pglab runs every job in a scratch folder under the "
                        f"measured path)")
    return None


def _file_problem(name: str, base_dir: Path) -> str | None:
    shown = show(name)
    try:
        base = base_dir.resolve()
        if not (base / name).resolve().is_relative_to(base):
            return f"{shown} leads out of the plan's folder (through a symbolic link); copy the file next to the plan"
        f = base_dir / name  # as pgbench and fio will open it ('missing/../x.sql' does not resolve on disk)
        st = f.stat()
    except (FileNotFoundError, NotADirectoryError):
        return f"no such file {shown} (relative paths are relative to the plan's folder)"
    except (OSError, RuntimeError) as exc:  # RuntimeError: a symbolic link loop (Python < 3.13)
        reason = getattr(exc, "strerror", None) or "symbolic link loop"
        return f"cannot read {shown} ({reason})"
    if not stat.S_ISREG(st.st_mode):
        return f"{shown} is not a regular file"
    if st.st_size > MAX_PLAN_BYTES:
        return f"{shown} is larger than 1 MiB"
    if not os.access(f, os.R_OK):
        return f"cannot read {shown} (permission denied)"
    return None


def resolve_path(value: str, base_dir: Path) -> Path:
    """Where a file named in the plan is: relative to the plan's folder (the schema refuses other paths)."""
    return base_dir / value
