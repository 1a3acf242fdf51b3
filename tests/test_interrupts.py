"""Ctrl-C and SIGTERM are recorded by the sweep's handler and acted on at pglab's safe points (pglab.interrupts).

The first test builds the race issue 31 saw by luck, every time: SIGINT arrives right after ``Popen._wait`` took its
waitpid lock, the moment pglab's old handler raised RunInterrupted into, leaving the lock taken for good (every later
wait on that pgbench timed out: a ``TimeoutExpired`` traceback 16 s later, the sweep marked failed). The end-to-end
interrupts of a real sweep are tests/test_interrupt.py's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from helpers import alive
from pglab import interrupts
from pglab.engine.sweep import interrupt_signals
from pglab.errors import RunInterrupted
from pglab.targets.base import Endpoint
from pglab.workloads.pgbench import PgbenchProcess

ENDPOINT = Endpoint("n0", "primary", "/nonexistent", 5432, "u", "d", Path("/nonexistent/pgpass"))


def test_a_signal_while_a_wait_holds_popens_lock_is_acted_on_after_the_wait_let_go_of_it(tmp_path: Path) -> None:
    """The client process stands in for pgbench (the wait is what is tested; a real pgbench needs a server): pglab
    waits on it as a run does (``poll_for``), and SIGINT is raised in the main thread at the return of the lock's
    ``acquire`` inside ``Popen._wait``, before the ``try`` that releases it. The handler must only record it; the
    wait lets go of the lock, then raises RunInterrupted itself; pgbench is stopped and reaped as a run's cleanup
    does (``stop``), at once, instead of three timeouts of 5 s each."""
    # started with a Python handler in place, as a run starts pgbench under pglab's: the child then has SIGINT's
    # default, also when the test runner inherited it ignored (a non-interactive shell's background job)
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = PgbenchProcess(["sleep", "30"], ENDPOINT, tmp_path, "client")
    finally:
        signal.signal(signal.SIGINT, inherited)
    lock = proc.proc._waitpid_lock  # type: ignore[attr-defined]  # CPython's, taken by every wait and poll
    seen: list[str] = []

    def strike(_frame: FrameType, event: str, arg: Any) -> None:
        if event == "c_return" and not seen and getattr(arg, "__self__", None) is lock and arg.__name__ == "acquire":
            assert lock is not None and not lock.acquire(blocking=False), "Popen._wait holds its lock here"
            seen.append("SIGINT while the lock is held")
            try:
                signal.raise_signal(signal.SIGINT)  # its Python handler runs before raise_signal returns
            except BaseException as exc:
                seen.append(f"the handler raised {type(exc).__name__}")
                raise

    stopped_in = None
    try:
        with interrupt_signals():
            sys.setprofile(strike)
            try:
                with pytest.raises(RunInterrupted) as caught:
                    while proc.poll_for(1.0) is None:
                        pass
            finally:
                sys.setprofile(None)
    finally:
        t = time.monotonic()
        proc.stop()  # what a run does when its wait raised; it timed out three times with the lock left taken
        stopped_in = time.monotonic() - t
    assert seen == ["SIGINT while the lock is held"]  # the handler raised nothing into Popen._wait
    assert caught.value.signal_name == "SIGINT"
    assert lock.acquire(blocking=False)  # the lock was let go of
    lock.release()
    assert proc.proc.returncode == -signal.SIGINT  # stop()'s SIGINT ended it, not the SIGKILL after its grace
    print(f"stopped in {stopped_in:.2f} s")


def test_the_handler_records_and_the_waits_raise_from_their_own_code() -> None:
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with interrupt_signals() as signals:
        handler = signal.getsignal(signal.SIGTERM)
        assert callable(handler)
        handler(signal.SIGTERM, None)  # nothing raised where the signal lands
        handler(signal.SIGINT, None)  # the first signal is the one acted on
        assert interrupts.pending() == "SIGTERM"
        outside: list[BaseException | None] = []

        def elsewhere() -> None:  # another thread's waits are plain waits: RunInterrupted is the main thread's
            try:
                interrupts.sleep(0.2)
                outside.append(None)
            except BaseException as exc:
                outside.append(exc)

        worker = threading.Thread(target=elsewhere)
        worker.start()
        worker.join()
        assert outside == [None]
        release = threading.Event()
        busy = threading.Thread(target=release.wait, daemon=True)
        busy.start()
        try:
            for wait in (lambda: interrupts.sleep(30), interrupts.check, lambda: interrupts.join(busy)):
                with pytest.raises(RunInterrupted, match=r"^interrupted by SIGTERM$"):
                    wait()
        finally:
            release.set()
        signals.shield()  # the sweep acts on it: teardown's waits are not interrupted, more signals are ignored
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
        interrupts.sleep(0.05)
        assert interrupts.pending() is None
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    interrupts.check()  # no handler of ours: nothing recorded, nothing raised


def test_a_program_run_through_a_safe_point_is_killed_and_reaped_when_the_signal_comes(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    with interrupt_signals():
        timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM))  # a real signal, to this process
        timer.start()
        try:
            with pytest.raises(RunInterrupted, match="SIGTERM"):
                interrupts.run(["sh", "-c", f'echo $$ > {pid_file}; exec sleep 30'], capture_output=True,
                               timeout=60)
        finally:
            timer.cancel()
    pid = int(pid_file.read_text())
    assert not alive(pid)  # killed and reaped: no zombie either
    done = interrupts.run(["sh", "-c", "echo out; echo err >&2; exit 3"], capture_output=True, text=True)
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n")
    with pytest.raises(subprocess.TimeoutExpired):
        interrupts.run(["sleep", "30"], timeout=0.3)
