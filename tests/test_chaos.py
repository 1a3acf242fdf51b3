"""No silent hang: standbys frozen (SIGSTOP, as a hung VM or a partition looks), pgbench frozen, the primary
killed, each during a run of a local lab. The run fails with the deadline's reason, a stopped pgbench's backends do
not outlive it, the lab that cannot recover stops the sweep in one sentence, and nothing is left behind."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
import pytest

from conftest import pglab, processes_mentioning, run_plan
from helpers import (
    born,
    fault_each_measured_pgbench,
    identities,
    lab_dir,
    pgbench_children,
    postmaster,
    still_running,
    stored_events,
    stored_runs,
    sweep_row,
)

pytestmark = pytest.mark.postgres

PLAN = """
name: chaos
target: {{local: {{instances: {instances}, synchronous: {{method: any, number: 1}}}}}}
dataset: {{scale: 1}}
matrix: {{workload: [tpcb-like], clients: [2], synchronous_commit: ['on']}}
run: {{duration: 4s, repeats: {repeats}, {deadlines}}}
"""
# pglab's deadlines for a silent part, shorter than their defaults (a pgbench 30 s past its end, standbys 60 s without
# replay progress, a connection 10 s): the runs below wait each out on purpose, and the sentences name these values
DEADLINES = "overrun: 10s, replay_stall: 10s, connect_timeout: 3"


def _start(plan: Path, results: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "pglab.cli", "run", str(plan), "--results", str(results),
                             "--format", "csv"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _freeze(pid: int) -> list[int]:
    """SIGSTOP a postmaster, then its children (listed once it can fork no more; one that exits meanwhile is
    gone, not frozen): the processes stopped."""
    from pglab.targets.local.procs import descendants

    os.kill(pid, signal.SIGSTOP)
    stopped = [pid]
    for child in descendants(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGSTOP)
            stopped.append(child)
    return stopped


def _pgbench_backends(lab: Path) -> list[tuple[int, str | None]]:
    """The primary's backends of pgbench (its default application_name) and what they wait for."""
    state = json.loads((lab / "lab.json").read_text())
    port = next(n["port"] for n in state["nodes"] if n["name"] == "n0")
    with psycopg.connect(host=str(lab / "sock"), port=port, user="pglab", dbname="pglab", connect_timeout=5,
                         passfile=str(lab / "secrets" / "pgpass"), options="-c statement_timeout=5s",
                         autocommit=True) as conn:
        return conn.execute("SELECT pid, wait_event FROM pg_stat_activity WHERE application_name = 'pgbench'"
                            ).fetchall()


def test_frozen_standbys_fail_the_run_then_stop_the_sweep_in_one_sentence(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN.format(instances=3, repeats=3, deadlines=DEADLINES))
    results = tmp_path / "results"
    proc = _start(plan, results)
    lab: Path | None = None
    frozen: list[int] = []
    backends_after_failure: list[tuple[int, str | None]] | None = None
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None and not (pids := pgbench_children(proc.pid)):
            time.sleep(0.1)
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        time.sleep(2.0)  # inside the measured run: commits now wait for an ack that will not come
        lab = lab_dir(results)
        frozen = [p for n in ("n1", "n2") for p in _freeze(postmaster(lab, n))]
        # run 1 fails at its deadline; the next run's replay wait then finds the standbys silent
        while time.monotonic() < deadline and proc.poll() is None and stored_runs(results)[0].status != "failed":
            time.sleep(0.2)
        if proc.poll() is None:
            time.sleep(1.0)
            backends_after_failure = _pgbench_backends(lab)
        _out, err = proc.communicate(timeout=240)
    finally:
        for p in frozen:  # the standbys are back, whatever became of them
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGCONT)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            pglab("lab", "clean")
    assert pids, "pgbench never started"
    assert proc.returncode == 1, err
    assert "Traceback" not in err
    runs = stored_runs(results)
    assert runs[0].status == "failed" and "pgbench did not end" in (runs[0].reason or ""), runs
    # the stopped pgbench's backends (committing, waiting for the standbys' ack) were ended before the next run
    assert backends_after_failure == [], backends_after_failure
    # no wait without a word: the overrun and the replay wait are said while they last
    assert "pgbench has not ended 5 s after its 4 s (transactions stuck?); it is stopped 10 s after its end" in err
    assert "waiting for standby(s) n1, n2 to replay" in err
    sentence = "standby(s) n1, n2 stopped answering (no replay progress for 10 s)"
    assert sentence in err.splitlines()[-1], err[-2000:]
    status, reason = (sweep := sweep_row(results))["status"], sweep["reason"]
    ended = [d or "" for _ts, _k, d, _run, _scope in stored_events(results, "leftover-backend-ended")]
    assert status == "failed" and sentence in reason, reason
    assert ended and any("SyncRep" in d for d in ended), ended
    assert (runs[1].repeat, runs[1].status, runs[1].reason) == (2, "failed", f"the sweep ended: {reason}"), runs
    assert lab is not None and processes_mentioning(str(lab)) == []

    # the standbys are back (SIGCONT): the same command resumes and completes the sweep
    run_plan(plan, results, "--format", "csv", timeout=300)
    assert [r.status for r in stored_runs(results)].count("ok") == 3
    assert processes_mentioning(str(results)) == []


def test_pgbench_frozen_then_the_primary_killed_fail_their_runs_and_the_sweep_goes_on(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN.format(instances=2, repeats=3, deadlines=DEADLINES))
    results = tmp_path / "results"
    proc = _start(plan, results)
    lab: Path | None = None
    faults = ["pgbench", "n0"]
    seen: dict[int, int | None] = {}  # the pgbench of each run struck (pid → start)

    def strike(fault: str, pgbench: int) -> None:
        nonlocal lab
        seen[pgbench] = born(pgbench)
        lab = lab or lab_dir(results)
        if fault == "pgbench":
            os.kill(pgbench, signal.SIGSTOP)  # alive, silent: only the deadline ends it
        else:
            os.kill(postmaster(lab, "n0"), signal.SIGKILL)

    try:
        fault_each_measured_pgbench(proc, faults, 300, strike)
        _out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            pglab("lab", "clean")
    assert not faults, f"the sweep ended before every fault was injected: {err[-2000:]}"
    assert proc.returncode == 1, err  # failed runs: exit 1, after the sweep went on
    assert "Traceback" not in err
    runs = stored_runs(results)
    assert [(r.repeat, r.status) for r in runs] == [(1, "failed"), (2, "failed"), (3, "ok")], runs
    assert "pgbench did not end" in (runs[0].reason or ""), runs
    assert "n0" in (runs[1].reason or "") or "connection" in (runs[1].reason or ""), runs
    assert "restarted n0" in err
    assert sweep_row(results)["status"] == "done"
    assert lab is not None and processes_mentioning(str(lab)) == []
    assert not still_running(seen)


def test_a_frozen_primary_fails_its_run_and_stops_the_sweep_in_one_sentence(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN.format(instances=2, repeats=2, deadlines=DEADLINES))
    results = tmp_path / "results"
    proc = _start(plan, results)
    frozen: list[int] = []
    labs: list[Path] = []

    def strike(_fault: str, _pgbench: int) -> None:
        labs.append(lab_dir(results))
        frozen.extend(_freeze(postmaster(labs[0], "n0")))

    started = time.monotonic()
    try:
        fault_each_measured_pgbench(proc, ["n0"], 240, strike)
        _out, err = proc.communicate(timeout=240)
    finally:
        for p in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGCONT)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            pglab("lab", "clean")
    print(f"ended {time.monotonic() - started:.1f} s after pglab started\n{err[-3000:]}")
    assert frozen, "the primary was never frozen"
    assert proc.returncode == 1, err
    assert "Traceback" not in err
    runs = stored_runs(results)
    # the run fails at pgbench's deadline, the next one finds the primary silent: one sentence, the sweep stops
    assert runs[0].status == "failed" and "the primary n0 does not answer" in (runs[0].reason or ""), runs
    sentence = "the primary n0 stopped answering (two connections timed out, 3 s each)"
    assert sentence in err.splitlines()[-1], err[-2000:]
    status, reason = (sweep := sweep_row(results))["status"], sweep["reason"]
    assert status == "failed" and sentence in reason, reason
    assert (runs[1].repeat, runs[1].status, runs[1].reason) == (2, "failed", f"the sweep ended: {reason}"), runs
    assert processes_mentioning(str(labs[0])) == []  # the frozen primary was stopped with its lab

    # the primary is back (SIGCONT): the same command resumes and completes the sweep
    run_plan(plan, results, "--format", "csv", timeout=300)
    assert [r.status for r in stored_runs(results)].count("ok") == 2


@pytest.mark.parametrize(("sig", "reason", "said"), [
    (signal.SIGKILL, "Toxiproxy, which carries the replication links, not running", "restarted Toxiproxy"),
    (signal.SIGSTOP, "Toxiproxy, which carries the replication links, does not answer its API (twice 2 s)",
     "ended Toxiproxy, which did not answer its API (twice 2 s)"),
], ids=["killed", "frozen"])
def test_toxiproxy_killed_or_frozen_fails_its_run_and_is_restarted_with_the_same_links(
        tmp_path: Path, sig: signal.Signals, reason: str, said: str) -> None:
    plan = tmp_path / "plan.yaml"
    shaped = "network: {latency_ms: 4}, synchronous:"
    plan.write_text(PLAN.format(instances=2, repeats=2, deadlines=DEADLINES).replace("synchronous:", shaped))
    results = tmp_path / "results"
    proc = _start(plan, results)
    struck: list[int] = []
    struck_ids: dict[int, int | None] = {}  # pid → start: the same process, checked ended at the end

    def strike(_fault: str, _pgbench: int) -> None:
        lab = lab_dir(results)
        struck.extend(int(p.split(":")[0]) for p in processes_mentioning(str(lab)) if "toxiproxy-server" in p)
        struck_ids.update(identities(struck))
        for p in struck:
            os.kill(p, sig)

    try:
        fault_each_measured_pgbench(proc, ["toxiproxy"], 240, strike)
        _out, err = proc.communicate(timeout=240)
    finally:
        for p in struck:  # a frozen one pglab failed to end would otherwise outlive the test
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGCONT)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            pglab("lab", "clean")
    print(err[-3000:])
    assert len(struck) == 1, struck
    assert proc.returncode == 1, err  # a failed run, the sweep went on
    assert "Traceback" not in err
    runs = stored_runs(results)
    assert runs[0].status == "failed" and reason in (runs[0].reason or ""), runs
    assert (runs[1].repeat, runs[1].status) == (2, "ok"), runs
    assert said in err and "restarted Toxiproxy" in err, err[-2000:]
    # the second run went through the same proxy port, shaped as the plan says
    links = [json.loads(p.read_text()) for p in sorted((results / "runs").glob("*/network.json"))]
    assert links and all(link["n1"]["latency_ms"] == 4 for link in links), links
    assert len({link["n1"]["proxy_port"] for link in links}) == 1, links
    assert not still_running(struck_ids)  # the frozen one was ended, not left behind


FULL_PLAN = """
name: full
target: {local: {instances: 1}}
dataset: {scale: 1}
matrix: {workload: [tpcb-like], clients: [2]}
run: {duration: 6s, repeats: 4}
"""  # 6 s: the faults come 2 s into run 1 and must land inside it (filling the server's tmpfs, then a WAL switch,
# took past a 3 s run's end on a loaded CI, so run 1 was ok)


def test_a_full_results_filesystem_stops_the_sweep_in_one_sentence_and_a_rerun_resumes(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(FULL_PLAN)
    mount = tmp_path / "small"
    mount.mkdir()
    assert subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)]).returncode == 0, \
        "the test mounts a small tmpfs: run it as root"
    results = mount / "res"

    def fill(_fault: str, _pgbench: int) -> None:  # 2 s into run 1: nothing more fits, whatever the run wrote
        with contextlib.suppress(OSError), open(mount / "filler", "wb") as f:
            while True:
                f.write(b"\0" * 4096)

    try:
        proc = _start(plan, results)
        try:
            fault_each_measured_pgbench(proc, ["results full"], 240, fill)
            _out, err = proc.communicate(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
                pglab("lab", "clean")
        print(err[-3000:])
        assert proc.returncode == 1, err
        assert "Traceback" not in err and "Exception in thread" not in err
        sentence = (f"error: no space left on the filesystem of {results}: free some and resume with the same pglab "
                    "run and --results")
        assert err.strip().splitlines()[-1] == sentence
        lab = re.search(r"initdb n0 \(data (\S+)/n0/data", err)
        assert lab is not None and processes_mentioning(lab.group(1)) == [] and not Path(lab.group(1)).exists()
        ok_before = [r.status for r in stored_runs(results)].count("ok")
        assert ok_before == 0  # run 1 could not be recorded

        # room again: the same command redoes the run that could not be recorded and completes the sweep
        (mount / "filler").unlink()
        again = run_plan(plan, results, "--format", "csv", timeout=300).proc
        runs = stored_runs(results)
        assert sorted(r.repeat for r in runs) == [1, 2, 3, 4] and {r.status for r in runs} == {"ok"}, runs
        assert f"{ok_before} completed before this resume" in again.stderr
    finally:
        subprocess.run(["umount", str(mount)], check=False)


@pytest.mark.parametrize("path", ["wal", "data"])
def test_a_full_server_filesystem_fails_the_run_stops_the_sweep_in_one_sentence_and_a_rerun_resumes(
        tmp_path: Path, path: str) -> None:
    small = Path(tempfile.mkdtemp(prefix=f"pglab-{path}-", dir="/var/tmp"))  # a path the server user can reach
    assert subprocess.run(["mount", "-t", "tmpfs", "-o", "size=128m", "tmpfs", str(small)]).returncode == 0, \
        "the test mounts a small tmpfs: run it as root"
    plan = tmp_path / "plan.yaml"
    plan.write_text(FULL_PLAN.replace("instances: 1", f"instances: 1, paths: {{{path}: {small}}}"))
    results = tmp_path / "results"
    proc = _start(plan, results)

    def fill(_fault: str, _pgbench: int) -> None:
        # the filesystem filled up 2 s into run 1, then a WAL segment switch: the next WAL written needs a new
        # segment file, whatever the TPS (the run's own WAL alone fills it only on a fast machine)
        with contextlib.suppress(OSError), open(small / "filler", "wb") as f:
            while True:
                f.write(b"\0" * (1 << 20))
        lab = lab_dir(results)
        port = next(n["port"] for n in json.loads((lab / "lab.json").read_text())["nodes"] if n["name"] == "n0")
        with contextlib.suppress(psycopg.Error), psycopg.connect(
                host=str(lab / "sock"), port=port, user="pglab", dbname="pglab", connect_timeout=5,
                passfile=str(lab / "secrets" / "pgpass"), autocommit=True) as conn:
            conn.execute("SELECT pg_switch_wal()")

    try:
        try:
            fault_each_measured_pgbench(proc, [f"{path} full"], 240, fill)
            _out, err = proc.communicate(timeout=300)
            print(err[-3000:])
            lab = re.search(r"initdb n0 \(data (\S+)/n0/data", err)
            assert lab is not None and processes_mentioning(lab.group(1)) == []
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
                pglab("lab", "clean")
        assert proc.returncode == 1, err
        assert "Traceback" not in err
        runs = stored_runs(results)
        # the health check finds the filesystem full within a second (or, on the WAL's, pgbench may first see its
        # backend die as the primary PANICs); the next run finds it still full: one sentence names it, the sweep stops
        reason = runs[0].reason or ""
        assert runs[0].status == "failed" and (f"no space left for the lab's servers: {small}/" in reason or (
            path == "wal" and ("n0 not running" in reason or "the backend died" in reason))), runs
        last = err.strip().splitlines()[-1]
        assert re.fullmatch(rf"error: no space left for the lab's servers: {re.escape(str(small))}/\S+ \(\d+\.\d MiB "
                            r"free\); free some there, then resume with the same pglab run and --results", last), last
        ended = f"the sweep ended: {last.removeprefix('error: ')}"
        assert (runs[1].repeat, runs[1].status, runs[1].reason) == (2, "failed", ended), runs

        # room again: the same command builds a new lab there and completes the sweep
        (small / "filler").unlink()
        run_plan(plan, results, "--format", "csv", timeout=300)
        assert [r.status for r in stored_runs(results)].count("ok") == 4, stored_runs(results)
    finally:
        subprocess.run(["umount", str(small)], check=False)
        small.rmdir()


HA_PLAN = """
name: chaos-ha
target: {local: {instances: 2, ha: patroni, synchronous: {method: any, number: 1}}}
dataset: {scale: 1}
matrix: {workload: [tpcb-like], clients: [2]}
run: {duration: 4s, repeats: 3}
"""


def test_etcd_killed_then_the_leaders_patroni_killed_then_frozen_fail_their_runs_and_are_restarted(
        tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(HA_PLAN.replace("repeats: 3", "repeats: 4"))
    results = tmp_path / "results"
    proc = _start(plan, results)
    struck: list[str] = []
    frozen: dict[int, int | None] = {}  # pid → start
    labs: list[Path] = []

    def strike(fault: str, _pgbench: int) -> None:
        labs.append(lab_dir(results))
        state = json.loads((labs[0] / "lab.json").read_text())
        pid = state["etcd"]["pid"] if fault == "etcd" else state["nodes"][0]["patroni_pid"]
        struck.append(fault)
        if fault == "frozen patroni":
            frozen[pid] = born(pid)
        os.kill(pid, signal.SIGSTOP if fault == "frozen patroni" else signal.SIGKILL)

    try:
        fault_each_measured_pgbench(proc, ["etcd", "patroni", "frozen patroni"], 500, strike)
        _out, err = proc.communicate(timeout=500)
    finally:
        for p in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGCONT)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            pglab("lab", "clean")
    print(err[-4000:])
    assert struck == ["etcd", "patroni", "frozen patroni"], err[-2000:]
    assert proc.returncode == 1, err
    assert "Traceback" not in err
    # each run fails at the next health check naming what died or went silent; the next run starts it again
    outcomes = [(r.repeat, r.status) for r in stored_runs(results)]
    assert outcomes == [(1, "failed"), (2, "failed"), (3, "failed"), (4, "ok")], outcomes
    reasons = [r.reason or "" for r in stored_runs(results)]
    assert "etcd (Patroni's DCS) not running" in reasons[0] and "Patroni of n0 not running" in reasons[1], reasons
    assert "Patroni of n0 does not answer its REST API (twice 2 s)" in reasons[2], reasons
    assert "restarted etcd (found not running)" in err and "restarted Patroni of n0 (found not running)" in err
    assert "ended Patroni of n0, which did not answer its REST API (twice 2 s)" in err, err[-2000:]
    assert sweep_row(results)["status"] == "done"
    assert labs and processes_mentioning(str(labs[0])) == []
    assert not still_running(frozen)


def test_a_frozen_etcd_stops_the_sweep_in_one_sentence(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(HA_PLAN)
    results = tmp_path / "results"
    proc = _start(plan, results)
    frozen: list[int] = []
    labs: list[Path] = []

    def strike(_fault: str, _pgbench: int) -> None:
        labs.append(lab_dir(results))
        frozen.append(json.loads((labs[0] / "lab.json").read_text())["etcd"]["pid"])
        os.kill(frozen[0], signal.SIGSTOP)

    try:
        fault_each_measured_pgbench(proc, ["etcd"], 400, strike)
        _out, err = proc.communicate(timeout=400)
    finally:
        for p in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGCONT)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            pglab("lab", "clean")
    print(err[-3000:])
    assert frozen, "etcd was never frozen"
    assert proc.returncode == 1, err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last == ("error: etcd (Patroni's DCS) does not answer (three health checks of 2 s); the lab cannot run the "
                    "next point: see the logs of etcd and Patroni in the lab, then resume with the same pglab run and "
                    "--results"), last
    status, reason = (sweep := sweep_row(results))["status"], sweep["reason"]
    assert status == "failed" and reason in last, reason
    assert labs and processes_mentioning(str(labs[0])) == []


def test_pgbench_init_on_a_frozen_server_ends_at_its_deadline_with_the_reason(tmp_path: Path) -> None:
    """``pgbench -i`` against a server that stopped answering would wait for ever: it is killed at its deadline
    (scaled with the dataset; given small here) and the error says so."""
    from pglab.plan.schema import Dataset, LocalTarget
    from pglab.targets.local.cluster import LocalLab
    from pglab.workloads import pgbench

    lab = LocalLab(LocalTarget(instances=1, synchronous=None), tmp_path / "lab")
    frozen: list[int] = []
    try:
        endpoint = lab.provision({}).primary
        frozen = _freeze(lab.server_pids()[0])
        with pytest.raises(pgbench.PgbenchError) as caught:
            pgbench.initialise(lab.bindir, endpoint, Dataset(scale=1), tmp_path / "init", timeout_s=3)
        assert str(caught.value) == (f"pgbench -i did not end within 3 s (the server stopped answering, or is far "
                                     f"slower than that allows); its output: {tmp_path / 'init' / 'pgbench-init.out'}")
        left = []  # a pgbench started in its output folder (other pgbench -i may run on this host)
        for entry in Path("/proc").iterdir():
            with contextlib.suppress(OSError):
                if entry.name.isdigit() and Path(os.readlink(entry / "cwd")) == tmp_path / "init":
                    left.append(entry.name)
        assert not left, f"pgbench -i left running: {left}"
    finally:
        for p in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGCONT)
        lab.teardown()
    assert pgbench.init_deadline_s(Dataset(scale=100)) == 900.0  # 600 s + 3 s per scale unit
