"""The plan: what to provision, what to run, which axes to sweep. Validated strictly (unknown fields fail)."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

BUILTIN_WORKLOADS = ("tpcb-like", "select-only", "simple-update")
SYNC_COMMIT_LEVELS = ("off", "local", "remote_write", "on", "remote_apply")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h)?\s*$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
_PARAM = re.compile(r"^[a-z_][a-z0-9_.]{0,62}$")
MAX_CLIENTS = 10_000


def _positive_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise PydanticCustomError("positive_int", "must be a positive integer")
    return value


def _non_negative_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise PydanticCustomError("non_negative_int", "must be an integer ≥ 0")
    return value


def _seconds(value: Any) -> float:
    """Accept 60, 60.5, "60s", "500ms", "2m", "1h"; return seconds."""
    if isinstance(value, bool):
        raise PydanticCustomError("duration", "must be a duration such as 30, '30s', '2m' or '500ms'")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and (m := _DURATION.match(value)):
        unit = m.group(2) or "s"
        seconds = float(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "min": 60, "h": 3600}[unit]
    else:
        raise PydanticCustomError("duration", "must be a duration such as 30, '30s', '2m' or '500ms'")
    if not 0 <= seconds <= 7 * 24 * 3600:
        raise PydanticCustomError("duration", "must be between 0 and one week")
    return seconds


PositiveInt = Annotated[int, BeforeValidator(_positive_int)]
NonNegativeInt = Annotated[int, BeforeValidator(_non_negative_int)]
Seconds = Annotated[float, BeforeValidator(_seconds)]
ParamValue = str | int | float | bool


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Synchronous(Strict):
    """Quorum (``any``) or priority (``first``) synchronous replication: ``ANY number (standbys…)``."""

    method: Literal["any", "first"] = "any"
    number: PositiveInt = 1


class LabPaths(Strict):
    """Where the lab lives. ``data`` and ``wal`` may be on different devices to separate WAL."""

    lab: str | None = Field(None, description="lab directory (default: a new temporary directory)")
    data: str | None = Field(None, description="base directory of the data directories (default: lab)")
    wal: str | None = Field(None, description="base directory of the WAL directories (default: lab)")


class LocalTarget(Strict):
    instances: PositiveInt = Field(3, description="primary + standbys")
    synchronous: Synchronous | None = Field(
        default_factory=Synchronous, description="null for asynchronous replication"
    )
    paths: LabPaths = Field(default_factory=LabPaths)
    run_as: str | None = Field(None, description="unprivileged user for the servers when pglab runs as root")
    bindir: str | None = Field(None, description="PostgreSQL bin directory (default: newest installed)")

    @field_validator("instances")
    @classmethod
    def _instances(cls, v: int) -> int:
        if v > 9:
            raise PydanticCustomError("instances", "must be at most 9 on a local lab")
        return v

    @model_validator(mode="after")
    def _sync_fits(self) -> LocalTarget:
        if self.instances == 1 and "synchronous" not in self.model_fields_set:
            object.__setattr__(self, "synchronous", None)  # a lone primary has nobody to wait for
        if self.synchronous is not None and self.synchronous.number > self.instances - 1:
            raise PydanticCustomError(
                "synchronous",
                "synchronous.number ({number}) must be at most the number of standbys ({standbys}); "
                "raise instances or set synchronous: null",
                {"number": self.synchronous.number, "standbys": self.instances - 1},
            )
        return self


class Target(Strict):
    local: LocalTarget | None = None

    @model_validator(mode="after")
    def _one(self) -> Target:
        if self.local is None:
            raise PydanticCustomError("target", "one target is needed; use 'local: {}' for the embedded lab")
        return self


class Postgres(Strict):
    parameters: dict[str, ParamValue] = Field(default_factory=dict)

    @field_validator("parameters")
    @classmethod
    def _names(cls, v: dict[str, ParamValue]) -> dict[str, ParamValue]:
        for name in v:
            _check_param_name(name)
        return v


def _check_param_name(name: str) -> None:
    if not _PARAM.match(name):
        raise PydanticCustomError("param", "'{name}' is not a PostgreSQL parameter name", {"name": name[:64]})
    if name in ("port", "listen_addresses", "unix_socket_directories", "synchronous_standby_names",
                "primary_conninfo", "data_directory", "hba_file", "ident_file", "include", "include_dir"):
        raise PydanticCustomError(
            "param", "'{name}' is managed by pglab and cannot be set in a plan", {"name": name}
        )
    if name == "synchronous_commit":
        raise PydanticCustomError(
            "param", "set synchronous_commit with the matrix axis 'synchronous_commit', not as a parameter"
        )


class Dataset(Strict):
    scale: PositiveInt = 10
    partitions: PositiveInt | None = None
    reset: Literal["vacuum", "reinit"] = Field(
        "vacuum",
        description="before each run: 'vacuum' (truncate history, VACUUM ANALYZE, CHECKPOINT) "
        "or 'reinit' (reload the dataset)",
    )


class Script(Strict):
    """One part of a mixed workload: a built-in script or a custom file, with a weight (pgbench @W)."""

    builtin: Literal["tpcb-like", "select-only", "simple-update"] | None = None
    file: str | None = None
    weight: PositiveInt = 1

    @model_validator(mode="after")
    def _one(self) -> Script:
        if (self.builtin is None) == (self.file is None):
            raise PydanticCustomError("script", "give exactly one of 'builtin' or 'file'")
        if self.file is not None and ("\x00" in self.file or not self.file.strip()):
            raise PydanticCustomError("script", "'file' must be a path to a pgbench script")
        return self


class CustomWorkload(Strict):
    name: str
    scripts: list[Script] = Field(min_length=1)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise PydanticCustomError("name", "must be 1-63 letters, digits, '-', '_' or '.'")
        if v in BUILTIN_WORKLOADS:
            raise PydanticCustomError("name", "'{name}' is a built-in workload name", {"name": v})
        return v


Workload = Literal["tpcb-like", "select-only", "simple-update"] | CustomWorkload
SyncCommit = Literal["off", "local", "remote_write", "on", "remote_apply"]


class Matrix(Strict):
    """Axes; every combination is one point."""

    workload: list[Workload] = Field(default_factory=lambda: ["tpcb-like"], min_length=1)
    clients: list[PositiveInt] = Field(default_factory=lambda: [1], min_length=1)
    jobs: list[PositiveInt] | None = Field(None, description="default: min(clients, cores)")
    synchronous_commit: list[SyncCommit] = Field(default_factory=lambda: ["on"], min_length=1)
    parameters: dict[str, list[ParamValue]] = Field(default_factory=dict)

    @field_validator("clients")
    @classmethod
    def _clients(cls, v: list[int]) -> list[int]:
        for c in v:
            if c > MAX_CLIENTS:
                raise PydanticCustomError("clients", "must be at most {n}", {"n": MAX_CLIENTS})
        return _unique(v)

    @field_validator("synchronous_commit")
    @classmethod
    def _sync(cls, v: list[str]) -> list[str]:
        return _unique(v)

    @field_validator("parameters")
    @classmethod
    def _params(cls, v: dict[str, list[ParamValue]]) -> dict[str, list[ParamValue]]:
        for name, values in v.items():
            _check_param_name(name)
            if not values:
                raise PydanticCustomError("param", "axis 'parameters.{name}' needs at least one value",
                                          {"name": name})
        return v

    @field_validator("workload")
    @classmethod
    def _workloads(cls, v: list[Any]) -> list[Any]:
        names = [w if isinstance(w, str) else w.name for w in v]
        if len(set(names)) != len(names):
            raise PydanticCustomError("workload", "workload names must be unique")
        return v


def _unique(values: list[Any]) -> list[Any]:
    if len(set(values)) != len(values):
        raise PydanticCustomError("unique", "values must be unique")
    return values


class Run(Strict):
    duration: Seconds | None = Field(None, description="measured seconds per run (default 60 s)")
    transactions: PositiveInt | None = Field(None, description="transactions per client instead of duration")
    warmup: Seconds = Field(0.0, description="run before the measured window, outside it")
    repeats: PositiveInt = 1
    rate: float | None = Field(None, gt=0, description="target transactions/s (pgbench -R)")
    sampling_rate: float = Field(1.0, gt=0, le=1, description="share of transactions logged (pgbench --sampling-rate)")
    protocol: Literal["simple", "extended", "prepared"] = "simple"
    pause: Seconds = Field(0.0, description="idle seconds between runs")

    @model_validator(mode="after")
    def _duration_or_tx(self) -> Run:
        if self.duration is not None and self.transactions is not None:
            raise PydanticCustomError("run", "give either 'duration' or 'transactions', not both")
        if self.duration is not None and self.duration < 1:
            raise PydanticCustomError("run", "'duration' must be at least 1 second")
        if self.repeats > 1000:
            raise PydanticCustomError("run", "'repeats' must be at most 1000")
        return self

    @property
    def measured_seconds(self) -> float | None:
        if self.transactions is not None:
            return None
        return self.duration if self.duration is not None else 60.0


class Probes(Strict):
    wait_hz: float = Field(5.0, ge=1, le=50, description="wait-event sampling rate")
    enabled: bool = True


_SIZE = re.compile(r"^\s*\d+(\.\d+)?\s*([kmgt]i?b?)?\s*$", re.IGNORECASE)


def _size(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int | str) or not _SIZE.match(str(value)):
        raise PydanticCustomError("size", "must be a size such as 256MiB, 1GiB or a number of bytes")
    return str(value)


class Storage(Strict):
    """The storage phase: fio on the lab's own data and WAL paths, before the database phase."""

    profiles: list[Literal["randread-8k", "randwrite-8k", "wal-fdatasync-8k", "seqread-1m", "seqwrite-1m",
                           "mixed-70-30-8k"]] = Field(
        default_factory=lambda: ["randread-8k", "randwrite-8k", "wal-fdatasync-8k", "seqwrite-1m"])
    job_files: list[str] = Field(default_factory=list, description="custom fio job files (plan-relative)")
    runtime: Seconds = Field(30.0, description="seconds per fio job")
    size: Annotated[str, BeforeValidator(_size)] = Field("1GiB", description="size of each job's test file")
    paths: list[Literal["data", "wal"]] = Field(default_factory=lambda: ["data", "wal"], min_length=1)

    @field_validator("runtime")
    @classmethod
    def _runtime(cls, v: float) -> float:
        if v < 1:
            raise PydanticCustomError("runtime", "must be at least 1 second")
        return v


class Cost(Strict):
    """What the configuration costs per month, to turn TPS into cost per TPS."""

    monthly: float = Field(gt=0, description="price per month of the whole configuration")
    currency: str = Field("USD", pattern=r"^[A-Z]{3}$")
    breakdown: dict[str, float] = Field(default_factory=dict, description="optional parts (compute, storage …)")

    @model_validator(mode="after")
    def _parts_add_up(self) -> Cost:
        if self.breakdown:
            total = sum(self.breakdown.values())
            if abs(total - self.monthly) > 0.01 * self.monthly:
                raise PydanticCustomError("cost", "breakdown adds up to {total}, not to monthly ({monthly})",
                                          {"total": f"{total:g}", "monthly": f"{self.monthly:g}"})
        return self


class Plan(Strict):
    name: str
    description: str | None = None
    target: Target = Field(default_factory=lambda: Target(local=LocalTarget()))
    postgres: Postgres = Field(default_factory=Postgres)
    dataset: Dataset = Field(default_factory=Dataset)
    matrix: Matrix = Field(default_factory=Matrix)
    run: Run = Field(default_factory=Run)
    probes: Probes = Field(default_factory=Probes)
    storage: Storage | None = Field(None, description="run fio on the lab's paths before the database phase")
    cost: Cost | None = Field(None, description="monthly price, for cost per TPS")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise PydanticCustomError("name", "must be 1-63 letters, digits, '-', '_' or '.'")
        return v
