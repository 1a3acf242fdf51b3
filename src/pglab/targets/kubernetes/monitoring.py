"""The monitoring queries pglab gives a Cluster's exporter: only those its figures come from.

Why: each read of an instance's exporter runs its monitoring queries in that instance (``metricsQueriesTTL`` is
below pglab's read interval, so none is served from the cache). The operator's default set (sessions, locks,
database sizes, every setting, the extensions of every database, …) cost the primary 0.25 s of CPU per read on the
lab, a quarter of a 0.5-CPU instance's quota at pglab's 2 s reads; these four cost it about half that
(docs/benchmarks.md, "What one exporter read costs"). They serve the metrics ``exporter`` reads under the names
the default set gives them, so a Prometheus that scrapes the Cluster finds them too.
"""

from __future__ import annotations

from typing import Any


def _columns(**usage: str) -> list[dict[str, dict[str, str]]]:
    return [{name: {"usage": kind, "description": f"{name} (pglab)"}} for name, kind in usage.items()]


# query name → the exporter's query; a metric is cnpg_<query name>_<column> (``name`` overrides the query name)
QUERIES: dict[str, dict[str, Any]] = {
    "pg_stat_database": {
        "query": "SELECT datname, xact_commit, xact_rollback, blks_read, blks_hit FROM pg_catalog.pg_stat_database "
                 "WHERE datname = pg_catalog.current_database()",
        "metrics": _columns(datname="LABEL", xact_commit="COUNTER", xact_rollback="COUNTER", blks_read="COUNTER",
                            blks_hit="COUNTER")},
    "pg_stat_bgwriter": {
        "runonserver": "<17.0.0",
        "query": "SELECT checkpoints_timed, checkpoints_req, buffers_checkpoint, buffers_clean, buffers_backend, "
                 "buffers_backend_fsync FROM pg_catalog.pg_stat_bgwriter",
        "metrics": _columns(checkpoints_timed="COUNTER", checkpoints_req="COUNTER", buffers_checkpoint="COUNTER",
                            buffers_clean="COUNTER", buffers_backend="COUNTER", buffers_backend_fsync="COUNTER")},
    "pg_stat_bgwriter_17": {  # PostgreSQL 17 moved the checkpoints to pg_stat_checkpointer and dropped the backends'
        "runonserver": ">=17.0.0", "name": "pg_stat_bgwriter",
        "query": "SELECT buffers_clean FROM pg_catalog.pg_stat_bgwriter",
        "metrics": _columns(buffers_clean="COUNTER")},
    "pg_stat_checkpointer": {
        "runonserver": ">=17.0.0",
        "query": "SELECT num_timed AS checkpoints_timed, num_requested AS checkpoints_req, buffers_written "
                 "FROM pg_catalog.pg_stat_checkpointer",
        "metrics": _columns(checkpoints_timed="COUNTER", checkpoints_req="COUNTER", buffers_written="COUNTER")},
    "pg_stat_replication": {  # the primary's view of each standby: the lags, and the WAL it has still to replay
        "primary": True,
        "query": "SELECT COALESCE(application_name, '') AS application_name, "
                 "COALESCE(EXTRACT(EPOCH FROM write_lag), 0)::float AS write_lag_seconds, "
                 "COALESCE(EXTRACT(EPOCH FROM flush_lag), 0)::float AS flush_lag_seconds, "
                 "COALESCE(EXTRACT(EPOCH FROM replay_lag), 0)::float AS replay_lag_seconds, "
                 "COALESCE(pg_catalog.pg_wal_lsn_diff(pg_catalog.pg_current_wal_lsn(), replay_lsn), 0) "
                 "AS replay_diff_bytes FROM pg_catalog.pg_stat_replication",
        "metrics": _columns(application_name="LABEL", write_lag_seconds="GAUGE", flush_lag_seconds="GAUGE",
                            replay_lag_seconds="GAUGE", replay_diff_bytes="GAUGE")},
    "pg_stat_archiver": {
        "query": "SELECT archived_count, failed_count FROM pg_catalog.pg_stat_archiver",
        "metrics": _columns(archived_count="COUNTER", failed_count="COUNTER")},
}
KEY = "queries"  # the ConfigMap's key the Cluster names


def metric_names() -> set[str]:
    """Every metric the queries serve (labels aside)."""
    return {f"cnpg_{q.get('name', name)}_{column}" for name, q in QUERIES.items()
            for m in q["metrics"] for column, spec in m.items() if spec["usage"] != "LABEL"}
