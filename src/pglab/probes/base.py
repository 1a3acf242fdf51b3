"""The probe protocol and the sampler that runs probes on one shared clock.

Every probe measures one layer (a block device, the CPU, PostgreSQL's statistics …). The sampler calls
``sample`` at the probe's interval, aligned to whole multiples of that interval on the epoch clock, so
samples from different probes, pgbench's progress lines and scenario events line up in time.
A sample carries the *end* of its interval as ``ts`` and the interval length ``dt`` when it is a rate.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable


def now() -> float:
    """The run's clock: epoch seconds with sub-second precision (same clock as pgbench's timestamps)."""
    return time.time()


@dataclass(frozen=True, slots=True)
class Sample:
    ts: float  # epoch seconds, end of the sampled interval
    source: str  # e.g. "disk:vda", "cpu", "pg:n0", "repl:n1", "waits"
    metric: str  # e.g. "r_s", "w_await_ms", "Lock:tuple"
    value: float | None


@dataclass
class ProbeContext:
    """What probes may look at. Built by the runner from the target's endpoints for each run."""

    # libpq connection string of the primary (the replication probe sees the standbys in its pg_stat_replication)
    primary_conninfo: str
    # directories whose block devices are sampled: label -> path (e.g. "data" -> lab/n0/data)
    paths: dict[str, Path] = field(default_factory=dict)
    # callables so that pids started after the probe (pgbench) are seen
    server_pids: Callable[[], Sequence[int]] = lambda: ()
    client_pids: Callable[[], Sequence[int]] = lambda: ()
    wait_hz: float = 5.0


@runtime_checkable
class Probe(Protocol):
    name: str
    interval: float

    def open(self) -> None:
        """Take the baseline (first counters, connections). Errors here are the user's to fix."""

    def sample(self, ts: float) -> list[Sample]:
        """Return samples for the interval ending at ``ts`` (deltas since the previous call)."""

    def close(self) -> None:
        """Release connections and files."""

    def summarize(self, samples: Sequence[Sample], start: float, end: float) -> dict[str, float]:
        """Summary figures over the measured window [start, end] from this probe's own samples."""


def in_window(sample: Sample, start: float, end: float, dt: float) -> bool:
    """A sample belongs to the window when the middle of its interval lies inside it."""
    mid = sample.ts - dt / 2.0
    return start <= mid <= end


STOP_TIMEOUT_S = 10.0  # all probes' threads together, when a run ends


def _open(probe: Probe) -> BaseException | None:
    """``probe.open()``; what it raised, or None."""
    try:
        probe.open()
    except BaseException as exc:
        return exc
    return None


def closes_with_end(probe: Probe) -> bool:
    """Whether ``probe``'s window figures use only samples taken by the window's end (gauges: a snapshot at
    ``ts``, in the window when ``ts`` is): then nothing after the end can change them. Said by a class attribute
    ``gauge = True``; a probe without it is a rate probe, whose window needs its first row past the end."""
    return bool(getattr(probe, "gauge", False))


def closing_sample(probe: Probe, ts: float) -> list[Sample]:
    """The sample that closes a window, taken at ``ts`` (just past the window's end): a rate probe's row from its
    last one to ``ts``, off its row grid. A probe whose rows come from finer reads (CPU, disk) says how with
    ``closing_sample``; any other's ``sample`` gives a row at every call."""
    close = getattr(probe, "closing_sample", None)
    return list(close(ts)) if close is not None else probe.sample(ts)


class Sampler:
    """Runs each probe in its own thread at its own interval; collects samples in memory."""

    def __init__(self, probes: Sequence[Probe]):
        self.probes = list(probes)
        self.samples: list[Sample] = []
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        # wakes the probes' threads when the window's end is known (close) or they must stop
        self._wake = threading.Condition()
        self._end: float | None = None
        self._threads: list[tuple[Probe, threading.Thread]] = []

    def start(self) -> None:
        """Open every probe, side by side (each opening is mostly a connection's round trips: one after the other
        they were a tenth of a second before every run), then start their threads. The first probe's error in the
        list's order is raised, after closing those that opened."""
        if len(self.probes) > 1:
            with ThreadPoolExecutor(max_workers=len(self.probes), thread_name_prefix="probe-open") as pool:
                outcomes = list(pool.map(_open, self.probes))
        else:
            outcomes = [_open(p) for p in self.probes]
        failed = next((exc for exc in outcomes if exc is not None), None)
        if failed is not None:
            for probe, exc in zip(self.probes, outcomes, strict=True):
                if exc is None:  # do not leak the connections of the probes that opened
                    with contextlib.suppress(Exception):
                        probe.close()
            raise failed
        for probe in self.probes:
            t = threading.Thread(target=self._loop, args=(probe,), name=f"probe-{probe.name}", daemon=True)
            t.start()
            self._threads.append((probe, t))

    def _loop(self, probe: Probe) -> None:
        """Sample at the probe's interval until stopped; the thread closes its probe itself, so a connection is
        never closed under a query still waiting on its server (libpq connections are not for two threads)."""
        try:
            self._sample_until_stopped(probe)
        finally:
            try:
                probe.close()
            except Exception as exc:
                self.errors.append(f"{probe.name}: close: {exc}")

    def _sample_until_stopped(self, probe: Probe) -> None:
        interval = probe.interval
        next_tick = (int(now() / interval) + 1) * interval
        last_row: float | None = None  # the tick of the last sample that gave rows (a fine read alone gives none)
        while True:
            closing = False
            with self._wake:
                while True:
                    if self._stop.is_set():
                        return
                    if self._end is not None:
                        if self._closed(probe, self._end, last_row):
                            return
                        closing = True  # the window ended: its closing sample now, not at the next tick
                        break
                    delay = next_tick - now()
                    if delay <= 0:
                        break
                    self._wake.wait(delay)
            ts = now()
            try:
                got = closing_sample(probe, ts) if closing else probe.sample(ts)
            except Exception as exc:  # a probe failing must not kill the run; it is recorded
                self.errors.append(f"{probe.name}: {exc}")
                got = []
            with self._lock:
                self.samples.extend(got)
            if closing:  # taken once, whether it gave a row or not (no device to read, a failing query)
                return
            if got:
                last_row = ts
            next_tick += interval
            late = now() - next_tick
            if late > 0:  # skip missed ticks rather than bursting
                next_tick += (int(late / interval) + 1) * interval

    @staticmethod
    def _closed(probe: Probe, end: float, last_row: float | None) -> bool:
        """Whether ``probe`` already has every sample its figures over a window ending by ``end`` can use, so that
        it needs no closing sample.

        A gauge (:func:`closes_with_end`): those taken by ``end``, every one of them complete (this runs between
        samples). A rate probe: a row past ``end`` (its interval holds the end; rows after it lie wholly past the
        end), which a tick between the end and the close may have given; else it takes its closing sample."""
        return closes_with_end(probe) or (last_row is not None and last_row > end)

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> list[Sample]:
        """Stop the probes within ``timeout`` seconds in all. A probe still waiting on a server that does not answer
        (frozen: its statement_timeout is the server's to enforce) is left to its thread, which closes it when the
        call returns (the server answers, or is stopped at teardown): it is said, never closed under that call."""
        with self._wake:
            self._stop.set()
            self._wake.notify_all()
        deadline = time.monotonic() + timeout
        for _probe, t in self._threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        for probe, t in self._threads:
            if t.is_alive():
                self.errors.append(f"{probe.name}: still waiting on its server {timeout:g} s after the run; left to "
                                   "end on its own")
        threaded = [id(probe) for probe, _t in self._threads]
        for probe in self.probes:
            if id(probe) not in threaded:  # opened, never sampled: no thread closes it
                try:
                    probe.close()
                except Exception as exc:
                    self.errors.append(f"{probe.name}: close: {exc}")
        with self._lock:
            return list(self.samples)

    def close(self, end: float, timeout: float = STOP_TIMEOUT_S,
              join: Callable[[threading.Thread, float], None] | None = None) -> list[Sample]:
        """The window ended at ``end`` (epoch seconds, no earlier than the window's last instant, and not in the
        future): each probe stops as soon as it has the samples its figures over the window can use. A gauge at once
        (its snapshots taken by the end are all it counts); a rate probe after its closing sample, taken at once
        (:func:`closing_sample`): a row from its last one to now, which holds the end, instead of waiting for the
        next whole tick (0-1 s). The rate probes' figures come
        from their reads (CPU and disk: the fine reads at each edge; PostgreSQL's: the rows whose middle lies in
        the window), and the closing read is the first past the end, as the next tick's was. ``join`` waits for
        one thread (``interrupts.join`` in a run: a signal is acted on there); then :meth:`stop`, with what is
        left of ``timeout``."""
        with self._wake:
            self._end = end
            self._wake.notify_all()
        deadline = time.monotonic() + timeout
        for _probe, t in self._threads:
            left = max(0.0, deadline - time.monotonic())
            if join is None:
                t.join(left)
            else:
                join(t, left)
        return self.stop(timeout=max(0.0, deadline - time.monotonic()))

    def summarize(self, start: float, end: float) -> dict[str, float]:
        out: dict[str, float] = {}
        with self._lock:
            samples = list(self.samples)
        for probe in self.probes:
            mine = [s for s in samples if s.source == probe.name or s.source.startswith(probe.name + ":")]
            out.update(probe.summarize(mine, start, end))
        return out
