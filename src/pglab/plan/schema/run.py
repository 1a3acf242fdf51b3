"""What runs on the target: the server's parameters, the pgbench dataset, the workloads, a run's length and
repeats, the probes, and the storage phase (fio)."""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Discriminator, Field, Tag, field_validator, model_validator
from pydantic_core import PydanticCustomError

from pglab.plan.schema.base import (
    Name,
    ParamValue,
    PlanFile,
    PlanSize,
    Rate,
    Seconds,
    Strict,
    _int_between,
    _number_between,
    _unique,
    show,
)

BUILTIN_WORKLOADS = ("tpcb-like", "select-only", "simple-update")
_PARAM = re.compile(r"[a-z_][a-z0-9_.]{0,62}")
MAX_SCALE = 100_000
MAX_PARTITIONS = 10_000
MAX_WEIGHT = 10_000
MAX_TRANSACTIONS = 1_000_000_000
MAX_REPEATS = 1000
MAX_LOAD_PODS = 64


class Postgres(Strict):
    parameters: dict[str, ParamValue] = Field(
        default_factory=dict, description="postgresql.conf settings of every instance, e.g. shared_buffers: 1GB")

    @field_validator("parameters")
    @classmethod
    def _names(cls, v: dict[str, ParamValue]) -> dict[str, ParamValue]:
        for name in v:
            _check_param_name(name)
        return v


def _check_param_name(name: str) -> None:
    if not _PARAM.fullmatch(name):
        raise PydanticCustomError("param", "{name} is not a PostgreSQL parameter name", {"name": show(name)})
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
    scale: Annotated[int, _int_between(1, MAX_SCALE)] = Field(
        10, description="pgbench scale factor (-s): 100,000 accounts, about 15 MB, per unit")
    partitions: Annotated[int, _int_between(1, MAX_PARTITIONS)] | None = Field(
        None, description="pgbench_accounts partitions (pgbench --partitions); none: not partitioned")
    reset: Literal["vacuum", "reinit", "snapshot"] = Field(
        "vacuum",
        description="before each run: 'vacuum' (truncate history, VACUUM ANALYZE, CHECKPOINT), "
        "'reinit' (reload the dataset with pgbench -i) or 'snapshot' (local lab: every instance put back to the "
        "snapshot taken after the first load, a reflink copy where the filesystem allows)",
    )
    cache: bool = Field(
        True, description="local lab: keep the first load of this dataset in the user's dataset cache and start "
        "later labs with the same PostgreSQL build, dataset and settings that shape the files from it instead of "
        "loading again (a copy, or a reflink where the filesystem allows); the run records whether it came from "
        "the cache (`pglab cache list|clean`; PGLAB_CACHE_DIR, PGLAB_CACHE_SIZE, PGLAB_CACHE=off)",
    )


class Script(Strict):
    """One part of a mixed workload: a built-in script or a custom file, with a weight (pgbench @W)."""

    builtin: Literal["tpcb-like", "select-only", "simple-update"] | None = Field(
        None, description="a pgbench built-in script (instead of file)")
    file: PlanFile | None = Field(None, description="pgbench script, relative to the plan's folder")
    weight: Annotated[int, _int_between(1, MAX_WEIGHT)] = Field(
        1, description="relative share of the transactions run with this script")

    @model_validator(mode="after")
    def _one(self) -> Script:
        if (self.builtin is None) == (self.file is None):
            raise PydanticCustomError("script", "give exactly one of 'builtin' or 'file'")
        return self


class CustomWorkload(Strict):
    name: Name = Field(description="the workload's name in tables: 1-63 letters, digits, '-', '_' or '.'")
    scripts: list[Script] = Field(min_length=1, max_length=100, description="the scripts mixed, each with its "
                                  "weight (1 to 100 of them)")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if v in BUILTIN_WORKLOADS:
            raise PydanticCustomError("name", "'{name}' is a built-in workload name", {"name": v})
        return v


Workload = Literal["tpcb-like", "select-only", "simple-update"] | CustomWorkload


def _percent(value: Any) -> float:
    """``5%`` (or a bare number, read as percent): in (0, 100)."""
    text = value.strip().removesuffix("%").strip() if isinstance(value, str) and value.strip().endswith("%") else None
    try:
        number = float(text) if text is not None else value
    except ValueError:
        number = None
    if isinstance(number, bool) or not isinstance(number, int | float) or not math.isfinite(number):
        raise PydanticCustomError("percent", "must be a percentage such as 5%")
    if not 0 < number < 100:
        raise PydanticCustomError("percent", "must be more than 0% and less than 100%")
    return float(number)


Percent = Annotated[float, BeforeValidator(_percent)]


class AdaptiveRepeats(Strict):
    """Repeat a point until its TPS is known well enough, as pyperf and the Phoronix suite do: at least ``min``
    runs, then more (one round at a time) until the 95 % interval's half-width is within ``target_ci`` of the mean,
    or ``max`` runs."""

    min: Annotated[int, _int_between(2, MAX_REPEATS, "an integer of at least 2 (an interval needs two runs)")] = (
        Field(3, description="runs before the interval is first checked (at least 2)"))
    max: Annotated[int, _int_between(2, MAX_REPEATS, "an integer of at least 2")] = Field(
        10, description="runs at most, even when the interval is still wider")
    target_ci: Percent = Field(description="half-width of TPS's 95 % interval, % of the mean, e.g. 5%")

    @model_validator(mode="after")
    def _bounds(self) -> AdaptiveRepeats:
        if self.max < self.min:
            raise PydanticCustomError("run", "max ({max}) must be at least min ({min})",
                                      {"max": self.max, "min": self.min, "at": "max"})
        return self


# a count, or a mapping of adaptive settings: told apart by the input's type, so each gets its own messages
Repeats = Annotated[Annotated[Annotated[int, _int_between(1, MAX_REPEATS)], Tag("count")]
                    | Annotated[AdaptiveRepeats, Tag("adaptive")],
                    Discriminator(lambda v: "adaptive" if isinstance(v, dict | AdaptiveRepeats) else "count")]


class Run(Strict):
    duration: Seconds | None = Field(None, description="measured seconds per run (default 60 s)")
    transactions: Annotated[int, _int_between(1, MAX_TRANSACTIONS)] | None = Field(
        None, description="transactions per client instead of duration")
    warmup: Seconds = Field(0.0, description="run before the measured window, outside it")
    repeats: Repeats = Field(
        1, description="runs per point, or {min, max, target_ci} to repeat until TPS is known within target_ci")
    order: Literal["interleaved", "sequential"] = Field(
        "interleaved", description="interleaved: each round runs every point once, in a shuffled order, so drift "
                                   "spreads over the points; CPU steps and parameter sets form blocks")
    seed: Annotated[int, _int_between(0, 2**63 - 1, "a non-negative integer")] | None = Field(
        None, description="seed of the interleaved order (default: drawn and recorded with the sweep)")
    rate: Rate | None = Field(None, description="target transactions/s (pgbench -R); as an axis: matrix.rate")
    latency_limit: Seconds | None = Field(
        None, description="pgbench --latency-limit (e.g. '5ms'): transactions slower count as late; with a rate, "
        "those already that late at their scheduled start are skipped")
    sampling_rate: Annotated[float, _number_between(0, 1, low_open=True)] = Field(
        1.0, description="share of transactions logged (pgbench --sampling-rate)")
    protocol: Literal["simple", "extended", "prepared"] = Field(
        "simple", description="query protocol of pgbench (-M)")
    pause: Seconds = Field(0.0, description="idle seconds between runs")
    load_pods: Annotated[int, _int_between(1, MAX_LOAD_PODS)] = Field(
        1, description="Kubernetes: pgbench pods that drive each run together (one Indexed Job, on distinct nodes "
        "where possible): the point's clients and threads split over them, TPS summed over their common window, "
        "latency from their merged transaction logs")
    # how long pglab waits for a silent part before it gives up (docs/reliability.md): the defaults suit a local lab
    # and most servers; a slower platform may need longer, a test that freezes a part on purpose shorter
    overrun: Seconds | None = Field(
        None, description="local, Patroni and external targets: seconds a pgbench may go on past its duration "
        "before the run fails as stuck (commits waiting for a standby or a primary that stopped answering) and it is "
        "stopped (default: the duration, at least 30 s); longer where opening the clients' connections takes long "
        "(many clients, TLS, a remote server), shorter to fail a hung run sooner")
    replay_stall: Seconds = Field(
        60.0, description="local, Patroni and external targets: before each run the standbys catch up with the "
        "primary; when none of those behind replays anything for this many seconds they count as stopped and the "
        "sweep stops in one sentence; longer on a platform whose standbys may pause that long (a throttled disk or "
        "VM), shorter to give up on a hung standby sooner")
    connect_timeout: Seconds = Field(
        10.0, description="local, Patroni and external targets: seconds pglab's own connection to the primary "
        "between runs may take (a whole number, at least 2: libpq's connect_timeout); two in a row that time out "
        "stop the sweep in one sentence (its quick looks right after a failed run take 5 s at most, or this if "
        "shorter); longer for a primary slow to accept a connection (far away, behind a busy "
        "pooler), shorter to give up on a frozen one sooner")

    @field_validator("duration", "overrun", "replay_stall")
    @classmethod
    def _duration(cls, v: float | None) -> float | None:
        if v is not None and v < 1:
            raise PydanticCustomError("run", "must be at least 1 second")
        return v

    @field_validator("connect_timeout")
    @classmethod
    def _connect_timeout(cls, v: float) -> float:
        if v != int(v) or v < 2:
            raise PydanticCustomError("run", "must be a whole number of seconds, at least 2 (libpq's connect_timeout)")
        return v

    @model_validator(mode="after")
    def _duration_or_tx(self) -> Run:
        if self.duration is not None and self.transactions is not None:
            raise PydanticCustomError("run", "give either 'duration' or 'transactions', not both")
        return self

    @property
    def min_repeats(self) -> int:
        return self.repeats.min if isinstance(self.repeats, AdaptiveRepeats) else self.repeats

    @property
    def max_repeats(self) -> int:
        return self.repeats.max if isinstance(self.repeats, AdaptiveRepeats) else self.repeats

    @property
    def target_ci_pct(self) -> float | None:
        return self.repeats.target_ci if isinstance(self.repeats, AdaptiveRepeats) else None

    def overrun_s(self, seconds: float) -> float:
        """How long a pgbench of ``seconds`` may go on past them before its run fails as stuck."""
        return self.overrun if self.overrun is not None else max(30.0, seconds)

    @property
    def measured_seconds(self) -> float | None:
        if self.transactions is not None:
            return None
        return self.duration if self.duration is not None else 60.0


class Probes(Strict):
    wait_hz: Annotated[float, _number_between(1, 50)] = Field(5.0, description="wait-event sampling rate")
    enabled: bool = Field(True, description="false: no disk, CPU, memory or PostgreSQL sampling during runs "
                          "(pgbench's own figures only)")


FioProfile = Literal["randread-8k", "randwrite-8k", "wal-fdatasync-8k", "seqread-8k", "seqwrite-8k", "seqread-1m",
                     "seqwrite-1m", "mixed-70-30-8k"]
StoragePath = Literal["data", "wal"]


def _host_dir(v: Any) -> str:
    """An absolute directory of the node, as a hostPath volume takes it ({node}: the node's name)."""
    if not isinstance(v, str) or not v.startswith("/") or len(v) > 4096 or "\0" in v or \
            ".." in v.split("/") or v.replace("{node}", "").count("{") or v.replace("{node}", "").count("}"):
        raise PydanticCustomError("host_path", "must be an absolute directory of the node, e.g. /mnt/disks/ssd0 "
                                  "({node} stands for the node's name), without '..'")
    return v.rstrip("/") or "/"


def _host_path(v: Any) -> Any:
    """One directory, or storage class → directory."""
    if v is None:
        return None
    if not isinstance(v, dict):
        return _host_dir(v)
    if not v:
        raise PydanticCustomError("host_path", "names no storage class; give a directory or class: directory")
    for key in v:
        if not isinstance(key, str) or not re.fullmatch(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?", key):
            raise PydanticCustomError("host_path", "{key} is not a storage class name", {"key": show(key, 60)})
    return {key: _host_dir(d) for key, d in v.items()}


class Storage(Strict):
    """The storage phase: fio on the lab's own data and WAL paths, before the database phase."""

    profiles: list[FioProfile] = Field(
        default_factory=lambda: list[FioProfile](["randread-8k", "randwrite-8k", "wal-fdatasync-8k", "seqwrite-1m"]),
        description="built-in fio jobs: 8 KiB random and sequential IO, WAL-like 8 KiB writes with fdatasync, "
                    "1 MiB sequential IO")
    job_files: list[PlanFile] = Field(default_factory=list, max_length=100,
                                      description="custom fio job files (relative to the plan's folder)")
    runtime: Seconds = Field(30.0, description="seconds per fio job")
    size: PlanSize = Field("1GiB", validate_default=True, description="size of each job's test file")
    paths: list[StoragePath] = Field(default_factory=lambda: list[StoragePath](["data", "wal"]), min_length=1,
                                     description="which of the lab's paths fio measures: data, wal or both")
    host_path: Annotated[str | dict[str, str] | None, BeforeValidator(_host_path)] = Field(
        None, description="Kubernetes: a directory on the nodes (a hostPath, {node} replaced by the node's name) "
        "where the same fio jobs also run, in a pod on the same node right after the PVC's, for the volume layer's "
        "cost; one directory for every class, or storage class → directory")

    @field_validator("runtime")
    @classmethod
    def _runtime(cls, v: float) -> float:
        if v < 1:
            raise PydanticCustomError("runtime", "must be at least 1 second")
        return v

    @field_validator("profiles", "paths")
    @classmethod
    def _distinct(cls, v: list[str]) -> list[str]:
        return _unique(v)
