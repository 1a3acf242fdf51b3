"""Host CPU (from /proc/stat) and the CPU used by the servers and by the client, every second.

Server and client CPU are Σ(utime+stime) of process trees: the pids the context names (postmasters,
pgbench) and all their descendants (backends, walsenders …), found from the ppid field of /proc/<pid>/stat.

Keeping it cheap: /proc is listed once per tick (a directory read), and only processes never seen before are
read to learn their parent; the tree is rebuilt only when processes came or went; then only the processes
of the trees are read for their times. A few dozen small reads per tick.

Processes that come and go between ticks are accounted so that nothing is negative, spiking or counted twice:
- a process alive at both reads counts Δ(utime+stime) plus Δ(cutime+cstime): the time of its children that
  exited and were reaped during the interval (short-lived processes such as ``pgbench -C`` backends, which
  never live through a tick, are counted this way);
- a process born during the interval (absent from the previous /proc listing, or its pid reused — detected
  by a different start time) counts all its time, its own and its reaped children's;
- a process that existed before but was not yet in a tree (pgbench registered after it started) counts
  from the read taken when it was first listed if that was at the previous tick, else starts at 0;
- a tracked process that exited has its final total added to its parent's cutime when reaped; what was
  already counted for it at the previous read is subtracted, so only its last partial interval is added.
  If no tracked ancestor survives (the whole tree stopped) that last partial interval is lost.
A tick whose sum would be negative (a child reaped between our reads of it and of its parent) reports 0 and
carries the difference to the next tick, so totals over a window stay exact. A parent that ignores SIGCHLD
gets no cutime from its children: their last partial interval is then lost, never double counted.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from pglab.probes._util import FineReads, counter_delta, peak_rows, rows_prorated
from pglab.probes.base import ProbeContext, Sample, now

CLK_TCK = os.sysconf("SC_CLK_TCK")
# /proc/stat cpu line order
_CPU_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def read_cpu_times(path: str = "/proc/stat") -> tuple[int, ...]:
    """The aggregate ``cpu`` line: user nice system idle iowait irq softirq steal (guest is inside user)."""
    with open(path, encoding="ascii") as f:
        line = f.readline()
    parts = line.split()
    return tuple(int(x) for x in parts[1:9])


@dataclass(slots=True)
class _Proc:
    ppid: int
    start: int  # start time in clock ticks since boot: identifies the process behind a pid
    own: int  # utime+stime when first seen
    kids: int  # cutime+cstime when first seen
    seen: int  # the tick it was first seen at


def _read_stat(pid: int) -> tuple[int, int, int, int] | None:
    """(ppid, starttime, utime+stime, cutime+cstime) of a process in clock ticks, or None if it is gone."""
    try:  # os.open/os.read: half the cost of open(); this runs for every tracked process every tick
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
    except OSError:
        return None
    try:
        data = os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)
    # comm may contain spaces and parentheses: the fields start after the last ')'
    rest = data[data.rfind(b")") + 2 :].split()
    # rest[0]=state [1]=ppid … [11]=utime [12]=stime [13]=cutime [14]=cstime … [19]=starttime
    try:
        return int(rest[1]), int(rest[19]), int(rest[11]) + int(rest[12]), int(rest[13]) + int(rest[14])
    except (IndexError, ValueError):
        return None


class ProcessTree:
    """All processes' parents, updated incrementally from one /proc listing per tick."""

    def __init__(self) -> None:
        self.procs: dict[int, _Proc] = {}
        self.listing: set[int] = set()
        self.tick = 0
        self._children: dict[int, list[int]] | None = None

    def refresh(self) -> set[int]:
        """Re-list /proc; returns the previous listing (to tell processes born since then)."""
        before = self.listing
        self.tick += 1
        now = {int(d) for d in os.listdir("/proc") if d.isdigit()}
        gone = self.procs.keys() - now
        born = now - self.procs.keys()
        for pid in gone:
            del self.procs[pid]
        for pid in born:
            st = _read_stat(pid)
            if st is not None:
                self.procs[pid] = _Proc(*st, self.tick)
        if gone or born:
            self._children = None
        self.listing = now
        return before

    def note(self, pid: int, ppid: int, start: int, own: int, kids: int) -> None:
        """A tracked process was re-read: a reused pid (new start time) or a new parent updates the tree."""
        p = self.procs.get(pid)
        if p is None or p.start != start:
            self.procs[pid] = _Proc(ppid, start, own, kids, self.tick)
            self._children = None
        elif p.ppid != ppid:
            p.ppid = ppid
            self._children = None

    def first_read(self, pid: int, start: int) -> _Proc | None:
        """The read of a process taken when it was first listed, if that was at the previous tick."""
        p = self.procs.get(pid)
        return p if p is not None and p.start == start and p.seen == self.tick - 1 else None

    def descendants(self, roots: Iterable[int]) -> set[int]:
        """The roots that exist and every process below them."""
        if self._children is None:
            children: dict[int, list[int]] = {}
            for pid, p in self.procs.items():
                children.setdefault(p.ppid, []).append(pid)
            self._children = children
        out: set[int] = set()
        stack = [r for r in roots if r in self.procs]
        while stack:
            pid = stack.pop()
            if pid in out:
                continue
            out.add(pid)
            stack.extend(self._children.get(pid, ()))
        return out


_Stat = tuple[int, int, int, int]
FINE = 0.1  # seconds between the counter reads that place a window's edges


@dataclass(frozen=True, slots=True)
class _Ticks:
    """Clock ticks between reads: the host's (by /proc/stat field), the servers', pgbench's, the lab's."""

    host: tuple[float, ...] = (0.0,) * len(_CPU_FIELDS)
    server: float = 0.0
    client: float = 0.0
    lab: float = 0.0
    servers_known: bool = False

    def __add__(self, o: _Ticks) -> _Ticks:
        return _Ticks(tuple(a + b for a, b in zip(self.host, o.host, strict=True)), self.server + o.server,
                      self.client + o.client, self.lab + o.lab, self.servers_known or o.servers_known)

    def scaled(self, k: float) -> _Ticks:
        return _Ticks(tuple(a * k for a in self.host), self.server * k, self.client * k, self.lab * k,
                      self.servers_known)

    def outside(self) -> float:
        """Processes' time on the host (user+nice+system; guest time is inside user) less the lab's."""
        return self.host[0] + self.host[1] + self.host[2] - self.lab


@dataclass(frozen=True, slots=True)
class _Fine:
    t: float  # epoch seconds of the read
    ticks: _Ticks  # since the previous read


@dataclass(slots=True)
class _Seen:
    start: int
    own: int  # utime + stime
    kids: int  # cutime + cstime (children reaped so far)
    ppid: int


@dataclass
class _Group:
    """CPU ticks of one process tree; see the module docstring for how exits and births are counted."""

    prev: dict[int, _Seen] = field(default_factory=dict)
    debt: int = 0  # negative remainder carried to the next tick

    def delta(self, pids: set[int], tree: ProcessTree, before: set[int], first: bool,
              reads: dict[int, _Stat | None] | None = None) -> int:
        """Ticks of the tree since the last call; ``reads`` shares this read's /proc/<pid>/stat among trees."""
        total = 0
        cur: dict[int, _Seen] = {}
        died: set[int] = set()
        for pid in pids:
            if reads is None:
                st = _read_stat(pid)
            elif pid in reads:
                st = reads[pid]
            else:
                st = reads[pid] = _read_stat(pid)
            if st is None:
                died.add(pid)  # exited after the listing
                continue
            ppid, start, own, kids = st
            tree.note(pid, ppid, start, own, kids)
            cur[pid] = _Seen(start, own, kids, ppid)
            if first:
                continue
            old = self.prev.get(pid)
            if old is not None and old.start == start:
                total += (own - old.own) + (kids - old.kids)
            elif pid not in before or old is not None:
                total += own + kids  # born during the interval (or a reused pid): its whole life is inside
            elif (first_read := tree.first_read(pid, start)) is not None:
                # born during the previous interval, tracked only now (pgbench registered after its start):
                # the read taken when it was first listed is exactly the previous tick's value
                total += (own - first_read.own) + (kids - first_read.kids)
            # else: existed for longer but untracked until now: this read is its baseline
        if not first:
            total -= self._counted_for_reaped(cur, died, tree)
        self.prev = cur
        total += self.debt
        self.debt = min(total, 0)
        return max(total, 0)

    def _counted_for_reaped(self, cur: dict[int, _Seen], died: set[int], tree: ProcessTree) -> int:
        """What was already counted for tracked processes that exited and whose time went up the tree."""

        def survived(pid: int) -> bool:
            old, new = self.prev.get(pid), cur.get(pid)
            return old is not None and new is not None and old.start == new.start

        out = 0
        for pid, old in self.prev.items():
            new = cur.get(pid)
            if new is not None and new.start == old.start:
                continue
            alive = pid in tree.listing and pid not in died and (new is None or new.start == old.start)
            if alive and new is None:
                continue  # still running but left the tree (reparented): its time does not come up to us
            # exited: its final total was added to the cutime of the ancestor that reaped it (through
            # ancestors that exited in the same interval)
            anc, hops = old.ppid, 0
            while anc in self.prev and not survived(anc) and hops < 64:
                anc, hops = self.prev[anc].ppid, hops + 1
            if survived(anc):
                out += old.own + old.kids
        return out


class CpuProbe(FineReads):
    """Host CPU breakdown, and server/client CPU in cores (1.0 = one full core).

    ``other_cores`` is the CPU the host's processes used outside the lab: the host's user+nice+system time
    (/proc/stat; irq, softirq and steal are not any process's) less the lab's, where the lab is one process
    tree rooted at pglab itself (its sampler threads, the witness, Patroni …), the servers and pgbench. One
    tree rather than three sums, so a pgbench that pglab reaps is counted once, through pglab's cutime.
    Why: a point where another process saturated the host must not read as "cpu bound" (issue item 6).

    Counters are read every ``fine`` seconds (0.1) and a row of figures is emitted every ``interval`` (1 s): the
    fine reads, kept in memory, place a window's edges within 0.1 s (a second's load is not even: pro-rating
    whole seconds was up to 13 % off on a 5 s window). Each read is shared by the three trees; on a lab of ~80
    processes a read costs about 1 ms, so 1 % of a core, counted as the lab's own.
    """

    name = "cpu"

    def __init__(self, ctx: ProbeContext, interval: float = 1.0, fine: float = FINE):
        super().__init__(interval, fine)
        self.ctx = ctx
        self.ncpu = os.cpu_count() or 1
        self._tree = ProcessTree()
        self._server = _Group()
        self._client = _Group()
        self._lab = _Group()
        self._other_debt = 0.0  # clock ticks the lab counted beyond the host's (a lagging read), carried
        self._prev_cpu: tuple[int, ...] = ()
        self._prev_t = 0.0  # monotonic time of the last read
        self._row: _Ticks = _Ticks()  # what the reads since the last row add up to
        self._t0 = 0.0  # epoch time of the first read
        self._reads: list[_Fine] = []

    def _lab_pids(self, servers: Sequence[int], clients: Sequence[int]) -> set[int]:
        return self._tree.descendants([os.getpid(), *servers, *clients])

    def open(self) -> None:
        self._t0 = now()
        self._prev_cpu = read_cpu_times()
        self._tree.refresh()  # the baseline listing
        servers, clients = self.ctx.server_pids(), self.ctx.client_pids()
        reads: dict[int, _Stat | None] = {}
        self._server.delta(self._tree.descendants(servers), self._tree, set(), True, reads)
        self._client.delta(self._tree.descendants(clients), self._tree, set(), True, reads)
        self._lab.delta(self._lab_pids(servers, clients), self._tree, set(), True, reads)
        self._prev_t = time.monotonic()
        self._row = _Ticks()
        self._reads = []
        self._grid_from(self._t0)

    def _sample(self, ts: float, closing: bool) -> list[Sample]:
        t_read = now()
        cpu = read_cpu_times()
        before = self._tree.refresh()
        servers, clients = self.ctx.server_pids(), self.ctx.client_pids()
        reads: dict[int, _Stat | None] = {}  # one read of each process, shared by the trees
        server = self._server.delta(self._tree.descendants(servers), self._tree, before, False, reads)
        client = self._client.delta(self._tree.descendants(clients), self._tree, before, False, reads)
        lab = self._lab.delta(self._lab_pids(servers, clients), self._tree, before, False, reads)
        d = tuple(counter_delta(c, p, 64) for c, p in zip(cpu, self._prev_cpu, strict=True))
        self._prev_cpu = cpu
        ticks = _Ticks(d, server, client, lab, bool(servers))
        self._reads.append(_Fine(t_read, ticks))
        self._row = self._row + ticks
        if not self._row_due(ts, closing):
            return []  # a fine read only: kept for the window's edges
        t = time.monotonic()
        dt = t - self._prev_t
        row, self._row, self._prev_t = self._row, _Ticks(), t
        if dt <= 0:
            return []
        total = sum(row.host) or 1
        pct = {name: v / total * 100 for name, v in zip(_CPU_FIELDS, row.host, strict=True)}
        server_cores = row.server / CLK_TCK / dt
        client_cores = row.client / CLK_TCK / dt
        # a negative remainder (the lab's times read a little after /proc/stat) is carried so sums stay exact
        other = row.outside() + self._other_debt
        self._other_debt = min(other, 0.0)
        values = {
            "user_pct": pct["user"],
            "nice_pct": pct["nice"],
            "system_pct": pct["system"],
            "irq_pct": pct["irq"],
            "softirq_pct": pct["softirq"],
            "iowait_pct": pct["iowait"],
            "idle_pct": pct["idle"],
            "steal_pct": pct["steal"],
            "busy_pct": 100.0 - pct["idle"] - pct["iowait"],
            "server_cores": server_cores,
            "server_host_pct": server_cores / self.ncpu * 100,
            "client_cores": client_cores,
            "client_host_pct": client_cores / self.ncpu * 100,
            "other_cores": max(other, 0.0) / CLK_TCK / dt,
            "servers_known": 1.0 if row.servers_known else 0.0,
            "dt": dt,
        }
        return [Sample(ts, "cpu", k, v) for k, v in values.items()]

    def close(self) -> None:
        self._server = _Group()
        self._client = _Group()
        self._lab = _Group()
        self._other_debt = 0.0  # the fine reads stay: the window is summarised after the sampler stopped

    def _exact(self, start: float, end: float) -> tuple[_Ticks, float] | None:
        """The ticks of [start, end] and its seconds from the fine reads, when they cover the window.

        Consecutive reads' deltas count for the share of their interval inside the window."""
        reads = self._reads
        if not reads or self._t0 > start or reads[-1].t < end:
            return None
        acc, seconds, ta = _Ticks(), 0.0, self._t0
        for r in reads:
            if r.t > start and ta < end and r.t > ta:
                share = (min(r.t, end) - max(ta, start)) / (r.t - ta)
                acc = acc + r.ticks.scaled(share)
                seconds += (r.t - ta) * share
            ta = r.t
        return acc, seconds

    def summarize(self, samples: Sequence[Sample], start: float, end: float) -> dict[str, float]:
        """Figures over the exact window: from this probe's fine reads when they cover it; else (rows from
        elsewhere) each row weighs the seconds of its interval inside the window."""
        rs = rows_prorated(samples, start, end)
        mostly = peak_rows(rs, self.row_interval)  # a peak is one row's
        exact = self._exact(start, end)
        if exact is not None and exact[1] > 0:
            ticks, seconds = exact
            total = sum(ticks.host) or 1.0
            pct = {name: v / total * 100 for name, v in zip(_CPU_FIELDS, ticks.host, strict=True)}
            out = {
                "cpu_pct": 100.0 - pct["idle"] - pct["iowait"],
                "cpu_user_pct": pct["user"],
                "cpu_sys_pct": pct["system"],
                "cpu_iowait_pct": pct["iowait"],
                "cpu_steal_pct": pct["steal"],
                "server_cpu_cores": ticks.server / CLK_TCK / seconds,
                "client_cpu_cores": ticks.client / CLK_TCK / seconds,
                "client_cpu_cores_max": max((r.get("client_cores") for r in mostly),
                                            default=ticks.client / CLK_TCK / seconds),
                "interference_cpu_cores": max(ticks.outside(), 0.0) / CLK_TCK / seconds,
            }
            if not ticks.servers_known:
                del out["server_cpu_cores"]  # no server process known on this host: not attributed, not zero
            return out
        total_dt = sum(r.get("dt") * share for r, share in rs)
        if not rs or total_dt <= 0:
            return {}

        def mean(metric: str) -> float:  # a rate times its row's length is the row's raw delta, pro-rated
            return sum(r.get(metric) * r.get("dt") * share for r, share in rs) / total_dt

        out = {
            "cpu_pct": mean("busy_pct"),
            "cpu_user_pct": mean("user_pct"),
            "cpu_sys_pct": mean("system_pct"),
            "cpu_iowait_pct": mean("iowait_pct"),
            "cpu_steal_pct": mean("steal_pct"),
            "server_cpu_cores": mean("server_cores"),
            "client_cpu_cores": mean("client_cores"),
            "client_cpu_cores_max": max(r.get("client_cores") for r in mostly),
            "interference_cpu_cores": mean("other_cores"),
        }
        if not any(r.get("servers_known", 1.0) for r, _ in rs):
            # no server process known on this host (an external server): its CPU is not attributed, not zero
            del out["server_cpu_cores"]
        return out
