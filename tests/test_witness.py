"""The witness writer against real servers: a quiet run loses nothing and its acks match the table; a manual
failover gives an RTO no shorter than the promotion and the witness follows the new primary; a COMMIT cut off
while waiting for a standby is logged in doubt and found to have survived; and writes acknowledged after the
standby stopped streaming are exactly the losses found after a failover to it."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

from helpers import scalar
from pglab.plan.schema import LocalTarget
from pglab.scenarios.witness import (
    ACKED,
    FAILED,
    IN_DOUBT,
    Attempt,
    Outcome,
    Witness,
    classify,
    evaluate,
    format_lsn,
    load_log,
    parse_lsn,
    switch_point,
)
from pglab.targets.base import _quote
from pglab.targets.local.cluster import LocalLab, Node, kill_tree

pytestmark = pytest.mark.postgres


def _wait(what: str, check: Callable[[], Any], timeout: float = 20) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def make_lab() -> Iterator[Callable[[], LocalLab]]:
    """Labs of a primary and one asynchronous standby, torn down after the test."""
    labs: list[tuple[LocalLab, Path]] = []

    def make() -> LocalLab:
        base = Path(tempfile.mkdtemp(prefix="pglab-test-"))
        os.chmod(base, 0o711)
        lab = LocalLab(LocalTarget(instances=2, synchronous=None), base)
        labs.append((lab, base))
        lab.provision({})
        return lab

    yield make
    for lab, base in labs:
        lab.teardown()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def shared_lab() -> Iterator[LocalLab]:
    base = Path(tempfile.mkdtemp(prefix="pglab-test-"))
    os.chmod(base, 0o711)
    lab = LocalLab(LocalTarget(instances=2, synchronous=None), base)
    try:
        lab.provision({})
        yield lab
    finally:
        lab.teardown()
        shutil.rmtree(base, ignore_errors=True)


def _conninfo(lab: LocalLab, *nodes: Node) -> str:
    """Every node named, the first read-write one taken: what follows the primary through a failover."""
    parts = {"host": ",".join(str(lab.sock_dir) for _ in nodes), "port": ",".join(str(n.port) for n in nodes),
             "user": "pglab", "dbname": "pglab", "passfile": str(lab.client_passfile),
             "target_session_attrs": "read-write"}
    return " ".join(f"{k}={_quote(v)}" for k, v in parts.items())


def _address(lab: LocalLab, node: Node) -> str:
    return f"{lab.sock_dir}:{node.port}"


def _log_time(node: Node, message: str) -> float:
    """When the server logged ``message`` last (log lines start with the time in UTC, to the millisecond)."""
    found = [line for line in node.log.read_text().splitlines() if message in line]
    assert found, f"{message!r} not in {node.name}'s log"
    stamp = re.match(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}) UTC", found[-1])
    assert stamp, found[-1]
    return datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S.%f").replace(tzinfo=UTC).timestamp()


def _count(lab: LocalLab, node: Node, ids: list[int] | None = None) -> int:
    with lab.connect(node) as conn:
        if ids is None:
            row = conn.execute("SELECT count(*) FROM pglab_witness").fetchone()
        else:
            row = conn.execute("SELECT count(*) FROM pglab_witness WHERE id = ANY(%s)", [ids]).fetchone()
    assert row is not None
    return int(row[0])


# ------------------------------------------------------------------------------------------ real servers
def test_quiet_run_loses_nothing_and_every_ack_is_in_the_table(shared_lab: LocalLab, tmp_path: Path) -> None:
    lab = shared_lab
    primary = lab.nodes[0]
    log = tmp_path / "witness.jsonl"
    w = Witness(_conninfo(lab, *lab.nodes), log, interval_s=0)  # as fast as the server answers
    w.prepare()
    w.start()
    time.sleep(2)
    w.stop()
    res = w.verify()
    attempts = w.attempts
    print(f"\nwitness, back to back: {res.attempts / res.duration_s:.0f} attempts/s over {res.duration_s:.1f} s")
    assert res.acked > 0 and res.acked == res.attempts and res.failed == res.in_doubt == 0
    assert res.acked_lost == 0 and res.acked_lost_ids == [] and res.unexpected == [] and res.lsn_gap_bytes == 0
    assert res.acked == _count(lab, primary) == res.present  # an independent count agrees
    assert [a.id for a in attempts] == list(range(1, res.attempts + 1))  # strictly increasing, none skipped
    assert {a.server for a in attempts} == {_address(lab, primary)} == {res.verified_on}
    lsns = [parse_lsn(a.lsn) for a in attempts if a.lsn]
    assert len(lsns) == res.attempts and lsns == sorted(lsns) and lsns[0] < lsns[-1]
    assert all(a.t_sent <= a.t_done for a in attempts)
    assert res.timeline == 1
    assert load_log(log) == attempts  # the raw artifact holds the same log


def test_failover_rto_covers_the_promotion_and_the_witness_follows(make_lab: Callable[[], LocalLab],
                                                                   tmp_path: Path) -> None:
    lab = make_lab()
    n0, n1 = lab.nodes
    with lab.connect(n0) as conn:
        conn.execute("CREATE TABLE pglab_load (i int, pad text)")
    script = tmp_path / "load.sql"
    script.write_text("INSERT INTO pglab_load SELECT g, repeat('x', 200) FROM generate_series(1, 100) g;\n")
    ep = lab.endpoints().primary
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")} | ep.env()
    load = subprocess.Popen([str(lab.bindir / "pgbench"), "-n", "-c", "2", "-T", "60", "-f", str(script)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    w = Witness(_conninfo(lab, n0, n1), tmp_path / "witness.jsonl")
    try:
        w.prepare()
        w.start()
        time.sleep(1.5)
        t_kill = time.time()
        lab._pg_ctl(n0, "-m", "immediate", "stop")
        time.sleep(1.0)  # the outage an operator (or Patroni) takes to decide
        t_promote = time.time()
        lab._pg_ctl(n1, "promote")
        t_promoted = time.time()
        _wait("an ack from the new primary", lambda: any(a.outcome == ACKED and a.t_sent > t_promote
                                                         for a in w.attempts))
        time.sleep(0.5)
    finally:
        w.stop()
        load.kill()
        load.wait()
    res = w.verify(fault_time=t_kill)
    promoted = _log_time(n1, "archive recovery complete")  # from here on n1 may accept writes
    print(f"\nfailover: RTO {res.rto_s:.3f} s (kill → promotion done {promoted - t_kill:.3f} s), "
          f"client gap {res.gap_s:.3f} s, {res.attempts} attempts, {res.failed} failed, {res.in_doubt} in doubt, "
          f"{res.acked_lost} acked lost ({res.lsn_gap_bytes} bytes)")
    assert t_promote <= promoted <= t_promoted
    assert res.rto_s is not None and res.gap_s is not None and res.first_ack_after is not None
    assert res.rto_s > 0 and res.rto_s >= promoted - t_kill - 0.001  # log times are to the millisecond
    assert res.rto_s <= t_promoted - t_kill + 3  # it reconnected promptly
    assert res.last_ack_before is not None and res.disrupted_at is not None
    assert res.last_ack_before <= res.disrupted_at  # the old primary may ack a little after the kill was called
    # the old primary may still ack just after the kill was called: the gap starts at its last ack; the first ack
    # after it cannot precede the promotion
    assert res.gap_s == pytest.approx(res.first_ack_after - res.last_ack_before)
    assert res.first_ack_after >= promoted - 0.001
    assert res.server_before == _address(lab, n0) and res.server_after == _address(lab, n1)
    assert res.verified_on == _address(lab, n1) and res.timeline == 2
    assert res.failed + res.in_doubt >= 1  # the witness felt the kill
    events = [(e["kind"], e["server"]) for e in w.events]
    assert events[0] == ("connected", _address(lab, n0)) and events[-1] == ("connected", _address(lab, n1))
    assert ("lost", _address(lab, n0)) in events
    assert t_kill <= res.disrupted_at < promoted
    assert res.unexpected == []
    assert res.present == _count(lab, n1)
    assert set(res.acked_lost_ids) <= {a.id for a in w.attempts if a.outcome == ACKED and (a.server or "").endswith(
        f":{n0.port}")}  # only what the old primary acknowledged can be lost


def test_commit_cut_off_while_waiting_for_a_standby_is_in_doubt_and_survives(shared_lab: LocalLab,
                                                                             tmp_path: Path) -> None:
    lab = shared_lab
    primary = lab.nodes[0]
    w = Witness(_conninfo(lab, *lab.nodes), tmp_path / "witness.jsonl", synchronous_commit="on")
    w.prepare()

    def sync_to(names: str | None) -> None:
        with lab.connect(primary) as conn:
            if names is None:
                conn.execute("ALTER SYSTEM RESET synchronous_standby_names")
            else:
                conn.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{names}'")
            conn.execute("SELECT pg_reload_conf()")

    def waiting() -> int | None:
        with lab.connect(primary) as conn:
            row = conn.execute("SELECT pid FROM pg_stat_activity WHERE application_name = 'pglab-witness' "
                               "AND wait_event = 'SyncRep'").fetchone()
        return row[0] if row else None

    sync_to("nobody")  # a standby that never comes: every COMMIT waits
    try:
        w.start()
        pid = _wait("the witness's COMMIT waiting for the standby", waiting)
        with lab.connect(primary) as conn:
            conn.execute("SELECT pg_terminate_backend(%s)", [pid])
        _wait("the attempt to be logged", lambda: w.attempts)
        _wait("the witness back, waiting again", lambda: waiting() not in (None, pid))
        w.stop(timeout=0.5)  # the second COMMIT still waits: stop cancels it, as a user would
    finally:
        with contextlib.suppress(Exception):
            w.stop()
        sync_to(None)
    # pg_reload_conf() only signals: until the checkpointer has read the new synchronous_standby_names, commits do
    # not wait, so the witness may have committed a few plain acks first (a loaded CI had three attempts once)
    *before, first, second = w.attempts
    assert all((a.outcome, a.warning) == (ACKED, None) for a in before), w.attempts
    assert (first.id, first.outcome) == (len(before) + 1, IN_DOUBT), w.attempts  # neither acknowledged nor failed
    assert first.error and "server closed the connection" in first.error
    assert first.warning and "terminating connection due to administrator command" in first.warning
    assert "already committed locally" in first.warning  # still in doubt: no client can count on the warning
    assert (second.id, second.outcome) == (first.id + 1, ACKED)  # a cancelled wait returns COMMIT with a warning
    assert second.warning and "canceling wait for synchronous replication" in second.warning
    res = w.verify()
    assert res.in_doubt_survived == [first.id] and res.in_doubt_lost == []  # PostgreSQL had committed it locally
    assert res.acked_lost == 0 and res.unexpected == [] and res.present == second.id == _count(lab, primary)


def test_writes_acknowledged_after_the_standby_stopped_are_the_losses(make_lab: Callable[[], LocalLab],
                                                                      tmp_path: Path) -> None:
    lab = make_lab()
    n0, n1 = lab.nodes
    w = Witness(_conninfo(lab, n0, n1), tmp_path / "witness.jsonl")
    w.prepare()
    try:
        w.start()
        time.sleep(0.5)  # acks the standby receives
        # hold the witness for a moment (its next INSERT waits for the lock) to stop the standby between two
        # writes: everything committed before is on the standby, everything committed after is not
        with lab.connect(n0) as hold:
            hold.execute("BEGIN")
            hold.execute("LOCK TABLE pglab_witness IN EXCLUSIVE MODE")
            boundary = parse_lsn(scalar(hold, "SELECT pg_current_wal_lsn()::text"))

            def received() -> bool:
                with lab.connect(n1) as conn:
                    got = scalar(conn, "SELECT pg_last_wal_receive_lsn()::text")
                return parse_lsn(got) >= boundary

            _wait("the standby to receive everything committed", received)
            lab._pg_ctl(n1, "-m", "fast", "stop")
            # taken before the release is sent: the witness's thread can commit and record acks between the ROLLBACK
            # and this thread's next step (seen under load: two writes after the release counted as kept)
            t_released = time.time()
            hold.execute("ROLLBACK")
        time.sleep(1.0)  # acks on the primary alone
        t_kill = time.time()
        pid = n0.postmaster_pid()
        assert pid is not None
        kill_tree(pid)  # kill -9 the primary and its backends
        lab._start(n1)  # the standby replays what it received, nothing more
        lab._pg_ctl(n1, "promote")
        # from the new primary itself: a write sent between t_kill and the kill's arrival can still be acked by the
        # old one (seen once under load: the wait ended at once and the witness stopped before a failure was
        # followed by an ack, so there was no RTO to read)
        _wait("an ack from the new primary", lambda: any(
            a.outcome == ACKED and a.t_sent > t_kill and a.server == _address(lab, n1) for a in w.attempts))
    finally:
        w.stop()
    acked = [a for a in w.attempts if a.outcome == ACKED]
    # no write can commit while held: what returned before the release committed before the hold
    kept = [a.id for a in acked if a.t_done < t_released]
    gone = [a.id for a in acked if a.t_done > t_released and a.server == _address(lab, n0)]
    assert kept and gone and len(kept) + len(gone) + sum(a.server == _address(lab, n1) for a in acked) == len(acked)
    res = w.verify(fault_time=t_kill)
    print(f"\nloss: {res.acked_lost} acked writes lost ({res.lsn_gap_bytes} bytes of WAL), RTO {res.rto_s:.3f} s")
    assert res.acked_lost == len(gone) > 0 and res.acked_lost_ids == gone
    assert _count(lab, n1, gone) == 0 and _count(lab, n1, kept) == len(kept)  # independently
    assert res.unexpected == [] and res.timeline == 2 and res.lsn_gap_basis == "timeline_switch"
    assert res.divergence_lsn is not None and res.last_lost_lsn is not None and res.lsn_gap_bytes is not None
    assert parse_lsn(res.divergence_lsn) >= boundary  # the standby had everything up to the hold
    assert 0 < res.lsn_gap_bytes <= parse_lsn(res.last_lost_lsn) - boundary
    assert res.server_before == _address(lab, n0) and res.server_after == _address(lab, n1)
    assert res.rto_s is not None and res.rto_s > 0


# ------------------------------------------------------------------------------------------ the arithmetic
def _a(ident: int, outcome: Outcome, t: float, server: str = "a:1", lsn: int | None = None) -> Attempt:
    return Attempt(ident, outcome, t, t + 0.005, server, format_lsn(lsn) if lsn is not None else None)


def test_classification() -> None:
    boom = psycopg.OperationalError("server closed the connection unexpectedly")
    assert classify("commit", None, False) == ACKED
    assert classify("commit", boom, True) == IN_DOUBT
    assert classify("commit", psycopg.errors.SerializationFailure("x"), False) == FAILED  # the server said no
    assert classify("insert", boom, True) == FAILED  # COMMIT never sent: nothing can have committed
    assert classify("insert", psycopg.errors.UniqueViolation("x"), False) == FAILED


def test_rto_rpo_arithmetic_on_a_constructed_log() -> None:
    log = [_a(1, ACKED, 10.0, lsn=100), _a(2, ACKED, 10.1, lsn=200), _a(3, ACKED, 10.2, lsn=300),
           _a(4, ACKED, 10.3, lsn=400),  # after the fault time, before the fault was felt
           _a(5, IN_DOUBT, 10.4, lsn=500), _a(6, FAILED, 10.5),
           _a(7, ACKED, 12.0, "b:2", lsn=1000), _a(8, ACKED, 12.1, "b:2", lsn=1100)]
    res = evaluate(log, [1, 2, 5, 7, 8, 9], fault_time=10.25)
    assert (res.attempts, res.acked, res.failed, res.in_doubt) == (8, 6, 1, 1)
    assert res.acked_lost_ids == [3, 4] and res.acked_lost == 2
    assert res.in_doubt_survived == [5] and res.in_doubt_lost == [] and res.unexpected == [9]
    assert res.lsn_gap_basis == "last_surviving_ack" and res.divergence_lsn == format_lsn(200)
    assert res.last_lost_lsn == format_lsn(400) and res.lsn_gap_bytes == 200
    assert res.disrupted_at == pytest.approx(10.405) and res.acked_after_fault == 1
    assert res.last_ack_before == pytest.approx(10.305) and res.server_before == "a:1"
    assert res.first_ack_after == pytest.approx(12.005) and res.server_after == "b:2"
    assert res.rto_s == pytest.approx(12.005 - 10.25) and res.gap_s == pytest.approx(12.005 - 10.305)
    with_switch = evaluate(log, [1, 2, 5, 7, 8], switch_lsn=250)
    assert with_switch.lsn_gap_basis == "timeline_switch" and with_switch.lsn_gap_bytes == 150
    assert with_switch.rto_s is None and with_switch.fault_time is None
    quiet = evaluate(log[:4], [1, 2, 3, 4], fault_time=11.0)  # nothing lost, nothing felt after the fault
    assert quiet.acked_lost == 0 and quiet.lsn_gap_bytes == 0 and quiet.rto_s is None
    # nothing refused, commits stalled (a synchronous standby gone): a write sent 9 ms before the fault and acked
    # just after it is not the recovery; the next one, held until the standby was back, is
    stall = [_a(1, ACKED, 9.98), Attempt(2, ACKED, 10.241, 10.2501, "a:1", None),
             Attempt(3, ACKED, 10.2502, 12.52, "a:1", None), _a(4, ACKED, 12.53)]
    held = evaluate(stall, [1, 2, 3, 4], fault_time=10.25)
    assert held.disrupted_at is None and held.rto_s == pytest.approx(12.52 - 10.25)
    assert held.gap_s == pytest.approx(12.52 - 9.985)
    assert switch_point("1\t0/3000148\tno recovery target specified\n") == parse_lsn("0/3000148")
    assert switch_point("1\t0/3000148\tx\n2\t1/A0\ty\n") == (1 << 32) + 0xA0
