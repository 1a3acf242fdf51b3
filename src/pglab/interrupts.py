"""SIGINT and SIGTERM during a sweep: the signal handler only records which came; pglab acts on it at its own safe
points, the waits below, by raising :class:`RunInterrupted` from ordinary code. Why never from the handler (it once
left ``Popen._wait``'s lock taken for good): docs/reliability.md, "Ctrl-C and SIGTERM are acted on where pglab
chooses".

What waits long in the main thread waits through :func:`sleep`, :func:`wait`, :func:`join`, :func:`wait_all` or
:func:`run`: each looks at the flag every :data:`POLL_S` and raises :class:`RunInterrupted` once a signal is
recorded. Outside :class:`Catching` (no handler of ours), and in other threads, they are the plain waits. Once the
sweep has acted on the signal it calls :meth:`Catching.shield`: teardown runs to its end, its waits not interrupted,
further signals ignored.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from concurrent.futures import FIRST_EXCEPTION, Future
from concurrent.futures import wait as wait_futures
from types import FrameType
from typing import Any

from pglab.errors import RunInterrupted

POLL_S = 0.1  # how often a wait looks at the flag: an interrupt is acted on within this (and the wait's own step)
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _State:
    armed = False  # our handlers are installed and the sweep has not acted on a signal yet
    pending: str | None = None  # the first signal recorded since they were installed


_state = _State()


def pending() -> str | None:
    """The name of the signal recorded and not yet acted on (``"SIGINT"``, ``"SIGTERM"``), or None."""
    return _state.pending if _state.armed else None


def check() -> None:
    """A safe point: raise :class:`RunInterrupted` when a signal was recorded (main thread only; elsewhere a no-op)."""
    if _state.armed and _state.pending is not None and threading.current_thread() is threading.main_thread():
        raise RunInterrupted(_state.pending)


def sleep(seconds: float) -> None:
    """``time.sleep(seconds)``, interrupted: raises :class:`RunInterrupted` within :data:`POLL_S` of a signal."""
    end = time.monotonic() + seconds
    while True:
        check()
        left = end - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(POLL_S, left))


def wait(proc: subprocess.Popen[Any], timeout: float | None = None) -> int:
    """``proc.wait(timeout)``, interrupted: its exit code; :class:`subprocess.TimeoutExpired` past ``timeout``;
    :class:`RunInterrupted` within :data:`POLL_S` of a signal (``proc`` is left running: stopping it is the
    caller's)."""
    end = None if timeout is None else time.monotonic() + timeout
    fd = _exit_fd(proc)
    exited = None
    if fd is not None:  # poll, not select: select refuses a descriptor numbered 1024 or more
        exited = select.poll()
        exited.register(fd, select.POLLIN)
    try:
        while True:
            check()
            step = POLL_S if end is None else min(POLL_S, end - time.monotonic())
            if step <= 0:
                if (rc := proc.poll()) is not None:
                    return rc
                raise subprocess.TimeoutExpired(proc.args, timeout or 0.0)
            if exited is not None and not exited.poll(step * 1000):
                continue  # still running (the descriptor is readable once it has exited)
            try:
                return proc.wait(timeout=step)  # exited: reaped at once (or waited for, if another thread reaps it)
            except subprocess.TimeoutExpired:
                continue
    finally:
        if fd is not None:
            os.close(fd)


def _exit_fd(proc: subprocess.Popen[Any]) -> int | None:
    """A descriptor readable from the moment ``proc`` exits (a pidfd, Linux 5.3 and later), so that a wait wakes
    then: ``Popen.wait(timeout)`` looks between sleeps of up to 50 ms, 25 ms late on average, and a run waits so on
    two pgbench (its warm-up's and its own). None where there is none: ``Popen.wait`` alone then."""
    if proc.returncode is not None or not hasattr(os, "pidfd_open"):
        return None
    try:
        return os.pidfd_open(proc.pid)
    except OSError:
        return None


def join(thread: threading.Thread, timeout: float | None = None) -> None:
    """``thread.join(timeout)``, interrupted (the thread is left running: stopping it is the caller's)."""
    end = None if timeout is None else time.monotonic() + timeout
    while thread.is_alive():
        check()
        step = POLL_S if end is None else min(POLL_S, end - time.monotonic())
        if step <= 0:
            return
        thread.join(step)


def wait_all(futures: Sequence[Future[Any]]) -> None:
    """Until every future is done or one has failed (``concurrent.futures.wait`` with ``FIRST_EXCEPTION``),
    interrupted; what still runs is left to the caller's pool, and the failures to the caller."""
    while True:
        check()
        if not wait_futures(futures, timeout=POLL_S, return_when=FIRST_EXCEPTION).not_done:
            return
        if any(f.done() and not f.cancelled() and f.exception() is not None for f in futures):
            return


def run(args: Sequence[str], *, timeout: float | None = None, capture_output: bool = False,
        **popen: Any) -> subprocess.CompletedProcess[Any]:
    """``subprocess.run(args, timeout=…, capture_output=…, **popen)`` (no ``input``, no ``check``), interrupted. As
    subprocess.run does on its timeout or any exception, the program is killed and reaped before it propagates."""
    if capture_output:
        popen.update(stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    end = None if timeout is None else time.monotonic() + timeout
    with subprocess.Popen(args, **popen) as proc:
        try:
            while True:
                check()
                step = POLL_S if end is None else min(POLL_S, end - time.monotonic())
                if step <= 0:
                    raise subprocess.TimeoutExpired(args, timeout or 0.0)
                try:
                    out, err = proc.communicate(timeout=step)  # called again after a timeout, it loses nothing
                    break
                except subprocess.TimeoutExpired:
                    continue
        except BaseException:
            proc.kill()
            proc.wait()
            raise
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def _record(signum: int, _frame: FrameType | None) -> None:
    """The handler: note the signal (the first one wins); nothing else, wherever the main thread was."""
    if _state.pending is None:
        _state.pending = signal.Signals(signum).name


class Catching:
    """SIGINT and SIGTERM recorded for the duration of a ``with`` block (main thread only); the handlers in place
    before are put back at its end, and the flag with them."""

    def __init__(self) -> None:
        self._saved: dict[int, Any] = {}
        self._before: tuple[bool, str | None] = (False, None)

    def __enter__(self) -> Catching:
        self._before = (_state.armed, _state.pending)
        _state.pending, _state.armed = None, True
        for sig in SIGNALS:
            self._saved[sig] = signal.signal(sig, _record)
        return self

    def shield(self) -> None:
        """The sweep acts on the signal now (or is ending): no wait raises any more, further signals are ignored."""
        for sig in self._saved:
            signal.signal(sig, signal.SIG_IGN)
        _state.armed = False

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._saved.items():
            signal.signal(sig, handler)
        _state.armed, _state.pending = self._before
