"""The plan grammar's building blocks: the limits several sections share, the field types and checks every section
uses (durations, sizes, text, parameter values, CPU counts, synchronous_commit levels), the strict model base, and
the synchronous replication both lab targets share (a domain's own limits are in its module)."""

from __future__ import annotations

import math
import posixpath
import re
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer, PlainValidator, WithJsonSchema
from pydantic_core import PydanticCustomError

from pglab.units import NotASize, NotWholeBytes, Size

_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h)?\s*", re.ASCII)
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
MAX_CLIENTS = 10_000
MAX_RATE = 10_000_000
MAX_TEXT = 4096  # paths and free text; PATH_MAX on Linux
MAX_VALUE = 1024  # a PostgreSQL parameter value given as text
WEEK = 7 * 24 * 3600
_INT64 = 1 << 63


def show(value: object, limit: int = 60) -> str:
    """A value for a one-line message: quoted, at most ``limit`` characters, control characters escaped."""
    try:
        text = str(value)
    except ValueError:  # an int too long to print
        return "a number with thousands of digits"
    cut = len(text) > limit
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[:limit])
    return "'" + text + ("…'" if cut else "'")


def _int_between(low: int, high: int, what: str = "a positive integer") -> Any:
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise PydanticCustomError("int", f"must be {what}")
        if value > high:
            raise PydanticCustomError("int", "must be at most {high}", {"high": high})
        return value

    return BeforeValidator(check)


def _number_between(low: float, high: float, *, low_open: bool = False) -> Any:
    """A YAML number (not a string, not a boolean), finite, in [low, high] (or (low, high])."""

    def check(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float) or (
                isinstance(value, float) and not math.isfinite(value)):  # an int is exact, however large
            raise PydanticCustomError("number", "must be a number")
        if value < low or (low_open and value == low):
            raise PydanticCustomError("number", "must be greater than {low}" if low_open else "must be at least {low}",
                                      {"low": f"{low:g}"})
        if value > high:
            raise PydanticCustomError("number", "must be at most {high}", {"high": f"{high:g}"})
        return float(value)

    return BeforeValidator(check)


def _control_chars(text: str, multiline: bool) -> bool:
    allowed = "\n\t" if multiline else ""
    return any(not c.isprintable() and c not in allowed for c in text)


def _text(limit: int = MAX_TEXT, *, multiline: bool = False, pattern: re.Pattern[str] | None = None,
          what: str = "text") -> Any:
    def check(value: Any) -> str:
        if not isinstance(value, str):
            raise PydanticCustomError("text", f"must be {what}")
        if len(value) > limit:
            raise PydanticCustomError("text", "must be at most {limit} characters long", {"limit": limit})
        if _control_chars(value, multiline):
            raise PydanticCustomError("text", "must not contain control characters (line breaks, tabs, NUL)"
                                      if not multiline else "must not contain control characters (NUL …)")
        if pattern is not None and not pattern.fullmatch(value):
            raise PydanticCustomError("text", f"must be {what}")
        return value

    return BeforeValidator(check)


def _plan_file(value: Any) -> str:
    """A file next to the plan: a relative path that stays inside the plan's folder (checked again on disk)."""
    if not isinstance(value, str) or not value.strip():
        raise PydanticCustomError("file", "must be the path of a file, relative to the plan's folder")
    if len(value) > MAX_TEXT:
        raise PydanticCustomError("file", "must be at most {limit} characters long", {"limit": MAX_TEXT})
    if _control_chars(value, multiline=False):
        raise PydanticCustomError("file", "must not contain control characters (line breaks, tabs, NUL)")
    if value.startswith(("/", "~")):
        raise PydanticCustomError("file", "must be relative to the plan's folder, not {shown}; copy the file next "
                                  "to the plan", {"shown": "an absolute path" if value[0] == "/" else "'~'"})
    if posixpath.normpath(value).split("/")[0] == "..":
        raise PydanticCustomError("file", "{shown} leads out of the plan's folder; copy the file next to the plan",
                                  {"shown": show(value)})
    return value


def _positive_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise PydanticCustomError("positive_int", "must be a positive integer")
    return value


def _seconds(value: Any) -> float:
    """Accept 60, 60.5, "60s", "500ms", "2m", "1h"; return seconds."""
    if isinstance(value, bool):
        raise PydanticCustomError("duration", "must be a duration such as 30, '30s', '2m' or '500ms'")
    if isinstance(value, int) and not 0 <= value <= WEEK:  # before float(): a huge int does not fit one
        raise PydanticCustomError("duration", "must be between 0 and one week")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and len(value) <= 64 and (m := _DURATION.fullmatch(value)):
        unit = m.group(2) or "s"
        seconds = float(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "min": 60, "h": 3600}[unit]
    else:
        raise PydanticCustomError("duration", "must be a duration such as 30, '30s', '2m' or '500ms'")
    if not 0 <= seconds <= WEEK:  # also refuses NaN
        raise PydanticCustomError("duration", "must be between 0 and one week")
    return seconds


def _param_value(value: Any) -> str | int | float | bool:
    """A PostgreSQL parameter value: text (one line, written quoted into postgresql.conf), a number or a boolean."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        if not -_INT64 <= value < _INT64:
            raise PydanticCustomError("param_value", "must be a number PostgreSQL can hold (64 bits at most)")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise PydanticCustomError("param_value", "must be a finite number")
        return value
    if isinstance(value, str):
        if len(value) > MAX_VALUE:
            raise PydanticCustomError("param_value", "must be at most {limit} characters long", {"limit": MAX_VALUE})
        if _control_chars(value, multiline=False):
            raise PydanticCustomError("param_value", "must not contain control characters (line breaks, tabs, NUL)")
        return value
    raise PydanticCustomError("param_value", "must be a string, a number or a boolean")


PositiveInt = Annotated[int, BeforeValidator(_positive_int)]
Seconds = Annotated[float, BeforeValidator(_seconds)]
ParamValue = Annotated[str | int | float | bool, BeforeValidator(_param_value)]
PlanFile = Annotated[str, BeforeValidator(_plan_file)]
Text = Annotated[str, _text()]
Name = Annotated[str, _text(63, pattern=_NAME, what="1-63 letters, digits, '-', '_' or '.'")]  # a name in tables
Clients = Annotated[int, _int_between(1, MAX_CLIENTS)]

MIN_SIZE, MAX_SIZE = 1 << 20, 1 << 50


def _size(value: Any) -> Size:
    """A fio size: bytes, or a number with a binary unit (fio's kb_base=1024): 256MiB, 1G, 512m; 1 MiB … 1 PiB.

    Parsed here, once: the field holds the text as written and its ``.bytes``."""
    try:
        size = Size(value)
    except NotWholeBytes as exc:
        if exc.exact > MAX_SIZE:
            raise PydanticCustomError("size", "must be between 1 MiB and 1 PiB") from None
        raise PydanticCustomError("size", "must be a whole number of bytes") from None
    except NotASize:
        raise PydanticCustomError("size", "must be a size such as 256MiB, 1GiB or a number of bytes") from None
    if not MIN_SIZE <= size.bytes <= MAX_SIZE:
        raise PydanticCustomError("size", "must be between 1 MiB and 1 PiB")
    return size


# The text the user wrote (dumps, stored plans and manifests show it unchanged) and its bytes (``.bytes``).
PlanSize = Annotated[Size, PlainValidator(_size), PlainSerializer(str, return_type=str),
                     WithJsonSchema({"type": "string"})]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Synchronous(Strict):
    """Quorum (``any``) or priority (``first``) synchronous replication: ``ANY number (standbys…)``."""

    method: Literal["any", "first"] = Field(
        "any", description="any: a quorum of standbys confirms each commit; first: the first standbys in order do")
    number: Annotated[int, _int_between(1, 8)] = Field(1, description="how many standbys must confirm a commit")


Cpus = Annotated[float, _number_between(0.0, 1024.0, low_open=True)]
Rate = Annotated[float, _number_between(0, MAX_RATE, low_open=True)]  # transactions/s, pgbench -R


def _sync_level(value: Any) -> Any:
    """YAML 1.1 reads unquoted on/off as booleans; for synchronous_commit they can only mean the levels."""
    return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value


SyncCommit = Annotated[Literal["off", "local", "remote_write", "on", "remote_apply"], BeforeValidator(_sync_level)]


def _unique(values: Any, key: Callable[[Any], Any] = lambda v: v, message: str = "values must be unique") -> Any:
    if values is not None and len({key(v) for v in values}) != len(values):
        raise PydanticCustomError("unique", message)
    return values
