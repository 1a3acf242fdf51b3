"""What Patroni is told: the timings (checked, since Patroni rewrites values that break its rules), the DCS
configuration every node bootstraps with, and each node's patroni.yml. Pure functions of the lab's state."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pglab.errors import UserError
from pglab.plan.schema import Synchronous
from pglab.targets.local.ha.node import HOST, HANode
from pglab.targets.local.pgconf import SUPERUSER

REPLICATION_USER = "replicator"
NAMESPACE = "/pglab/"
TIMINGS: dict[str, int] = {"ttl": 20, "loop_wait": 1, "retry_timeout": 6, "primary_start_timeout": 300}


def check_timings(timings: dict[str, int]) -> None:
    """Patroni silently rewrites values that break its rules; refuse them instead, so what is recorded holds."""
    ttl, loop_wait, retry = timings["ttl"], timings["loop_wait"], timings["retry_timeout"]
    if ttl < 20 or loop_wait < 1 or retry < 3:
        raise UserError(f"HA timings: Patroni needs ttl >= 20, loop_wait >= 1 and retry_timeout >= 3 "
                        f"(given ttl={ttl}, loop_wait={loop_wait}, retry_timeout={retry}).")
    if loop_wait + 2 * retry > ttl:
        raise UserError(f"HA timings: Patroni needs loop_wait + 2 * retry_timeout <= ttl "
                        f"({loop_wait} + 2 * {retry} > {ttl}).")


def dcs_config(timings: dict[str, int], synchronous: Synchronous | None, instances: int,
               parameters: dict[str, Any]) -> dict[str, Any]:
    t = timings
    sync = synchronous
    dcs: dict[str, Any] = {
        "ttl": t["ttl"], "loop_wait": t["loop_wait"], "retry_timeout": t["retry_timeout"],
        "primary_start_timeout": t["primary_start_timeout"],
        "maximum_lag_on_failover": 1024 * 1024,
        "failsafe_mode": True,
        "synchronous_mode": False,
        "postgresql": {
            "use_pg_rewind": True,
            "use_slots": True,
            "parameters": {
                "wal_level": "replica", "hot_standby": True, "max_wal_senders": 10, "max_replication_slots": 10,
                "log_checkpoints": True, "log_timezone": "UTC",  # the runner reads checkpoint times from logs
                **parameters,
            },
        },
    }
    if sync is not None and instances > 1:
        dcs["synchronous_mode"] = "quorum" if sync.method == "any" else True
        dcs["synchronous_node_count"] = sync.number
    return dcs


def patroni_config(node: HANode, *, scope: str, lab_dir: Path, etcd_port: int, bindir: Path, connect_port: int,
                   passwords: dict[str, str], dcs: dict[str, Any], restore: bool) -> dict[str, Any]:
    """``connect_port``: what replicas stream from (the node's proxy when the plan shapes the links); ``restore``:
    the node bootstraps from the staged backup instead of initdb."""
    bootstrap: dict[str, Any] = {
        "dcs": dcs,
        "initdb": [{"encoding": "UTF8"}, {"locale": "C"}, {"waldir": str(node.wal)}],
    }
    if restore:
        # Patroni's custom bootstrap: the script moves the staged backup into place, Patroni starts it (backup
        # recovery from the WAL streamed with it), then sets the new lab's passwords
        bootstrap["method"] = "pglab_restore"
        bootstrap["pglab_restore"] = {"command": str(lab_dir / "server" / "restore.sh"), "no_params": True}
    return {
        "scope": scope,
        "namespace": NAMESPACE,
        "name": node.name,
        "restapi": {"listen": f"{HOST}:{node.rest_port}", "connect_address": f"{HOST}:{node.rest_port}",
                    "authentication": {"username": SUPERUSER, "password": passwords["rest"]}},
        "etcd3": {"hosts": [f"{HOST}:{etcd_port}"], "protocol": "http"},
        "watchdog": {"mode": "off"},
        "bootstrap": bootstrap,
        "postgresql": {
            "listen": f"{HOST}:{node.port}",
            # what replicas stream from: the node's proxy when the plan shapes the links
            "connect_address": f"{HOST}:{connect_port}",
            "data_dir": str(node.data),
            "bin_dir": str(bindir),
            "pgpass": str(lab_dir / "server" / f"pgpass-{node.name}"),
            "authentication": {
                "superuser": {"username": SUPERUSER, "password": passwords["superuser"]},
                "replication": {"username": REPLICATION_USER, "password": passwords["replication"]},
            },
            "parameters": {
                "unix_socket_directories": str(lab_dir / "sock"),
                "logging_collector": True,
                "log_directory": str(lab_dir / "logs"),
                "log_filename": node.pg_log.name,
                "log_file_mode": "0644",
                "log_rotation_age": 0,
                "log_rotation_size": 0,
            },
            "pg_hba": [
                "# written by Patroni for pglab: loopback and unix sockets only, passwords never in clear",
                "local all all scram-sha-256",
                f"host all all {HOST}/32 scram-sha-256",
                f"local replication {REPLICATION_USER} scram-sha-256",
                f"host replication {REPLICATION_USER} {HOST}/32 scram-sha-256",
                f"local replication {SUPERUSER} scram-sha-256",  # base backups taken by pglab's scenarios
            ],
            "basebackup": [{"waldir": str(node.wal)}, {"checkpoint": "fast"}],
            "create_replica_methods": ["basebackup"],
        },
    }
