"""Fuzzing the plan: malformed and hostile plans all end in exit 2, one line naming the field, nothing started.

Every case runs the real entry point (``pglab.cli.main``) in-process, as ``pglab plan validate FILE`` or
``pglab run FILE --results DIR``, with ``subprocess.Popen``, the runner and the lab patched to fail the test if
anything tries to start; a handful also run as real subprocesses. Hypothesis is derandomized: the same
plans every time.

Categories (examples each; a few repeat, each test asserts how many distinct plans it saw): leaf values of the
wrong type, negative, huge, NaN/inf, huge or control-character text (400); mappings and lists replaced by the
wrong shape (100); unknown keys at every level, including keys that are not text or look like pydantic's own
location tags (230); file names with path traversal, absolute paths, NUL bytes, symbolic links out of the plan's
folder, directories, FIFOs (100); whole-file attacks: alias bombs, self-referencing anchors, deep nesting,
non-UTF-8 bytes, empty or non-mapping documents, duplicate keys, tabs, several documents, unsafe tags, NUL,
numbers with thousands of digits, oversized files (200); ``pglab run`` on a mix of all of them (150); and 10
subprocesses. Over 1,100 distinct plans in all.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import yaml
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from conftest import pglab, processes_mentioning

# ----------------------------------------------------------------------------- the base plan and its fields

JOB_FILE = "jobs.fio"
SCRIPT = "report.sql"


def base_plan() -> dict[str, Any]:
    """The quickstart's shape, with every section and field filled in, so that every field can be broken."""
    return {
        "name": "quickstart",
        "description": "fuzz base\nsecond line",
        "target": {"local": {
            "instances": 3,
            "synchronous": {"method": "any", "number": 1},
            "paths": {"lab": "lab", "data": "data", "wal": "wal"},
            "run_as": "postgres",
            "bindir": "/usr/lib/postgresql/16/bin",
        }},
        "postgres": {"parameters": {"shared_buffers": "128MB", "max_wal_size": "1GB"}},
        "dataset": {"scale": 10, "partitions": 2, "reset": "vacuum"},
        "storage": {"profiles": ["randread-8k", "wal-fdatasync-8k"], "job_files": [JOB_FILE], "runtime": "4s",
                    "size": "256MiB", "paths": ["data", "wal"]},
        "matrix": {
            "workload": ["tpcb-like", "select-only",
                         {"name": "mix", "scripts": [{"builtin": "tpcb-like", "weight": 9},
                                                     {"file": SCRIPT, "weight": 1}]}],
            "synchronous_commit": ["local", "on", "remote_apply"],
            "clients": [1, 4, 8],
            "jobs": [1, 2],
            "parameters": {"work_mem": ["4MB", "64MB"]},
        },
        "run": {"duration": "8s", "warmup": "2s", "repeats": 1, "rate": 1000, "sampling_rate": 0.5,
                "protocol": "simple", "pause": 0},
        "probes": {"wait_hz": 5, "enabled": True},
        "cost": {"monthly": 100, "currency": "USD", "breakdown": {"compute": 60, "storage": 40}},
    }


Path_ = tuple[str | int, ...]

# every scalar field of the base plan, with the kind of value it takes
LEAVES: dict[Path_, str] = {
    ("name",): "name",
    ("description",): "description",
    ("target", "local", "instances"): "int",
    ("target", "local", "synchronous", "method"): "literal",
    ("target", "local", "synchronous", "number"): "int",
    ("target", "local", "paths", "lab"): "text",
    ("target", "local", "paths", "data"): "text",
    ("target", "local", "paths", "wal"): "text",
    ("target", "local", "run_as"): "text",
    ("target", "local", "bindir"): "text",
    ("postgres", "parameters", "shared_buffers"): "param",
    ("postgres", "parameters", "max_wal_size"): "param",
    ("dataset", "scale"): "int",
    ("dataset", "partitions"): "int",
    ("dataset", "reset"): "literal",
    ("storage", "profiles", 0): "literal",
    ("storage", "profiles", 1): "literal",
    ("storage", "runtime"): "seconds",
    ("storage", "size"): "size",
    ("storage", "paths", 0): "literal",
    ("storage", "paths", 1): "literal",
    ("matrix", "workload", 0): "literal",
    ("matrix", "workload", 1): "literal",
    ("matrix", "workload", 2, "name"): "name",
    ("matrix", "workload", 2, "scripts", 0, "builtin"): "literal",
    ("matrix", "workload", 2, "scripts", 0, "weight"): "int",
    ("matrix", "workload", 2, "scripts", 1, "weight"): "int",
    ("matrix", "synchronous_commit", 0): "level",
    ("matrix", "synchronous_commit", 2): "level",
    ("matrix", "clients", 0): "int",
    ("matrix", "clients", 2): "int",
    ("matrix", "jobs", 1): "int",
    ("matrix", "parameters", "work_mem", 0): "param",
    ("matrix", "parameters", "work_mem", 1): "param",
    ("run", "duration"): "seconds",
    ("run", "warmup"): "seconds",
    ("run", "repeats"): "int",
    ("run", "rate"): "number",
    ("run", "sampling_rate"): "fraction",
    ("run", "protocol"): "literal",
    ("run", "pause"): "seconds",
    ("probes", "wait_hz"): "number",
    ("probes", "enabled"): "bool",
    ("cost", "monthly"): "number",
    ("cost", "currency"): "name",
    ("cost", "breakdown", "compute"): "part",
}

# the mappings that are models (unknown keys are refused) and their fields
MODELS: dict[Path_, set[str]] = {
    (): {"name", "description", "target", "postgres", "dataset", "matrix", "run", "probes", "storage", "cost"},
    ("target",): {"local", "external", "kubernetes"},
    ("target", "local"): {"instances", "synchronous", "paths", "run_as", "bindir"},
    ("target", "local", "synchronous"): {"method", "number"},
    ("target", "local", "paths"): {"lab", "data", "wal"},
    ("postgres",): {"parameters"},
    ("dataset",): {"scale", "partitions", "reset"},
    ("storage",): {"profiles", "job_files", "runtime", "size", "paths"},
    ("matrix",): {"workload", "synchronous_commit", "clients", "jobs", "parameters"},
    ("matrix", "workload", 2): {"name", "scripts"},
    ("matrix", "workload", 2, "scripts", 0): {"builtin", "file", "weight"},
    ("matrix", "workload", 2, "scripts", 1): {"builtin", "file", "weight"},
    ("run",): {"duration", "transactions", "warmup", "repeats", "rate", "sampling_rate", "protocol", "pause"},
    ("probes",): {"wait_hz", "enabled"},
    ("cost",): {"monthly", "currency", "breakdown"},
}
# mappings whose keys are free names (parameter names, cost parts): a key must still be a valid name
NAME_MAPS: list[Path_] = [("postgres", "parameters"), ("matrix", "parameters"), ("cost", "breakdown")]
# lists (and whether an empty one is an error); and the mappings a scalar cannot replace
LISTS: dict[Path_, bool] = {
    ("storage", "profiles"): False, ("storage", "job_files"): False, ("storage", "paths"): True,
    ("matrix", "workload"): True, ("matrix", "workload", 2, "scripts"): True, ("matrix", "synchronous_commit"): True,
    ("matrix", "clients"): True, ("matrix", "jobs"): True, ("matrix", "parameters", "work_mem"): True,
}
MAPPINGS: list[Path_] = [p for p in MODELS if p] + NAME_MAPS
FILE_FIELDS: list[Path_] = [("matrix", "workload", 2, "scripts", 1, "file"), ("storage", "job_files", 0)]

ALLOWED_LITERALS = {"any", "first", "vacuum", "reinit", "snapshot", "randread-8k", "randwrite-8k", "wal-fdatasync-8k",
                    "seqread-1m", "seqwrite-1m", "mixed-70-30-8k", "data", "wal", "tpcb-like", "select-only",
                    "simple-update", "off", "local", "remote_write", "on", "remote_apply", "simple", "extended",
                    "prepared"}
SIZE_LIKE = re.compile(r"\s*\d+(\.\d+)?\s*[kmgtp]?i?b?\s*", re.IGNORECASE)
LAX_BOOLS = {"0", "1", "true", "false", "yes", "no", "on", "off", "t", "f", "y", "n"}  # what pydantic takes as bool


def render(path: Path_) -> str:
    """The dotted path the CLI must name: ``matrix.workload[2].scripts[1].file``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else ("." if out else "") + part
    return out


def get(plan: dict[str, Any], path: Path_) -> Any:
    node: Any = plan
    for part in path:
        node = node[part]
    return node


def put(plan: dict[str, Any], path: Path_, value: Any) -> dict[str, Any]:
    plan = copy.deepcopy(plan)
    get(plan, path[:-1])[path[-1]] = value
    return plan


def dump(plan: Any) -> bytes:
    """YAML with every non-ASCII character escaped: a raw NEL or LINE SEPARATOR would be read as a line break."""
    return yaml.safe_dump(plan, sort_keys=False, allow_unicode=False).encode("ascii")


# ----------------------------------------------------------------------------- strategies


@dataclass(frozen=True)
class Case:
    """A plan file's bytes and what the error must name: the field (``prefixes``: a line starts with one of
    them) or, for whole-file problems, the file itself (``prefixes`` is None)."""

    category: str
    content: bytes
    prefixes: tuple[str, ...] | None
    note: str = ""


def field_case(category: str, plan: Any, path: Path_, note: str = "") -> Case:
    p = render(path)
    return Case(category, dump(plan), (p + ":", p + ".", p + "["), note)


def file_case(category: str, content: bytes, note: str = "") -> Case:
    return Case(category, content, None, note)


control_text = st.builds(lambda a, c, b: a + c + b, st.text(max_size=10),
                         st.sampled_from(["\x00", "\n", "\r", "\t", "\x1b[31m", "\x7f", "\u2028", "\x85", "\x08"]),
                         st.text(max_size=10))
huge_text = st.builds(lambda n, c: c * n, st.integers(5000, 20000), st.sampled_from(["a", "é", "x/", "0"]))
containers = st.one_of(st.lists(st.integers(), min_size=0, max_size=3),
                       st.dictionaries(st.text(min_size=1, max_size=5), st.integers(), max_size=2))
non_finite = st.sampled_from([math.nan, math.inf, -math.inf])
huge_int = st.integers(10**10, 10**1000)
negative = st.one_of(st.integers(max_value=-1), st.floats(max_value=-1e-9, allow_nan=False, allow_infinity=False))
garbage_text = st.text(max_size=30)


def bad_value(kind: str) -> st.SearchStrategy[Any]:
    """Values that a field of this kind must refuse."""
    if kind == "int":  # positive integers with a cap below 10**10; floats, text and booleans are refused
        return st.one_of(st.integers(max_value=0), huge_int, st.floats(allow_nan=True), garbage_text,
                         st.booleans(), containers)
    if kind == "seconds":  # 0 … one week (the duration fields need ≥ 1 s, warmup/pause may be 0)
        return st.one_of(negative, st.integers(10**7, 10**600), st.floats(min_value=1e7, allow_infinity=True),
                         non_finite, st.booleans(), containers,
                         st.sampled_from(["10 parsecs", "-5s", "99999999h", "nan", "inf", "1e3", "5 s s", "",
                                          "٣s", "1" * 5000, "5.s", ".5s"]),
                         garbage_text.map(lambda s: s + " fortnights"))
    if kind in ("number", "part"):  # finite, > 0 (a part of the cost: ≥ 0) and below a cap under 1e13
        return st.one_of(negative, non_finite, st.floats(min_value=1e13, allow_infinity=False),
                         st.integers(10**13, 10**1000), st.booleans(), garbage_text, containers,
                         st.just(0) if kind == "number" else st.nothing())
    if kind == "fraction":  # (0, 1]
        return st.one_of(negative, non_finite, st.floats(min_value=1.0001, allow_infinity=False), huge_int,
                         st.booleans(), garbage_text, containers, st.just(0))
    if kind == "level":  # a synchronous_commit level: YAML's bare on/off (booleans) are the levels 'on'/'off'
        return st.one_of(garbage_text.filter(lambda s: s not in ALLOWED_LITERALS), st.integers(),
                         st.floats(), huge_text, control_text, st.lists(st.integers(), max_size=2))
    if kind == "literal":
        return st.one_of(garbage_text.filter(lambda s: s not in ALLOWED_LITERALS), st.integers(),
                         st.floats(), st.booleans(), huge_text, control_text, st.lists(st.integers(), max_size=2))
    if kind == "name":  # the plan's name, a workload's name, a currency: short plain names
        return st.one_of(st.integers(), st.floats(), st.booleans(), containers, huge_text, control_text,
                         st.sampled_from(["", "-x", "a b", "../x", "x/y", "ü" * 3, "a" * 64, "tpcb-like\n"]))
    if kind == "text":  # paths and user names: one line of text
        return st.one_of(st.integers(), st.floats(), st.booleans(), containers, huge_text, control_text)
    if kind == "description":  # free text: line breaks and tabs allowed, other control characters not
        return st.one_of(st.integers(), st.floats(), st.booleans(), containers, huge_text,
                         control_text.filter(lambda s: any(not c.isprintable() and c not in "\n\t" for c in s)))
    if kind == "param":  # a PostgreSQL parameter value: text, number or boolean; never NaN, huge or multi-line
        return st.one_of(non_finite, st.integers(2**63, 10**500), st.integers(-(10**500), -(2**63) - 1),
                         st.builds(lambda n: "x" * n, st.integers(1025, 20000)),
                         control_text.filter(lambda s: any(not c.isprintable() for c in s)), containers)
    if kind == "size":  # 1 MiB … 1 PiB, whole bytes
        return st.one_of(negative, st.integers(0, 2**20 - 1), st.integers(2**50 + 1, 10**600), st.floats(),
                         st.booleans(), containers, garbage_text.filter(lambda s: not SIZE_LIKE.fullmatch(s)),
                         st.sampled_from(["1.3", "0.5k", "2PiB", "0GiB", "1e9", "-1GiB", "1 GiB GiB", "9" * 400,
                                          "99999999999999999TiB", "256 MiB\nfilename=/dev/sda"]))
    if kind == "bool":
        return st.one_of(st.integers().filter(lambda i: i not in (0, 1)), st.floats().filter(lambda f: f not in (0, 1)),
                         garbage_text.filter(lambda s: s.lower() not in LAX_BOOLS), containers)
    raise AssertionError(kind)


@st.composite
def leaf_cases(draw: st.DrawFn) -> Case:
    path = draw(st.sampled_from(sorted(LEAVES, key=render)))
    value = draw(bad_value(LEAVES[path]))
    return field_case("leaf", put(base_plan(), path, value), path, f"{render(path)} = {value!r:.80}")


@st.composite
def shape_cases(draw: st.DrawFn) -> Case:
    """A mapping where a list or scalar belongs, and the other way round; empty lists that need an item."""
    if draw(st.booleans()):
        path = draw(st.sampled_from(sorted(MAPPINGS, key=render)))
        value = draw(st.one_of(st.integers(), st.text(max_size=10), st.booleans(), st.floats(),
                               st.lists(st.integers(), max_size=3)))
    else:
        path = draw(st.sampled_from(sorted(LISTS, key=render)))
        choices: list[st.SearchStrategy[Any]] = [st.integers(), st.text(max_size=10), st.booleans(), st.floats(),
                   st.dictionaries(st.text(min_size=1, max_size=5), st.integers(), max_size=2)]
        if LISTS[path]:
            choices.append(st.just([]))
        value = draw(st.one_of(choices))
    return field_case("shape", put(base_plan(), path, value), path, f"{render(path)} = {value!r:.80}")


HOSTILE_KEYS = ["CustomWorkload", "literal['tpcb-like','select-only','simple-update']", "str", "int", "bool",
                "float", "[key]", "__class__", "model_config", "../../etc/passwd", "a\nb", "key: value", "x" * 5000,
                "\u2028", "name ", " name", "NAME", "Name", "é", "\x00", "", "plan", "<<", "*a", "&a", "!!python"]
PLAIN_KEY = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,62}")


def key_prefixes(parent: Path_, key: Any, name_map: bool) -> tuple[str, ...]:
    """How the CLI names an unknown key: its parent's path, then the key (plain, or quoted when it is not)."""
    head = render(parent)
    if isinstance(key, str) and PLAIN_KEY.fullmatch(key):
        shown: tuple[str, ...] = (key + ":", key + ".")
    elif key is None or isinstance(key, bool | int | float):
        text = "null" if key is None else str(key).lower() if isinstance(key, bool) else str(key)
        shown = (text + ":",)
    else:
        shown = ("'",)
    if not head:
        return shown
    out = tuple(f"{head}.{s}" for s in shown)
    return out + ((head + ":",) if name_map else ())  # 'postgres.parameters: 'X' is not a parameter name'


key_strategy = st.one_of(st.text(min_size=1, max_size=40), st.sampled_from(HOSTILE_KEYS), st.integers(),
                         st.booleans(), st.none(), st.floats(allow_nan=False))
param_name = re.compile(r"[a-z_][a-z0-9_.]{0,62}")
label_name = re.compile(r"[A-Za-z0-9][A-Za-z0-9_ .-]{0,62}")


@st.composite
def unknown_key_cases(draw: st.DrawFn) -> Case:
    """A key that is no field (models), or no valid name (parameter maps, cost parts), at any level."""
    plan = base_plan()
    value: Any
    if draw(st.integers(0, 4)) > 0:
        parent = draw(st.sampled_from(sorted(MODELS, key=render)))
        fields = MODELS[parent]
        key = draw(key_strategy.filter(lambda k: k not in fields))
        value = draw(st.one_of(st.integers(), st.text(max_size=5), st.none(), st.lists(st.integers(), max_size=2)))
        name_map = False
    else:
        parent = draw(st.sampled_from(NAME_MAPS))
        check = label_name if parent == ("cost", "breakdown") else param_name
        managed = ["port", "listen_addresses", "synchronous_standby_names", "primary_conninfo", "data_directory",
                   "include", "include_dir", "synchronous_commit", "hba_file", "unix_socket_directories"]
        bad_names = key_strategy.filter(lambda k: not (isinstance(k, str) and check.fullmatch(k)))
        key = draw(bad_names if parent == ("cost", "breakdown") else st.one_of(bad_names, st.sampled_from(managed)))
        value = 0 if parent == ("cost", "breakdown") else ["1"] if parent == ("matrix", "parameters") else "1"
        name_map = True
    get(plan, parent)[key] = value
    return Case("key", dump(plan), key_prefixes(parent, key, name_map), f"{render(parent)}[{key!r:.40}]")


@st.composite
def file_name_cases(draw: st.DrawFn) -> Case:
    """Script and fio job file names that leave the plan's folder, do not exist or are no regular file."""
    path = draw(st.sampled_from(FILE_FIELDS))
    value = draw(st.one_of(
        st.builds(lambda n, tail: "../" * n + tail, st.integers(1, 12),
                  st.sampled_from(["etc/passwd", SCRIPT, "plan/report.sql", "root/.ssh/id_rsa", ""])),
        st.builds(lambda head, n: head + "/.." * n + "/etc/passwd", st.sampled_from(["sub", ".", "lab"]),
                  st.integers(2, 6)),
        st.sampled_from(["/etc/passwd", "/etc/shadow", "/dev/zero", "/proc/self/environ", "/", "//etc/passwd",
                         "~/.bashrc", "~root/.ssh/id_rsa", "~nosuchuser/x.sql", "report.sql\x00.txt", "\x00",
                         "report.sql\n", "", " ", ".", "./", "..", "dir.sql", "escape.sql", "escape-dir/passwd",
                         "loop.sql", "fifo.sql", "big.sql", "missing.sql", "report.sql/x", "x" * 5000,
                         "a/" * 3000 + "x", "\u202ereport.sql", "report.sql\t"]),
        st.builds(lambda s: "zz-missing-" + s, st.text(min_size=0, max_size=30)),
        st.integers(), st.booleans(), st.lists(st.text(max_size=3), max_size=2), control_text,
    ))
    return field_case("file", put(base_plan(), path, value), path, f"{render(path)} = {value!r:.80}")


def _bomb(fanout: int, depth: int, flow: bool, mapping: bool) -> str:
    lines = [f"l0: &l0 [{', '.join(['lol'] * fanout)}]"]
    for i in range(1, depth + 1):
        if mapping:
            body = "{" + ", ".join(f"k{j}: *l{i - 1}" for j in range(fanout)) + "}"
        else:
            body = "[" + ", ".join([f"*l{i - 1}"] * fanout) + "]"
        if flow:
            lines.append(f"l{i}: &l{i} {body}")
        else:
            items = [f"  - *l{i - 1}"] * fanout if not mapping else [f"  k{j}: *l{i - 1}" for j in range(fanout)]
            lines.append(f"l{i}: &l{i}\n" + "\n".join(items))
    return "\n".join(lines)


@st.composite
def alias_bomb(draw: st.DrawFn) -> bytes:
    fanout = draw(st.integers(2, 12))
    depth = draw(st.integers(3, 20).filter(lambda d: fanout**d > 10**6))
    bomb = _bomb(fanout, depth, draw(st.booleans()), draw(st.booleans()))
    where = draw(st.sampled_from(["", "description", "matrix", "x-anchors"]))
    if not where:
        return (bomb + "\nname: t\n").encode()
    nested = "\n".join("  " + line for line in bomb.splitlines())
    return f"name: t\n{where}:\n{nested}\n".encode()


@st.composite
def self_anchor(draw: st.DrawFn) -> bytes:
    body = draw(st.sampled_from(["&a [*a]", "&a {x: *a}", "&a [1, [2, *a]]", "&a {clients: [*a]}", "&a [{k: *a}]"]))
    where = draw(st.sampled_from(["name", "matrix.clients", "run", "description", "cost.breakdown", "extra"]))
    head, _, leaf = where.partition(".")
    if leaf:
        return f"name: t\n{head}:\n  {leaf}: {body}\n".encode()
    return (f"{head}: {body}\n" + ("name: t\n" if head != "name" else "")).encode()


@st.composite
def deep_nesting(draw: st.DrawFn) -> bytes:
    depth = draw(st.integers(65, 20000))
    style = draw(st.sampled_from(["list", "map", "mixed", "block"]))
    where = draw(st.sampled_from(["", "name: t\nrun: ", "name: t\ndescription: ", "name: t\nmatrix:\n  clients: "]))
    if style == "list":
        body = "[" * depth + "]" * depth
    elif style == "map":
        body = "{a: " * depth + "1" + "}" * depth
    elif style == "mixed":
        body = "[{a: " * depth + "1" + "}]" * depth
    else:
        depth = min(depth, 600)
        body = "\n" + "".join("  " * (i + 1) + f"k{i}:\n" for i in range(depth)) + "  " * (depth + 1) + "v"
    return (where + body + "\n").encode()


BASE_TEXT = dump(base_plan())


@st.composite
def not_utf8(draw: st.DrawFn) -> bytes:
    bad = draw(st.sampled_from([b"\xff", b"\xfe\xff", b"\xc3\x28", b"\x80", b"\xc0\xaf", b"\xed\xa0\x80", b"\xe9t\xe9",
                                b"\xf4\x90\x80\x80", b"\xf8\x88\x80\x80\x80", b"\xe2\x82"]))
    where = draw(st.integers(0, len(BASE_TEXT)))
    if draw(st.booleans()):
        return BASE_TEXT[:where] + bad + BASE_TEXT[where:]
    encoding = draw(st.sampled_from(["utf-16", "utf-32", "latin-1", "cp1252"]))
    return ("name: tést\ndescription: «plan»\n").encode(encoding)


@st.composite
def not_a_mapping(draw: st.DrawFn) -> bytes:
    choice = draw(st.sampled_from(["empty", "space", "comment", "doc", "value"]))
    if choice == "empty":
        return b""
    if choice == "space":
        return draw(st.sampled_from([b"\n", b"   \n\n", b"\n\n\n  \n"]))
    if choice == "comment":
        return b"# only a comment\n"
    if choice == "doc":
        return draw(st.sampled_from([b"---\n", b"---\n...\n", b"--- null\n", b"~\n"]))
    value = draw(st.one_of(st.lists(st.integers(), max_size=5), st.integers(), st.text(max_size=20), st.floats(),
                           st.booleans(), st.just([base_plan()])))
    return dump(value)


def _dup_json(node: Any, target: Path_ | None, here: Path_ = ()) -> str:
    """JSON (a YAML flow document) of the base plan with the key at ``target`` written twice."""
    if isinstance(node, dict):
        parts = [f"{json.dumps(k)}: {_dup_json(v, target, (*here, k))}" for k, v in node.items()]
        if target is not None and target[:-1] == here:
            parts.append(f"{json.dumps(target[-1])}: {_dup_json(node[target[-1]], None)}")
        return "{" + ", ".join(parts) + "}"
    if isinstance(node, list):
        return "[" + ", ".join(_dup_json(v, target, (*here, i)) for i, v in enumerate(node)) + "]"
    return json.dumps(node)


def _mapping_keys(node: Any, here: Path_ = ()) -> Iterator[Path_]:
    if isinstance(node, dict):
        for k, v in node.items():
            yield (*here, k)
            yield from _mapping_keys(v, (*here, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _mapping_keys(v, (*here, i))


DUP_TARGETS = sorted(_mapping_keys(base_plan()), key=render)


@st.composite
def duplicate_key_cases(draw: st.DrawFn) -> Case:
    target = draw(st.sampled_from(DUP_TARGETS))
    if draw(st.booleans()):  # flow style (JSON)
        content = _dup_json(base_plan(), target).encode()
    else:  # block style: a top-level key written again at the end, with another value
        key = target[0]
        content = BASE_TEXT + yaml.safe_dump({key: get(base_plan(), (key,))}, sort_keys=False).encode()
        target = (key,)
    p = render(target)
    return Case("duplicate", content, (p + ":",), f"duplicate {p}")


def _with_line(draw: st.DrawFn, make: Callable[[str], str]) -> bytes:
    """The base plan (block style) with one line rewritten."""
    lines = BASE_TEXT.decode().splitlines()
    i = draw(st.integers(0, len(lines) - 1))
    lines[i] = make(lines[i])
    return ("\n".join(lines) + "\n").encode()


@st.composite
def tab_indented(draw: st.DrawFn) -> bytes:
    lines = BASE_TEXT.decode().splitlines()
    indented = [i for i, ln in enumerate(lines) if re.match(r" +(- |[a-z_]+:)", ln)]  # not a quoted text's 2nd line
    i = draw(st.sampled_from(indented))
    lines[i] = "\t" + lines[i].lstrip(" ")
    return ("\n".join(lines) + "\n").encode()


@st.composite
def hostile_yaml(draw: st.DrawFn) -> bytes:
    """Unsafe or unknown tags, NUL, control characters, several documents, numbers with thousands of digits."""
    kind = draw(st.sampled_from(["tag", "nul", "control", "documents", "digits", "merge", "big"]))
    if kind == "tag":
        tag = draw(st.sampled_from(["!!python/object/apply:os.system ['touch /tmp/pglab-fuzz-pwned']",
                                    "!!python/name:os.system", "!!binary aGVsbG8=", "!!set {a, b}", "!custom x",
                                    "!!omap [{a: 1}]", "!!pairs [{a: 1}]", "!<tag:evil.example,2024:x> 1",
                                    "!!python/object:subprocess.Popen {args: [id]}"]))
        return (f"name: t\ndescription: {tag}\n").encode()
    if kind == "nul":
        where = draw(st.integers(0, len(BASE_TEXT)))
        return BASE_TEXT[:where] + b"\x00" + BASE_TEXT[where:]
    if kind == "control":
        char = draw(st.sampled_from(["\x01", "\x1b", "\x7f", "\x08", "\ufffe", "\x0b", "\x0c"]))
        return _with_line(draw, lambda ln: ln + char)
    if kind == "documents":
        return BASE_TEXT + b"---\n" + BASE_TEXT
    if kind == "digits":
        n = draw(st.integers(4301, 100000))
        template = draw(st.sampled_from(["dataset: {scale: %s}", "matrix: {clients: [%s]}", "run: {duration: %s}",
                                      "x: %s", "postgres: {parameters: {work_mem: %s}}"]))
        return ("name: t\n" + template % ("9" * n) + "\n").encode()
    if kind == "merge":  # a merge key on something that is not a mapping
        return draw(st.sampled_from([b"name: t\nrun: {<<: [1]}\n", b"name: t\nrun: {<<: 5}\n",
                                     b"name: t\nrun: {<<: *undefined}\n", b"name: t\n<<: {name: u}\n<<: x\n"]))
    return b"# " + b"x" * (1 << 20) + b"\nname: t\n"  # a comment makes the file larger than 1 MiB


whole_file_cases = st.one_of(
    alias_bomb().map(lambda c: file_case("bomb", c)),
    self_anchor().map(lambda c: file_case("self-anchor", c)),
    deep_nesting().map(lambda c: file_case("deep", c)),
    not_utf8().map(lambda c: file_case("utf8", c)),
    not_a_mapping().map(lambda c: file_case("not-a-mapping", c)),
    tab_indented().map(lambda c: file_case("tab", c)),
    hostile_yaml().map(lambda c: file_case("yaml", c)),
    duplicate_key_cases(),
)
any_case = st.one_of(leaf_cases(), shape_cases(), unknown_key_cases(), file_name_cases(), whole_file_cases)

# ----------------------------------------------------------------------------- running the CLI in-process


class Started(AssertionError):
    """Something tried to start a process or a lab: a refused plan must start nothing."""


_REAL_POPEN = subprocess.Popen


class _NoPopen:
    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        argv = args[0] if args else kwargs.get("args")
        if isinstance(argv, list) and len(argv) > 3 and str(argv[0]).endswith("/postgres") and argv[3] == "-C":
            return _REAL_POPEN(*args, **kwargs)  # a valid plan's parameters asked of PostgreSQL: no server starts
        raise Started(f"a process was started: {args!r:.200}")


def _no_start(*args: Any, **kwargs: Any) -> None:
    raise Started(f"the runner or the lab was started: {args!r:.200}")


@contextlib.contextmanager
def nothing_starts() -> Iterator[None]:
    import pglab.engine.sweep
    import pglab.targets.local.cluster

    with mock.patch.object(subprocess, "Popen", _NoPopen), \
            mock.patch.object(pglab.engine.sweep, "run_sweep", _no_start), \
            mock.patch.object(pglab.targets.local.cluster, "LocalLab", _no_start), \
            mock.patch.object(os, "fork", _no_start), mock.patch.object(os, "posix_spawn", _no_start):
        yield


_COMMAND: list[Any] = []  # pglab's click command, built from pglab.cli.app once (typer builds it anew at every call)


def cli(*args: str) -> tuple[int, str, str]:
    """``pglab ARGS`` through the real entry point, in this process: exit code, stdout, stderr. ``main()`` runs as
    the console script runs it; only the command typer would build from the same ``app`` is built once, not at each
    of the thousand calls."""
    import typer.main

    from pglab import cli as pglab_cli

    if not _COMMAND:
        _COMMAND.append(typer.main.get_command(pglab_cli.app))

    stdout, stderr = io.StringIO(), io.StringIO()
    code: Any = 0
    with mock.patch.object(sys, "argv", ["pglab", *args]), mock.patch.object(pglab_cli, "app", _COMMAND[0]), \
            contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr), nothing_starts():
        try:
            pglab_cli.main()
        except SystemExit as exc:
            code = exc.code
    return code if isinstance(code, int) else 1, stdout.getvalue(), stderr.getvalue()


def make_folder(folder: Path) -> Path:
    """The plan's folder: the files the base plan names, and traps for the file-name cases."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / SCRIPT).write_text("SELECT 1;\n")
    (folder / JOB_FILE).write_text("[job]\nrw=read\n")
    (folder / "dir.sql").mkdir(exist_ok=True)
    (folder / "big.sql").write_bytes(b"-- \n" * (1 << 18) + b"x")
    for name, target in (("escape.sql", "/etc/passwd"), ("escape-dir", "/etc"), ("loop.sql", "loop.sql")):
        if not (folder / name).is_symlink():
            (folder / name).symlink_to(target)
    if not (folder / "fifo.sql").exists():
        os.mkfifo(folder / "fifo.sql")
    return folder


def check(case: Case, folder: Path, command: str) -> None:
    plan = folder / "plan.yaml"
    plan.write_bytes(case.content)
    results = folder / "results"
    args = ["plan", "validate", str(plan)] if command == "validate" else ["run", str(plan), "--results", str(results)]
    try:
        code, out, err = cli(*args)
    except Started:
        raise
    except BaseException as exc:  # any escape from main() is a crash the user would see
        raise AssertionError(f"{case.category} {case.note}: pglab crashed with {type(exc).__name__}: {exc}"
                             f"\n{case.content[:300]!r}") from exc
    where = f"{case.category} {case.note}\n{case.content[:300]!r}\nstderr: {err[:2000]}"
    assert code == 2, f"exit {code}: {where}\nstdout: {out[:500]}"
    assert "Traceback" not in err, where
    lines = err.splitlines()
    assert lines and all(line.strip() for line in lines), where
    if case.prefixes is None:  # a whole-file problem: a sentence that names the file
        assert any(line.startswith(f"{plan}: ") for line in lines), where
    else:
        assert any(line.startswith(case.prefixes) for line in lines), f"expected {case.prefixes}: {where}"
    for line in lines:
        assert len(line) < 600, f"a message is not one short line: {where}"
    if command == "run":
        assert not results.exists(), where
    for name in ("lab", "data", "wal"):
        assert not (folder / name).exists(), where


def fuzz(strategy: st.SearchStrategy[Case], examples: int, folder: Path, command: str = "validate",
         quota: int | None = None) -> dict[str, int]:
    """Run ``examples`` derandomized examples; return how many distinct plans each category got."""
    seen: dict[str, set[bytes]] = {}

    @settings(max_examples=examples, derandomize=True, deadline=None, database=None, print_blob=False,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    @given(strategy)
    def run(case: Case) -> None:
        seen.setdefault(case.category, set()).add(case.content)
        check(case, folder, command)

    run()
    counts = {k: len(v) for k, v in sorted(seen.items())}
    total = sum(counts.values())
    print(f"{command}: {total} distinct plans {counts}")
    assert total >= (quota if quota is not None else examples * 0.9), counts
    return counts


# ----------------------------------------------------------------------------- the tests

# what each fuzz test runs: the strategy, examples, command and the distinct plans it must reach (None: 90 %)
FUZZED: dict[str, tuple[Callable[[], st.SearchStrategy[Case]], int, str, int | None]] = {
    "leaf": (leaf_cases, 400, "validate", None),
    "shape": (shape_cases, 100, "validate", 80),
    "key": (unknown_key_cases, 230, "validate", 200),
    "file-name": (file_name_cases, 100, "validate", 80),
    "file": (lambda: whole_file_cases, 200, "validate", 170),
    "run": (lambda: any_case, 150, "run", 130),
}


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], dict[str, int]]:
    """The distinct plans per category of one fuzz of ``FUZZED``, run once per module whichever test asks first:
    each test stands alone (run by itself it fuzzes what it needs), and the module fuzzes each set once."""
    done: dict[str, dict[str, int]] = {}

    def get(name: str) -> dict[str, int]:
        if name not in done:
            strategy, examples, command, quota = FUZZED[name]
            done[name] = fuzz(strategy(), examples, make_folder(tmp_path_factory.mktemp(name)), command, quota)
        return done[name]

    return get


def test_the_base_plan_is_valid(tmp_path: Path) -> None:
    folder = make_folder(tmp_path)
    (folder / "plan.yaml").write_bytes(BASE_TEXT)
    code, out, err = cli("plan", "validate", str(folder / "plan.yaml"))
    assert code == 0, err
    assert "valid" in out


def test_wrong_leaf_values(fuzzed: Callable[[str], dict[str, int]]) -> None:
    assert fuzzed("leaf")


def test_wrong_shapes(fuzzed: Callable[[str], dict[str, int]]) -> None:
    assert fuzzed("shape")


def test_unknown_keys(fuzzed: Callable[[str], dict[str, int]]) -> None:
    assert fuzzed("key")


def test_file_names(fuzzed: Callable[[str], dict[str, int]]) -> None:
    assert fuzzed("file-name")


def test_whole_file_attacks(fuzzed: Callable[[str], dict[str, int]]) -> None:
    counts = fuzzed("file")
    assert {"bomb", "self-anchor", "deep", "utf8", "not-a-mapping", "tab", "yaml", "duplicate"} <= set(counts)


def test_run_refuses_before_starting_anything(fuzzed: Callable[[str], dict[str, int]]) -> None:
    assert fuzzed("run")


def test_at_least_a_thousand_plans(fuzzed: Callable[[str], dict[str, int]]) -> None:
    """Every fuzz above together (each run once in the module, whichever test asked first) tried a thousand
    distinct plans, each refused as check() requires."""
    total = {f"{name}/{category}": n for name in FUZZED for category, n in fuzzed(name).items()}
    assert sum(total.values()) >= 1000, total


# ----------------------------------------------------------------------------- the same, out of process

SUBPROCESS_CASES = [
    ("validate", field_case("leaf", put(base_plan(), ("matrix", "clients", 1), -4), ("matrix", "clients", 1))),
    ("run", field_case("leaf", put(base_plan(), ("run", "duration"), 10**400), ("run", "duration"))),
    ("validate", Case("key", dump({**base_plan(), 5: 1}), ("5:",))),
    ("run", field_case("file", put(base_plan(), FILE_FIELDS[0], "../../../../etc/passwd"), FILE_FIELDS[0])),
    ("validate", field_case("file", put(base_plan(), FILE_FIELDS[1], "escape.sql"), FILE_FIELDS[1])),
    ("run", file_case("bomb", (_bomb(9, 9, True, False) + "\nname: t\n").encode())),
    ("validate", file_case("deep", b"name: t\nrun: " + b"[" * 100000 + b"]" * 100000 + b"\n")),
    ("run", file_case("utf8", b"name: t\xe9st\n")),
    ("validate", Case("duplicate", b"name: t\nrun: {duration: 5, duration: 6}\n", ("run.duration:",))),
    ("run", file_case("tag", b"name: t\ndescription: !!python/object/apply:os.system ['id']\n")),
]


@pytest.mark.parametrize(("command", "case"), SUBPROCESS_CASES, ids=[f"{c}-{k.category}" for c, k in SUBPROCESS_CASES])
def test_out_of_process(tmp_path: Path, command: str, case: Case) -> None:
    folder = make_folder(tmp_path / "plans")
    plan = folder / "plan.yaml"
    plan.write_bytes(case.content)
    results = tmp_path / "results"
    args = ["plan", "validate", str(plan)] if command == "validate" else ["run", str(plan), "--results", str(results)]
    proc = pglab(*args, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    if case.prefixes is None:
        assert any(line.startswith(f"{plan}: ") for line in lines), proc.stderr
    else:
        assert any(line.startswith(case.prefixes) for line in lines), proc.stderr
    assert proc.stdout == ""
    assert not results.exists()
    assert not any((folder / name).exists() for name in ("lab", "data", "wal"))
    assert processes_mentioning(str(tmp_path)) == []
