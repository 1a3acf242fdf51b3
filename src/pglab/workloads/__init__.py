"""Workloads: what runs against the database (pgbench) and on the storage (fio, later)."""
