"""The plan as a whole: exactly one target, and what the sections allow together (what a target cannot do, a
scenario or tenants that do not fit it, the number of runs)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator
from pydantic_core import PydanticCustomError

from pglab.plan.schema.base import MAX_TEXT, Name, Strict, _text
from pglab.plan.schema.capacity import Capacity, Cost
from pglab.plan.schema.external import ExternalTarget
from pglab.plan.schema.kubernetes import _DNS_LABEL, K8S_FIXED_PARAMETERS, KubernetesTarget, quantity_bytes
from pglab.plan.schema.local import LocalTarget
from pglab.plan.schema.matrix import Matrix
from pglab.plan.schema.run import CustomWorkload, Dataset, Postgres, Probes, Run, Storage
from pglab.plan.schema.tenants import Tenants
from pglab.units import size_bytes

MAX_RUNS = 100_000


def wal_size_bytes(value: str | int | float | bool) -> int | None:
    """min_wal_size or max_wal_size in bytes as PostgreSQL reads it (a bare number is MB), None if not a size
    (PostgreSQL will say so itself)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float) or str(value).strip().isdigit():
        return int(float(value) * 2**20)
    try:
        return size_bytes(str(value))
    except ValueError:
        return None


class Target(Strict):
    local: LocalTarget | None = Field(None, description="a lab pglab builds on this host (default when no target "
                                      "is given)")
    external: ExternalTarget | None = Field(None, description="an existing server, measured as it is")
    kubernetes: KubernetesTarget | None = Field(None, description="a CloudNativePG cluster pglab creates")

    @model_validator(mode="after")
    def _one(self) -> Target:
        if sum(t is not None for t in (self.local, self.external, self.kubernetes)) != 1:
            raise PydanticCustomError("target", "give exactly one target: 'local: {}' for the embedded lab, "
                                      "'external: {conninfo: …}' for an existing server, or 'kubernetes: {…}' for a "
                                      "CloudNativePG cluster")
        return self


class Plan(Strict):
    name: Name = Field(description="the plan's name: 1-63 letters, digits, '-', '_' or '.'; the default results "
                      "folder is results/<name>")
    description: Annotated[str, _text(MAX_TEXT, multiline=True)] | None = Field(
        None, description="free text stored with the results and shown in reports")
    target: Target = Field(default_factory=lambda: Target(local=LocalTarget()),
                           description="where PostgreSQL runs: exactly one of local, external, kubernetes")
    postgres: Postgres = Field(default_factory=Postgres, description="server settings for every point")
    dataset: Dataset = Field(default_factory=Dataset, description="the pgbench dataset and how runs start from it")
    matrix: Matrix = Field(default_factory=Matrix, description="the axes swept; every combination is one point")
    run: Run = Field(default_factory=Run, description="how long each run lasts, how often points repeat, in which "
                     "order")
    probes: Probes = Field(default_factory=Probes, description="what is sampled during runs")
    storage: Storage | None = Field(None, description="run fio on the lab's paths before the database phase")
    cost: Cost | None = Field(None, description="monthly price, for cost per TPS")
    capacity: Capacity | None = Field(None, description="search, for each point of the matrix, the highest rate "
                                      "(transactions/s) whose latency percentile stays under a target")
    tenants: Tenants | None = Field(None, description="many tenants in QoS tiers, measured in the same window "
                                    "(instead of the matrix): on one local host, or a CloudNativePG Cluster each on "
                                    "Kubernetes")

    @model_validator(mode="after")
    def _external_is_not_reconfigured(self) -> Plan:
        if self.target.external is None:
            return self
        for given, field in ((self.postgres.parameters, "postgres.parameters"),
                             (self.matrix.parameters, "matrix.parameters"), (self.storage, "storage"),
                             (self.matrix.cpus, "matrix.cpus"), (self.dataset.reset == "snapshot", "dataset.reset")):
            if given:
                raise PydanticCustomError("external", "an external target is measured as it is (pglab never "
                                          "changes its settings nor runs fio on its disks); remove this",
                                          {"at": field})
        return self

    @model_validator(mode="after")
    def _kubernetes_fits(self) -> Plan:
        """What the Kubernetes target cannot do yet is refused here, not discovered half-way through a sweep."""
        k8s = self.target.kubernetes
        if k8s is None:
            if self.storage and self.storage.host_path is not None:
                raise PydanticCustomError("kubernetes", "host_path runs fio in a pod on a node's directory: a "
                                          "Kubernetes target only (on a local target, storage.paths are already "
                                          "the host's); remove it", {"at": "storage.host_path"})
            return self
        for where, names in (("postgres.parameters", self.postgres.parameters),
                             ("matrix.parameters", self.matrix.parameters)):
            for name in names:
                if name in K8S_FIXED_PARAMETERS:
                    raise PydanticCustomError("kubernetes", "'{name}' is managed by CloudNativePG and cannot be set "
                                              "on a Kubernetes target", {"name": name, "at": f"{where}.{name}"})
        for given, field, why in (
                (self.storage and self.storage.job_files, "storage.job_files", "custom fio job files"),
                (self.dataset.reset == "snapshot", "dataset.reset", "resetting to a snapshot"),
                # the deadlines of the process-run targets (pglab.drivers.local); the Kubernetes driver has its own
                *((name in self.run.model_fields_set, f"run.{name}", "this deadline of local and external targets")
                  for name in ("overrun", "replay_stall", "connect_timeout"))):
            if given:
                raise PydanticCustomError("kubernetes", "{why} is not available on a Kubernetes target yet; remove "
                                          "this", {"why": why, "at": field})
        self._wal_sizes_fit_their_volumes()
        if self.storage and k8s.wal_storage is None and self.storage.paths == ["wal"]:
            raise PydanticCustomError("kubernetes", "'wal' needs target.kubernetes.wal_storage: without it the WAL "
                                      "is on the data volume", {"at": "storage.paths"})
        return self

    def _wal_sizes_fit_their_volumes(self) -> None:
        """CloudNativePG refuses a Cluster whose min_wal_size or max_wal_size, when set, is not below its WAL
        volume (its webhook answers 422 when pglab creates it): said here, before anything is created."""
        k8s = self.target.kubernetes
        assert k8s is not None
        volumes = [("target.kubernetes.wal_storage.size", k8s.wal_storage)]
        volumes += [(f"matrix.storage.{i}.wal_storage.size", option.wal_storage)
                    for i, option in enumerate(self.matrix.storage or [])]
        volumes += [(f"tenants.arrangements.{i}.tiers.{j}.wal_storage.size", tier.wal_storage)
                    for i, a in enumerate(self.tenants.arrangements if self.tenants else []) for j, tier in
                    enumerate(a.tiers)]
        for name in ("min_wal_size", "max_wal_size"):
            values = [(f"postgres.parameters.{name}", self.postgres.parameters[name])] \
                if name in self.postgres.parameters else []
            values += [(f"matrix.parameters.{name}", v) for v in self.matrix.parameters.get(name, [])]
            for where, value in values:
                wanted = wal_size_bytes(value)
                for field, volume in volumes:
                    if volume is not None and wanted is not None and wanted >= quantity_bytes(volume.size):
                        raise PydanticCustomError(
                            "kubernetes", "{name} {value} is not below the WAL volume ({field}: {size}), which "
                            "CloudNativePG refuses; lower it or make the volume larger",
                            {"name": name, "value": str(value), "field": field, "size": volume.size, "at": where})

    @model_validator(mode="after")
    def _one_rate(self) -> Plan:
        """A rate is one value (run.rate) or an axis (matrix.rate), not both; tenants carry their own load."""
        if self.matrix.rate and self.run.rate is not None:
            raise PydanticCustomError("rate", "run.rate and matrix.rate both set the rate; keep one",
                                      {"at": "run.rate"})
        for given, field in ((self.matrix.rate, "matrix.rate"), (self.run.rate, "run.rate"),
                             (self.tenants, "tenants"), (self.matrix.scenario, "matrix.scenario")):
            if self.capacity is not None and given:
                raise PydanticCustomError("capacity", "the capacity search chooses the rates itself and measures "
                                          "one load; remove this", {"at": field})
        if self.capacity is not None and self.run.target_ci_pct is not None:
            raise PydanticCustomError("capacity", "the capacity search runs each probe rate a fixed number of times; "
                                      "give repeats as a number", {"at": "run.repeats"})
        if self.matrix.rate and self.tenants is not None:
            raise PydanticCustomError("rate", "the rate axis is not for tenants plans (each tier sets its own "
                                      "load); remove it", {"at": "matrix.rate"})
        return self

    @model_validator(mode="after")
    def _storage_axis_fits(self) -> Plan:
        """The storage axis builds a CloudNativePG Cluster per value: Kubernetes only."""
        if not self.matrix.storage:
            return self
        if self.target.kubernetes is None:
            raise PydanticCustomError("storage_axis", "the storage axis builds a CloudNativePG Cluster per value and "
                                      "runs on a Kubernetes target only; remove it (on a local lab, compare paths "
                                      "with one plan per path)", {"at": "matrix.storage"})
        cluster = self.target.kubernetes.cluster_name
        for i, option in enumerate(self.matrix.storage):
            # the value's fio Job on the last instance's node: a label value, 63 at most
            longest = f"{cluster}-fio-{option.name}-data-{self.target.kubernetes.instances}"
            if len(longest) > 63:
                raise PydanticCustomError("storage_axis", "'{name}' with cluster_name '{cluster}' makes names "
                                          "longer than Kubernetes allows (63); shorten one of them",
                                          {"name": option.name, "cluster": cluster, "at": f"matrix.storage.{i}.name"})
        return self

    @model_validator(mode="after")
    def _scenarios_fit(self) -> Plan:
        local = self.target.local
        ha = local is not None and local.ha is not None
        if ha and self.dataset.reset == "snapshot":  # Patroni owns the data directories: no snapshot restore yet
            raise PydanticCustomError("ha", "not available with target.local.ha yet; remove it",
                                      {"at": "dataset.reset"})
        for i, sc in enumerate(self.matrix.scenario or []):
            at = f"matrix.scenario.{i}"
            k8s = self.target.kubernetes
            if sc.restore_check and (sc.kind != "backup" or k8s is None or not sc.witness):
                why = ("is the backup scenario's (a Cluster recovered from its backup); remove it"
                       if sc.kind != "backup" else
                       "runs on a Kubernetes target only (a Cluster recovered by CloudNativePG); remove it"
                       if k8s is None else "compares the recovered Cluster with the witness's acknowledged writes; "
                       "set witness: true or remove restore_check")
                raise PydanticCustomError("scenario", "restore_check {why}", {"why": why, "at": f"{at}.restore_check"})
            if k8s is not None:  # pglab asks CloudNativePG (or deletes the primary pod); the operator does the rest
                if sc.kind == "backup" and k8s.wal_archive is None:
                    raise PydanticCustomError("scenario", "a backup on Kubernetes needs target.kubernetes.wal_archive "
                                              "(the object store the Barman Cloud plugin archives WAL and writes "
                                              "the base backup to)", {"at": f"{at}.kind"})
                if sc.kind == "backup" and sc.max_rate is not None:
                    raise PydanticCustomError("scenario", "max_rate is pg_basebackup's: the Barman Cloud plugin's "
                                              "backup has no rate limit; remove it", {"at": f"{at}.max_rate"})
                if sc.kind == "node-loss" and k8s.node_fault is None:
                    raise PydanticCustomError("scenario", "a node-loss needs target.kubernetes.node_fault: the "
                                              "commands that stop and start a node (Kubernetes cannot power a "
                                              "machine off)", {"at": f"{at}.kind"})
                if sc.kind == "failover" and sc.kill != "node":
                    raise PydanticCustomError("scenario", "on Kubernetes a failover deletes the primary pod (kill: "
                                              "node); kill: postgres is not available there", {"at": f"{at}.kill"})
                if k8s.instances < 2 and sc.kind != "backup":
                    raise PydanticCustomError("scenario", "a {kind} needs a standby: raise "
                                              "target.kubernetes.instances", {"kind": sc.kind, "at": f"{at}.kind"})
            elif sc.kind in ("node-loss", "node-drain"):
                raise PydanticCustomError("scenario", "{kind} runs on a Kubernetes target only (the local lab's "
                                          "failover with kill: node is its node loss)",
                                          {"kind": sc.kind, "at": f"{at}.kind"})
            elif local is None:
                raise PydanticCustomError("scenario", "scenarios run on the local lab only (pglab must be able to "
                                          "kill and restart the servers)", {"at": at})
            elif sc.kind in ("failover", "switchover") and not ha:
                raise PydanticCustomError("scenario", "a {kind} needs target.local.ha: patroni (something must "
                                          "elect the new primary)", {"kind": sc.kind, "at": f"{at}.kind"})
            if sc.kind == "standby-loss" and local is not None and local.instances < 2:
                raise PydanticCustomError("scenario", "standby-loss needs a standby: raise target.local.instances",
                                          {"at": f"{at}.kind"})
            seconds = self.run.measured_seconds
            if seconds is None:
                raise PydanticCustomError("scenario", "a scenario needs run.duration, not run.transactions",
                                          {"at": "run.transactions"})
            end = sc.at + (sc.down if sc.kind == "standby-loss" else 0)
            if end >= seconds:
                raise PydanticCustomError("scenario", "the scenario ends at {end} s, after the {seconds} s run; "
                                          "lower 'at' or raise run.duration", {"end": f"{end:g}",
                                                                                "seconds": f"{seconds:g}",
                                                                                "at": f"{at}.at"})
        return self

    @model_validator(mode="after")
    def _tenants_fit(self) -> Plan:
        """Tenants replace the single lab and the matrix: what would be ignored with them is refused."""
        if self.tenants is None:
            return self
        if self.target.kubernetes is not None:
            return self._kubernetes_tenants_fit()
        local = self.target.local
        if local is None:
            raise PydanticCustomError("tenants", "tenants run on the local target or on Kubernetes (pglab builds "
                                      "every tenant); use target: {local: {}} or target: {kubernetes: {…}}",
                                      {"at": "target"})
        for i, a in enumerate(self.tenants.arrangements):
            for j, t in enumerate(a.tiers):
                for field in ("storage", "wal_storage", "namespace"):
                    if getattr(t, field) is not None:
                        raise PydanticCustomError("tenants", "is for a Kubernetes target; on a local lab remove it",
                                                  {"at": f"tenants.arrangements.{i}.tiers.{j}.{field}"})
        given = [("target.local.instances", "instances" in local.model_fields_set, "set tenants.instances instead"),
                 ("target.local.resources", local.resources is not None, "give each tier its resources instead"),
                 ("target.local.client", local.client is not None, "not available with tenants yet; remove it"),
                 ("target.local.network", local.network is not None, "not available with tenants yet; remove it"),
                 ("target.local.ha", local.ha is not None, "not available with tenants; remove it"),
                 ("matrix", "matrix" in self.model_fields_set, "each tier gives its tenants' workload, clients and "
                  "synchronous_commit; remove the matrix")]
        for field, present, what in given:
            if present:
                raise PydanticCustomError("tenants", "{what}", {"what": what, "at": field})
        if self.tenants.instances == 1 and any(t.synchronous_commit in ("remote_write", "remote_apply")
                                               for a in self.tenants.arrangements for t in a.tiers):
            raise PydanticCustomError("tenants", "remote_write and remote_apply need a standby: raise "
                                      "tenants.instances or use on/local/off", {"at": "tenants.arrangements"})
        return self

    def _kubernetes_tenants_fit(self) -> Plan:
        """Tenants on Kubernetes: a CloudNativePG Cluster per tenant, each tier's resources and storage class; what
        it cannot honour is refused."""
        k8s, tenants = self.target.kubernetes, self.tenants
        assert k8s is not None and tenants is not None
        given = [("target.kubernetes.instances", "instances" in k8s.model_fields_set, "set tenants.instances instead"),
                 ("matrix", "matrix" in self.model_fields_set, "each tier gives its tenants' workload, clients and "
                  "synchronous_commit; remove the matrix"),
                 ("tenants.parallel_builds", tenants.parallel_builds is not None, "a Kubernetes cluster builds every "
                  "tenant's Cluster at once; remove it")]
        for field, present, what in given:
            if present:
                raise PydanticCustomError("tenants", "{what}", {"what": what, "at": field})
        if k8s.synchronous is not None and "synchronous" in k8s.model_fields_set and \
                k8s.synchronous.number >= tenants.instances:
            raise PydanticCustomError("tenants", "synchronous.number ({number}) must be lower than tenants.instances "
                                      "({instances}); raise tenants.instances or set synchronous: null",
                                      {"number": k8s.synchronous.number, "instances": tenants.instances,
                                       "at": "target.kubernetes.synchronous.number"})
        if tenants.instances == 1 and any(t.synchronous_commit in ("remote_write", "remote_apply")
                                          for a in tenants.arrangements for t in a.tiers):
            raise PydanticCustomError("tenants", "remote_write and remote_apply need a standby: raise "
                                      "tenants.instances or use on/local/off", {"at": "tenants.arrangements"})
        for i, a in enumerate(tenants.arrangements):
            width = max(2, len(str(a.tenant_count)))
            for j, t in enumerate(a.tiers):
                at = f"tenants.arrangements.{i}.tiers.{j}"
                if not _DNS_LABEL.fullmatch(t.name):
                    raise PydanticCustomError("tenants", "on Kubernetes a tier's name labels its Clusters: use "
                                              "lower-case letters, digits and '-'", {"at": f"{at}.name"})
                r = t.resources
                if r is not None and any(v is not None for v in (r.read_iops, r.write_iops, r.read_mbps,
                                                                 r.write_mbps)):
                    raise PydanticCustomError("tenants", "IO limits are not available on Kubernetes (give the tier a "
                                              "storage class with the limits instead: storage.class); remove them",
                                              {"at": f"{at}.resources"})
                if isinstance(t.workload, CustomWorkload) and any(s.file for s in t.workload.scripts):
                    raise PydanticCustomError("tenants", "script files are not available with tenants on Kubernetes "
                                              "yet; use built-in scripts", {"at": f"{at}.workload"})
            if len(f"{k8s.cluster_name}-t{'0' * width}-pgbench-init") > 63:
                raise PydanticCustomError("tenants", "'{cluster}' is too long to name the tenants' Clusters and Jobs "
                                          "(63 characters at most); shorten it",
                                          {"cluster": k8s.cluster_name, "at": "target.kubernetes.cluster_name"})
        return self

    @model_validator(mode="after")
    def _load_pods_fit(self) -> Plan:
        """run.load_pods: several pgbench pods per run exist on a Kubernetes target only, each with a client."""
        n = self.run.load_pods
        if n == 1:
            return self
        if self.target.kubernetes is None:
            raise PydanticCustomError("load_pods", "spreading a run over pgbench pods needs target: kubernetes; "
                                      "remove run.load_pods", {"at": "run.load_pods"})
        fewest = min(self.matrix.clients)
        if fewest < n:
            raise PydanticCustomError("load_pods", "{n} pods need at least {n} clients, but matrix.clients has "
                                      "{fewest}; lower run.load_pods or raise the clients",
                                      {"n": n, "fewest": fewest, "at": "run.load_pods"})
        if self.matrix.scenario:
            raise PydanticCustomError("load_pods", "scenarios run with one pgbench pod (load_pods: 1); remove "
                                      "run.load_pods or matrix.scenario", {"at": "run.load_pods"})
        return self

    @model_validator(mode="after")
    def _runs(self) -> Plan:
        probes = self.capacity.max_probes if self.capacity else 1
        runs = self.matrix.points * self.run.max_repeats * probes
        if runs > MAX_RUNS:
            raise PydanticCustomError("plan", "{points} points × {repeats} repeats{probes} make {runs} runs, more "
                                      "than {max}; lower run.repeats or shorten an axis",
                                      {"points": self.matrix.points, "repeats": self.run.max_repeats, "runs": runs,
                                       "probes": f" × {probes} capacity probes" if self.capacity else "",
                                       "max": MAX_RUNS, "at": "run.repeats"})
        return self
