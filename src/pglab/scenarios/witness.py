"""The witness writer: an independent client that measures a fault's RTO and RPO from the client's side.

During a scenario it inserts strictly increasing ids, one short transaction each, and logs every attempt:

- ``acked``     COMMIT returned: the server promised the row (at the session's ``synchronous_commit`` level);
- ``failed``    an error before COMMIT was sent, or an error the server reported on a live connection: nothing
                was committed;
- ``in_doubt``  the connection was lost while COMMIT was in flight: the row may or may not exist.

After the fault, :meth:`Witness.verify` reads the ids back from the (new) primary. Acknowledged ids that are
missing are the RPO; in-doubt ids are reported apart (survived or lost), never counted as losses. The first
acknowledged write after the fault gives the RTO.

It runs in a thread, not a process: it spends its time in libpq waits (psycopg releases the GIL there), its
Python work per attempt is a few microseconds, and the runner reads its attempts in memory. Its log (JSON lines,
flushed per line) is the raw artifact from which every figure can be recomputed (:func:`load_log`).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

import psycopg

from pglab.probes.base import now

Outcome = Literal["acked", "failed", "in_doubt"]
Stage = Literal["insert", "commit"]
ACKED: Outcome = "acked"
FAILED: Outcome = "failed"
IN_DOUBT: Outcome = "in_doubt"
TABLE = "pglab_witness"
APPLICATION_NAME = "pglab-witness"

_INSERT = (f"INSERT INTO {TABLE} (id, t_client) VALUES (%s, %s) "
           "RETURNING pg_current_wal_insert_lsn()::text")


@dataclass(frozen=True)
class Attempt:
    """One write. ``lsn`` is the WAL insert position right after the row's insert record (its commit record
    follows it), known once the INSERT returned; ``warning`` holds what the server noticed meanwhile (e.g. a
    synchronous-replication wait cancelled: committed locally only)."""

    id: int
    outcome: Outcome
    t_sent: float  # epoch seconds, just before the INSERT was sent
    t_done: float  # epoch seconds, when the outcome was known
    server: str | None  # host:port of the server that answered
    lsn: str | None = None
    error: str | None = None
    warning: str | None = None


@dataclass(frozen=True)
class WitnessResult:
    """What a trial's witness log and the rows read back say. Times are epoch seconds, durations seconds."""

    attempts: int
    acked: int
    failed: int
    in_doubt: int
    present: int  # witness rows read back from the verifying server
    acked_lost: int  # RPO in writes: acknowledged ids that are missing
    acked_lost_ids: list[int]
    in_doubt_survived: list[int]  # in-doubt ids present: committed after all, not a loss
    in_doubt_lost: list[int]  # in-doubt ids missing: never promised, not a loss either
    unexpected: list[int]  # ids present that were logged failed or never logged: a bug somewhere, never normal
    verified_on: str | None = None  # host:port the rows were read from
    timeline: int | None = None  # that server's WAL timeline
    # RPO in WAL: see evaluate()
    last_lost_lsn: str | None = None
    divergence_lsn: str | None = None
    lsn_gap_bytes: int | None = None
    lsn_gap_basis: Literal["timeline_switch", "last_surviving_ack"] | None = None
    # RTO: see evaluate(); all None without a fault time
    fault_time: float | None = None
    disrupted_at: float | None = None
    last_ack_before: float | None = None
    first_ack_after: float | None = None
    rto_s: float | None = None
    gap_s: float | None = None
    server_before: str | None = None
    server_after: str | None = None
    acked_after_fault: int = 0  # acks completed between the fault time and the disruption (the fault not yet felt)
    duration_s: float = 0.0  # first attempt sent to last attempt done

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# ------------------------------------------------------------------------------------------ pure functions
def classify(stage: Stage, error: BaseException | None, connection_lost: bool) -> Outcome:
    """An attempt's outcome from where it stopped. Only a lost connection during COMMIT leaves it in doubt: a
    server that reports an error on a live connection has rolled back, and before COMMIT nothing can commit."""
    if error is None:
        return ACKED if stage == "commit" else FAILED
    if stage == "commit" and connection_lost:
        return IN_DOUBT
    return FAILED


def parse_lsn(text: str) -> int:
    high, low = text.split("/")
    return (int(high, 16) << 32) | int(low, 16)


def acked_before_lsn(attempts: list[Attempt], end: int) -> tuple[list[int], list[int]]:
    """The acknowledged ids of a witness that writes one attempt after the other, split at the WAL position ``end``:
    those whose commit record is certainly before it, and the rest. An attempt's own LSN is its insert's (its commit
    follows), but every later attempt began after it was acknowledged: an ack counts as before ``end`` when a later
    attempt's insert LSN is at most ``end``."""
    ordered = sorted(attempts, key=lambda a: a.id)
    last = max((i for i, a in enumerate(ordered) if a.lsn is not None and parse_lsn(a.lsn) <= end), default=-1)
    acked = [(i, a.id) for i, a in enumerate(ordered) if a.outcome == ACKED]
    return [ident for i, ident in acked if i < last], [ident for i, ident in acked if i >= last]


def format_lsn(value: int) -> str:
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"


def timeline_of(walfile: str) -> int:
    """The timeline of a WAL file name (its first 8 hex digits), as ``pg_walfile_name`` gives it."""
    return int(walfile[:8], 16)


def switch_point(history: str) -> int | None:
    """Where a timeline began: the LSN on the last line of its ``.history`` file (``parent_tli<TAB>lsn<TAB>…``)."""
    lines = [line for line in history.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if not lines:
        return None
    try:
        return parse_lsn(lines[-1].split()[1])
    except (IndexError, ValueError):
        return None


def evaluate(attempts: Iterable[Attempt], present: Iterable[int], *, fault_time: float | None = None,
             switch_lsn: int | None = None, verified_on: str | None = None,
             timeline: int | None = None) -> WitnessResult:
    """RPO and RTO from a witness log and the ids read back.

    RPO: ``acked_lost_ids`` = acknowledged ids not present. In WAL bytes, ``lsn_gap_bytes`` = the highest LSN of a
    lost acknowledged write (``last_lost_lsn``) minus ``divergence_lsn``, the point up to which the surviving
    history holds the old primary's WAL: the new timeline's switch point (``switch_lsn``, from the verifying
    server's timeline history) when known, else the highest LSN of a surviving acknowledged write answered by the
    same server as the lost one. It is 0 when no acknowledged write is lost, None when a loss has no LSN to
    compare. Attempt LSNs are taken just before their commit record, so the gap may miss that last record
    (tens of bytes).

    RTO (with ``fault_time``): the fault is felt at ``disrupted_at``, when the first attempt done at or after the
    fault time was not acknowledged (acks the old primary still gave in between are counted in
    ``acked_after_fault``); without such an attempt, at the fault time itself. ``first_ack_after`` is the first
    acknowledged write sent after that; ``rto_s`` = ``first_ack_after`` − ``fault_time``; ``gap_s`` =
    ``first_ack_after`` − ``last_ack_before`` (the last ack done before the disruption): the outage the client saw."""
    items = sorted(attempts, key=lambda a: a.t_sent)
    have = set(present)
    acked = [a for a in items if a.outcome == ACKED]
    doubt = {a.id for a in items if a.outcome == IN_DOUBT}
    acked_ids = {a.id for a in acked}
    lost = sorted(acked_ids - have)
    lost_set = set(lost)

    last_lost = divergence = gap = None
    basis: Literal["timeline_switch", "last_surviving_ack"] | None = None
    lost_lsns = [(parse_lsn(a.lsn), a.server) for a in acked if a.id in lost_set and a.lsn]
    if not lost:
        gap = 0
    elif lost_lsns:
        last_lost, old_server = max(lost_lsns, key=lambda p: p[0])
        if switch_lsn is not None:
            divergence, basis = switch_lsn, "timeline_switch"
        else:
            kept = [parse_lsn(a.lsn) for a in acked if a.id in have and a.lsn and a.server == old_server]
            kept = [x for x in kept if x < last_lost]
            if kept:
                divergence, basis = max(kept), "last_surviving_ack"
        if divergence is not None:
            gap = max(0, last_lost - divergence)

    result: dict[str, Any] = {}
    if fault_time is not None:
        result = _recovery(items, fault_time)
    return WitnessResult(
        attempts=len(items), acked=len(acked), failed=sum(a.outcome == FAILED for a in items), in_doubt=len(doubt),
        present=len(have), acked_lost=len(lost), acked_lost_ids=lost,
        in_doubt_survived=sorted(doubt & have), in_doubt_lost=sorted(doubt - have),
        unexpected=sorted(have - acked_ids - doubt), verified_on=verified_on, timeline=timeline,
        last_lost_lsn=format_lsn(last_lost) if last_lost is not None else None,
        divergence_lsn=format_lsn(divergence) if divergence is not None else None,
        lsn_gap_bytes=gap, lsn_gap_basis=basis,
        duration_s=(max(a.t_done for a in items) - items[0].t_sent) if items else 0.0,
        **result,
    )


def _recovery(items: list[Attempt], fault_time: float) -> dict[str, Any]:
    """The RTO half of evaluate(), on attempts sorted by t_sent."""
    out: dict[str, Any] = {"fault_time": fault_time}
    broken = [a.t_done for a in items if a.outcome != ACKED and a.t_done >= fault_time]
    disrupted = min(broken) if broken else None
    felt = disrupted if disrupted is not None else fault_time
    before = [a for a in items if a.outcome == ACKED and a.t_done <= felt]
    # the first ack of a write sent after the disruption (or, with no write refused, after the fault): a write
    # sent just before the fault and acked just after it says nothing about whether the service came back
    after = [a for a in items if a.outcome == ACKED and a.t_sent >= (disrupted if disrupted is not None else
                                                                     fault_time)]
    out["disrupted_at"] = disrupted
    out["acked_after_fault"] = sum(a.outcome == ACKED and fault_time <= a.t_done <= felt for a in items)
    last = max(before, key=lambda a: a.t_done) if before else None
    first = min(after, key=lambda a: a.t_done) if after else None
    if last is not None:
        out["last_ack_before"], out["server_before"] = last.t_done, last.server
    if first is not None:
        out["first_ack_after"], out["server_after"] = first.t_done, first.server
        out["rto_s"] = first.t_done - fault_time
        if last is not None:
            out["gap_s"] = first.t_done - last.t_done
    return out


def load_log(path: Path) -> list[Attempt]:
    """The attempts of a witness log (the raw artifact), in the order they were written."""
    out = []
    with open(path) as f:
        for line in f:
            record = json.loads(line)
            if record.pop("kind", None) == "attempt":
                out.append(Attempt(**record))
    return out


# ------------------------------------------------------------------------------------------ the writer
@dataclass
class _InFlight:
    id: int
    t_sent: float
    server: str | None
    stage: Stage = "insert"
    lsn: str | None = None


@dataclass
class _Notices:
    messages: list[str] = field(default_factory=list)

    def __call__(self, diag: psycopg.errors.Diagnostic) -> None:
        detail = f" ({diag.message_detail})" if diag.message_detail else ""
        self.messages.append(f"{diag.severity}: {diag.message_primary}{detail}")


class Witness:
    """An independent writer for one trial: ``prepare()``, ``start()``, the fault, ``stop()``, ``verify()``.

    ``conninfo`` should list every server with ``target_session_attrs=read-write`` so that after a failover the
    witness follows the new primary; on a lost connection it reconnects in a loop (``connect_timeout`` per try,
    ``reconnect_s`` between tries) and goes on with the next id. ``synchronous_commit`` is set for its session
    (None: the server's). ``interval_s`` is the pause between attempts (0: as fast as the server answers)."""

    def __init__(self, conninfo: str, log_path: Path, synchronous_commit: str | None = None,
                 interval_s: float = 0.01, connect_timeout: int = 2, reconnect_s: float = 0.02):
        self.conninfo = conninfo
        self.log_path = log_path
        self.synchronous_commit = synchronous_commit
        self.interval_s = interval_s
        self.connect_timeout = connect_timeout
        self.reconnect_s = reconnect_s
        self._lock = threading.Lock()
        self._attempts: list[Attempt] = []
        self._events: list[dict[str, Any]] = []
        self._next_id = 1
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._conn: psycopg.Connection[Any] | None = None
        self._server: str | None = None
        self._inflight: _InFlight | None = None
        self._notices = _Notices()
        self._abandoned = False
        self._crash: BaseException | None = None
        self._log: IO[str] | None = None

    # -------------------------------------------------------------- control
    def prepare(self, timeout: float = 30.0) -> None:
        """Create the witness table on the primary (once) and empty it: ids start again at 1 each trial."""
        with self._control(self.conninfo, timeout) as conn:
            conn.execute(f"CREATE TABLE IF NOT EXISTS {TABLE} (id bigint PRIMARY KEY, "
                         "t_client double precision NOT NULL, t_server timestamptz NOT NULL DEFAULT clock_timestamp())")
            conn.execute(f"TRUNCATE {TABLE}")

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("the witness is already running")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "w")  # noqa: SIM115 - open for the thread's lifetime, closed in stop()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="pglab-witness", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop after the attempt in flight. One still hanging after ``timeout`` (a COMMIT waiting for a standby that
        is gone) is cancelled, as a user would: PostgreSQL then returns that COMMIT with a warning (committed locally
        only), logged acked with its ``warning``. One that survives even the cancel is logged in doubt (failed if it
        had not reached COMMIT, which it then never sends) and its thread is left behind."""
        thread = self._thread
        if thread is None:
            return
        self._stop.set()
        thread.join(timeout)
        if thread.is_alive() and (conn := self._conn) is not None:
            with contextlib.suppress(Exception):
                conn.cancel_safe(timeout=3)
            thread.join(5)
        if thread.is_alive():
            with self._lock:
                self._abandoned = True
                if (f := self._inflight) is not None:
                    self._record_locked(Attempt(
                        f.id, IN_DOUBT if f.stage == "commit" else FAILED, f.t_sent, now(), f.server, f.lsn,
                        f"the witness stopped with the {f.stage.upper()} still in flight"))
        self._thread = None
        with self._lock:
            if self._log is not None:
                self._log.close()
                self._log = None
        if self._crash is not None:
            raise RuntimeError(f"the witness stopped on an unexpected error: {self._crash!r}") from self._crash

    def verify(self, conninfo: str | None = None, fault_time: float | None = None,
               timeout: float = 30.0) -> WitnessResult:
        """Read every id back from the primary ``conninfo`` names (default: the witness's own, which follows the
        new primary) and evaluate the log against them; see :func:`evaluate` for each figure."""
        if self._thread is not None:
            raise RuntimeError("stop the witness before verifying")
        with self._control(conninfo or self.conninfo, timeout) as conn:
            server = f"{conn.info.host}:{conn.info.port}"
            present = [r[0] for r in conn.execute(f"SELECT id FROM {TABLE}")]
            walfile = conn.execute("SELECT pg_walfile_name(pg_current_wal_lsn())").fetchone()
            timeline = timeline_of(walfile[0]) if walfile else None
            switch = None
            if timeline is not None and timeline > 1:
                try:
                    row = conn.execute("SELECT pg_read_file(%s)", [f"pg_wal/{timeline:08X}.history"]).fetchone()
                    switch = switch_point(row[0]) if row else None
                except psycopg.Error:  # not allowed to read it: fall back to the last surviving ack
                    switch = None
        return evaluate(self.attempts, present, fault_time=fault_time, switch_lsn=switch, verified_on=server,
                        timeline=timeline)

    @property
    def attempts(self) -> list[Attempt]:
        with self._lock:
            return list(self._attempts)

    @property
    def events(self) -> list[dict[str, Any]]:
        """Connections made and lost, with times and servers (also in the log)."""
        with self._lock:
            return list(self._events)

    # -------------------------------------------------------------- the thread
    @staticmethod
    def _control(conninfo: str, timeout: float) -> psycopg.Connection[Any]:
        """A control session, retried until ``timeout``: right after a failover the new primary may not be up."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return psycopg.connect(conninfo, autocommit=True, connect_timeout=max(2, min(10, int(timeout))),
                                       application_name="pglab-witness-control")
            except psycopg.OperationalError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.2)

    def _run(self) -> None:
        tries = 0
        try:
            while not self._stop.is_set():
                if self._conn is None:
                    tries += 1
                    if not self._connect(tries):
                        self._stop.wait(self.reconnect_s)
                        continue
                    tries = 0
                acked = self._attempt()
                if self._abandoned:
                    break
                self._stop.wait(self.interval_s if acked else self.reconnect_s)
        except BaseException as exc:  # surfaced by stop()
            self._crash = exc
        finally:
            if self._conn is not None:
                with contextlib.suppress(Exception):
                    self._conn.close()
                self._conn = None

    def _connect(self, tries: int) -> bool:
        conn = None
        try:
            conn = psycopg.connect(self.conninfo, autocommit=False, connect_timeout=self.connect_timeout,
                                   application_name=APPLICATION_NAME)
            if self.synchronous_commit is not None:
                conn.execute("SELECT set_config('synchronous_commit', %s, false)", [self.synchronous_commit])
                conn.commit()
        except psycopg.Error:
            if conn is not None:
                with contextlib.suppress(Exception):
                    conn.close()
            return False
        conn.add_notice_handler(self._notices)
        self._conn, self._server = conn, f"{conn.info.host}:{conn.info.port}"
        self._event("connected", server=self._server, tries=tries)
        return True

    def _attempt(self) -> bool:
        conn = self._conn
        assert conn is not None
        with self._lock:
            ident = self._next_id
            self._next_id += 1
            self._notices.messages.clear()
            flight = self._inflight = _InFlight(ident, now(), self._server)
        error: psycopg.Error | None = None
        try:
            row = conn.execute(_INSERT, (ident, flight.t_sent)).fetchone()
            with self._lock:
                if self._abandoned:  # stop() gave up on this attempt and logged it failed: never commit it
                    return False
                flight.lsn = row[0] if row else None
                flight.stage = "commit"
            conn.commit()
        except psycopg.Error as exc:
            error = exc
        t_done = now()
        lost = conn.broken or conn.closed
        outcome = classify(flight.stage, error, lost)
        with self._lock:
            self._inflight = None
            if not self._abandoned:
                self._record_locked(Attempt(
                    ident, outcome, flight.t_sent, t_done, flight.server, flight.lsn,
                    _one_line(error) if error is not None else None,
                    " / ".join(self._notices.messages) or None))
        if error is None:
            return True
        if not lost:
            try:
                conn.rollback()
                return False
            except psycopg.Error:
                pass
        self._event("lost", server=self._server, error=_one_line(error))
        with contextlib.suppress(Exception):
            conn.close()
        self._conn = None
        return False

    def _record_locked(self, attempt: Attempt) -> None:
        self._attempts.append(attempt)
        self._write({"kind": "attempt", **asdict(attempt)})

    def _event(self, kind: str, **details: Any) -> None:
        event = {"kind": kind, "t": now(), **details}
        with self._lock:
            self._events.append(event)
            self._write(event)

    def _write(self, record: dict[str, Any]) -> None:
        if self._log is not None:
            self._log.write(json.dumps(record) + "\n")
            self._log.flush()


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
