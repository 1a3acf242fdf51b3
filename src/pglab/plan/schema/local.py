"""target.local: the lab pglab builds on this host (its paths, limits, replication link and HA)."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from pglab.plan.schema.base import (
    Cpus,
    PlanSize,
    PositiveInt,
    Strict,
    Synchronous,
    Text,
    _int_between,
    _number_between,
    _text,
)

_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}")


class LabPaths(Strict):
    """Where the lab lives. ``data`` and ``wal`` may be on different devices to separate WAL."""

    lab: Text | None = Field(None, description="lab directory (default: a new temporary directory)")
    data: Text | None = Field(None, description="base directory of the data directories (default: lab)")
    wal: Text | None = Field(None, description="base directory of the WAL directories (default: lab)")


_CPUSET = re.compile(r"\d{1,4}(-\d{1,4})?(,\d{1,4}(-\d{1,4})?){0,63}")


class Resources(Strict):
    """Limits per instance, through cgroups (like a Kubernetes pod's requests = limits: Guaranteed QoS)."""

    cpus: Cpus | None = Field(None, description="CPU quota in cores (1.5 = 150 ms of CPU time per 100 ms)")
    memory: PlanSize | None = Field(None, description="memory limit (cgroup memory.max), e.g. 4GiB")
    read_iops: Annotated[int, _int_between(1, 10**9)] | None = Field(None, description="read IOs per second")
    write_iops: Annotated[int, _int_between(1, 10**9)] | None = Field(None, description="write IOs per second")
    read_mbps: Annotated[float, _number_between(0.0, 10**6, low_open=True)] | None = Field(
        None, description="read MiB per second")
    write_mbps: Annotated[float, _number_between(0.0, 10**6, low_open=True)] | None = Field(
        None, description="write MiB per second")


class Client(Strict):
    """pgbench's own budget, so that server and client do not steal from each other unseen."""

    cpus: Cpus | None = Field(None, description="CPU quota of pgbench, in cores")
    cpuset: Annotated[str, _text(256, pattern=_CPUSET, what="a CPU list such as 1 or 0-1,3")] | None = Field(
        None, description="CPUs pgbench may run on (cpuset), e.g. '1'")


class Network(Strict):
    """The replication link between the primary and each standby, shaped through Toxiproxy."""

    latency_ms: Annotated[int, _int_between(0, 10_000, "a whole number of milliseconds, 0 or more")] = Field(
        0, description="added round trip (half each way): what every synchronous commit pays on top")
    jitter_ms: Annotated[int, _int_between(0, 10_000, "a whole number of milliseconds, 0 or more")] = Field(
        0, description="spread of the added round trip (uniform ±)")
    bandwidth_kbps: Annotated[int, _int_between(8, 10**9, "a whole number of kbit/s, at least 8")] | None = Field(
        None, description="primary → standby bandwidth cap in kbit/s (a multiple of 8)")

    @model_validator(mode="after")
    def _consistent(self) -> Network:
        if self.jitter_ms > self.latency_ms:
            raise PydanticCustomError("network", "jitter_ms ({j}) must be at most latency_ms ({l}): a delay cannot "
                                      "be negative", {"j": self.jitter_ms, "l": self.latency_ms, "at": "jitter_ms"})
        if self.bandwidth_kbps is not None and self.bandwidth_kbps % 8:
            raise PydanticCustomError("network", "must be a multiple of 8 (Toxiproxy shapes whole kB/s)",
                                      {"at": "bandwidth_kbps"})
        return self


class LocalTarget(Strict):
    instances: PositiveInt = Field(3, description="primary + standbys")
    synchronous: Synchronous | None = Field(
        default_factory=Synchronous, description="null for asynchronous replication"
    )
    paths: LabPaths = Field(default_factory=LabPaths, description="where the lab, its data and its WAL live")
    run_as: Annotated[str, _text(32, pattern=_USER, what="a user name")] | None = Field(
        None, description="unprivileged user for the servers when pglab runs as root")
    bindir: Text | None = Field(None, description="PostgreSQL bin directory (default: newest installed)")
    resources: Resources | None = Field(None, description="CPU, memory and IO limits of each instance (cgroups)")
    client: Client | None = Field(None, description="pgbench's own cgroup: CPU quota and/or cpuset")
    network: Network | None = Field(None, description="replication link latency/bandwidth through Toxiproxy")
    limits: Literal["strict", "best-effort"] = Field(
        "strict", description="strict: fail when limits cannot be applied; best-effort: run, and record that "
        "they were not")
    ha: Literal["patroni"] | None = Field(
        None, description="'patroni': the instances run under Patroni with an etcd of their own, clients follow "
        "the leader (failover and switchover scenarios need it)")

    @field_validator("instances")
    @classmethod
    def _instances(cls, v: int) -> int:
        if v > 9:
            raise PydanticCustomError("instances", "must be at most 9 on a local lab")
        return v

    @model_validator(mode="after")
    def _ha_fits(self) -> LocalTarget:
        if self.ha is None:
            return self
        if self.instances < 2:
            raise PydanticCustomError("ha", "an HA lab needs at least 2 instances", {"at": "instances"})
        return self

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
