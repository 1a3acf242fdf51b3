"""What a sweep does between its windows, side by side or at once where it can (issue 33, item 1: the duty cycle of
short runs). Each test fails when the steps run one after the other: a barrier that all of them must reach at once,
which steps taken in turn never pass (its timeout only ends a failing test); the log summary's modules found loaded
while the lab is still being built; a wait on a program that returns at its exit with every polling sleep refused."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from conftest import REPO
from pglab.drivers import local
from pglab.plan.load import parse_plan
from pglab.probes import Sample
from pglab.targets.base import Endpoint, Endpoints
from pglab.targets.local.cluster import LocalLab
from pglab.targets.local.pgconf import Node

BARRIER_S = 30.0  # only a failing test waits it out


class BarrierProbe:
    """A probe whose opening waits for the other steps of the probes phase."""

    name, interval, gauge = "barrier", 0.5, True

    def __init__(self, barrier: threading.Barrier):
        self.barrier = barrier

    def open(self) -> None:
        self.barrier.wait()

    def sample(self, ts: float) -> list[Sample]:
        return []

    def close(self) -> None:
        pass

    def summarize(self, samples: Sequence[Sample], start: float, end: float) -> dict[str, float]:
        return {}


def test_a_runs_settings_probes_and_statements_open_side_by_side(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The probes phase before every window: the settings read, the probes' opening and pg_stat_statements' lookup
    are each a connection's round trips; taken together they cost the longest of them, not their sum."""
    barrier = threading.Barrier(3, timeout=BARRIER_S)
    statements: list[str] = []

    class Statements:
        def __init__(self, conninfo: str, *, create: bool):
            self.errors: list[str] = []

        def open(self) -> None:
            barrier.wait()
            statements.append("open")

    def settings(endpoints: Endpoints, run_dir: Path) -> dict[str, Any]:
        barrier.wait()
        return {"shared_buffers": {"setting": "16384", "unit": "8kB"}}

    monkeypatch.setattr(local, "default_probes", lambda ctx: [BarrierProbe(barrier)])
    monkeypatch.setattr(local, "StatementsWindow", Statements)
    plan = SimpleNamespace(run=SimpleNamespace(warmup=0.0), probes=SimpleNamespace(enabled=True, wait_hz=5.0))
    target = SimpleNamespace(probe_paths=dict, server_pids=list, read_only=False)
    driver = SimpleNamespace(plan=plan, target=target, _pgbench=[], settings=settings,
                             _summary_modules=threading.Thread(target=lambda: None))
    run = local.LocalRun(driver, None, tmp_path)  # type: ignore[arg-type]  # a stand-in: what start_probes reads
    primary = Endpoint("n0", "primary", str(tmp_path), 5432, "pglab", "pglab", tmp_path / "pgpass")
    run.endpoints = Endpoints(primary, [])
    try:
        run.start_probes()
    finally:
        if run.sampler is not None:
            run.sampler.stop()
    assert not barrier.broken
    assert run.settings == {"shared_buffers": {"setting": "16384", "unit": "8kB"}} and statements == ["open"]


def _lab(tmp_path: Path) -> LocalLab:
    """A 3-node lab as pglab holds it, with no server behind it (what the tests below replace does the rest)."""
    spec = parse_plan("name: t\ntarget: {local: {instances: 3}}\nmatrix: {clients: [1]}\n").target.local
    assert spec is not None
    lab = LocalLab(spec, tmp_path)
    lab.nodes = [Node(f"n{i}", "primary" if i == 0 else "standby", tmp_path / f"n{i}", tmp_path / f"w{i}", 5432 + i,
                      tmp_path / f"n{i}.log") for i in range(3)]
    return lab


def test_the_labs_servers_stop_side_by_side(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sweep's teardown stops every server of the lab at once (each pg_ctl waits for its postmaster to go)."""
    lab = _lab(tmp_path)
    barrier = threading.Barrier(3, timeout=BARRIER_S)
    stopped: list[tuple[str, bool]] = []

    def stop_node(node: Node, discard: bool = False) -> None:
        barrier.wait()
        stopped.append((node.name, discard))

    monkeypatch.setattr(lab, "stop_node", stop_node)
    lab._stop_all()
    assert not barrier.broken
    assert sorted(stopped) == [("n0", True), ("n1", True), ("n2", True)]  # every one, at once (its files go next)



def test_a_parameter_change_reloads_the_labs_servers_side_by_side(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A run whose point changes a parameter (the quickstart's synchronous_commit, before nearly every run) reloads
    every server: each a connection of its own, all at once; then asks the primary what needs a restart."""
    lab = _lab(tmp_path)
    barrier = threading.Barrier(3, timeout=BARRIER_S)
    statements: list[tuple[str, str]] = []

    class Conn:
        def __init__(self, node: Node):
            self.node = node

        def __enter__(self) -> Conn:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def execute(self, query: str) -> list[tuple[str]]:
            if "pg_reload_conf" in query:
                barrier.wait()
            statements.append((self.node.name, query))
            return []  # nothing pending a restart

    monkeypatch.setattr(lab, "connect", lambda node, **_kw: Conn(node))
    monkeypatch.setattr(lab.conf, "validate", lambda parameters: None)
    monkeypatch.setattr(lab.conf, "write", lambda node: None)
    lab._apply({"synchronous_commit": "local"})
    assert not barrier.broken
    assert sorted(statements[:3]) == [(f"n{i}", "SELECT pg_reload_conf()") for i in range(3)]
    assert statements[3] == ("n0", "SELECT name FROM pg_settings WHERE pending_restart")  # after every reload
    assert lab.conf.parameters == {"synchronous_commit": "local"}


def test_a_wait_on_a_program_wakes_at_its_exit_without_polling(monkeypatch: pytest.MonkeyPatch) -> None:
    """pgbench's end is seen when it exits (its pidfd), not at Popen.wait's next look between sleeps of up to 50 ms:
    with every sleep refused, the wait still returns the exit code (and a timeout still ends it)."""
    from pglab import interrupts

    done = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3); raise SystemExit(3)"])
    late = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        def refused(seconds: float) -> None:
            raise AssertionError(f"a wait polled: sleep({seconds})")

        monkeypatch.setattr(time, "sleep", refused)
        assert interrupts.wait(done, timeout=BARRIER_S) == 3
        with pytest.raises(subprocess.TimeoutExpired):
            interrupts.wait(late, timeout=0.25)
    finally:
        monkeypatch.undo()
        late.kill()
        late.wait()
        done.wait()


SUMMARY_MODULES = """
import sys, time
from pathlib import Path
from pglab.drivers.local import LocalDriver
from pglab.engine.types import SilentObserver
from pglab.plan.expand import expand
from pglab.plan.load import parse_plan

class Built(Exception):
    pass

class Target:
    cpus_axis, cpus = False, None

    def provision(self, parameters):
        # the lab builds for seconds: the summary's modules load meanwhile, or never before the first run's summary
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            module, special = sys.modules.get("pglab.workloads.txlog"), sys.modules.get("scipy.special")
            # their functions defined: the imports are complete
            if module is not None and hasattr(module, "compress") and special is not None and hasattr(special,
                                                                                                    "stdtrit"):
                raise Built
            time.sleep(0.01)
        raise SystemExit("the log summary's modules were not loaded while the lab was built")

assert "pglab.workloads.txlog" not in sys.modules and "polars" not in sys.modules and "scipy" not in sys.modules
plan = parse_plan("name: t\\ntarget: {local: {instances: 1}}\\nmatrix: {clients: [1]}\\n")
driver = LocalDriver(plan, Path("."), "", Path(sys.argv[1]), Target(), SilentObserver())
try:
    driver.open(expand(plan)[0], False, False)
except Built:
    print("loaded while the lab was built")
"""


def test_the_log_summarys_modules_load_while_the_lab_builds(tmp_path: Path) -> None:
    """The first run's summary used to import numpy and polars (0.3-0.6 s on the project's VM) after its window, and
    the sweep's closing tables scipy.special (0.35 s); they load while the lab builds now (in a fresh interpreter, as
    `pglab run` starts)."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.run([sys.executable, "-c", SUMMARY_MODULES, str(tmp_path)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "loaded while the lab was built"
