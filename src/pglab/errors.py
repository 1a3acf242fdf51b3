"""Errors shared across layers: those a user can cause (the CLI turns them into one sentence and exit code 2), and
a lab's server step that failed."""

from __future__ import annotations

import errno
import sqlite3


class UserError(Exception):
    """A problem the user can fix (plan, path, permission, missing binary, busy port).

    The message is shown as is: one sentence naming the field or the thing and what to do."""


class PlanError(UserError):
    """The plan is invalid; ``problems`` holds one line per problem, each naming a field path."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


class LabError(Exception):
    """A server step failed (not the user's input): the message carries the tool's own words."""


class LabUnsound(Exception):
    """The lab cannot be brought back to a sound state within a deadline (standbys not answering): the sweep stops
    with this one sentence instead of failing every remaining run, or waiting without a word."""


class NoSpace(Exception):
    """A filesystem pglab writes its results to is full: nothing more can be recorded, so the sweep stops with this
    one sentence (what was stored stays; the run under way is redone by a rerun)."""


def no_space(exc: BaseException) -> str | None:
    """The file a full filesystem (or quota) refused, or '' when not known, if that is what ``exc`` or an exception
    it was raised from is; None otherwise."""
    seen: BaseException | None = exc
    for _ in range(10):  # the chain: a failure while handling the failure to write
        if seen is None:
            return None
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return str(seen.filename or "")
        if isinstance(seen, sqlite3.OperationalError) and "disk is full" in str(seen):
            return "results.db"
        seen = seen.__cause__ or seen.__context__
    return None


class RunInterrupted(Exception):
    """Raised at one of the runner's safe points (:mod:`pglab.interrupts`) once SIGINT/SIGTERM has been recorded, so
    what was started is stopped in ``except``/``finally`` blocks and the sweep is marked interrupted."""

    def __init__(self, signal_name: str = "SIGINT"):
        self.signal_name = signal_name
        super().__init__(f"interrupted by {signal_name}")


def first_line(exc: BaseException) -> str:
    """An exception's first line of text, or its type's name when it has none: what a one-line reason shows."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0].strip()


def last_words(log: str) -> str:
    """A process's last two lines of output (progress lines left out): what a failed Job's reason quotes."""
    lines = [line.strip() for line in log.splitlines() if line.strip() and not line.startswith("progress:")]
    return " / ".join(lines[-2:]) or "no output"
