"""matrix.scenario: a fault or an operation during every measured run of a point."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field

from pglab.plan.schema.base import Seconds, Strict, _text


class Scenario(Strict):
    """A fault or an operation during every measured run of the point, ``at`` seconds after pgbench starts.

    A witness client writes increasing ids through it and reads them back afterwards (RPO, RTO); pgbench is
    started again whenever the fault ends it, so that the load and its timeline run through the outage."""

    kind: Literal["failover", "switchover", "standby-loss", "backup", "node-loss", "node-drain"] = Field(
        description="failover: kill the leader; switchover: a planned one; standby-loss: a standby stopped for a "
        "while; backup: pg_basebackup of the primary; Kubernetes only: node-loss: the primary's node fails as a "
        "machine does (target.kubernetes.node_fault) and comes back once a new primary is reported; node-drain: "
        "the primary's node cordoned and its instance pods evicted, as an upgrade does, uncordoned after down")
    at: Seconds = Field(5.0, description="seconds after the start of the measured run")
    kill: Literal["node", "postgres"] = Field(
        "node", description="failover: SIGKILL the leader's Patroni and postgres (node) or its postgres only")
    down: Seconds = Field(5.0, description="standby-loss: seconds before the killed standby is started again; "
                          "node-loss, node-drain: the least seconds the node stays away")
    max_rate: Annotated[str, _text(16, pattern=re.compile(r"[1-9][0-9]*[kM]?"), what="a rate such as 32M")] | None = (
        Field(None, description="backup: pg_basebackup --max-rate (kB/s, or with k/M); unthrottled without it"))
    witness: bool = Field(True, description="run the witness writer (acknowledged writes lost, RTO)")
    restore_check: bool = Field(False, description="backup, Kubernetes only: once the backup completed, a new "
                                "Cluster is recovered from it and the WAL archived since, and must hold every write "
                                "the witness saw acknowledged before the backup's end; its time to healthy and the "
                                "writes lost are stored, and it is deleted")

    @property
    def label(self) -> str:
        if self.kind == "failover":
            return f"failover-{self.kill}"
        if self.kind == "backup":
            label = f"backup max-rate={self.max_rate}" if self.max_rate else "backup"
            return f"{label} restore-check" if self.restore_check else label
        return self.kind
