"""The Kubernetes witness's script (``scripts.witness_script``) run by sh against a real PostgreSQL that goes away
and comes back only after the witness's time is up: the witness goes on writing until a write is acknowledged, so
the RTO is measured when the failover is slower than the run (a lost node on a loaded lab took longer than its 60 s
run). Its log is evaluated by the code a run uses (``parse_witness_log``, ``witness.evaluate``)."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import as_server_user
from k8s_support import k8s_plan
from pg_server import BINDIR, Server, start_server
from pglab.plan.load import parse_plan
from pglab.scenarios.witness import evaluate
from pglab.targets.kubernetes.scenario import parse_witness_log
from pglab.targets.kubernetes.scripts import RESULTS_DIR, WITNESS_MARK, WITNESS_STOP, witness_script

pytestmark = pytest.mark.postgres


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    yield from start_server("")


def pg_ctl(server: Server, *args: str) -> None:
    subprocess.run([str(BINDIR / "pg_ctl"), "-D", str(server.base / "data"), *args], check=True, capture_output=True,
                   timeout=120, **as_server_user())


def wait_for(path: Path, what: str, seconds: float) -> str:
    """The witness's stdout once ``what`` is in it (a deadline: the witness prints it within its own time)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        text = path.read_text()
        if what in text:
            return text
        time.sleep(0.1)
    raise AssertionError(f"the witness never printed {what!r} in {seconds} s:\n{path.read_text()}")


def start_witness(server: Server, tmp_path: Path, seconds: float) -> tuple[subprocess.Popen[bytes], Path]:
    """The witness of a failover plan run by sh against ``server`` for ``seconds`` (and its margin), in
    ``tmp_path`` as its results folder; its stdout and stderr in ``tmp_path``/pod.log."""
    plan = parse_plan(k8s_plan("matrix: {clients: [1], scenario: [{kind: failover, at: 1s}]}", "run: {duration: 2s}"))
    script = witness_script(plan, seconds).replace(f"cd {RESULTS_DIR}", f"cd {tmp_path}")
    env = {**os.environ, "PATH": f"{BINDIR}:{os.environ['PATH']}", "PGHOST": str(server.base),
           "PGPORT": str(server.port), "PGUSER": "postgres", "PGDATABASE": "postgres"}
    out = tmp_path / "pod.log"
    with open(out, "w") as stdout:
        return subprocess.Popen(["/bin/sh", "-c", script], env=env, stdout=stdout, stderr=subprocess.STDOUT), out


def test_writes_failing_when_the_time_is_up_go_on_until_one_is_acknowledged(server: Server, tmp_path: Path) -> None:
    proc, out = start_witness(server, tmp_path, 1.0)
    try:
        wait_for(out, f"{WITNESS_MARK} acked 3 ", 60)
        fault = time.time()
        pg_ctl(server, "-m", "immediate", "stop")  # as a lost primary: nothing answers any more
        # the witness's own time (1 s + its margin) ends with its writes failing: it says so and goes on
        over = wait_for(out, f"{WITNESS_MARK} overtime", 60)
        back = time.time()
        pg_ctl(server, "-l", str(server.base / "log"), "-w", "restart")  # the options of its last start
        assert proc.wait(timeout=120) == 0, out.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = parse_witness_log(out.read_text())
    w = evaluate(log.attempts, log.present, fault_time=fault)
    assert w.acked_lost == 0 and not w.unexpected, w
    assert w.failed > 0 and w.rto_s is not None, w
    # the first write acknowledged after the fault came once the server was back, after the witness's time was up
    assert w.first_ack_after is not None and w.first_ack_after > back > fault
    overtime = float(over.split(f"{WITNESS_MARK} overtime ")[1].split()[0])
    assert overtime <= back
    # and the witness stopped at that ack: nothing written after it
    assert max(a.id for a in log.attempts) == max(a.id for a in log.attempts if a.outcome == "acked")
    assert f"{WITNESS_MARK} stopped {max(a.id for a in log.attempts)}" in out.read_text()


def test_told_that_pgbench_ended_the_witness_stops_without_writing_its_margin(server: Server, tmp_path: Path) -> None:
    """pglab makes WITNESS_STOP in the witness's folder once pgbench's Job has ended: a witness given 10 minutes
    (and its margin) then stops writing at once, says when, and still reads its ids back."""
    proc, out = start_witness(server, tmp_path, 600.0)
    try:
        wait_for(out, f"{WITNESS_MARK} acked 3 ", 60)
        (tmp_path / WITNESS_STOP).touch()
        told = time.time()
        assert proc.wait(timeout=120) == 0, out.read_text()  # 600 s and more otherwise
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = out.read_text()
    log = parse_witness_log(text)
    asked = float(text.split(f"{WITNESS_MARK} stop-asked ")[1].split()[0])
    assert told - 1 <= asked  # whole seconds: seen at its next attempt
    assert f"{WITNESS_MARK} overtime" not in text and f"{WITNESS_MARK} stopped {len(log.attempts)}" in text
    assert all(a.outcome == "acked" for a in log.attempts) and log.present == [a.id for a in log.attempts]
