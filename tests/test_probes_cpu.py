"""CPU and memory probes against real processes burning CPU and real dirty pages."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

import pytest

from pglab.probes import CpuProbe, MemoryProbe, ProbeContext, Sampler, now
from pglab.probes._util import rows

pytestmark = pytest.mark.postgres

BURN = "import sys, time\nend = float(sys.argv[1])\nwhile time.time() < end:\n    pass\n"


def _next_second() -> float:
    t = now()
    time.sleep(int(t) + 1.0 - t)
    return now()


def _run_sampled(probe: CpuProbe, sampler: Sampler, start_proc, seconds: int) -> tuple[float, list]:
    """Start a process at a whole second, let it burn ``seconds`` and return (start second, samples)."""
    sampler.start()
    try:
        s = float(int(_next_second()))
        proc = start_proc(s + seconds + 0.05)
        proc.wait(timeout=seconds + 10)
        time.sleep(max(0.0, s + seconds + 1.1 - now()))
    finally:
        samples = sampler.stop()
    assert not sampler.errors
    return s, samples


def test_client_cpu_of_a_burning_process_is_one_core() -> None:
    pids: list[int] = []
    probe = CpuProbe(ProbeContext("", client_pids=lambda: pids))
    sampler = Sampler([probe])

    def start(end: float) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", BURN, str(end)])
        pids.append(proc.pid)  # registered after start, as the runner does with pgbench
        return proc

    s, samples = _run_sampled(probe, sampler, start, 2)
    summary = probe.summarize(samples, s, s + 2)
    assert 0.8 <= summary["client_cpu_cores"] <= 1.2, summary
    assert summary["client_cpu_cores_max"] <= 1.2
    assert summary["server_cpu_cores"] == 0.0
    assert 0 < summary["cpu_pct"] <= 100
    # the host saw at least that core busy: 1 of ncpu cores
    assert summary["cpu_pct"] >= 0.8 * 100 / (os.cpu_count() or 1) - 1


CHURN = """
import os, subprocess, sys, time
end = float(sys.argv[1])
burner = subprocess.Popen([sys.executable, "-c", os.environ["BURN"], str(end)])
n = 0
while time.time() < end:  # children that live ~50 ms each: none of them lives through a tick
    subprocess.run([sys.executable, "-c", "import time\\nt = time.process_time()\\n"
                    "while time.process_time() - t < 0.03: pass"], check=True)
    n += 1
burner.wait()
t = os.times()
print(t.user + t.system + t.children_user + t.children_system, n, flush=True)
time.sleep(1.2)  # like a postmaster, outlive the children past the next tick
"""


def test_server_cpu_counts_the_whole_tree_including_short_lived_children() -> None:
    """A 'postmaster' with one long-lived busy child and a stream of short-lived ones (like pgbench -C
    backends): the probe's CPU-seconds over the run equal what the tree itself reports (os.times with
    children), so exits are neither lost nor counted twice."""
    roots: list[int] = []
    probe = CpuProbe(ProbeContext("", server_pids=lambda: roots))
    sampler = Sampler([probe])
    procs: list[subprocess.Popen] = []

    def start(end: float) -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, "-c", CHURN, str(end)],
            env={**os.environ, "BURN": BURN},
            stdout=subprocess.PIPE,
            text=True,
        )
        roots.append(proc.pid)
        procs.append(proc)
        return proc

    s, samples = _run_sampled(probe, sampler, start, 2)
    out, _ = procs[0].communicate()
    reported_s, children = float(out.split()[0]), int(out.split()[1])
    assert children >= 10
    ticks = [r for r in rows(samples) if s < r.ts <= s + 3.5]
    measured_s = sum(r.get("server_cores") * r.get("dt") for r in ticks)
    print(f"tree CPU: probe {measured_s:.3f} s, tree itself {reported_s:.3f} s, {children} children")
    assert measured_s == pytest.approx(reported_s, rel=0.02, abs=0.03), (measured_s, reported_s)
    ncpu = os.cpu_count() or 1
    assert all(0.0 <= r.get("server_cores") <= ncpu + 0.1 for r in rows(samples))
    summary = probe.summarize(samples, s, s + 2)
    # the tree burned its CPU inside these two seconds: their mean is its total over two (however busy the host)
    assert summary["server_cpu_cores"] == pytest.approx(reported_s / 2, rel=0.25)
    assert summary["client_cpu_cores"] == 0.0


def test_host_percentages_add_up() -> None:
    probe = CpuProbe(ProbeContext(""))
    probe.open()
    time.sleep(0.3)
    got = {s.metric: s.value for s in probe.sample(now())}
    parts = ("user_pct", "nice_pct", "system_pct", "irq_pct", "softirq_pct", "iowait_pct", "idle_pct")
    assert sum(got[k] for k in (*parts, "steal_pct")) == pytest.approx(100.0)
    assert got["busy_pct"] == pytest.approx(100.0 - got["idle_pct"] - got["iowait_pct"])
    assert 0.25 < got["dt"] < 1.0


def test_memory_probe_sees_dirty_pages() -> None:
    probe = MemoryProbe()
    probe.open()
    before = now()
    with tempfile.NamedTemporaryFile(dir="/var/tmp", prefix="pglab-dirty-") as f:
        f.write(os.urandom(1 << 20) * 48)  # 48 MiB, not synced: it sits in the page cache as Dirty
        f.flush()
        samples = probe.sample(now())
    summary = probe.summarize(samples, before, now())
    assert set(summary) == {"dirty_mb_max", "dirty_mb_mean", "writeback_mb_max"}
    assert summary["dirty_mb_max"] + summary["writeback_mb_max"] >= 24, summary
