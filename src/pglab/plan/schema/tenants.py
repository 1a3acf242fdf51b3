"""tenants: many independent tenants in QoS tiers, measured in the same window."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from pglab.plan.schema.base import Clients, Name, Strict, SyncCommit, _int_between, _unique
from pglab.plan.schema.kubernetes import DnsLabel, K8sStorage
from pglab.plan.schema.local import Resources
from pglab.plan.schema.run import Workload

MAX_TENANTS = 256


class Tier(Strict):
    """A QoS class of tenants (high, medium, best-effort …): the same limits and the same load for each."""

    name: Name = Field(description="the tier's name in tables (high, best-effort …), unique in its arrangement")
    tenants: Annotated[int, _int_between(1, MAX_TENANTS)] = Field(1, description="how many tenants in this tier")
    resources: Resources | None = Field(None, description="limits of each instance of each tenant (cgroups); "
                                        "none: the tenant competes freely")
    workload: Workload = Field("tpcb-like", description="each tenant's workload: a built-in name or a custom "
                               "{name, scripts}")
    clients: Clients = Field(1, description="pgbench clients of each tenant")
    jobs: Clients = Field(1, description="pgbench threads of each tenant")
    synchronous_commit: SyncCommit = Field("on", description="each tenant's synchronous_commit level")
    storage: K8sStorage | None = Field(None, description="Kubernetes: each tenant's data volumes {class, size} "
                                       "(default: target.kubernetes.storage)")
    wal_storage: K8sStorage | None = Field(None, description="Kubernetes: each tenant's WAL volumes {class, size} "
                                           "(default: target.kubernetes.wal_storage; none there and here: WAL on "
                                           "the data volume)")
    namespace: DnsLabel | None = Field(None, description="Kubernetes: the namespace of this tier's Clusters "
                                       "(default: target.kubernetes.namespace)")

    @model_validator(mode="after")
    def _jobs(self) -> Tier:
        if self.jobs > self.clients:
            raise PydanticCustomError("tier", "jobs ({j}) must be at most clients ({c}): pgbench refuses more "
                                      "threads than clients", {"j": self.jobs, "c": self.clients, "at": "jobs"})
        return self


class Arrangement(Strict):
    """One way of packing tenants on the host (for example: no QoS, or one critical tenant on a high tier)."""

    name: Name = Field(description="the arrangement's name in tables (one point each), unique")
    tiers: list[Tier] = Field(min_length=1, max_length=16, description="the tiers sharing the host (1 to 16); "
                              "256 tenants at most in all")

    @field_validator("tiers")
    @classmethod
    def _tiers(cls, v: list[Tier]) -> list[Tier]:
        _unique(v, lambda t: t.name, "tier names must be unique within an arrangement")
        total = sum(t.tenants for t in v)
        if total > MAX_TENANTS:
            raise PydanticCustomError("tenants", "{total} tenants, more than {max}; lower a tier's 'tenants'",
                                      {"total": total, "max": MAX_TENANTS})
        return v

    @property
    def tenant_count(self) -> int:
        return sum(t.tenants for t in self.tiers)


class Tenants(Strict):
    """Many independent tenants, measured in the same window (on one local host, or a Cluster each on Kubernetes);
    each arrangement is one point."""

    instances: Annotated[int, _int_between(1, 5)] = Field(
        1, description="instances per tenant: 1 = a single server; more = a primary and streaming standbys "
        "(target.local.synchronous, or target.kubernetes.synchronous, applies)")
    parallel_builds: Annotated[int, _int_between(1, 64)] | None = Field(
        None, description="tenants built and loaded at the same time (default: the host's cores)")
    arrangements: list[Arrangement] = Field(min_length=1, max_length=20, description="ways of packing the "
                                            "tenants, each measured as one point (1 to 20)")

    @field_validator("arrangements")
    @classmethod
    def _names(cls, v: list[Arrangement]) -> list[Arrangement]:
        return _unique(v, lambda a: a.name, "arrangement names must be unique")
