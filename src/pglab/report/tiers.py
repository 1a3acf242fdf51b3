"""The tier table of a tenants plan: ``arrangement | tier | instances | TPS per instance | latency`` (the published
shape), with each tier's fairness and the noisy-neighbour view: how a tier fares against the same host with no QoS.

Figures are per tenant (each tenant's own pgbench), averaged over the tier's tenants within a run, then the median
over repeats. The host view sums every tenant and adds the host's own disk and CPU figures of the same window.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from pglab import metrics
from pglab.analysis.compare import delta_fields, difference
from pglab.analysis.flags import flag_text, flags
from pglab.store.sqlite import RunRow, Store

TIER_COLUMNS = ["arrangement", "tier", *metrics.keys("tiers"), "tps_vs_base_pct", "tps_ci95_low_pct",
                "tps_ci95_high_pct", "tps_verdict", "repeats", "failed_runs", "flags"]
TIER_HEADERS = {**metrics.headers("tiers"), "tps_vs_base_pct": "vs base", "tps_verdict": "verdict"}
HOST_COLUMNS = ["arrangement", *metrics.keys("host")]
HOST_HEADERS = metrics.headers("host")
TENANT_COLUMNS = ["arrangement", "repeat", "tenant", "tier", *metrics.keys("tenants")]


def is_tenants_sweep(store: Store, sweep_id: int | None) -> bool:
    """Its points are arrangements (also before any run ended)."""
    sweep_id = sweep_id if sweep_id is not None else store.latest_sweep_id()
    return any("arrangement" in axes for axes in store.point_axes(sweep_id))


def _arrangements(store: Store, sweep_id: int | None) -> OrderedDict[str, list[RunRow]]:
    groups: OrderedDict[str, list[RunRow]] = OrderedDict()
    for r in store.runs(sweep_id):
        if "arrangement" in r.axes:
            groups.setdefault(str(r.axes["arrangement"]), []).append(r)
    return groups


def _tiers_of(store: Store, sweep_id: int, arrangement: str) -> list[str]:
    """The arrangement's tier names in plan order (runs only store metrics; the plan has the order)."""
    text = store.plan_text(sweep_id)
    try:
        import yaml

        plan = yaml.safe_load(text) if text is not None else None
        for a in (plan or {}).get("tenants", {}).get("arrangements", []):
            if a.get("name") == arrangement:
                return [str(t["name"]) for t in a.get("tiers", [])]
    except (yaml.YAMLError, AttributeError, KeyError, TypeError):
        pass
    return []


def tier_table(store: Store, sweep_id: int | None = None) -> tuple[list[str], list[dict[str, Any]]]:
    """One row per arrangement × tier. ``vs base``: the tier's TPS per instance against the first arrangement's
    TPS per instance over all its tenants (the plan's first arrangement is its baseline, e.g. no QoS): the Δ of
    the means over repeats with its 95 % interval and verdict, as every comparison (one run a side: "too few
    repeats"). ``flags``: the arrangement's runs' flags (unstable host TPS, interference)."""
    sweep_id = sweep_id if sweep_id is not None else store.latest_sweep_id()
    if sweep_id is None:
        return [], []
    groups = _arrangements(store, sweep_id)
    if not groups:
        return [], []
    instances_each = _instances_per_tenant(store, sweep_id)
    base: list[float | None] = []
    rows: list[dict[str, Any]] = []
    for i, (arrangement, runs) in enumerate(groups.items()):
        ok = [r for r in runs if r.status == "ok"]
        if i == 0:
            base = [(r.metrics.get("tps") or 0) / max(1.0, r.metrics.get("tenants") or 1) for r in ok]
        arrangement_flags = flag_text([("", flags([r.metrics for r in ok]))])
        names = _tiers_of(store, sweep_id, arrangement) or sorted(
            {k.split(".")[1] for r in ok for k in r.metrics if k.startswith("tier.")})
        for tier in names:
            def m(metric: str, how: metrics.How = "median", tier: str = tier, ok: list[RunRow] = ok) -> float | None:
                return metrics.combine(how, [r.metrics.get(metric.replace("{tier}", tier)) for r in ok])

            row: dict[str, Any] = {"arrangement": arrangement, "tier": tier,
                                   **{shown.key: m(shown.metric.name, shown.how) for shown in metrics.columns("tiers")}}
            if row["instances"] is not None:  # the tier's tenants, each with its instances
                row["instances"] = int(row["instances"] * instances_each)
            d = difference("tps", base, [r.metrics.get(f"tier.{tier}.tps") for r in ok]) if i > 0 else None
            row.update({**delta_fields(d, "tps"), "repeats": len(ok), "failed_runs": len(runs) - len(ok),
                        "flags": arrangement_flags})
            rows.append(row)
    columns = [c for c in TIER_COLUMNS if c in ("arrangement", "tier", "instances", "tps_per_instance")
               or any(r.get(c) is not None for r in rows)]
    return columns, rows


def host_table(store: Store, sweep_id: int | None = None) -> tuple[list[str], list[dict[str, Any]]]:
    """One row per arrangement: every tenant added up, with the host's disk and CPU in the same window."""
    sweep_id = sweep_id if sweep_id is not None else store.latest_sweep_id()
    rows = []
    for arrangement, runs in _arrangements(store, sweep_id).items():
        ok = [r for r in runs if r.status == "ok"]
        row: dict[str, Any] = {"arrangement": arrangement}
        for shown in metrics.columns("host"):
            row[shown.key] = metrics.combine(shown.how, [r.metrics.get(shown.metric.name) for r in ok])
        for c in ("tenants", "instances"):
            row[c] = int(row[c]) if row[c] is not None else None
        rows.append(row)
    columns = [c for c in HOST_COLUMNS if c == "arrangement" or any(r.get(c) is not None for r in rows)]
    return columns, rows


def tenant_table(store: Store, sweep_id: int | None = None) -> tuple[list[str], list[dict[str, Any]]]:
    """One row per run × tenant (for CSV/JSON and a close look at fairness)."""
    sweep_id = sweep_id if sweep_id is not None else store.latest_sweep_id()
    columns = list(TENANT_COLUMNS)
    rows = []
    for r in store.runs(sweep_id):
        if "arrangement" not in r.axes or r.status != "ok":
            continue
        for tenant, (tier, m) in store.tenant_metrics(r.id).items():
            rows.append({"arrangement": r.axes["arrangement"], "repeat": r.repeat, "tenant": tenant, "tier": tier,
                         **{s.key: m.get(s.metric.name) for s in metrics.columns("tenants")}})
    return columns, rows


def _instances_per_tenant(store: Store, sweep_id: int) -> int:
    for r in store.runs(sweep_id):
        tenants, instances = r.metrics.get("tenants"), r.metrics.get("instances")
        if tenants and instances:
            return max(1, round(instances / tenants))
    return 1


def tier_headers(store: Store, sweep_id: int | None) -> dict[str, str]:
    sweep_id = sweep_id if sweep_id is not None else store.latest_sweep_id()
    headers = dict(TIER_HEADERS)
    if sweep_id is not None and _instances_per_tenant(store, sweep_id) > 1:
        headers["tps_per_instance"] = "TPS per tenant"
    groups = _arrangements(store, sweep_id)
    if groups:
        headers["tps_vs_base_pct"] = f"vs {next(iter(groups))}"
    return headers
