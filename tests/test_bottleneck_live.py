"""Bottleneck attribution on runs made to be bound by one resource, on a real lab.

select-only with 8 clients on this machine's few cores saturates the CPU; tpcb-like under remote_apply, with
the standby applying WAL 30 ms late (recovery_min_apply_delay), makes every commit wait for the standby.
The verdict for each point must name that resource first, with the figures behind it.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import run_plan
from helpers import outsider
from pglab.analysis.bottleneck import interfered

pytestmark = [pytest.mark.postgres, pytest.mark.quiet]


def test_cpu_bound_and_sync_replication_bound_points_are_named() -> None:
    base = Path(tempfile.mkdtemp(prefix="pglab-test-"))
    os.chmod(base, 0o711)
    try:
        plan = base / "plan.yaml"
        plan.write_text(f"""
name: bottlenecks
target: {{local: {{instances: 2, synchronous: {{method: any, number: 1}}}}}}
postgres: {{parameters: {{recovery_min_apply_delay: 30ms}}}}
dataset: {{scale: 4}}
matrix:
  workload: [select-only, tpcb-like]
  clients: [{max(8, 4 * (os.cpu_count() or 1))}]
  synchronous_commit: [remote_apply]
run: {{duration: 4s, warmup: 1s, repeats: 1}}
""")
        proc = run_plan(plan, base / "r", "--format", "csv").proc
        rows = {r["workload"]: r for r in csv.DictReader(io.StringIO(proc.stdout))}
        select_only, tpcb = rows["select-only"]["bottleneck"], rows["tpcb-like"]["bottleneck"]
        runs = [json.loads(f.read_text()) for f in (base / "r" / "runs").glob("*/run.json")]
        outside = {r["point"]["workload"]: interfered(r["metrics"]) for r in runs}
        for r in runs:
            print(r["point"]["workload"], "outside the lab:", r["metrics"].get("interference_cpu_cores"), "cores")
        print(select_only, tpcb, sep="\n")
        # on a machine shared with other jobs, the host may be saturated from outside the lab: the verdict then
        # says so first, and the lab's own bound must still be named
        if outside["select-only"]:
            assert select_only.startswith(("interference (", "cpu (")), select_only
        else:
            assert select_only.startswith("cpu ("), select_only
            assert "% busy" in select_only or "cores" in select_only
        if outside["tpcb-like"] and tpcb.startswith("interference ("):
            assert "sync-replication (" in tpcb, tpcb
        else:
            assert tpcb.startswith("sync-replication ("), tpcb
        assert "IPC:SyncRep" in tpcb
        # the standby's delay, not the CPU, bounds tpcb-like: far fewer transactions than select-only
        assert float(rows["tpcb-like"]["tps"]) < float(rows["select-only"]["tps"]) / 5
    finally:
        shutil.rmtree(base, ignore_errors=True)


CPU_CGROUP = Path("/sys/fs/cgroup/cpu")  # cgroup v1 (the lab machines' hierarchy)


class CpuTicks:
    """utime + stime of some processes, read every 0.1 s with the time of each read (a thread of the test)."""

    def __init__(self, pids: list[int]) -> None:
        self.pids, self._stop = pids, threading.Event()
        self.reads: list[tuple[float, float]] = []  # (epoch s, CPU s of every pid)
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> CpuTicks:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            ticks = sum(sum(map(int, Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[11:13]))
                        for pid in self.pids)
            self.reads.append((time.time(), ticks / os.sysconf("SC_CLK_TCK")))
            time.sleep(0.1)

    def cores(self, start: float, end: float) -> float:
        """Cores used over [start, end], the seconds interpolated linearly at both edges."""
        ts, secs = zip(*self.reads, strict=True)
        return float(np.interp(end, ts, secs) - np.interp(start, ts, secs)) / (end - start)


def test_a_host_saturated_from_outside_is_named_interference() -> None:
    """The same small select-only point twice, the second time beside busy loops that are not the lab's: their
    CPU is interference_cpu_cores, and the verdict names interference, not cpu.

    The oracle: the loops' own CPU time (/proc/<pid>/stat, read every 0.1 s by the test and interpolated at the
    run's window edges) is all counted outside the lab, and is most of what is. The loops run in a CPU cgroup of
    their own weighted 16 times the default, so they take the larger share of the saturated host whatever groups
    the lab's processes are in (in the root group they did not always: 0.98 cores against the lab's 0.99 once).
    The rule names interference first only when the outside uses more than the lab (analysis/bottleneck.py)."""
    base = Path(tempfile.mkdtemp(prefix="pglab-test-"))
    os.chmod(base, 0o711)
    outsiders: list[int] = []
    heavy: Path | None = None
    try:
        plan = base / "plan.yaml"
        plan.write_text("""
name: interference
target: {local: {instances: 1}}
dataset: {scale: 1}
matrix: {workload: [select-only], clients: [1]}
run: {duration: 4s, warmup: 1s, repeats: 1}
""")
        found = {}
        for label in ("alone", "beside"):
            if label == "beside":
                outsiders = [outsider() for _ in range(max(2, os.cpu_count() or 1))]
                heavy = CPU_CGROUP / f"pglab-test-outsiders-{os.getpid()}"
                heavy.mkdir()
                (heavy / "cpu.shares").write_text("16384")
                for pid in outsiders:
                    (heavy / "tasks").write_text(str(pid))
                loop_ticks = CpuTicks(outsiders).start()
            proc = run_plan(plan, base / label, "--format", "csv").proc
            row = next(csv.DictReader(io.StringIO(proc.stdout)))
            metrics = json.loads(next((base / label / "runs").glob("*/run.json")).read_text())["metrics"]
            found[label] = (row["bottleneck"], metrics)
            if label == "beside":
                loop_ticks.stop()
            print(label, metrics["interference_cpu_cores"], "cores outside the lab;", row["bottleneck"])
        verdict, beside = found["beside"]
        assert interfered(beside), beside
        window = json.loads(next((base / "beside" / "runs").glob("*/run.json")).read_text())["window"]
        loops = loop_ticks.cores(*window)
        assert beside["interference_cpu_cores"] >= 0.95 * loops and loops >= 0.8 * beside["interference_cpu_cores"], (
            loops, beside)
        if (os.cpu_count() or 1) <= 2 or beside["cpu_pct"] >= 90:
            assert verdict.startswith("interference ("), verdict
            assert "cores used outside the lab" in verdict
        verdict, alone = found["alone"]
        assert alone["server_cpu_cores"] > 0  # the lab's own servers are the servers', never outside it
        if not interfered(alone):  # a shared machine may be busy anyway: the flag, not a guess, decides
            assert not verdict.startswith("interference"), verdict
    finally:
        for pid in outsiders:
            os.kill(pid, 9)
        if heavy is not None:
            for _ in range(50):  # the killed loops leave the group once reaped
                with contextlib.suppress(OSError):
                    heavy.rmdir()
                    break
                time.sleep(0.1)
        shutil.rmtree(base, ignore_errors=True)
