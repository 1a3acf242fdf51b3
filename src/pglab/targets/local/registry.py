"""Every local lab (and fio scratch folder) a pglab process builds is registered, so that one left behind by a killed
pglab is found: a JSON file per lab in ``<state>/labs/`` naming its directories and its owner (pid and start time),
written before its first server starts, removed once it is torn down, kept (marked kept) for a lab kept with
``--keep`` until ``pglab lab clean``. Where ``<state>`` is and how an orphan is reaped: docs/reliability.md, "SIGKILL
of pglab itself".
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from pglab.artifacts import write_json
from pglab.errors import UserError
from pglab.targets.local import leftovers
from pglab.targets.local.procs import kill_all, process_start_time, processes_using
from pglab.targets.local.removal import remove_tree


def state_dir() -> Path:
    if os.environ.get("PGLAB_STATE_DIR"):
        return Path(os.environ["PGLAB_STATE_DIR"])
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "pglab"


def _labs_dir() -> Path:
    d = state_dir() / "labs"
    try:
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:  # the environment's to fix: one sentence naming the variable, not a traceback
        where = "PGLAB_STATE_DIR" if os.environ.get("PGLAB_STATE_DIR") else \
            "XDG_STATE_HOME" if os.environ.get("XDG_STATE_HOME") else "HOME"
        raise UserError(f"{where}: cannot create pglab's lab registry in '{d}' ({exc.strerror}); point "
                        f"PGLAB_STATE_DIR at a folder you can write to.") from None
    return d


def _entry_file(lab_dir: Path) -> Path:
    return _labs_dir() / (str(lab_dir.resolve()).strip("/").replace("/", "_") + ".json")


@dataclass(frozen=True)
class Entry:
    lab_dir: Path
    owner_pid: int
    owner_start: int | None
    kept: bool
    dirs: tuple[Path, ...]  # directories created for the lab outside it (data/WAL bases given in the plan)
    file: Path

    def owner_alive(self) -> bool:
        return self.owner_start is not None and process_start_time(self.owner_pid) == self.owner_start


def register(lab_dir: Path, dirs: list[Path]) -> None:
    pid = os.getpid()
    write_json(_entry_file(lab_dir), {"lab_dir": str(lab_dir), "owner_pid": pid,
                                      "owner_start": process_start_time(pid), "kept": False,
                                      "dirs": [str(d) for d in dirs], "created": time.time()})


def mark_kept(lab_dir: Path) -> None:
    path = _entry_file(lab_dir)
    with contextlib.suppress(OSError, ValueError):
        data = json.loads(path.read_text())
        data["kept"] = True
        write_json(path, data)


def unregister(lab_dir: Path) -> None:
    with contextlib.suppress(OSError):
        _entry_file(lab_dir).unlink()


def entries() -> list[Entry]:
    out = []
    for f in sorted(_labs_dir().glob("*.json")):
        try:
            d = json.loads(f.read_text())
            out.append(Entry(Path(d["lab_dir"]), int(d["owner_pid"]), d.get("owner_start"), bool(d.get("kept")),
                             tuple(Path(p) for p in d.get("dirs", [])), f))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


def reap(entry: Entry) -> str:
    """Stop everything an orphaned lab left running and remove its files. Returns one sentence saying what."""
    stopped: list[str] = []
    if (entry.lab_dir / "lab.json").is_file():
        with contextlib.suppress(Exception):
            stopped = leftovers.stop_lab(entry.lab_dir)
    remaining = processes_using([entry.lab_dir, *entry.dirs])
    kill_all(remaining)
    remove_tree(entry.lab_dir)
    for d in entry.dirs:
        remove_tree(d)
    with contextlib.suppress(OSError):
        entry.file.unlink()
    if entry.lab_dir.name.startswith(".pglab-fio-"):
        return (f"cleaned up fio scratch folder {entry.lab_dir} left behind by pglab pid {entry.owner_pid} (no "
                f"longer running)" + (f"; killed {len(remaining)} fio process(es) still writing there"
                                      if remaining else ""))
    what = ", ".join(stopped) if stopped else "no server was running"
    extra = f"; killed {len(remaining)} other process(es) still using it" if remaining else ""
    return (f"cleaned up lab {entry.lab_dir} left behind by pglab pid {entry.owner_pid} (no longer running): "
            f"stopped {what}{extra}")


def reap_orphans() -> list[str]:
    """Clean every registered lab whose pglab is gone and that was not kept; one sentence per lab."""
    return [reap(e) for e in entries() if not e.kept and not e.owner_alive()]
