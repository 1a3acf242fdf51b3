"""Why a Kubernetes tenant's run went as it did: its primary's WAL, checkpoint and backend-write counters, read by
its own run Job right before and right after its measured window with the local ``pg`` probe's query
(``probes.pgstats``, chosen in the pod by the server's version), under the local probe's names. When the reads fall,
as whom, and what they give: docs/kubernetes.md, tenants' "Why each tenant's run went as it did". A read that failed
gives no figure (psql's words in ``pgstats.err``), never a failed run.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pglab.probes._util import Row
from pglab.probes.pgstats import _COUNTERS as COUNTERS
from pglab.probes.pgstats import _COUNTS as COUNTS
from pglab.probes.pgstats import _RAW as RAW
from pglab.probes.pgstats import _query_for, why_figures
from pglab.targets.kubernetes.scripts import READ_MARK, WindowRead

START_FILE, END_FILE, ERR_FILE = "pgstats-start.txt", "pgstats-end.txt", "pgstats.err"
MIB = 1024 * 1024
GONE_TRIES = 50  # the last read's wait for pgbench's backends to be gone, 0.1 s apart
SETTLE_TRIES = 10  # then the last read again, 0.5 s apart, until the counters reported late stop moving (≤ 5 s)
Read = tuple[float, dict[str, float | None]]  # the server's epoch, every counter (None: not on this server)


def read_sql(server_version_num: int) -> str:
    """The local probe's query for that version, the server's epoch first; marked as pglab's own (the window's
    pg_stat_statements leaves it out)."""
    return (f"SELECT /* {READ_MARK} */ extract(epoch FROM clock_timestamp())::float8, q.* FROM "
            f"({' '.join(_query_for(server_version_num).split())}) q")


def read_part() -> WindowRead:
    """The run Job's reads (``scripts.window_reads`` puts them at the window's edges): the server's version asked
    first, then its query; one line ``epoch|counter|…`` (psql's unaligned row, an empty field for NULL)."""
    def psql(version: int) -> str:
        return shlex.join(["psql", "-XAtq", "-c", read_sql(version)])

    read = ("pgstats_read() { { v=$(psql -XAtq -c 'SHOW server_version_num'); "
            f'if [ "$v" -ge 170000 ]; then {psql(170000)}; elif [ "$v" -ge 140000 ]; then {psql(140000)}; '
            f'else {psql(130000)}; fi; }} > "$1" 2>> {ERR_FILE} || true; }}')
    # pgbench's backends publish their counters as they exit, after pgbench itself has: the last read waits
    # (at most GONE_TRIES x 0.1 s) until none is left
    gone = shlex.quote(f"SELECT /* {READ_MARK} */ count(*) FROM pg_stat_activity WHERE application_name = "
                       "'pgbench'")
    wait = (f'pgstats_gone() {{ n=0; until [ "$(psql -XAtq -c {gone} 2>> {ERR_FILE})" = 0 ]; do n=$((n+1)); '
            f'[ "$n" -ge {GONE_TRIES} ] && break; sleep 0.1; done; }}')
    # up to PostgreSQL 16 the backends' writes reach pg_stat_bgwriter when the checkpointer next absorbs them, later
    # on a busy server: the end read is the first one the counts (field 1 is the epoch) did not move after
    counts = ",".join(str(COUNTERS.index(c) + 2) for c in COUNTS)
    settle = (f'pgstats_settled() {{ pgstats_read "$1"; n=0; while [ "$n" -lt {SETTLE_TRIES} ]; do sleep 0.5; '
              f'pgstats_read "$1.next"; [ "$(cut -d "|" -f {counts} "$1")" = "$(cut -d "|" -f {counts} "$1.next")" ] '
              '&& break; mv "$1.next" "$1"; n=$((n+1)); done; rm -f "$1.next"; }')
    return f"{read}\n{wait}\n{settle}", f"pgstats_read {START_FILE}", f"pgstats_gone; pgstats_settled {END_FILE}"


class ReadError(ValueError):
    """A read the Job shipped that cannot be parsed."""


def parse(text: str) -> Read | None:
    """One read as the Job shipped it; None when psql printed no row (its words are in pgstats.err)."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return None
    fields = lines[-1].split("|")
    if len(fields) != len(COUNTERS) + 1:
        raise ReadError(f"unreadable: {len(fields)} fields, not {len(COUNTERS) + 1}: {lines[-1][:200]}")
    try:
        values = [float(f) if f.strip() else None for f in fields]
    except ValueError as exc:
        raise ReadError(f"unreadable: {exc}") from None
    ts = values[0]
    if ts is None:
        raise ReadError("unreadable: no epoch")
    return ts, dict(zip(COUNTERS, values[1:], strict=True))


def deltas(start: Read, end: Read) -> dict[str, float] | None:
    """Each counter's increase from ``start`` to ``end`` (a counter not on the server left out); None when one went
    back (statistics reset, or another server answered)."""
    (t0, a), (t1, b) = start, end
    out = {k: v - w for k in COUNTERS if (v := b[k]) is not None and (w := a[k]) is not None}
    if t1 <= t0 or any(v < 0 for v in out.values()):
        return None
    return out


def _row(d: dict[str, float]) -> Row:
    """The increases as the local probe's row of a window (its counts as they are, its raw counters ``d_``)."""
    return Row("pg", 0.0, {**{k: d[k] for k in COUNTS if k in d}, **{f"d_{k}": d[k] for k in RAW if k in d}})


def figures(d: dict[str, float], seconds: float) -> dict[str, float]:
    """The local pg probe's figures (``PgStatsProbe.summarize``) from the counters' increases over ``seconds``: its
    rates, and the counts and per-commit figures of ``probes.pgstats.why_figures``."""
    out: dict[str, float] = {f"{k}_s": d[k] / seconds for k in ("commits", "rollbacks", "blks_read", "blks_hit")
                             if k in d}
    if "wal_bytes" in d:
        out["wal_mb_s"] = d["wal_bytes"] / MIB / seconds
    out.update(why_figures([_row(d)]))
    if (accesses := d.get("blks_hit", 0.0) + d.get("blks_read", 0.0)) > 0:
        out["cache_hit_pct"] = d.get("blks_hit", 0.0) / accesses * 100
    return out


def summed(each: Iterable[dict[str, float]]) -> dict[str, float]:
    """Every tenant's counts added up, per commit as ratios of the sums, as a local tenants run's host figures
    (``probes.pgstats.why_figures`` over every tenant's rows)."""
    rows = [_row(d) for d in each]
    return why_figures(rows) if rows else {}


def record(folder: Path) -> tuple[dict[str, float], dict[str, Any], dict[str, float]] | None:
    """The figures of the two reads a Job shipped into ``folder``, what tenants.json keeps of them (the reads'
    window and the counters' increases) and those increases; None when there are not two reads. A read that cannot
    be parsed, or counters that went back, leave a line in the folder's probe errors."""
    start_file, end_file = folder / START_FILE, folder / END_FILE
    if not (start_file.is_file() and end_file.is_file()):
        return None
    try:
        start, end = parse(start_file.read_text(errors="replace")), parse(end_file.read_text(errors="replace"))
    except ReadError as exc:
        problem = str(exc)
    else:
        if start is None or end is None:
            return None
        if (d := deltas(start, end)) is not None:
            info = {"window": [start[0], end[0]], "source": "the run Job's reads (pg_stat_wal, pg_stat_bgwriter or "
                    "pg_stat_checkpointer and pg_stat_io, pg_stat_database)", "deltas": d}
            return figures(d, end[0] - start[0]), info, d
        problem = "counters went back between the reads (statistics reset, or another server answered)"
    with (folder / "probe-errors.txt").open("a") as f:
        f.write(f"pgstats: {problem}\n")
    return None
