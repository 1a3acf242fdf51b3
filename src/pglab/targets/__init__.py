"""Targets: where PostgreSQL runs (local lab; later Kubernetes and external servers)."""
