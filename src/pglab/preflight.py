"""Preflight: what a plan needs from this host, checked before a lab is built or a results folder is created.

A wrong setup found after initdb and a dataset load costs minutes and leaves a failed sweep behind; found here,
it costs a sentence. Every refusal names the field and what to do (exit 2). ``plan validate`` and ``pglab run``
run the same checks: ``plan validate`` on a host without PostgreSQL (a plan written for another host) says what
it could not check instead of refusing; ``pglab run`` refuses there too."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pglab.errors import PlanError, UserError
from pglab.plan.schema import Plan
from pglab.targets.base import OWN_SESSIONS
from pglab.targets.local.lab_base import searchable_by
from pglab.targets.local.postgres_bin import ServerUser, find_bindir, resolve_plan_user, resolve_server_user
from pglab.units import human_bytes

DEFAULT_RESULTS_ROOT = Path("results")  # relative to where pglab runs: results/<plan name> by default
DEFAULT_MAX_CONNECTIONS = 100  # PostgreSQL's own default, when the installed one cannot be asked


@dataclass
class Settings:
    """What the installed PostgreSQL says the plan's parameters come to (the smallest and largest of every
    combination of the matrix's parameter values)."""

    max_connections: int
    shared_buffers_bytes: int | None = None


# ------------------------------------------------------------------ the entry points
def check_plan(plan: Plan, plan_dir: Path, *, host: bool = False, results: Path | None = None) -> list[str]:
    """Refuse (PlanError or UserError) what this plan cannot do here, as ``pglab run`` would; return notes on what
    was not checked.

    Every check runs either way: the parameters and connections (asked of the installed PostgreSQL), the programs
    the plan needs (fio, Toxiproxy, etcd and Patroni), its limits against this host's CPUs and memory, its paths.
    ``host`` (``pglab run``): PostgreSQL missing here is refused too; without it (``plan validate``) a host without
    PostgreSQL is taken for one the plan was not written for, and the notes say what was not checked.
    ``results``: an explicit results folder, whose parent must exist."""
    if results is not None:
        check_results_parent(results)
    local = plan.target.local
    if local is None:  # external and Kubernetes targets are asked at their own preflight
        return [] if host else _remote_notes(plan)
    check_wal_level(plan)
    notes: list[str] = []
    try:
        bindir = find_bindir(local.bindir)
    except UserError as exc:
        if host:
            raise
        return [f"postgres.parameters and max_connections not checked: {str(exc).rstrip('.')}",
                "this host's programs, CPUs, memory and paths not checked either: without PostgreSQL it is not where "
                "the plan runs"]
    check_binaries(plan)
    notes += check_limits(plan)
    try:
        user = resolve_server_user(local.run_as)
    except UserError as exc:
        if host:
            raise
        return [*notes, f"postgres.parameters, max_connections and the paths not checked: {str(exc).rstrip('.')}"]
    if user is not None:  # root: the plan's code runs as the plan user, who must exist
        resolve_plan_user()
    check_paths(plan, plan_dir)
    settings = check_parameters(plan, bindir, user, shared_buffers=True)
    if settings is None:
        notes.append("postgres.parameters not checked: the installed PostgreSQL could not be asked")
        settings = Settings(_plan_max_connections(plan))
    check_connections(plan, settings.max_connections)
    if settings.shared_buffers_bytes is not None:
        ram = host_memory()
        if ram and settings.shared_buffers_bytes >= ram:
            raise UserError(f"postgres.parameters.shared_buffers: {human_bytes(settings.shared_buffers_bytes)} is not "
                            f"less than this host's memory ({human_bytes(ram)}); lower it.")
    return notes


def _remote_notes(plan: Plan) -> list[str]:
    """What ``plan validate`` cannot judge of a target on another machine."""
    if plan.target.kubernetes is not None:
        return ["the cluster not asked (nodes, storage classes, CloudNativePG, permissions): 'pglab k8s check' "
                "asks it, and 'pglab run' does first"]
    if plan.target.external is not None:
        return ["the external server not connected to (its version, parameters and max_connections): 'pglab run' "
                "does first"]
    return []


LAB_WAL_SENDERS = 10  # what the local lab (and its Patroni) sets unless the plan's parameters do


def check_wal_level(plan: Plan) -> None:
    """``wal_level: minimal`` starts no server of a lab: PostgreSQL refuses it next to max_wal_senders above 0 (the
    lab's 10, for pg_basebackup and its standbys), and standbys cannot replay it. ``postgres -C`` does not check
    this pair (only a start does), so it is judged here."""
    local = plan.target.local
    if local is None:
        return
    for params, index in _combinations(plan):
        if str(params.get("wal_level", "replica")).strip().lower() != "minimal":
            continue
        field = (f"matrix.parameters.wal_level[{index['wal_level']}]" if "wal_level" in index
                 else "postgres.parameters.wal_level")
        senders = str(params.get("max_wal_senders", LAB_WAL_SENDERS)).strip()
        if local.instances > 1:
            raise PlanError([f"{field}: minimal leaves the {local.instances - 1} standby(s) of "
                             f"target.local.instances: {local.instances} no WAL to replay; use replica."])
        if not senders.isdigit() or int(senders) > 0:
            raise PlanError([f"{field}: PostgreSQL refuses minimal next to max_wal_senders {senders} (the lab sets "
                             f"{LAB_WAL_SENDERS} unless postgres.parameters.max_wal_senders says otherwise); use "
                             "replica, or set max_wal_senders: 0 as well."])


def check_results_parent(results: Path) -> None:
    """An explicit --results names a folder pglab creates, not a tree: a typo must not become directories."""
    if results.exists():
        if not results.is_dir():
            raise UserError(f"--results: '{results}' is a file; give a folder.")
        return
    parent = results.absolute().parent
    if parent == DEFAULT_RESULTS_ROOT.absolute() and not parent.exists():
        return  # ./results, where runs go by default, is pglab's to create (--results results/qs in a fresh clone)
    if not parent.is_dir():
        raise UserError(f"--results: the folder '{parent}' does not exist; create it first or give a folder in "
                        "an existing one.")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"--results: cannot create '{results}': '{parent}' is not writable.")


# ------------------------------------------------------------------ binaries
def check_binaries(plan: Plan) -> None:
    """fio for a storage phase, Toxiproxy for shaped links, etcd and Patroni for an HA lab."""
    local = plan.target.local
    if local is None:
        return
    if plan.storage is not None:
        from pglab.workloads.fio import find_fio

        find_fio()
    if local.network is not None:
        from pglab.targets.local.toxiproxy import find_toxiproxy

        find_toxiproxy()
    if local.ha == "patroni":
        from pglab.targets.local.ha.processes import find_etcd, find_patroni

        find_etcd()
        find_patroni()


# ------------------------------------------------------------------ limits against the host
def host_memory() -> int | None:
    """Bytes of RAM, or None when the system does not say."""
    with contextlib.suppress(ValueError, OSError, AttributeError):
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    return None


def online_cpus() -> set[int] | None:
    """The CPUs a cpuset may name (the kernel's online list), or None when it cannot be read."""
    try:
        text = Path("/sys/devices/system/cpu/online").read_text().strip()
    except OSError:
        return None
    return parse_cpulist(text)


def parse_cpulist(text: str) -> set[int]:
    cpus: set[int] = set()
    for part in filter(None, text.split(",")):
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def check_limits(plan: Plan) -> list[str]:
    """A CPU limit above the host's cores or a memory limit above its RAM limits nothing: it would be recorded as
    applied while the instance runs unconstrained, so it is refused (with limits: best-effort too). Returns notes
    on what could not be checked (the host does not say) or will not be applied."""
    local = plan.target.local
    notes: list[str] = []
    if local is None:
        return notes
    cores, ram = os.cpu_count() or 1, host_memory()
    cpu_limits: list[tuple[str, float]] = []
    memory_limits: list[tuple[str, int]] = []
    if local.resources is not None:
        if local.resources.cpus is not None:
            cpu_limits.append(("target.local.resources.cpus", local.resources.cpus))
        if local.resources.memory is not None:
            memory_limits.append(("target.local.resources.memory", local.resources.memory.bytes))
    if local.client is not None and local.client.cpus is not None:
        cpu_limits.append(("target.local.client.cpus", local.client.cpus))
    cpu_limits += [(f"matrix.cpus[{i}]", c) for i, c in enumerate(plan.matrix.cpus or [])]
    for a, arrangement in enumerate(plan.tenants.arrangements if plan.tenants else []):
        for t, tier in enumerate(arrangement.tiers):
            at = f"tenants.arrangements[{a}].tiers[{t}].resources"
            if tier.resources is not None and tier.resources.cpus is not None:
                cpu_limits.append((f"{at}.cpus", tier.resources.cpus))
            if tier.resources is not None and tier.resources.memory is not None:
                memory_limits.append((f"{at}.memory", tier.resources.memory.bytes))
    for field, cpus in cpu_limits:
        if cpus > cores:
            raise UserError(f"{field}: {cpus:g} CPUs is more than this host's {cores}; lower it to {cores} or less.")
    if memory_limits and ram is None:
        notes.append(f"{memory_limits[0][0]} not checked: this host does not say how much memory it has")
    for field, limit in memory_limits:
        if ram is not None and limit > ram:
            raise UserError(f"{field}: {human_bytes(limit)} is more than this host's memory ({human_bytes(ram)}); "
                            "lower it.")
    # a cpuset naming CPUs the host lacks is refused by the kernel when the lab is built: with limits: strict that
    # ends the sweep, so it is refused here first; best-effort runs on and records the limits as not applied
    cpuset = local.client.cpuset if local.client is not None else None
    online = online_cpus()
    if cpuset and online is None:
        notes.append("target.local.client.cpuset not checked: this host's online CPUs cannot be read")
    if cpuset and online is not None:
        missing = sorted(parse_cpulist(cpuset) - online)
        shown = ", ".join(map(str, missing[:8]))
        if missing and local.limits == "strict":
            raise UserError(f"target.local.client.cpuset: CPU {shown} is not on this host (its CPUs: "
                            f"{_cpulist(online)}); name CPUs it has, or set target.local.limits: best-effort to run "
                            "without the limits.")
        if missing:
            notes.append(f"target.local.client.cpuset: CPU {shown} is not on this host (its CPUs: {_cpulist(online)});"
                         " with limits: best-effort the runs go on without the limits and record them as not applied")
    return notes


def _cpulist(cpus: set[int]) -> str:
    ordered = sorted(cpus)
    return f"{ordered[0]}-{ordered[-1]}" if ordered == list(range(ordered[0], ordered[-1] + 1)) else \
        ",".join(map(str, ordered))


# ------------------------------------------------------------------ paths
def check_paths(plan: Plan, plan_dir: Path) -> None:
    """The lab's folders: a lab folder that is not empty, or one whose nearest existing parent cannot be written,
    is refused before a results folder exists (the lab finds the rest as it creates them)."""
    local = plan.target.local
    if local is None:
        return
    user = resolve_server_user(local.run_as)
    for name in ("lab", "data", "wal"):
        given = getattr(local.paths, name)
        if not given:
            continue
        field = f"target.local.paths.{name}"
        p = Path(given).expanduser()
        path = (p if p.is_absolute() else plan_dir / p).absolute()
        if name == "lab" and path.is_dir() and any(path.iterdir()):
            raise UserError(f"{field}: '{path}' is not empty; give an empty or new directory.")
        if path.exists() and not path.is_dir():
            raise UserError(f"{field}: '{path}' is a file; give a directory.")
        existing = path
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if not existing.is_dir():
            raise UserError(f"{field}: '{existing}' is a file, so '{path}' cannot be created; give a directory.")
        if not os.access(existing, os.W_OK | os.X_OK):
            raise UserError(f"{field}: cannot create '{path}': '{existing}' is not writable; choose a directory "
                            "you can write to.")
        if user is not None and not searchable_by(existing, user.uid, user.gid):
            raise UserError(f"{field}: the server user '{user.name}' cannot reach '{path}' (a parent directory is "
                            "not searchable); choose a directory under a world-searchable path such as /var/tmp.")
        plan_user = resolve_plan_user() if user is not None and name == "lab" else None  # its sockets, its passfile
        if plan_user is not None and not searchable_by(existing, plan_user.uid, plan_user.gid):
            raise UserError(f"{field}: the plan user '{plan_user.name}', who runs pgbench, cannot reach '{path}' (a "
                            "parent directory is not searchable); choose a directory under a world-searchable path "
                            "such as /var/tmp.")


# ------------------------------------------------------------------ PostgreSQL parameters
def _raw(value: Any) -> str:
    """A parameter's value as ``postgres -c`` takes it (no quoting: it is one argument)."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def _combinations(plan: Plan) -> list[tuple[dict[str, Any], dict[str, int]]]:
    """Enough combinations of the parameters for every value of every matrix axis to appear in one: the i-th
    value of each axis together (cycling the shorter ones). Returns (parameters, axis name → value index)."""
    axes = plan.matrix.parameters
    width = max((len(v) for v in axes.values()), default=1)
    out = []
    for i in range(width):
        index = {name: i % len(values) for name, values in axes.items()}
        params = {**plan.postgres.parameters, **{name: axes[name][j] for name, j in index.items()}}
        out.append((params, index))
    return out


def _ask(bindir: Path, user: ServerUser | None, workdir: Path, params: dict[str, Any],
         name: str) -> tuple[str | None, str | None]:
    """``postgres -C name`` with ``params``: (its value, None) or (None, PostgreSQL's FATAL line and hint)."""
    args = [str(bindir / "postgres"), "-D", str(workdir), "-C", name]
    for k, v in params.items():
        args += ["-c", f"{k}={_raw(v)}"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env.update(LC_ALL="C", LANG="C")
    kwargs: dict[str, Any] = user.popen_kwargs() if user else {}
    proc = subprocess.run(args, capture_output=True, text=True, timeout=30, env=env, cwd=workdir, check=False,
                          **kwargs)
    if proc.returncode == 0:
        return proc.stdout.strip(), None
    lines = [re.sub(r"^.*?(FATAL|HINT|DETAIL):\s+", r"\1: ", line) for line in proc.stderr.splitlines()]
    fatal = [line.removeprefix("FATAL: ") for line in lines if line.startswith("FATAL: ")]
    hints = [line for line in lines if line.startswith(("HINT: ", "DETAIL: "))]
    return None, "; ".join(fatal[:1] + hints[:1]) or (proc.stderr.strip().splitlines() or ["no message"])[-1]


def check_parameters(plan: Plan, bindir: Path, user: ServerUser | None, *,
                     shared_buffers: bool = False) -> Settings | None:
    """Ask the installed PostgreSQL whether every parameter's name and value is valid (``postgres -C`` on an
    empty throwaway folder: it reads the settings and exits, it starts nothing). PlanError with one line per
    parameter refused; None when PostgreSQL could not be asked at all (the lab asks again before it writes)."""
    try:
        workdir = Path(tempfile.mkdtemp(prefix="pglab-check-"))
    except OSError:
        return None
    try:
        (workdir / "postgresql.conf").touch()
        if user is not None:
            os.chown(workdir, user.uid, user.gid)
            os.chown(workdir / "postgresql.conf", user.uid, user.gid)
        os.chmod(workdir, 0o700)
        return _check_in(plan, bindir, user, workdir, shared_buffers)
    except (OSError, subprocess.SubprocessError):
        return None
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _check_in(plan: Plan, bindir: Path, user: ServerUser | None, workdir: Path,
              shared_buffers: bool) -> Settings | None:
    value, _ = _ask(bindir, user, workdir, {}, "max_connections")
    if value is None:  # the check itself cannot run here (not the plan's fault): leave it to the lab
        return None
    problems: dict[str, str] = {}
    block: str | None = None
    connections: list[int] = []
    buffers: list[int] = []
    for params, index in _combinations(plan):
        params = {k: v for k, v in params.items() if k not in problems}
        for _attempt in range(len(params) + 1):
            value, fatal = _ask(bindir, user, workdir, params, "max_connections")
            if fatal is None:
                break
            named = re.search(r'parameter "([^"]+)"', fatal)
            name = named.group(1) if named else None
            if name is None or name not in params:
                problems[""] = f"postgres.parameters: PostgreSQL refuses the plan's parameters ({fatal}); fix them."
                break
            field = (f"matrix.parameters.{name}[{index[name]}]" if name in index
                     else f"postgres.parameters.{name}")
            problems[name] = f"{field}: PostgreSQL refuses it ({fatal}); fix the plan."
            params.pop(name)
        if value is not None and value.isdigit() and not problems:
            connections.append(int(value))
            if shared_buffers:
                pages, _ = _ask(bindir, user, workdir, params, "shared_buffers")
                block = block or _ask(bindir, user, workdir, {}, "block_size")[0]
                if pages and pages.isdigit() and block and block.isdigit():
                    buffers.append(int(pages) * int(block))
    if problems:
        raise PlanError(list(problems.values()))
    return Settings(min(connections or [DEFAULT_MAX_CONNECTIONS]), max(buffers) if buffers else None)


def _plan_max_connections(plan: Plan) -> int:
    """max_connections as the plan writes it (the smallest of an axis), else PostgreSQL's default: what is known
    when the installed PostgreSQL cannot be asked."""
    given = plan.matrix.parameters.get("max_connections") or (  # an axis overrides postgres.parameters
        [plan.postgres.parameters["max_connections"]] if "max_connections" in plan.postgres.parameters else [])
    numbers = [int(v) for v in given if not isinstance(v, bool) and str(v).strip().isdigit()]
    return min(numbers) if numbers else DEFAULT_MAX_CONNECTIONS


def check_connections(plan: Plan, max_connections: int) -> None:
    """Clients above max_connections fail every run late, on a connection error: refused here instead."""
    if plan.tenants is not None:
        clients = [(f"tenants.arrangements[{a}].tiers[{t}].clients", tier.clients)
                   for a, arr in enumerate(plan.tenants.arrangements) for t, tier in enumerate(arr.tiers)]
    else:
        clients = [(f"matrix.clients[{i}]", c) for i, c in enumerate(plan.matrix.clients)]
    field, most = max(clients, key=lambda fc: fc[1])
    if most + OWN_SESSIONS > max_connections:
        raise PlanError([f"{field}: {most} clients and pglab's own {OWN_SESSIONS} sessions need max_connections of "
                         f"at least {most + OWN_SESSIONS}, and the server allows {max_connections}; lower the "
                         f"clients or set postgres.parameters.max_connections: {most + OWN_SESSIONS}."])
