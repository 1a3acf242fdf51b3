"""``pglab cluster …``: a local HA lab (etcd + Patroni) driven like an operator's CLI (patronictl, kubectl cnpg).

``create`` builds the lab from a plan's ``target.local`` (``ha: patroni``) and leaves it running after pglab exits
(registered as kept, so no later pglab reaps it); every other command attaches to it by name (its directory's
name) or directory, acts, and exits. ``destroy`` stops everything and removes the files.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Literal

import typer
from rich.console import Console
from rich.table import Table

from pglab.errors import LabError, UserError

cluster_app = typer.Typer(no_args_is_help=True, help="Local HA labs (etcd + Patroni): create, status, switchover, "
                          "failover, scale, backup, restore, destroy.")

out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
MAX_NODES = 9  # as target.local.instances


def _log(message: str) -> None:
    err.print(f"[dim]{time.strftime('%X')} {message}[/dim]", highlight=False)


def reap() -> None:
    """Clean up the labs left behind by a pglab that died, saying what went."""
    from pglab.targets.local import registry

    for message in registry.reap_orphans():
        err.print(message, markup=False, highlight=False)


def _local_ha_spec(plan_file: Path, name: str | None) -> tuple[Any, dict[str, Any], Path]:
    """The plan's target.local (which must say ha: patroni) with the lab directory --name asks for, its
    postgres.parameters, and the folder relative paths are taken from."""
    from pglab.plan.load import load_plan

    plan, _ = load_plan(plan_file)
    spec = plan.target.local
    if spec is None:
        raise UserError(f"{plan_file}: target.local is missing; a cluster is a local HA lab (target.local.ha: "
                        "patroni).")
    if spec.ha != "patroni":
        raise UserError(f"{plan_file}: target.local.ha must be 'patroni' for a cluster (it is "
                        f"{'not set' if spec.ha is None else repr(spec.ha)}).")
    for field in ("resources", "client", "network"):  # pglab run applies them; a kept cluster would lose them
        if getattr(spec, field) is not None:
            raise UserError(f"{plan_file}: target.local.{field} is not available with pglab cluster yet (pglab run "
                            "applies it); remove it.")
    if name is not None:
        if not _NAME.fullmatch(name):
            raise UserError(f"--name: '{name}' must be 1-63 letters, digits, '-', '_' or '.', starting with a letter "
                            "or digit.")
        if spec.paths.lab:
            raise UserError("--name: the plan already names the lab's folder (target.local.paths.lab); drop one.")
        if _registered(name) is not None:
            raise UserError(f"--name: a lab named '{name}' exists already; destroy it or choose another name.")
        lab_dir = Path(tempfile.gettempdir()) / name
        if lab_dir.exists():
            raise UserError(f"--name: '{lab_dir}' exists already; choose another name.")
        spec = spec.model_copy(update={"paths": spec.paths.model_copy(update={"lab": str(lab_dir)})})
    return spec, dict(plan.postgres.parameters), plan_file.resolve().parent


def _registered(name: str) -> Path | None:
    from pglab.targets.local import registry

    for e in registry.entries():
        if e.lab_dir.name == name and (e.lab_dir / "lab.json").is_file():
            return e.lab_dir
    return None


def _find(lab: str) -> Path:
    """A lab given by name (its directory's name, as registered) or by directory."""
    from pglab.targets.local.ha import is_ha_lab

    path = Path(lab)
    if ("/" in lab or path.is_dir()) and (path / "lab.json").is_file():
        if not is_ha_lab(path):
            raise UserError(f"'{lab}' is a pglab lab but not an HA one; 'pglab lab clean {lab}' removes it.")
        return path.resolve()
    found = _registered(lab) if "/" not in lab else None
    if found is None or not is_ha_lab(found):
        raise UserError(f"no HA lab named '{lab}'; 'pglab lab list' shows the labs (give a name or a directory).")
    return found


def _attach(lab: str) -> Any:
    from pglab.targets.local.ha import HALab

    return HALab.attach(_find(lab), log=_log)


def _print_members(lab: Any, as_json: bool = False) -> None:
    members = sorted(lab.members(), key=lambda m: m.name)
    if as_json:
        rows = [{"name": m.name, "role": m.role, "state": m.state, "lag": m.lag, "timeline": m.timeline,
                 "port": m.port} for m in members]
        out.print(json.dumps({"name": lab.name, "dir": str(lab.lab_dir), "members": rows}), markup=False,
                  highlight=False, soft_wrap=True)
        return
    leader_tl = next((m.timeline for m in reversed(members) if m.role == "leader"), None)
    table = Table(title=f"Cluster: {lab.name} ({lab.lab_dir})", title_justify="left")
    for column in ("Member", "Host", "Role", "State", "TL", "Lag in MB"):
        table.add_column(column, justify="right" if column in ("TL", "Lag in MB") else "left")
    for m in members:
        lag = "" if m.role == "leader" else ("unknown" if m.lag is None else f"{m.lag / 1024 / 1024:.0f}")
        tl = m.timeline if m.timeline is not None else leader_tl
        table.add_row(m.name, f"127.0.0.1:{m.port}", m.role, m.state, "" if tl is None else str(tl), lag)
    out.print(table)


def _build(spec: Any, parameters: dict[str, Any], base_dir: Path, restore_from: Path | None = None) -> Any:
    from pglab.targets.local import registry
    from pglab.targets.local.ha import HALab

    lab = HALab(spec, base_dir, log=_log)
    lab.restore_from = restore_from
    lab.start(parameters)
    assert lab.lab_dir is not None
    registry.mark_kept(lab.lab_dir)  # it outlives this process: no later pglab reaps it as an orphan
    return lab


@cluster_app.command("create")
def create(plan_file: Path = typer.Argument(..., help="plan (YAML) with target.local.ha: patroni"),
           name: str | None = typer.Option(None, "--name", help="the lab's name: its folder becomes $TMPDIR/NAME "
                                           "(default: a new pglab-ha-XXXX folder)")) -> None:
    """Build an HA lab from a plan's target.local and postgres.parameters; it keeps running after this command."""
    spec, parameters, base_dir = _local_ha_spec(plan_file, name)
    reap()
    lab = _build(spec, parameters, base_dir)
    out.print(f"created {lab.name} in {lab.lab_dir} ({lab.build_seconds:.1f} s)", markup=False, highlight=False)
    _print_members(lab)


@cluster_app.command("status")
def status(lab: str = typer.Argument(..., help="lab name or directory"),
           fmt: Literal["table", "json"] = typer.Option("table", "--format", "-f",
                                   help="json: one JSON object instead of the table"),
           as_json: bool = typer.Option(False, "--json", hidden=True, help="the same as --format json")) -> None:
    """Members: name, role, state, timeline, lag (like patronictl list)."""
    _print_members(_attach(lab), as_json or fmt == "json")


@cluster_app.command("list")
def list_labs() -> None:
    """HA labs registered by this user's pglab, with their leader."""
    from pglab.targets.local import registry
    from pglab.targets.local.ha import HALab, is_ha_lab

    for e in registry.entries():
        if not is_ha_lab(e.lab_dir):
            continue
        try:
            leader = HALab.attach(e.lab_dir).primary().name
        except (UserError, LabError, OSError):
            leader = "no leader"
        out.print(f"{e.lab_dir.name}  {e.lab_dir}  leader {leader}", markup=False, highlight=False)


@cluster_app.command("switchover")
def switchover(lab: str = typer.Argument(..., help="lab name or directory"),
               to: str | None = typer.Option(None, "--to", help="the replica to promote (default: Patroni picks)")
               ) -> None:
    """Planned switchover: the leader steps down, a replica takes over; prints the seconds it took."""
    the_lab = _attach(lab)
    names = [n.name for n in the_lab.nodes]
    if to is not None:
        if to not in names:
            raise UserError(f"--to: no node '{to}' in {the_lab.name}; its nodes are {', '.join(names)}.")
        if the_lab.primary().name == to:
            raise UserError(f"--to: {to} is the leader already; name a replica.")
    t = the_lab.faults.switchover(to)
    out.print(f"switchover {t.old} -> {t.new} (timeline {t.timeline}) in {t.seconds:.1f} s", markup=False,
              highlight=False)
    the_lab.wait_ready()
    _print_members(the_lab)


@cluster_app.command("failover")
def failover(lab: str = typer.Argument(..., help="lab name or directory")) -> None:
    """Kill the leader's node (Patroni and postgres, SIGKILL), wait for the new leader, then start the killed node
    again so it rejoins as a replica; prints the measured seconds."""
    the_lab = _attach(lab)
    if len([n for n in the_lab.nodes if n.name not in the_lab.killed]) < 2:
        raise UserError(f"{the_lab.name}: a failover needs at least 2 running nodes.")
    kill = the_lab.faults.kill_primary_node()
    t = the_lab.faults.wait_new_primary(kill.node, since=kill.at)
    out.print(f"failover {t.old} -> {t.new} (timeline {t.timeline}): new leader takes writes {t.seconds:.1f} s "
              f"after the kill", markup=False, highlight=False)
    started = time.monotonic()
    the_lab.faults.start_node(kill.node)
    the_lab.wait_ready(180)
    out.print(f"{kill.node} rejoined as a replica in {time.monotonic() - started:.1f} s", markup=False,
              highlight=False)
    _print_members(the_lab)


@cluster_app.command("scale")
def scale(lab: str = typer.Argument(..., help="lab name or directory"),
          instances: int = typer.Argument(..., help="the number of nodes wanted (leader included), 2 to 9")) -> None:
    """Add replicas (cloned by Patroni from the leader) or remove some (the newest replicas first)."""
    if not 2 <= instances <= MAX_NODES:
        raise UserError(f"N: an HA lab has 2 to {MAX_NODES} nodes (given {instances}).")
    the_lab = _attach(lab)
    started = time.monotonic()
    current = len(the_lab.nodes)
    if instances > current:
        for _ in range(instances - current):
            node = the_lab.add_node()
            out.print(f"added {node.name}", markup=False, highlight=False)
    elif instances < current:
        leader = the_lab.primary().name
        replicas = sorted((n.name for n in the_lab.nodes if n.name != leader), key=lambda s: int(s[1:]), reverse=True)
        for name in replicas[:current - instances]:
            the_lab.remove_node(name)
            out.print(f"removed {name}", markup=False, highlight=False)
        the_lab.wait_ready()
    out.print(f"{the_lab.name}: {current} -> {instances} nodes in {time.monotonic() - started:.1f} s", markup=False,
              highlight=False)
    _print_members(the_lab)


@cluster_app.command("backup")
def backup(lab: str = typer.Argument(..., help="lab name or directory"),
           target: Path = typer.Argument(..., help="folder for the backup (new or empty)"),
           fmt: str = typer.Option("plain", "--format", help="plain (a data directory) or tar")) -> None:
    """pg_basebackup of the current leader (WAL streamed with it, fast checkpoint); prints size and seconds."""
    from pglab.targets.local.pgconf import SUPERUSER

    if fmt not in ("plain", "tar"):
        raise UserError(f"--format: '{fmt}' is not one of plain, tar.")
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise UserError(f"DIR: '{target}' exists and is not an empty folder; give a new or empty one.")
    the_lab = _attach(lab)
    leader = the_lab.primary().name
    node = the_lab._node(leader)
    created = not target.exists()
    started = time.monotonic()
    proc = subprocess.run(
        [str(the_lab.bindir / "pg_basebackup"), "-h", str(the_lab.lab_dir / "sock"), "-p", str(node.port),
         "-U", SUPERUSER, "-D", str(target), "-F", fmt[0], "-X", "stream", "-c", "fast", "--no-password",
         "-l", f"pglab cluster backup of {the_lab.name}"],
        env={**the_lab._env(), "PGPASSFILE": str(the_lab.client_passfile)}, capture_output=True, text=True,
        check=False, timeout=3600)
    seconds = time.monotonic() - started
    if proc.returncode != 0:
        if created:
            shutil.rmtree(target, ignore_errors=True)
        raise LabError(f"pg_basebackup from {leader} failed: {(proc.stderr or proc.stdout).strip()}")
    size = sum(p.stat().st_size for p in target.rglob("*") if p.is_file() and not p.is_symlink())
    out.print(f"backup of {the_lab.name} (leader {leader}, {fmt}) in {target}: {size / 1024 / 1024:.1f} MiB in "
              f"{seconds:.1f} s", markup=False, highlight=False)


@cluster_app.command("restore")
def restore(backup_dir: Path = typer.Argument(..., help="a folder written by 'pglab cluster backup'"),
            plan_file: Path = typer.Argument(..., help="plan (YAML) with target.local.ha: patroni"),
            name: str | None = typer.Option(None, "--name", help="the new lab's name (its folder: $TMPDIR/NAME)")
            ) -> None:
    """A new HA lab whose first node starts from the backup (Patroni custom bootstrap), the others cloned from it."""
    if not backup_dir.is_dir() or not ((backup_dir / "base.tar").is_file() or
                                       ((backup_dir / "PG_VERSION").is_file()
                                        and (backup_dir / "global" / "pg_control").is_file())):
        raise UserError(f"BACKUP_DIR: '{backup_dir}' holds no base backup (a data directory with PG_VERSION, or "
                        "base.tar).")
    spec, parameters, base_dir = _local_ha_spec(plan_file, name)
    reap()
    started = time.monotonic()
    lab = _build(spec, parameters, base_dir, restore_from=backup_dir.resolve())
    with lab.connect(lab.primary().name, dbname="postgres") as conn:
        row = conn.execute("SELECT system_identifier FROM pg_control_system()").fetchone()
        dbs = [r[0] for r in conn.execute("SELECT datname FROM pg_database WHERE NOT datistemplate "
                                          "ORDER BY datname").fetchall()]
    sysid = int(row[0]) if row else None
    if sysid != lab.restored_system_id:
        raise LabError(f"restored lab {lab.name} runs system {sysid}, the backup holds {lab.restored_system_id}; "
                       f"destroy it ('pglab cluster destroy {lab.name}').")
    out.print(f"restored {backup_dir} into {lab.name} in {lab.lab_dir} ({time.monotonic() - started:.1f} s): "
              f"system {sysid} as in the backup; databases {', '.join(dbs)}", markup=False, highlight=False)
    _print_members(lab)


@cluster_app.command("destroy")
def destroy(lab: str = typer.Argument(..., help="lab name or directory")) -> None:
    """Stop every process of the lab (Patroni, PostgreSQL, etcd), remove its files and unregister it."""
    from pglab.targets.local.ha import clean_ha_lab

    lab_dir = _find(lab)
    started = time.monotonic()
    stopped = clean_ha_lab(lab_dir)
    out.print(f"destroyed {lab_dir.name} ({lab_dir}) in {time.monotonic() - started:.1f} s"
              + (f"; stopped {', '.join(stopped)}" if stopped else ""), markup=False, highlight=False)
