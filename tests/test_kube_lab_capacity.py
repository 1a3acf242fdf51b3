"""The capacity search (issue 29) on the lab's CloudNativePG Cluster: the engine's search is the same on every target,
but on Kubernetes each probe's rate has to reach the pgbench of the run Job (`-R`), and the window's latency
percentiles and skipped transactions have to come from that pod. A server of known capacity as in
tests/test_capacity.py: every transaction a 50 ms pg_sleep, four clients, so no rate above 80 tx/s can be held.

Kept short for the CI track: one 1-instance Cluster, 5 s runs, at most six rates (the closed loop's included).
The same sweep loads pg_stat_statements (a pg_stat_statements.* parameter: CloudNativePG loads it and creates the
extension) and checks each run's statements.json, which its Job read around pgbench: the sleep statement's calls
are the transactions pgbench itself counted (issue 29 item 5).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import pglab
from kube_lab_support import kubelab, namespace_gone, small_plan
from pglab.store.sqlite import Store

pytestmark = pytest.mark.kube_lab

SERVICE_S = 0.050
CLIENTS = 4
LOAD = f"""matrix:
  workload: [{{name: sleep, scripts: [{{file: sleep.sql}}]}}]
  clients: [{CLIENTS}]
  jobs: [1]
run: {{duration: 5s}}
capacity: {{percentile: 99, target: 200ms, precision_pct: 10, max_probes: 6}}
"""


def test_the_capacity_search_runs_its_probes_at_their_rates_in_the_cluster(lab: kubelab.KubeLab,
                                                                           tmp_path: Path) -> None:
    ns = "pglab-e2e-capacity"
    (tmp_path / "sleep.sql").write_text(f"SELECT pg_sleep({SERVICE_S});\n")
    plan = tmp_path / "plan.yaml"
    text = small_plan(lab, "cap", ns, LOAD)
    assert text.count("max_connections: 40}") == 1
    plan.write_text(text.replace("max_connections: 40}", "max_connections: 40, pg_stat_statements.max: '1000'}"))
    results = tmp_path / "results"
    proc = pglab("run", str(plan), "--results", str(results), timeout=1800)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    namespace_gone(lab, ns, proc.stderr)

    store = Store.open(results, create=False)
    closed, *probes = store.runs()
    assert probes and all(r.status == "ok" for r in (closed, *probes))
    top = closed.metrics["tps"]
    assert "rate" not in closed.axes and top is not None and top <= CLIENTS / SERVICE_S
    for r in (closed, *probes):  # what the run Job read of pg_stat_statements: its pgbench's statements
        out = (store.dir / r.dir / "pgbench.out").read_text()
        processed = int(re.search(r"actually processed: (\d+)", out).group(1))  # type: ignore[union-attr]
        doc = json.loads((store.dir / r.dir / "statements.json").read_text())
        sleep = [s for s in doc["statements"] if s["query"].startswith("SELECT pg_sleep(")]
        assert len(sleep) == 1 and sleep[0]["calls"] == processed, (processed, doc["statements"])
        assert sleep[0]["mean_exec_time"] >= SERVICE_S * 1000  # pg_sleep sleeps that long at least
        assert not any("pglab-statements" in s["query"] for s in doc["statements"])
    for r in probes:
        rate = r.axes["rate"]
        # the probe's rate reached the pod's pgbench, and its figures are that pgbench's open-loop ones
        out = (store.dir / r.dir / "pgbench.out").read_text()
        assert "rate limit schedule lag: avg " in out, (rate, out[-1500:])
        assert r.metrics["latency_p99_ms"] is not None, (rate, r.metrics)
        assert r.metrics["schedule_lag_ms"] is not None, (rate, r.metrics)
    events = store.conn.execute("SELECT detail FROM events WHERE kind = 'capacity'").fetchall()
    store.close()
    assert len(events) == 1, events
    m = re.search(r": (\d+) tx/s(?: \(below (\d+)\))?, ", events[0][0] or "")
    assert m is not None, events
    held = {r.axes["rate"]: (r.metrics["latency_p99_ms"] or 1e9) <= 200 and (r.metrics.get("skipped_pct") or 0) <= 1
            for r in probes}
    capacity = float(m.group(1))
    assert capacity < CLIENTS / SERVICE_S
    failing: float | None = None
    if m.group(2) is None:
        # The first probe, at the closed loop's own pace, held: no rate above it can be offered by these clients, so
        # the search ends there. Seen once in CI, the machine loaded: the closed loop ran slow and its rate then held.
        assert "the clients bound it" in events[0][0], events
        assert [r.axes["rate"] for r in probes] == [capacity] == [float(round(top))] and held[capacity]
    else:
        failing = float(m.group(2))
        # the answer is the highest rate that held and the bound the lowest that failed above it, below what the
        # server can serve at all (how far below depends on the lab's network and load: 18 tx/s held, 36 failed once)
        assert held[capacity] and not held[failing] and capacity == max(r for r, ok in held.items() if ok)
        assert failing == min(r for r, ok in held.items() if not ok and r > capacity)
        assert failing - capacity <= failing * 0.10 or len(probes) + 1 == 6  # the precision, or max_probes spent

    table = pglab("report", str(results), "--table", "capacity", "--format", "csv", check=True).stdout
    row = dict(zip(*(line.split(",") for line in table.splitlines()), strict=True))
    assert (float(row["capacity_tps"]), float(row["failed_at_tps"]) if row["failed_at_tps"] else None) == (capacity,
                                                                                                          failing)
