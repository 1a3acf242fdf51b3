"""Kubernetes target: a CloudNativePG cluster, pgbench and fio as Jobs (``render`` builds every manifest)."""
