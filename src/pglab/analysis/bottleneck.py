"""Which resource bounds a result, each verdict with the figures behind it.

Rules over the figures the probes stored for the measured window (shares of active backends per wait event,
CPU of the host, of the servers, of pgbench and of the host's processes outside the lab, device utilisation,
PostgreSQL's WAL, checkpoint and buffer-write counts of the window) and, when the storage phase ran, the fio
ceilings. A rule fires when its figure passes a threshold; the verdicts
are ordered by how far past.
Thresholds are deliberately plain, so a reader can check a verdict against the run's own numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

HOST_CPU_BUSY_PCT = 90.0  # the host's cores are all but saturated
SERVER_CORES_SHARE = 0.85  # servers use this share of the cores available to them
CLIENT_THREAD_BUSY = 0.85  # each pgbench thread near one full core
WAIT_SHARE = 0.30  # a wait class holding this share of active backends is what they are waiting on
DEVICE_UTIL_PCT = 90.0  # the device is busy nearly all the time
CEILING_SHARE = 0.80  # IOPS this close to what fio measured on the same device
THROTTLED_PCT = 20.0  # the CFS scheduler throttled the primary's cgroup in this share of its periods
INTERFERENCE_CORES = 0.25
"""Cores used on the host outside the lab (``interference_cpu_cores``) past which a point is interfered with.

Why a quarter of a core: an idle host's daemons (journald, sshd, cron, the kernel's threads) stay well under
0.05 core, and pglab's own reads are counted as the lab's, so 0.25 is far above the noise; yet it is an eighth
of a 2-core host, which moves a CPU-bound point's TPS by more than its repeats usually differ. One figure for
every host size: what another process takes from the lab is cores, whatever the host has.
"""
FPI_PER_RECORD = 0.05
"""Full-page images per WAL record (``wal_fpi`` / ``wal_records``) past which page images are most of the WAL.

An image is up to a page (8 kB) against ~100 B for the records pgbench's statements log, so one record in twenty
carrying one makes the images about four fifths of the bytes. On its own it is no finding: pglab checkpoints
before each window, so every run logs the first change of each page it touches in full; what makes it one is a
checkpoint *requested* inside the window (``checkpoints_req``: the WAL reached ``max_wal_size`` before
``checkpoint_timeout``), which starts the images over while the load runs.
"""
BACKEND_WRITE_SHARE = 0.5  # the backends wrote this share of the window's buffer writes themselves ...
BACKEND_WRITES_S = 100.0  # ... and at least this many buffers a second (0.8 MB/s of 8 kB pages)

WAL_WAITS = ("IO:WALSync", "IO:WALWrite", "LWLock:WALWrite", "IO:WALInitSync", "IO:WALInitWrite")
SYNC_REP_WAITS = ("IPC:SyncRep",)
CLIENT_WAITS = ("Client:ClientRead",)


@dataclass(frozen=True)
class Verdict:
    resource: str  # cpu | interference | client | sync-replication | wal-flush | locks | storage | checkpoints
    #                | backend-writes
    score: float  # figure / threshold: > 1 means past it; verdicts sort by it
    evidence: str  # the figures, in words

    def __str__(self) -> str:
        return f"{self.resource} ({self.evidence})"


def _share(metrics: dict[str, float | None], names: tuple[str, ...]) -> float:
    return sum(metrics.get(f"wait.{n}") or 0.0 for n in names)


def _wal_detail(metrics: dict[str, float | None]) -> str:
    """What the WAL waited on was made of, where pg_stat_wal was read: its bytes and full-page images per commit, and
    the checkpoints of the window (after one, each page's first change logs the whole page: WAL per commit jumps)."""
    per_commit, fpi = metrics.get("wal_bytes_per_commit"), metrics.get("wal_fpi_per_commit")
    if per_commit is None or fpi is None:
        return ""
    checkpoints = (metrics.get("checkpoints_timed") or 0.0) + (metrics.get("checkpoints_req") or 0.0)
    text = f"; {per_commit:,.0f} B of WAL and {fpi:.2f} full-page images per commit"
    return text + (f" with {checkpoints:g} checkpoint(s) in the window" if checkpoints else "")


def _checkpoint_verdict(metrics: dict[str, float | None]) -> Verdict | None:
    """Checkpoints requested in the window and page images a large part of its WAL: the load fills max_wal_size
    before checkpoint_timeout, and each of those checkpoints makes every page's next change log the whole page.
    A point's figures are means over its runs: a checkpoint in one run of three reads 0.33 per run."""
    requested, fpi, records = metrics.get("checkpoints_req"), metrics.get("wal_fpi"), metrics.get("wal_records")
    if not requested or fpi is None or not records:
        return None
    per_record = fpi / records
    if per_record < FPI_PER_RECORD:
        return None
    per_commit = metrics.get("wal_bytes_per_commit")
    detail = f"{requested:.2g} checkpoint(s) requested in the window (WAL reached max_wal_size before " \
             f"checkpoint_timeout) and {per_record * 100:.0f} full-page images per 100 WAL records"
    if per_commit is not None:
        detail += f", {per_commit:,.0f} B of WAL per commit"
    return Verdict("checkpoints", per_record / FPI_PER_RECORD,
                   detail + "; raise max_wal_size (and checkpoint_timeout) so checkpoints come further apart")


def _backend_writes_verdict(metrics: dict[str, float | None]) -> Verdict | None:
    """The backends wrote most of the window's dirty buffers themselves (to free one for the page they needed),
    not the background writer or the checkpointer: shared_buffers too small for the working set, or a background
    writer too lazy for the load."""
    backend, window = metrics.get("buffers_backend"), metrics.get("window_s")
    if not backend or not window:
        return None
    written = backend + (metrics.get("buffers_clean") or 0.0) + (metrics.get("buffers_checkpoint") or 0.0)
    share, rate = backend / written, backend / window
    if share < BACKEND_WRITE_SHARE or rate < BACKEND_WRITES_S:
        return None
    return Verdict("backend-writes", share / BACKEND_WRITE_SHARE,
                   f"backends wrote {backend:,.0f} shared buffers themselves ({rate:,.0f}/s, {share * 100:.0f} % of "
                   "the window's buffer writes); raise shared_buffers if the working set does not fit, or make the "
                   "background writer keep up (bgwriter_lru_maxpages, bgwriter_delay)")


def interfered(metrics: dict[str, float | None]) -> bool:
    """True when processes outside the lab used at least :data:`INTERFERENCE_CORES` during the window: the
    point's figures then measured the host shared with someone else, not the platform alone."""
    other = metrics.get("interference_cpu_cores")
    return other is not None and other >= INTERFERENCE_CORES


def attribute(metrics: dict[str, float | None], cores: int, jobs: int | None = None,
              ceilings: dict[str, float] | None = None) -> list[Verdict]:
    """Every rule that fires, the cause first. An empty list means nothing stood out.

    A saturated host is named ``interference`` rather than ``cpu`` when processes outside the lab used
    :data:`INTERFERENCE_CORES` or more and more than the servers and pgbench together.
    Two orderings are not by score: a saturated host CPU comes first (backends then also wait for a starved
    pgbench, which is a symptom); and row/transaction lock waits come after what the lock *holders* wait on
    (with 8 clients on 2 branches, most backends queue behind the one committing, and the committing one waits
    for the standbys or the WAL flush: that is the cause, found among the backends not waiting on a lock)."""
    out: list[Verdict] = []
    busy = metrics.get("cpu_pct")
    server = metrics.get("server_cpu_cores")
    client = metrics.get("client_cpu_cores")
    client_read = _share(metrics, CLIENT_WAITS)
    host_saturated = busy is not None and busy >= HOST_CPU_BUSY_PCT
    other = metrics.get("interference_cpu_cores")
    lab = (server or 0.0) + (client or 0.0)
    if host_saturated:
        assert busy is not None
        detail = f"host CPU {busy:.0f} % busy, " + (f"servers {server:.2f} of {cores} cores" if server is not None
                                                   else "servers' CPU not attributed")  # None: not found on this host
        if client is not None:
            detail += f", pgbench {client:.2f}"
        if client_read >= WAIT_SHARE:
            detail += f"; {client_read * 100:.0f} % of active backends wait for the starved pgbench"
        if interfered(metrics) and other is not None:
            # what saturates the host is named first: the processes outside the lab when they use more than it
            first = other >= lab
            out.append(Verdict("interference", 100.0 + busy / HOST_CPU_BUSY_PCT + (0.5 if first else -0.5),
                               f"{other:.2f} of {cores} cores used outside the lab"
                               + (" (the server's own among them if it runs on this host)" if server is None else "")
                               + f"; {detail}"))
            if not first:
                out.append(Verdict("cpu", 100.0 + busy / HOST_CPU_BUSY_PCT, detail))
        else:
            out.append(Verdict("cpu", 100.0 + busy / HOST_CPU_BUSY_PCT, detail))
    elif server is not None and server >= SERVER_CORES_SHARE * cores:
        out.append(Verdict("cpu", server / (SERVER_CORES_SHARE * cores), f"servers {server:.2f} of {cores} cores"))
    quota, primary = metrics.get("limit_cpus"), metrics.get("primary_cpu_cores")
    throttled = metrics.get("cpu_throttled_pct")
    if quota and ((primary is not None and primary >= SERVER_CORES_SHARE * quota)
                  or (throttled is not None and throttled >= THROTTLED_PCT)):
        score = max((primary or 0.0) / (SERVER_CORES_SHARE * quota), (throttled or 0.0) / THROTTLED_PCT)
        detail = f"primary {primary or 0.0:.2f} of its {quota:g}-core quota"
        if throttled is not None:
            detail += f", throttled in {throttled:.0f} % of CFS periods"
        if host_saturated:
            detail += f"; host CPU {busy:.0f} % busy"
        out.append(Verdict("cpu", 200.0 + score, detail))  # the quota is the direct bound, before the host
    client_quota, client_throttled = metrics.get("limit_client_cpus"), metrics.get("client_throttled_pct")
    if client_quota and ((client is not None and client >= SERVER_CORES_SHARE * client_quota)
                         or (client_throttled is not None and client_throttled >= THROTTLED_PCT)):
        score = max((client or 0.0) / (SERVER_CORES_SHARE * client_quota), (client_throttled or 0.0) / THROTTLED_PCT)
        out.append(Verdict("client", 150.0 + score, f"pgbench {client or 0.0:.2f} of its {client_quota:g}-core quota"
                           + (f", throttled in {client_throttled:.0f} % of CFS periods"
                              if client_throttled is not None else "")))
    if client is not None and jobs and client >= CLIENT_THREAD_BUSY * jobs:
        out.append(Verdict("client", client / (CLIENT_THREAD_BUSY * jobs),
                           f"pgbench {client:.2f} cores for {jobs} thread(s)"))
    row_locks = sum(v or 0.0 for k, v in metrics.items() if k.startswith("wait.Lock:"))
    queued = row_locks >= WAIT_SHARE and row_locks < 0.99
    scale = 1.0 / (1.0 - row_locks) if queued else 1.0
    for resource, share, words in (
        ("sync-replication", _share(metrics, SYNC_REP_WAITS), "waiting for standbys (IPC:SyncRep)"),
        ("wal-flush", _share(metrics, WAL_WAITS), "waiting on WAL write/flush"),
        ("client", 0.0 if host_saturated else client_read, "waiting for pgbench (Client:ClientRead)"),
    ):
        effective = share * scale
        if effective >= WAIT_SHARE:
            where = (f"{effective * 100:.0f} % of the backends not queued on a lock ({share * 100:.0f} % of all)"
                     if queued else f"{share * 100:.0f} % of active backends")
            detail = _wal_detail(metrics) if resource == "wal-flush" else ""
            out.append(Verdict(resource, effective / WAIT_SHARE, f"{where} {words}{detail}"))
    locks = sum([value or 0.0 for name, value in metrics.items() if name.startswith(("wait.Lock:", "wait.LWLock:"))
                 and name.removeprefix("wait.") not in WAL_WAITS], 0.0)
    if locks >= WAIT_SHARE:
        out.append(Verdict("locks", 0.5 * locks / WAIT_SHARE,
                           f"{locks * 100:.0f} % of active backends waiting on locks (Lock/LWLock)"))
    util = metrics.get("util_pct_max")
    if util is not None and util >= DEVICE_UTIL_PCT:
        out.append(Verdict("storage", util / DEVICE_UTIL_PCT, f"device {util:.0f} % utilised at peak"))
    for figure, ceiling_name, what in (("write_iops", "randwrite_iops_qd32", "random-write IOPS"),
                                       ("read_iops", "randread_iops_qd32", "random-read IOPS")):
        value, ceiling = metrics.get(figure), (ceilings or {}).get(ceiling_name)
        if value is not None and ceiling and value >= CEILING_SHARE * ceiling:
            out.append(Verdict("storage", value / (CEILING_SHARE * ceiling),
                               f"{value:,.0f} {figure.replace('_', ' ')} = {value / ceiling * 100:.0f} % of the "
                               f"fio ceiling ({ceiling:,.0f} {what} at QD 32)"))
    # what PostgreSQL's own counters say the window cost, where they were read (none: nothing claimed)
    out.extend(v for v in (_checkpoint_verdict(metrics), _backend_writes_verdict(metrics)) if v is not None)
    out.sort(key=lambda v: v.score, reverse=True)
    merged: dict[str, Verdict] = {}
    for v in out:  # one verdict per resource: the strongest
        merged.setdefault(v.resource, v)
    return list(merged.values())


def storage_ceiling_share(metrics: dict[str, float | None], ceilings: dict[str, float] | None) -> float | None:
    """Total IOPS as a share of the fio random-IOPS ceiling (reads and writes weighted by their mix)."""
    if not ceilings:
        return None
    r, w = metrics.get("read_iops") or 0.0, metrics.get("write_iops") or 0.0
    cr, cw = ceilings.get("randread_iops_qd32"), ceilings.get("randwrite_iops_qd32")
    if not (cr or cw):
        return None
    return (r / cr if cr else 0.0) + (w / cw if cw else 0.0)


def describe(verdicts: list[Verdict]) -> str:
    return "; ".join(str(v) for v in verdicts) if verdicts else "none stood out"


def mean_metrics(runs: list[Any]) -> dict[str, float | None]:
    """The mean of every stored figure over the runs (a point's view for the rules above)."""
    sums: dict[str, list[float]] = {}
    for r in runs:
        for k, v in r.metrics.items():
            if v is not None:
                sums.setdefault(k, []).append(float(v))
    return {k: sum(vs) / len(vs) for k, vs in sums.items()}
