"""The replay wait before a run: a standby that stops answering ends the sweep in one sentence, a standby whose
walsender went away counts as behind (not as caught up), and a standby that catches up lets the run start."""

from __future__ import annotations

from typing import Any

import pytest

from pglab.drivers.local import _wait_replay
from pglab.errors import LabUnsound


class FakeConn:
    """pg_stat_replication as the primary shows it, one answer per query (the last one repeats)."""

    def __init__(self, answers: list[list[tuple[str, str | None, bool | None]]]):
        self.answers = answers
        self.queries = 0

    def execute(self, _sql: str) -> FakeConn:
        self.queries += 1
        return self

    def fetchall(self) -> list[tuple[str, str | None, bool | None]]:
        return self.answers[min(self.queries, len(self.answers)) - 1]


def test_standbys_that_replay_nothing_stop_the_sweep_naming_them() -> None:
    conn: Any = FakeConn([[("n1", "0/100", False), ("n2", "0/100", False)]])
    logged: list[str] = []
    with pytest.raises(LabUnsound, match=r"^standby\(s\) n1, n2 stopped answering \(no replay progress for 0 s\)"):
        _wait_replay(conn, ["n1", "n2"], logged.append, stall_s=0.3)


def test_a_standby_gone_from_pg_stat_replication_is_behind_not_caught_up() -> None:
    conn: Any = FakeConn([[("n1", "0/200", True)]])  # n2's walsender gave up after wal_sender_timeout
    with pytest.raises(LabUnsound, match=r"standby\(s\) n2 stopped answering"):
        _wait_replay(conn, ["n1", "n2"], lambda _line: None, stall_s=0.3)


def test_standbys_that_catch_up_let_the_run_start() -> None:
    conn: Any = FakeConn([[("n1", "0/100", False)], [("n1", "0/180", False)], [("n1", "0/200", True)]])
    _wait_replay(conn, ["n1"], lambda _line: None, stall_s=60)
    assert conn.queries == 3


def test_without_names_the_standbys_connected_are_waited_for() -> None:
    """A lab whose membership moves (HA) names none: those connected are waited for, none connected is no wait."""
    catching_up: Any = FakeConn([[("n1", "0/100", False)], [("n1", "0/180", False)], [("n1", "0/200", True)]])
    _wait_replay(catching_up, [], lambda _line: None, stall_s=60)
    assert catching_up.queries == 3  # asked until n1, connected and behind, had caught up
    stalled: Any = FakeConn([[("n1", "0/100", False)]])
    with pytest.raises(LabUnsound, match=r"^standby\(s\) n1 stopped answering"):
        _wait_replay(stalled, [], lambda _line: None, stall_s=0.3)
    none: Any = FakeConn([[]])
    _wait_replay(none, [], lambda _line: None, stall_s=0.3)
    assert none.queries == 1  # none connected: asked once, no wait


def test_without_names_a_client_that_reports_no_replay_such_as_an_archiver_is_not_waited_for() -> None:
    """pg_receivewal streams WAL but reports no replay position: on a server pglab does not own it is not a standby
    the run must wait for (and never catching up, it would stop the sweep)."""
    conn: Any = FakeConn([[("pg_receivewal", None, None), ("n1", "0/200", True)]])
    _wait_replay(conn, [], lambda _line: None, stall_s=0.3)
    assert conn.queries == 1
