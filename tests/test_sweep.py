"""End to end: a real 3-node lab, a real pgbench sweep, the store and the report agree with pgbench.

One sweep (kept with --keep so the topology can be inspected afterwards) serves every test here.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import pwd
import re
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from conftest import pglab, processes_mentioning
from helpers import read_store, scalar, stored_events, sweep_row
from pglab.probes._util import rows_in_window
from pglab.probes.base import Sample

pytestmark = pytest.mark.postgres

RECORD_SC = """\
BEGIN;
SELECT pg_advisory_xact_lock(4242);
CREATE TABLE IF NOT EXISTS sc_seen (ts timestamptz NOT NULL, sc text NOT NULL);
INSERT INTO sc_seen VALUES (clock_timestamp(), current_setting('synchronous_commit'));
END;
"""

SEED_COLUMNS = ["workload", "synchronous_commit", "clients", "tps", "latency_avg_ms", "latency_p95_ms",
                "latency_p99_ms", "read_iops", "write_iops", "total_iops", "read_latency_ms", "write_latency_ms",
                "cpu_pct", "wal_mb_s", "replay_lag_max_ms"]  # then each instance's I/O, repeats …


@pytest.fixture(scope="module")
def sweep() -> Any:
    base = Path(tempfile.mkdtemp(prefix="pglab-test-"))
    os.chmod(base, 0o711)  # the server user must reach the WAL base below it
    wal_base = base / "walbase"
    (base / "record_sc.sql").write_text(RECORD_SC)
    plan = base / "plan.yaml"
    plan.write_text(f"""
name: e2e
target:
  local:
    instances: 3
    synchronous: {{method: any, number: 1}}
    paths: {{wal: {wal_base}}}
postgres:
  parameters: {{shared_buffers: 64MB}}
dataset: {{scale: 2}}
matrix:
  workload:
    - name: mix
      scripts: [{{builtin: tpcb-like, weight: 4}}, {{file: record_sc.sql, weight: 1}}]
  synchronous_commit: [local, remote_apply]
  clients: [2]
run: {{duration: 3s, warmup: 1s, repeats: 2}}
storage: {{profiles: [wal-fdatasync-8k], runtime: 2s, size: 16MiB}}
""")
    results = base / "results"
    proc = pglab("run", str(plan), "--results", str(results), "--keep", "--format", "csv")
    target = sweep_row(results)["target"] or {}
    lab = Path(target["lab_dir"]) if target.get("lab_dir") else None
    try:
        with read_store(results) as store:
            yield {"proc": proc, "results": results, "store": store, "lab": lab, "wal_base": wal_base,
                   "target": target}
    finally:
        if lab is not None:
            pglab("lab", "clean", str(lab))
            assert processes_mentioning(str(lab)) == []
        shutil.rmtree(base, ignore_errors=True)


def _lab_conn(sweep: Any, node: int = 0) -> psycopg.Connection[Any]:
    lab: Path = sweep["lab"]
    port = sweep["target"]["nodes"][node]["port"]
    return psycopg.connect(host=str(lab / "sock"), port=port, user="pglab", dbname="pglab",
                           passfile=str(lab / "secrets" / "pgpass"), autocommit=True)


def _runs(sweep: Any) -> list[dict[str, Any]]:
    store = sweep["store"]
    rows = {r.id: r for r in store.runs()}
    return [{"id": run_id, "status": rows[run_id].status, "dir": sweep["results"] / rows[run_id].dir,
             "window": store.run_window(run_id), "axes": rows[run_id].axes, "metrics": rows[run_id].metrics}
            for run_id, _started, _ended in store.run_times(store.latest_sweep_id())]


def test_the_sweep_completes(sweep: Any) -> None:
    proc = sweep["proc"]
    assert proc.returncode == 0, proc.stderr
    runs = _runs(sweep)
    assert len(runs) == 4 and {r["status"] for r in runs} == {"ok"}


def test_topology_is_what_the_plan_says(sweep: Any) -> None:
    with _lab_conn(sweep) as conn:
        rows = conn.execute("SELECT application_name, state, sync_state FROM pg_stat_replication "
                            "ORDER BY application_name").fetchall()
        assert rows == [("n1", "streaming", "quorum"), ("n2", "streaming", "quorum")]
        assert scalar(conn, "SHOW synchronous_standby_names") == "ANY 1 (n1, n2)"
        walfile = scalar(conn, "SELECT pg_walfile_name(pg_current_wal_lsn())")
        assert scalar(conn, "SELECT pg_is_in_recovery()") is False
    for i, node in enumerate(sweep["target"]["nodes"]):
        wal_dir = sweep["wal_base"] / node["name"] / "wal"
        assert Path(node["wal"]) == wal_dir
        pg_wal = Path(node["data"]) / "pg_wal"
        assert pg_wal.is_symlink() and pg_wal.resolve() == wal_dir.resolve()
        segments = [p.name for p in wal_dir.iterdir() if re.fullmatch(r"[0-9A-F]{24}", p.name)]
        assert segments, f"no WAL segment in {wal_dir}"
        if i == 0:
            assert walfile in segments
        with _lab_conn(sweep, i) as conn:
            assert scalar(conn, "SELECT pg_is_in_recovery()") is (i > 0)


def test_benchmark_sessions_see_the_points_synchronous_commit(sweep: Any) -> None:
    with _lab_conn(sweep) as conn:
        rows = conn.execute("SELECT extract(epoch FROM ts)::float8, sc FROM sc_seen").fetchall()
    checked = 0
    for run in _runs(sweep):
        start, end = run["window"]
        seen = {sc for ts, sc in rows if start <= ts <= end}
        assert seen == {run["axes"]["synchronous_commit"]}, (run["id"], seen)
        checked += 1
    assert checked == 4


def test_stored_tps_is_pgbench_own_figure(sweep: Any) -> None:
    for run in _runs(sweep):
        text = (run["dir"] / "pgbench.out").read_text()
        m = re.search(r"^tps = ([\d.]+) \(without initial connection time\)$", text, re.MULTILINE)
        assert m, text
        assert run["metrics"]["tps"] == float(m.group(1))
        avg = re.search(r"^latency average = ([\d.]+) ms$", text, re.MULTILINE)
        assert avg and run["metrics"]["latency_avg_ms"] == float(avg.group(1))


def test_percentiles_recomputed_from_the_raw_log(sweep: Any) -> None:
    for run in _runs(sweep):
        latencies = []
        logs = list(run["dir"].glob("pgbench_log.*"))
        assert logs and all(log.suffix == ".gz" for log in logs)  # kept, compressed once summarised
        for log in logs:
            for line in gzip.decompress(log.read_bytes()).decode().splitlines():
                fields = line.split()
                if fields[2].isdigit():
                    latencies.append(int(fields[2]) / 1000.0)
        assert len(latencies) == run["metrics"]["transactions"]
        q = statistics.quantiles(latencies, n=100, method="inclusive")
        assert run["metrics"]["latency_p95_ms"] == pytest.approx(q[94], rel=1e-9)
        assert run["metrics"]["latency_p99_ms"] == pytest.approx(q[98], rel=1e-9)
        assert run["metrics"]["latency_max_ms"] == pytest.approx(max(latencies), rel=1e-9)


def test_warm_up_is_outside_the_measured_window(sweep: Any) -> None:
    for run in _runs(sweep):
        events = dict(sweep["store"].run_event_times(run["id"]))
        start, end = run["window"]
        assert events["warmup-start"] < events["warmup-end"] <= start < end
        assert "tps = " in (run["dir"] / "warmup.out").read_text()  # the warm-up ran, and is kept
        series = [ts for ts, _source, metric, _value in sweep["store"].series(run["id"], "pgbench") if metric == "tps"]
        inside = [ts for ts in series if start <= ts - 0.5 <= end]
        assert 2 <= len(inside) <= 4, series


def test_probes_sampled_the_window(sweep: Any) -> None:
    for run in _runs(sweep):
        m = run["metrics"]
        assert m["write_iops"] > 0  # tpcb-like commits write WAL
        assert m["wal_mb_s"] > 0
        # backends publish their commit counts up to a second late, so the probe's ticks in the window (whole ones,
        # chosen by their middle, as pglab sums them) see part of the window's commits and up to all of the 1 s
        # warm-up's; beyond those only pglab's own sessions commit in the database: the wait sampler's 5 reads a
        # second, the statistics and replication readers' one each, the reset's few (45 over 4 ticks in one run)
        start, end = run["window"]
        ticks = rows_in_window([Sample(*s) for s in sweep["store"].series(run["id"], "pg")], start, end, rate=True)
        counted = sum(r.get("d_commits") for r in ticks)
        assert m["commits_s"] == pytest.approx(counted / sum(r.get("dt") for r in ticks), rel=1e-9)
        warm_up = re.search(r"transactions actually processed: (\d+)", (run["dir"] / "warmup.out").read_text())
        assert warm_up is not None
        assert 0.3 * m["transactions"] < counted <= m["transactions"] + int(warm_up[1]) + 20 * len(ticks), (
            counted, m["transactions"], warm_up[1], len(ticks))
        assert 0 < m["cpu_pct"] <= 100
        assert m["replay_lag_max_ms"] is not None
        sources = {source for _ts, source, _metric, _value in sweep["store"].series(run["id"])}
        assert {"cpu", "pg", "waits", "mem"} <= sources and any(s.startswith("disk:") for s in sources)
        assert {"repl:n1", "repl:n2"} <= sources


def test_the_table_and_the_report_agree_with_the_store(sweep: Any) -> None:
    printed = list(csv.DictReader(io.StringIO(sweep["proc"].stdout)))
    report = pglab("report", str(sweep["results"]), "--format", "csv", check=True)
    rows = list(csv.DictReader(io.StringIO(report.stdout)))
    assert rows == printed
    assert len(rows) == 2
    assert list(rows[0])[: len(SEED_COLUMNS)] == SEED_COLUMNS
    runs = _runs(sweep)
    for row in rows:
        for column in SEED_COLUMNS:
            assert row[column] != "", column
        assert row["bottleneck"]  # a verdict, or "none stood out"
        mine = [r for r in runs if r["axes"]["synchronous_commit"] == row["synchronous_commit"]]
        assert int(row["repeats"]) == 2
        assert float(row["tps"]) == pytest.approx(statistics.mean(r["metrics"]["tps"] for r in mine), rel=1e-12)
        assert float(row["tps_ci95"]) > 0
    per_run = pglab("report", str(sweep["results"]), "--format", "json", "--per-run", check=True)
    listed = json.loads(per_run.stdout)
    assert {r["run_id"] for r in listed} == {r["id"] for r in runs}
    assert all((sweep["results"] / r["dir"] / "pgbench.out").is_file() for r in listed)
    table = pglab("report", str(sweep["results"]), check=True).stdout
    assert "±" in table and "remote_apply" in table


def test_server_logs_are_kept_and_checkpoints_become_events(sweep: Any) -> None:
    logs = sweep["results"] / "server-logs"
    assert sorted(p.name for p in logs.iterdir()) == ["n0.log", "n1.log", "n2.log"]
    starts = [line for line in (logs / "n0.log").read_text().splitlines() if "checkpoint starting:" in line]
    events = [(ts, detail) for ts, _kind, detail, _run, _scope in stored_events(sweep["results"], "checkpoint-start")]
    assert len(events) == len(starts) >= 4  # at least the CHECKPOINT before each of the 4 runs
    (row,) = sweep["store"].sweeps()
    started, finished = row["started"], row["finished"]
    assert all(started - 5 <= ts <= finished + 5 for ts, _ in events)  # on the run's clock, not shifted by hours


def test_environment_is_stored(sweep: Any) -> None:
    env = sweep["store"].sweep_environment(sweep["store"].latest_sweep_id())
    assert env["postgres"]["version_num"] >= 130000
    assert "shared_buffers" in env["postgres"]["non_default_settings"]
    assert env["cpu"]["count"] >= 1 and env["memory"]["total_bytes"] > 0
    assert env["paths"]["n0.wal"]["fstype"] and env["paths"]["n0.wal"]["mount_options"]
    assert "name: e2e" in env["plan"]


def test_no_password_in_artifacts(sweep: Any, tmp_path: Path) -> None:
    """The generated password lives in owner-only passfiles (pglab's, the server user's and, as root, the plan
    user's, in a folder of root's it cannot write) and nowhere else: not in the store, the run folders, the server
    logs, the reports and exports, the lab's other files, the registry, nor the output."""
    lab: Path = sweep["lab"]
    passfiles = {lab / "secrets" / "pgpass", lab / "server" / "pgpass"}
    if os.geteuid() == 0:  # pgbench ran as the plan user
        passfiles.add(lab / "client" / "pgpass")
        folder = (lab / "client").stat()
        assert folder.st_uid == 0 and oct(folder.st_mode & 0o777) == "0o711"
        assert (lab / "client" / "pgpass").stat().st_uid == pwd.getpwnam("pglab-run").pw_uid
    password = (lab / "secrets" / "pgpass").read_text().strip().rsplit(":", 1)[1]
    assert len(password) >= 20
    for f in passfiles:
        assert oct(f.stat().st_mode & 0o777) == "0o600"
    assert oct((lab / "secrets").stat().st_mode & 0o777) == "0o700"
    pglab("report", str(sweep["results"]), "--html", str(tmp_path / "report.html"), check=True)
    pglab("export", str(sweep["results"]), "--format", "csv", "--to", str(tmp_path / "export"), check=True)
    from pglab.targets.local.registry import state_dir

    scanned = 0
    for root in (sweep["results"], tmp_path, lab, state_dir()):
        for path in root.rglob("*"):
            if path.is_file() and path not in passfiles and not path.is_symlink():
                assert password.encode() not in path.read_bytes(), path
                scanned += 1
    assert scanned > 100
    assert password not in sweep["proc"].stdout + sweep["proc"].stderr


def test_synced_writes_on_the_data_path_are_counted_on_its_device(sweep: Any) -> None:
    """A known burst of synced 8 KiB writes into the primary's data directory, seen by the disk probe."""
    from pglab.probes import DiskProbe, ProbeContext, Sampler, now, resolve_device

    data = Path(sweep["target"]["nodes"][0]["data"])
    scratch = data / "pglab-fio-test"
    scratch.mkdir()
    device = resolve_device(data).device
    findmnt = subprocess.run(["findmnt", "-no", "MAJ:MIN", "--target", str(data)], capture_output=True,
                             text=True, check=True).stdout.strip()
    assert Path(f"/sys/dev/block/{findmnt}").resolve().name == device
    probe = DiskProbe(ProbeContext("", paths={"n0.data": data}))
    sampler = Sampler([probe])
    sampler.start()
    try:
        t0 = now()
        fio = subprocess.run(["fio", "--name=burst", f"--directory={scratch}", "--rw=write", "--bs=8k",
                              "--size=4m", "--fdatasync=1", "--ioengine=psync", "--output-format=json"],
                             capture_output=True, text=True, check=True)
        t1 = now()
        time.sleep(1.3)
    finally:
        samples = sampler.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    issued = json.loads(fio.stdout)["jobs"][0]["write"]["total_ios"]
    assert issued == 512
    counted = sum(s.value or 0 for s in samples
                  if s.source == f"disk:{device}" and s.metric == "d_writes" and t0 - 1 <= s.ts - 0.5 <= t1 + 1)
    assert counted >= issued


def test_storage_phase_ran_on_the_lab_paths_once_per_device(sweep: Any) -> None:
    store = sweep["store"]
    rows = [(f["label"], f["path"], f["device"], f["profile"], f["iops"], f["json_file"])
            for f in store.fio_results(store.latest_sweep_id())]
    # data and WAL bases are two folders on one device: measured once, as 'data'
    assert [(r[0], r[3]) for r in rows] == [("data", "wal-fdatasync-8k")]
    _label, path, device, _profile, iops, json_file = rows[0]
    assert Path(path) == Path(sweep["target"]["nodes"][0]["data"]).parent
    fio_json = json.loads((sweep["results"] / json_file).read_text())
    assert iops == fio_json["jobs"][0]["write"]["iops"]
    ceilings = store.ceilings(store.latest_sweep_id())["data"]
    assert ceilings["commit_flush_per_s"] == iops
    assert not list(Path(path).glob(".pglab-fio-*"))  # fio's test files are gone
    report = pglab("report", str(sweep["results"]), check=True).stdout
    assert "storage (fio)" in report and "wal-fdatasync-8k" in report and "commit_flush_per_s" in report
    assert "remote_apply" in report  # and the database table after it
    storage_csv = pglab("report", str(sweep["results"]), "--format", "csv", "--table", "storage", check=True)
    rows_csv = list(csv.DictReader(io.StringIO(storage_csv.stdout)))
    assert [r["job"] for r in rows_csv] == ["wal-fdatasync-8k-qd1"] and rows_csv[0]["device"] == device


def test_html_report_works_offline_in_chromium(sweep: Any, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Debian's Chromium, headless: no console error, no request from the page, every chart drawn."""
    out = tmp_path_factory.mktemp("html-report")
    report = out / "report.html"
    pglab("report", str(sweep["results"]), "--html", str(report), check=True)
    html = report.read_text()
    figures = re.findall(r'<figure id="([^"]+)">', html)
    assert [f for f in figures if not f.startswith("run-")] == [  # one workload, two levels, one client count
        "durability-mix-tps", "durability-mix-latency_avg_ms", "scaling-mix-tps", "scaling-mix-latency_p99_ms",
        "disk-mix-write_iops"]
    assert len([f for f in figures if f.startswith("run-")]) == 4  # every run: fewer than the charts' limit
    for section in ("Summary", "Per configuration", "Price of durability", "Storage profiles", "Runs", "Plan",
                    "Environment"):
        assert section in html
    assert "Uplift" not in html  # the sweep varies no configuration axis: no empty section
    assert "<script" not in html and re.search(r'(src|href)="https?://', html) is None
    chromium = shutil.which("chromium")
    assert chromium, "Debian's chromium is installed by ./setup.sh test"
    flags = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={out / 'profile'}", "--host-resolver-rules=MAP * ~NOTFOUND",
             "--enable-logging=stderr", "--v=0", f"--log-net-log={out / 'net.json'}", "--virtual-time-budget=8000",
             "--window-size=1400,4000"]
    shot = subprocess.run([*flags, f"--screenshot={out / 'report.png'}", report.as_uri()], capture_output=True,
                          text=True, timeout=120)
    assert (out / "report.png").stat().st_size > 10_000, shot.stderr[-2000:]
    print(f"screenshot: {out / 'report.png'}")
    console = [line for line in shot.stderr.splitlines() if "CONSOLE" in line]
    assert not [line for line in console if "Uncaught" in line or "rror" in line], console
    net = json.loads((out / "net.json").read_text())
    kinds = {v: k for k, v in net["constants"]["logEventTypes"].items()}
    requests = [e.get("params", {}) for e in net["events"] if kinds.get(e["type"]) == "URL_REQUEST_START_JOB"]
    from_page = [r.get("url") for r in requests if "url" in r and r.get("initiator") != "not an origin"]
    assert from_page == []
    dom = subprocess.run([*flags, "--dump-dom", report.as_uri()], capture_output=True, text=True, timeout=120).stdout
    for figure in figures:
        start = dom.index(f'id="{figure}"')
        block = dom[start: dom.find("</figure>", start)]
        assert "<svg" in block and ("<polyline" in block or "<rect" in block), figure
