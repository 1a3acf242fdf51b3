"""The studies' example plans (examples/study-*.yaml, issue 28 item 4). Every one validates as written; study 004's
(a managed service: an external server to pglab) runs end to end against a server this test starts, at its
smallest, and the table the study published is read back and checked against the stored runs: the client loop
per workload, B against A as uplift % (Δ = (B − A) / A of the stored means), and the price per TPS (the plan's
monthly price over the peak point's stored mean TPS) with the cost's parts (cost.breakdown) beside it."""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
import statistics
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from conftest import REPO, pglab, run_plan
from helpers import Ran
from kube_lab_support import (
    MEMORY_VALUE,
    STUDY_EDITS,
    STUDY_LAB,
    STUDY_SIZES,
    TMPFS_CLASS,
    kubelab,
    study_plan,
)
from pglab.plan.schema import LocalTarget
from pglab.targets.local.cluster import LocalLab
from pglab.units import money, size_bytes

STUDIES = sorted(p.name for p in (REPO / "examples").glob("study-*.yaml"))
MANAGED = REPO / "examples" / "study-managed-client-loop.yaml"


def test_there_is_an_example_per_study() -> None:
    """Each study's example says which study it reproduces, what differs from it and how to run it."""
    said = {}
    for name in STUDIES:
        head = "".join(line for line in (REPO / "examples" / name).read_text().splitlines(keepends=True)
                       if line.startswith("#"))
        assert "What differs from the study" in head, name
        assert "pglab run examples/" + name in head, name
        said[name] = re.findall(r"study (00\d)", head)[0]
    assert sorted(set(said.values())) == ["000", "001", "002", "003", "004"], said


@pytest.mark.parametrize("example", STUDIES)
def test_a_study_example_validates(example: str) -> None:
    proc = pglab("plan", "validate", str(REPO / "examples" / example))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"{REPO / 'examples' / example}: valid — "), proc.stdout


# ------------------------------------------------------------------ study 004 end to end, against a real server
@pytest.fixture(scope="module")
def server() -> Iterator[dict[str, str]]:
    base = Path(tempfile.mkdtemp(prefix="pglab-test-"))
    lab = LocalLab(LocalTarget(instances=1, synchronous=None), base)
    try:
        ep = lab.provision({}).primary
        yield {"conninfo": f"host={ep.host} port={ep.port} user={ep.user} dbname={ep.dbname}",
               "passfile": str(ep.passfile)}
    finally:
        lab.teardown()
        shutil.rmtree(base, ignore_errors=True)


def smallest(server: dict[str, str], monthly: float | None = None) -> str:
    """The example's text pointed at this test's server, at its smallest: scale 1, 2 and 4 clients, 2 s runs (the
    study's 3 repeats kept: the uplift's interval needs them); ``monthly`` replaces the price (side B)."""
    text = MANAGED.read_text()
    text, n = re.subn(r'conninfo: ".*"', f'conninfo: "{server["conninfo"]}"\n    passfile: {server["passfile"]}', text)
    assert n == 1
    for old, new in (("scale: 100", "scale: 1"), ("clients: [4, 8, 16, 32, 64, 96]", "clients: [2, 4]"),
                     ("jobs: [4]", "jobs: [2]"), ("duration: 60s", "duration: 2s"), ("warmup: 10s", "warmup: 0s")):
        assert old in text, old
        text = text.replace(old, new)
    if monthly is not None:  # B's price: its storage part differs (the parts must add up to it)
        assert "monthly: 1450" in text and "storage: 620" in text
        text = text.replace("monthly: 1450", f"monthly: {monthly:g}").replace(
            "storage: 620", f"storage: {monthly - 830:g}")
    return text


def means(ran: Ran) -> dict[tuple[str, int], float]:
    """(workload, clients) → mean TPS of the point's ok runs, from the store."""
    groups: dict[tuple[str, int], list[float]] = {}
    for r in ran.runs():
        tps = r.metrics.get("tps")
        assert r.status == "ok" and tps is not None, r.reason
        groups.setdefault((str(r.axes["workload"]), int(r.axes["clients"])), []).append(float(tps))
    assert all(len(v) == 3 for v in groups.values()), groups
    return {k: statistics.fmean(v) for k, v in groups.items()}


@pytest.mark.postgres
def test_the_managed_client_loop_publishes_the_studys_table(tmp_path: Path, server: dict[str, str]) -> None:
    sides = {}
    for side, monthly in (("a", None), ("b", 1000.0)):
        plan = tmp_path / f"{side}.yaml"
        plan.write_text(smallest(server, monthly))
        sides[side] = run_plan(plan, tmp_path / side, "--allow-destructive", "--format", "json")
    a, b = means(sides["a"]), means(sides["b"])
    # the client loop: every client count × read-write and read-only, the database table's rows
    assert sorted(a) == sorted(b) == [("select-only", 2), ("select-only", 4), ("tpcb-like", 2), ("tpcb-like", 4)]
    rows = json.loads(sides["a"].proc.stdout)
    assert sorted((r["workload"], r["clients"]) for r in rows) == sorted(a)
    for r in rows:
        assert r["tps"] == pytest.approx(a[(r["workload"], r["clients"])], rel=1e-9)

    # uplift: B against A per client count and workload, Δ = (B − A) / A of the stored means, with its interval
    proc = pglab("compare", str(tmp_path / "a"), str(tmp_path / "b"), "--uplift", "--format", "json", check=True)
    uplift = json.loads(proc.stdout)
    assert {"workload", "clients", "a", "b", "uplift_pct", "ci95_low_pct", "ci95_high_pct", "verdict"} <= set(
        uplift[0])
    assert sorted((u["workload"], u["clients"]) for u in uplift) == sorted(a)
    for u in uplift:
        key = (u["workload"], u["clients"])
        assert u["a"] == pytest.approx(a[key], rel=1e-9) and u["b"] == pytest.approx(b[key], rel=1e-9)
        assert u["uplift_pct"] == pytest.approx((b[key] - a[key]) / a[key] * 100, rel=1e-6)
        assert (u["ci95_low_pct"] is None) == (u["ci95_high_pct"] is None)  # None: Fieller's set unbounded
        if u["ci95_low_pct"] is not None:
            assert u["ci95_low_pct"] < u["uplift_pct"] < u["ci95_high_pct"]
    text = pglab("compare", str(tmp_path / "a"), str(tmp_path / "b"), "--uplift", check=True, env={
        **os.environ, "COLUMNS": "200"}).stdout
    assert "uplift % [95 %]" in text, text
    for workload in ("tpcb-like", "select-only"):  # each side's price per TPS, B against A, below the table
        peak_a = max(v for (w, _), v in a.items() if w == workload)
        peak_b = max(v for (w, _), v in b.items() if w == workload)
        line = next(x for x in text.splitlines() if x.startswith(f"{workload}: B costs "))
        assert f"{money(1000 / peak_b)} USD/TPS·month vs {money(1450 / peak_a)} for A" in line, line
        assert "monthly 1000 vs 1450" in line, line

    # $/TPS per workload: the plan's monthly price over the peak point's stored mean TPS, on each side
    for side, table, price in (("a", a, 1450.0), ("b", b, 1000.0)):
        proc = pglab("report", str(tmp_path / side), "--table", "cost", "--format", "json", check=True)
        cost = {r["workload"]: r for r in json.loads(proc.stdout)}
        assert sorted(cost) == ["select-only", "tpcb-like"]
        for workload, r in cost.items():
            peak = max(v for (w, _), v in table.items() if w == workload)
            assert r["peak_tps"] == pytest.approx(peak, rel=1e-9) and r["monthly"] == price
            assert r["per_tps"] == pytest.approx(price / peak, rel=1e-9)
            assert (workload, r["at_clients"]) in table and table[(workload, r["at_clients"])] == pytest.approx(peak)
            # the cost's parts beside it, each its monthly price, as the plan the sweep ran gives them
            parts = {"compute": 730, "storage": price - 830, "backup": 100}
            assert [c for c in r if c.startswith("monthly.")] == [f"monthly.{p}" for p in parts], r
            assert {p: r[f"monthly.{p}"] for p in parts} == parts
        stored = yaml.safe_load(sides[side].sweep()["plan_text"])
        assert stored["cost"]["breakdown"] == parts and sum(parts.values()) == price
        # the terminal's table: a column per part, the parts' prices in its rows
        text = pglab("report", str(tmp_path / side), "--table", "cost", check=True,
                     env={**os.environ, "COLUMNS": "200"}).stdout
        header = next(line for line in text.splitlines() if "peak tps" in line)
        assert [h for h in ("compute/month", "storage/month", "backup/month") if h in header] == [
            "compute/month", "storage/month", "backup/month"], text
        for workload in ("tpcb-like", "select-only"):
            line = next(x for x in text.splitlines() if workload in x)
            assert all(money(v) in line for v in parts.values()), (line, parts)
        # and the HTML report's cost table: the parts' headers, then each row's prices in the plan's order
        pglab("report", str(tmp_path / side), "--html", str(tmp_path / f"{side}.html"), check=True)
        html = (tmp_path / f"{side}.html").read_text()
        cost_html = html[html.index("Cost at peak TPS"):]
        assert all(f"{p}/month" in cost_html for p in parts), cost_html[:2000]
        assert re.search(".*?".join(f">{money(v)}<" for v in parts.values()), cost_html, re.S), cost_html[:2000]


def test_the_smallest_004_is_the_example_with_its_sizes_only(tmp_path: Path) -> None:
    """The edit above changes sizes, the server and B's price, nothing else the study measures."""
    fake = {"conninfo": "host=/tmp port=5432 user=u dbname=d", "passfile": str(tmp_path / "pgpass")}
    small, full = yaml.safe_load(smallest(fake, 1000.0)), yaml.safe_load(MANAGED.read_text())
    assert small["matrix"]["workload"] == full["matrix"]["workload"] == ["tpcb-like", "select-only"]
    assert small["target"]["external"]["destructive"] is True
    assert small["target"]["external"]["conninfo"] == fake["conninfo"]
    assert small["cost"]["breakdown"] == {**full["cost"]["breakdown"], "storage": 170}
    assert full["matrix"]["clients"] == [4, 8, 16, 32, 64, 96] and full["run"]["repeats"] == 3


# ------------------------------------------------------------------ the studies the lab tests run (kube_lab_support)
def flat(data: object, prefix: str = "") -> dict[str, object]:
    """A plan's fields by dotted path (a list's items by index)."""
    if isinstance(data, dict):
        return {k: v for key, value in data.items() for k, v in flat(value, f"{prefix}{key}.").items()}
    if isinstance(data, list):
        return {k: v for i, value in enumerate(data) for k, v in flat(value, f"{prefix}{i}.").items()}
    return {prefix.rstrip("."): data}


def magnitude(value: object) -> float:
    """A size field's number, to compare: a count, seconds ("30s") or bytes ("16MiB")."""
    text = str(value)
    if text.endswith("s") and text[:-1].replace(".", "", 1).isdigit():
        return float(text[:-1])
    return float(size_bytes(value)) if isinstance(value, str) else float(str(value))


@pytest.mark.parametrize("example", sorted(STUDY_EDITS))
def test_a_study_the_lab_runs_is_its_example_with_its_sizes_only(example: str, tmp_path: Path) -> None:
    """The plan a lab test runs for a study (kube_lab_support.study_plan) differs from the example in sizes, none
    larger, and in what the lab needs (its kubeconfig and namespace, a fresh archive destination), nothing else; it
    validates. Two exceptions, each the lab's check of a feature the study does not use: the storage-axis test's
    memory class (MEMORY_VALUE), appended to study 002's two classes as a third value of its storage axis, the
    study's own values unchanged; and study 001's best-effort tier in a namespace of its own."""
    text = study_plan(example, "/lab/admin.kubeconfig", destination="s3://pglab/x", namespace="pglab-x",
                      memory=MEMORY_VALUE, host_path="/lab/nodes/{node}/disk",
                      prometheus="{url: 'http://127.0.0.1:9090', interval: 1s}", slow="pglab-x-slow")
    (tmp_path / example).write_text(text)
    proc = pglab("plan", "validate", str(tmp_path / example))
    assert proc.returncode == 0, proc.stderr
    small, full = flat(yaml.safe_load(text)), flat(yaml.safe_load((REPO / "examples" / example).read_text()))
    appended = set()
    if example == "study-storage-classes.yaml":  # a third value of the axis, after the study's two
        n = len(yaml.safe_load((REPO / "examples" / example).read_text())["matrix"]["storage"])
        appended = {k for k in small if k.startswith(f"matrix.storage.{n}.")}
        assert {k.removeprefix(f"matrix.storage.{n}."): small[k] for k in appended} == flat(
            yaml.safe_load(MEMORY_VALUE)[0])
        assert not any(k.startswith(f"matrix.storage.{n}.") for k in full)
        assert small[f"matrix.storage.{n}.storage.class"] == TMPFS_CLASS
    if example == "study-qos-tiers.yaml":  # the best-effort tier in a namespace of its own, nothing else
        appended = {k for k in small if k.endswith(".namespace") and k.startswith("tenants.")}
        assert {k: small[k] for k in appended} == {"tenants.arrangements.1.tiers.2.namespace": "pglab-x-slow"}
    changed = {k for k in small.keys() | full.keys() if small.get(k) != full.get(k)} - appended
    sizes = {k for k in changed if any(fnmatch.fnmatchcase(k, p) or fnmatch.fnmatchcase(k, f"{p}.*")
                                       for p in STUDY_SIZES)}
    assert changed - sizes <= set(STUDY_LAB), sorted(changed - sizes)
    assert small["target.kubernetes.kubeconfig"] == "/lab/admin.kubeconfig"
    if "target.kubernetes.namespace" in changed:
        assert small["target.kubernetes.namespace"] == "pglab-x"
    small_doc, full_doc = yaml.safe_load(text), yaml.safe_load((REPO / "examples" / example).read_text())
    for axis in ("clients", "jobs"):  # a size axis keeps its values, each no larger, or the first of them
        kept = small_doc.get("matrix", {}).get(axis) or []
        values = full_doc.get("matrix", {}).get(axis) or []
        assert len(kept) == len(values) or (0 < len(kept) < len(values) and kept == values[:len(kept)]), axis
        sizes -= {f"matrix.{axis}.{i}" for i in range(len(kept), len(values))}
    for k in sizes - {"run.repeats"}:  # smaller: a number, a duration ("30s") or a size ("16MiB"), each no larger
        assert k in small and k in full, k
        assert magnitude(small[k]) <= magnitude(full[k]), (k, small[k], full[k])
    # a verdict needs its repeats: the study's kept when it had 3 or more, more where shorter runs spread wider
    if "run.repeats" in full:
        assert int(str(small["run.repeats"])) >= min(3, int(str(full["run.repeats"])))
    if "target.kubernetes.wal_archive.s3.endpoint" in full:  # the lab's object store, as the example names it
        assert full["target.kubernetes.wal_archive.s3.endpoint"] == kubelab.OBJECTSTORE_URL
        assert full["target.kubernetes.wal_archive.s3.credentials"] == \
            f"{kubelab.OBJECTSTORE_NS}/{kubelab.OBJECTSTORE_SECRET}"
