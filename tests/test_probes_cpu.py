"""CPU and memory probes against real processes burning CPU and real dirty pages."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import pytest

from helpers import outsider
from pglab.analysis.bottleneck import attribute, interfered
from pglab.probes import CpuProbe, MemoryProbe, ProbeContext, Sampler, now
from pglab.probes._util import rows

pytestmark = [pytest.mark.postgres, pytest.mark.quiet]

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


def test_client_cpu_of_a_burning_process_is_what_it_used() -> None:
    """What the burner itself used (its os.times), at most one core."""
    pids: list[int] = []
    probe = CpuProbe(ProbeContext("", client_pids=lambda: pids))
    sampler = Sampler([probe])
    procs: list[subprocess.Popen] = []

    def start(end: float) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", BURN + "import os\nt = os.times()\nprint(t.user + t.system)",
                                 str(end)], stdout=subprocess.PIPE, text=True)
        pids.append(proc.pid)  # registered after start, as the runner does with pgbench
        procs.append(proc)
        return proc

    s, samples = _run_sampled(probe, sampler, start, 2)
    reported = float(procs[0].communicate()[0])
    summary = probe.summarize(samples, s, s + 2)
    # all but its last 50 ms (after the window) fell inside the two seconds
    assert summary["client_cpu_cores"] * 2 == pytest.approx(reported, rel=0.1, abs=0.06), (summary, reported)
    # one thread: at most one core (a whole one only on a host with a core to spare: on a loaded one it gets its share)
    assert 0 < summary["client_cpu_cores"] <= 1.2, summary
    assert summary["client_cpu_cores_max"] <= 1.2
    assert "server_cpu_cores" not in summary  # no server named: not attributed, never claimed idle
    assert 0 < summary["cpu_pct"] <= 100
    # the host saw at least what the burner used busy
    assert summary["cpu_pct"] >= summary["client_cpu_cores"] * 100 / (os.cpu_count() or 1) - 1


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
    probe = CpuProbe(ProbeContext(""), fine=1.0)  # a row at every call
    probe.open()
    time.sleep(0.3)
    got: dict[str, Any] = {s.metric: s.value for s in probe.sample(now())}
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


TICK = os.sysconf("SC_CLK_TCK")


def _own_ticks(pid: int | str) -> int:
    """utime+stime of one process, read by the test itself (not with pglab's parser)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def _host_ticks() -> int:
    """user+nice+system of the whole host: the time processes ran."""
    with open("/proc/stat") as f:
        user, nice, system = f.readline().split()[1:4]
    return int(user) + int(nice) + int(system)


def _measure(hogs: int) -> tuple[dict[str, Any], float, float]:
    """5 s with a registered 'pgbench' burning beside pglab's sampler, and ``hogs`` outsiders burning too.

    Returns the probe's window figures, the outside CPU read by the test at the window's edges (host's time less
    this process's and the burner's: the lab), and the cores the outsiders themselves used."""
    pids: list[int] = []
    probe = CpuProbe(ProbeContext("", client_pids=lambda: pids))
    sampler = Sampler([probe])
    outsiders: list[int] = []
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    pids.append(burner.pid)
    try:
        for _ in range(hogs):
            outsiders.append(outsider())
        for pid in outsiders:
            with open(f"/proc/{pid}/stat") as f:
                assert int(f.read().rsplit(")", 1)[1].split()[1]) != os.getpid()  # not pglab's child
        sampler.start()
        s = float(int(_next_second())) + 1.0  # one tick after the start: the probe knows every process
        edges = []
        for t in (s, s + 5.0):
            time.sleep(max(0.0, t - now()))
            edges.append((now(), _host_ticks(), _own_ticks("self") + _own_ticks(burner.pid),
                          sum(_own_ticks(p) for p in outsiders)))
        time.sleep(max(0.0, s + 6.2 - now()))  # the tick closing the window
    finally:
        samples = sampler.stop()
        burner.kill()
        burner.wait()
        for pid in outsiders:
            os.kill(pid, 9)
    assert not sampler.errors
    (ta, host_a, lab_a, hog_a), (tb, host_b, lab_b, hog_b) = edges
    seconds = tb - ta
    outside = ((host_b - host_a) - (lab_b - lab_a)) / TICK / seconds
    return probe.summarize(samples, ta, tb), outside, (hog_b - hog_a) / TICK / seconds


def test_cpu_used_outside_the_lab_is_interference() -> None:
    """Two busy loops that are not the lab's, beside a lab burning one core: the probe counts them outside the lab,
    as the test's own reads at the window's edges do, and the verdict names interference rather than cpu. The same
    lab without them: what is left outside the lab agrees with the test's reads too (other engineers' jobs on a
    shared machine are outside the lab as well), and the lab's own core is never in it."""
    quiet, quiet_outside, _ = _measure(hogs=0)
    busy, busy_outside, hog_cores = _measure(hogs=2)
    ncpu = os.cpu_count() or 1
    print(f"without outsiders: probe {quiet['interference_cpu_cores']:.3f} cores outside, test's reads "
          f"{quiet_outside:.3f}, pgbench {quiet['client_cpu_cores']:.2f}; with two: probe "
          f"{busy['interference_cpu_cores']:.3f}, test's reads {busy_outside:.3f}, the outsiders {hog_cores:.3f}, "
          f"pgbench {busy['client_cpu_cores']:.2f}, host {busy['cpu_pct']:.0f} % busy")
    for figures, outside in ((quiet, quiet_outside), (busy, busy_outside)):
        # the lab's burner (a runnable busy loop gets its share of the host) would be off by its cores
        assert figures["client_cpu_cores"] > 0.05
        assert figures["interference_cpu_cores"] == pytest.approx(outside, abs=0.05), (figures, outside)
    assert hog_cores > 0  # they ran, and all they used is outside the lab
    assert busy["interference_cpu_cores"] >= 0.95 * hog_cores
    assert interfered(busy)
    # two busy loops and the lab's one on the host's cores: saturated, and mostly by the outsiders
    verdicts = attribute(busy, cores=ncpu, jobs=1)
    if ncpu <= 2:
        assert verdicts[0].resource == "interference", verdicts
        assert "cores used outside the lab" in verdicts[0].evidence
    if not interfered(quiet):  # a shared machine may have been busy anyway: then the verdict says so too
        assert all(v.resource != "interference" for v in attribute(quiet, cores=ncpu, jobs=1))


def test_window_figures_match_reads_at_the_exact_edges() -> None:
    """A client busy 0.5 s in every 1.6 s (uneven within any second) and 5 s and 15 s windows whose edges fall
    mid-second: the host's busy share and the client's cores agree with the test's own reads at the edges.

    Within 2 % (and a clock tick, 10 ms of CPU, of the client's time): pro-rating whole seconds was up to 13 %
    off on such a load, since a second's share of the burst depends on where the burst fell in it."""
    pids: list[int] = []
    probe = CpuProbe(ProbeContext("", client_pids=lambda: pids))
    sampler = Sampler([probe])
    burner = subprocess.Popen([sys.executable, "-c", "import time\nwhile True:\n t = time.time()\n"
                               " while time.time() - t < 0.5: pass\n time.sleep(1.1)"])
    pids.append(burner.pid)

    def host() -> tuple[int, int]:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
        return sum(v), v[3] + v[4]  # all, idle + iowait

    try:
        sampler.start()
        t0 = float(int(_next_second())) + 1.0
        windows = [(t0 + 0.37, 5.0), (t0 + 1.61, 15.0)]
        reads = {}
        for edge in sorted({e for a, length in windows for e in (a, a + length)}):
            time.sleep(max(0.0, edge - now()))
            reads[edge] = (now(), host(), _own_ticks(burner.pid))
        time.sleep(1.3)
    finally:
        samples = sampler.stop()
        burner.kill()
        burner.wait()
    assert not sampler.errors
    for a, length in windows:
        (ta, (all_a, idle_a), c_a), (tb, (all_b, idle_b), c_b) = reads[a], reads[a + length]
        busy = 100 * (1 - (idle_b - idle_a) / (all_b - all_a))
        client = (c_b - c_a) / TICK / (tb - ta)
        got = probe.summarize(samples, ta, tb)
        print(f"{length:g} s: host busy {busy:.2f} % (probe {got['cpu_pct']:.2f}), client {client:.3f} cores "
              f"(probe {got['client_cpu_cores']:.3f})")
        assert got["cpu_pct"] == pytest.approx(busy, rel=0.02)
        assert got["client_cpu_cores"] == pytest.approx(client, rel=0.02, abs=2 / TICK / length)
