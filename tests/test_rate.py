"""Rate as an axis (issue 29 item 1): open-loop runs at fixed arrival rates on a real local lab, each run's figures
checked against pgbench's own output and per-transaction log (the oracles), and the plan's refusals."""

from __future__ import annotations

import gzip
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import pglab, write_plan
from helpers import Ran, run_files

pytestmark = pytest.mark.postgres

PLAN = """
name: rate
target: {local: {instances: 1}}
dataset: {scale: 1}
matrix:
  clients: [2]
  rate: [40, 400]
run: {duration: 4s, repeats: 1, order: sequential, latency_limit: 2ms}
probes: {enabled: false}
"""


def _line(text: str, pattern: str) -> re.Match[str]:
    m = re.search(pattern, text, re.MULTILINE)
    assert m is not None, f"pgbench printed no {pattern!r}"
    return m


def _log_lines(run_dir: Path) -> list[list[str]]:
    lines: list[list[str]] = []
    for f in sorted(run_dir.glob("pgbench_log.*")):
        text = gzip.decompress(f.read_bytes()).decode() if f.suffix == ".gz" else f.read_text()
        lines += [line.split() for line in text.splitlines() if line.strip()]
    return lines


def test_each_rate_is_a_point_and_its_figures_are_pgbenchs(run_in_tmp: Callable[..., Ran]) -> None:
    ran = run_in_tmp(PLAN)
    runs = ran.runs()
    assert [r.axes["rate"] for r in runs] == [40.0, 400.0] and all(r.status == "ok" for r in runs)
    for (run_dir, record), row in zip(run_files(ran.results), runs, strict=True):
        rate = row.axes["rate"]
        command = record["command"]
        assert command[command.index("-R") + 1] == f"{rate:g}" and "--latency-limit=2" in command
        out = (run_dir / "pgbench.out").read_text()
        m = row.metrics
        lag = _line(out, r"^rate limit schedule lag: avg ([\d.]+) \(max ([\d.]+)\) ms")
        assert (m["schedule_lag_ms"], m["schedule_lag_max_ms"]) == (float(lag.group(1)), float(lag.group(2)))
        processed = int(_line(out, r"^number of transactions actually processed: (\d+)").group(1))
        skipped = int(_line(out, r"^number of transactions skipped: (\d+)").group(1))
        late = int(_line(out, r"^number of transactions above the 2\.0 ms latency limit: (\d+)/").group(1))
        assert m["skipped_pct"] == pytest.approx(skipped / (processed + skipped) * 100)
        assert m["late_pct"] == pytest.approx(late / processed * 100)
        # the log (every transaction: no sampling) says the same: one 'skipped' line for each transaction skipped
        log = _log_lines(run_dir)
        assert sum(1 for f in log if f[2] == "skipped") == skipped
        done = [f for f in log if f[2] not in ("skipped", "failed")]
        assert len(done) == processed and all(len(f) >= 7 for f in done)  # the schedule lag column is there
        # latency counts from the scheduled start: each logged time holds its schedule lag, and the mean of the
        # times is pgbench's own latency average (which its documentation says includes the lag)
        assert all(int(f[2]) >= int(f[6]) for f in done)
        average = float(_line(out, r"^latency average = ([\d.]+) ms").group(1))
        assert m["latency_log_mean_ms"] == pytest.approx(sum(int(f[2]) for f in done) / len(done) / 1000)
        assert m["latency_log_mean_ms"] == pytest.approx(average, abs=0.0015)
    # the report shows the rate as an axis and the schedule's figures as columns
    report = pglab("report", str(ran.results), "--format", "csv", check=True).stdout
    header = report.splitlines()[0].split(",")
    assert {"rate", "schedule_lag_ms", "skipped_pct", "late_pct"} <= set(header)


@pytest.mark.parametrize(("plan", "field"), [
    ("matrix: {rate: [10]}\nrun: {rate: 10}\n", "run.rate"),
    ("matrix: {rate: [10, 10]}\n", "matrix.rate"),
    ("matrix: {rate: [0]}\n", "matrix.rate"),
])
def test_a_rate_given_twice_or_out_of_range_is_refused_naming_the_field(tmp_path: Path, plan: str,
                                                                        field: str) -> None:
    path = write_plan(tmp_path / "plan.yaml", f"name: bad\n{plan}")
    proc = pglab("plan", "validate", str(path))
    assert proc.returncode == 2 and proc.stderr.startswith(field), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
