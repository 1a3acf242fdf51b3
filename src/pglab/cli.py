"""Command line: run, report, plan validate|schema|reference. User errors end in one sentence and exit code 2."""

from __future__ import annotations

import json
import os
import sys
import time
from contextlib import closing
from pathlib import Path
from typing import Any, Literal

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from pglab import __version__
from pglab.cluster_cli import cluster_app, err, out, reap
from pglab.errors import LabError, LabUnsound, NoSpace, PlanError, UserError
from pglab.plan.expand import Point
from pglab.plan.load import load_plan
from pglab.plan.schema import Plan
from pglab.workloads.fio import FioError
from pglab.workloads.pgbench import PgbenchError, ProgressPoint


def _hide_flag_type() -> None:
    """typer's help labels every flag ``<bool>`` as if it took a value (``--keep <bool>``): a flag's type is not
    shown. Done only when this typer has that method, so another version shows its own help unchanged."""
    option = getattr(getattr(typer, "core", None), "TyperOption", None)
    shown = getattr(option, "display_type_rich", None)
    if option is None or shown is None:
        return

    def display_type_rich(self: Any, ctx: Any) -> Any:
        return None if getattr(self, "is_flag", False) else shown(self, ctx)

    option.display_type_rich = display_type_rich


_hide_flag_type()
app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False,
                  context_settings={"help_option_names": ["-h", "--help"]},  # inherited by every subcommand
                  help="Reproducible PostgreSQL platform benchmarks from one plan file.")
plan_app = typer.Typer(no_args_is_help=True, help="Check a plan, or print its JSON Schema or its reference.")
app.add_typer(plan_app, name="plan")
lab_app = typer.Typer(no_args_is_help=True, help="Labs kept with --keep (or left behind).")
app.add_typer(lab_app, name="lab")
k8s_app = typer.Typer(no_args_is_help=True, help="Kubernetes target (CloudNativePG): a plan's manifests, and a "
                      "preflight of its cluster.")
app.add_typer(k8s_app, name="k8s")
cache_app = typer.Typer(no_args_is_help=True, help="The dataset cache: loaded datasets kept for later labs.")
app.add_typer(cache_app, name="cache")
app.add_typer(cluster_app, name="cluster", help="Local HA labs (etcd + Patroni): create, status, switchover, "
              "failover, scale, backup, restore, destroy.")

FORMATS = ("table", "markdown", "csv", "json")
# a Literal option: its values are shown in --help, completed by the shell and refused with the list
Format = Literal["table", "markdown", "csv", "json"]


def _choices(*values: str) -> Any:
    """Shell completion of an option whose value pglab checks itself (to refuse a wrong one in its own sentence)."""
    def complete(incomplete: str) -> list[str]:
        return [v for v in values if v.startswith(incomplete)]

    return complete


EXPORT_FORMATS = ("csv", "json", "parquet")  # pglab.report.export.FORMATS, without importing polars for --help


def _version(value: bool) -> None:
    if value:
        out.print(f"pglab {__version__}", markup=False, highlight=False)
        raise typer.Exit(0)


@app.callback()
def _main(version: bool = typer.Option(False, "--version", "-V", is_eager=True, callback=_version,
                                       help="print pglab's version and exit")) -> None:
    """Reproducible PostgreSQL platform benchmarks from one plan file."""


class ProgressView:
    """Live progress: the current point, its phase, pgbench's current TPS, and the sweep's ETA. Not on a terminal
    (a CI log, ``| tee``) there is no live bar: each run's start is a line, "run n of N" with the sweep's ETA."""

    def __init__(self, console: Console):
        self.console = console
        self.live = console.is_terminal
        self.announced: tuple[int, int] | None = None  # the (point, repeat) whose start line was printed
        self.bar = Progress(
            SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
            TextColumn("{task.completed:.0f}/{task.total:.0f} runs"),
            TextColumn("[bold]{task.fields[tps]}"), TimeElapsedColumn(), TextColumn("ETA {task.fields[eta]}"),
            console=console, transient=False, disable=not console.is_terminal,  # logs only when not a terminal
        )
        self.task: Any = None
        # since the first run began: the runs' own pace, not the provisioning, storage phase and dataset before it
        self.runs_began: float | None = None
        self.estimate: float | None = None
        self.done = 0
        self.total = 0
        self.at_most = False  # the total is an upper bound (a capacity search ends once it has its answer)

    def __enter__(self) -> ProgressView:
        self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.stop()

    def log(self, message: str) -> None:
        self.bar.console.print(f"[dim]{message}[/dim]")

    def sweep_started(self, runs: int, estimate_s: float | None, at_most: bool = False) -> None:
        self.total, self.estimate, self.at_most = runs, estimate_s, at_most
        self.task = self.bar.add_task("provisioning", total=runs, tps="", eta=self._eta())

    def _eta(self) -> str:
        if self.done and self.runs_began is not None:
            remaining = (time.monotonic() - self.runs_began) / self.done * (self.total - self.done)
        elif self.estimate:
            remaining = self.estimate
        else:
            return "?"
        return time.strftime("%M:%S", time.gmtime(remaining)) if remaining < 3600 else f"{remaining / 3600:.1f} h"

    def run_started(self, point: Point, repeat: int, phase: str) -> None:
        if self.runs_began is None:
            self.runs_began = time.monotonic()
        self.bar.update(self.task, description=f"{point.label()} #{repeat} {phase}", tps="",
                             eta=self._eta())
        if not self.live and self.announced != (point.index, repeat):  # once a run, not once a phase
            self.announced = (point.index, repeat)
            eta = self._eta()
            self.bar.console.print(f"run {self.done + 1} of {'at most ' if self.at_most else ''}"
                                   f"{max(self.total, self.done + 1)}: {point.label()} #{repeat}; sweep ETA "
                                   f"{'at most ' if self.at_most and eta != '?' else ''}"
                                   f"{'not known yet' if eta == '?' else eta}", markup=False, highlight=False)

    def progress(self, p: ProgressPoint) -> None:
        self.bar.update(self.task, tps=f"{p.tps:,.0f} tps", eta=self._eta())

    def run_finished(self, point: Point, repeat: int, status: str, metrics: dict[str, Any]) -> None:
        self.done += 1
        self.bar.update(self.task, advance=1, eta=self._eta())
        if status == "ok" and point.arrangement is not None:  # tenants: each tier's TPS per tenant and p99
            tiers = ", ".join(f"{t.name} {metrics.get(f'tier.{t.name}.tps') or 0:,.1f} tps/tenant p99 "
                              f"{metrics.get(f'tier.{t.name}.latency_p99_ms') or 0:.1f} ms"
                              for t in point.arrangement.tiers)
            self.log(f"{point.label()} #{repeat}: host {metrics.get('tps', 0):,.1f} tps; {tiers}")
        elif status == "ok":
            self.log(f"{point.label()} #{repeat}: {metrics.get('tps', 0):,.1f} tps, "
                     f"p99 {metrics.get('latency_p99_ms') or 0:.2f} ms")
        else:
            self.bar.console.print(f"[yellow]{point.label()} #{repeat}: {status}"
                                        f"{': ' + str(metrics['reason']) if metrics.get('reason') else ''}")


@app.command()
def run(
    plan_file: Path = typer.Argument(..., help="plan (YAML)"),
    results: Path | None = typer.Option(None, "--results", help="results folder (default results/<plan name>: run "
                                        "again to resume)"),
    keep: bool = typer.Option(False, "--keep", help="leave the lab running and its files in place"),
    fmt: Format = typer.Option("table", "--format", "-f", help="table printed at the end"),
    force_new: bool = typer.Option(False, "--force-new", help="start a new sweep in a results folder that holds "
                                   "another plan's (or an unfinished) sweep, instead of resuming or refusing"),
    allow_destructive: bool = typer.Option(False, "--allow-destructive", help="let pglab write to an external "
                                           "target whose plan says destructive: true (load, reset, write workloads)"),
) -> None:
    """Run a plan: provision, sweep the matrix, store every run, print the table.

    Run again into the same --results folder after an interruption (Ctrl-C, a crash, a kill) and the sweep
    resumes: completed runs are kept, unfinished ones are run again."""
    plan, text = load_plan(plan_file)
    outcome, results, started, included, interrupted = _run_plan(
        plan, text, plan_file.resolve().parent, results, keep=keep, force_new=force_new,
        allow_destructive=allow_destructive)
    _sweep_ended(outcome, plan.name, results, fmt, started, included, interrupted)


def _run_plan(plan: Plan, text: str, plan_dir: Path, results: Path | None, *, keep: bool = False,
              force_new: bool = False, allow_destructive: bool = False) -> tuple[Any, Path, float, str, str]:
    """A plan's sweep through its driver, as `pglab run` and `pglab noise` do it: the outcome, the results folder,
    when it started, and what the end-of-sweep lines say was included and what an interrupt left."""
    from pglab.drivers import check_options, driver_for
    from pglab.engine.sweep import check_results_dir, run_sweep
    from pglab.preflight import DEFAULT_RESULTS_ROOT, check_plan

    check_options(plan, keep=keep, allow_destructive=allow_destructive)
    check_plan(plan, plan_dir, host=True, results=results)  # before a results folder or a lab exists
    results = results or DEFAULT_RESULTS_ROOT / plan.name  # a rerun resumes there; a changed plan is refused
    check_results_dir(results)
    options: dict[str, Any] = {}
    cluster_errors: tuple[type[Exception], ...] = ()  # the cluster's refusals: its words, exit 1, no traceback
    included, interrupted = "lab setup and teardown included", "the lab was torn down; completed runs are stored."
    if plan.target.kubernetes is not None:
        from pglab.extras import require

        require("kubernetes", "k8s", "target.kubernetes")
        from pglab.targets.kubernetes.orchestrate import K8sError

        options["api"] = _preflight(plan, err)  # before a results folder or anything in the cluster exists
        cluster_errors = (K8sError,)
        included = "cluster creation and cleanup included"
        interrupted = ("what pglab created in the cluster was deleted; completed runs are stored (run again into "
                       "the same --results to resume).")
    started = time.monotonic()
    try:
        with ProgressView(err) as view:
            driver = driver_for(plan, text, plan_dir, results, view, allow_destructive=allow_destructive, **options)
            outcome = run_sweep(driver, plan, text, plan_dir, results, view, force_new=force_new, keep=keep)
    except cluster_errors as exc:
        err.print(f"error: {exc}", markup=False, highlight=False)
        raise typer.Exit(1) from None
    return outcome, results, started, included, interrupted


@app.command()
def noise(
    plan_file: Path = typer.Argument(..., help="plan (YAML): its first point is measured"),
    repeats: int = typer.Option(6, "--repeats", help="identical runs (even, at least 4): two sides of half each"),
    results: Path | None = typer.Option(None, "--results", help="results folder (default results/<plan name>-noise)"),
    keep: bool = typer.Option(False, "--keep", help="leave the lab running and its files in place"),
    allow_destructive: bool = typer.Option(False, "--allow-destructive", help="as for pglab run"),
) -> None:
    """Measure the host's noise floor: the plan's first point run --repeats times in one lab, an A/A comparison of
    its even and odd runs, and the smallest difference a comparison on this host can resolve."""
    from pglab.analysis.noise import noise_floor
    from pglab.plan.noise import noise_plan
    from pglab.store import Store

    _, text = load_plan(plan_file)
    plan, derived = noise_plan(text, repeats)
    outcome, results, started, included, interrupted = _run_plan(
        plan, derived, plan_file.resolve().parent, results, keep=keep, allow_destructive=allow_destructive)
    with closing(Store.open(results, create=False)) as store:
        floor = noise_floor(store, outcome.sweep_id)
    lines = floor.lines() if floor is not None else ["noise floor: fewer than two runs ended ok, no spread to measure"]
    _sweep_ended(outcome, plan.name, results, "table", started, included, interrupted, after=lines)


def _sweep_ended(outcome: Any, name: str, results: Path, fmt: str, started: float, included: str,
                 interrupted: str, after: list[str] | None = None) -> None:
    """The end of `pglab run`, local or Kubernetes: the tables, one summary line, failures; exit 130 when
    interrupted by SIGINT (143 by SIGTERM, as a shell reports a process the signal ended), 1 when a run failed."""
    from pglab.report.tables import full_report
    from pglab.store import Store

    with closing(Store.open(results, create=False)) as store:
        text = full_report(store, fmt, outcome.sweep_id, title=f"{name} — {results}", width=_terminal_width())
    out.print(text, end="", soft_wrap=True, markup=False, highlight=False)
    for line in after or []:
        out.print(line, soft_wrap=True, markup=False, highlight=False)
    elapsed = time.monotonic() - started
    before = f", {outcome.already_done} completed before this resume" if outcome.resumed else ""
    err.print(f"results: {results}  ({outcome.ok} ok, {outcome.failed} failed{before}; "
              f"{int(elapsed // 60)} min {elapsed % 60:.0f} s, {included})")
    for f in outcome.failures:
        err.print(f"[yellow]failed: {f}")
    if outcome.interrupted:
        err.print(f"[yellow]interrupted: {interrupted}")
        raise typer.Exit(interrupted_exit(outcome.interrupted_by))
    if outcome.failed:
        raise typer.Exit(1)


def interrupted_exit(signal_name: str | None) -> int:
    """128 + the signal's number, as a shell reports a process that signal ended: 130 for SIGINT, 143 for SIGTERM."""
    return 143 if signal_name == "SIGTERM" else 130


PIPED_WIDTH = 120  # what a table piped into a file or a pager fits, unless COLUMNS says otherwise


def _terminal_width() -> int:
    """The width the terminal tables must fit: the terminal's, or COLUMNS, or 120 when piped; a row never
    wraps (columns are left out instead, and a line says which)."""
    if os.environ.get("COLUMNS", "").isdigit() or out.is_terminal:
        return out.width
    return PIPED_WIDTH


@app.command()
def report(
    results: Path = typer.Argument(..., help="results folder written by 'pglab run'"),
    fmt: str = typer.Option("table", "--format", help="|".join(FORMATS), autocompletion=_choices(*FORMATS)),
    per_run: bool = typer.Option(False, "--per-run", help="one row per run, with run_id and its folder"),
    sweep: int | None = typer.Option(None, "--sweep", help="sweep id (default: the latest)"),
    table: str | None = typer.Option(None, "--table", help="database|storage|durability|scenarios|cost|uplift|"
                                     "tiers|tenants|time (time: where the wall time went, the duty cycle; CSV/JSON "
                                     "hold one table; default: database when there is one)"),
    html: Path | None = typer.Option(None, "--html", help="also write the self-contained HTML report to this file"),
    wide: bool = typer.Option(False, "--wide", help="every column, however wide (default: a compact table that "
                              "fits the terminal)"),
    columns: str | None = typer.Option(None, "--columns", help="the database table's figures in the terminal or "
                                       "markdown, comma-separated (e.g. tps,latency_avg_ms,wal_mb_s); the axes are "
                                       "always shown"),
) -> None:
    """Print the results tables again, from the store: storage (fio) and database (pgbench)."""
    from pglab.report.tables import TABLES, full_report, selectable_columns, table_problem
    from pglab.store import Store

    _check_format(fmt)
    if table not in (None, *TABLES):
        raise UserError(f"--table: '{table}' is not one of {', '.join(TABLES)}.")
    with closing(Store.open(results, create=False)) as store:
        ids = [s["id"] for s in store.sweeps()]
        if not ids:
            raise UserError(f"'{results}' holds no sweep yet; run a plan into it first.")
        if sweep is not None and sweep not in ids:
            raise UserError(f"--sweep: '{results}' holds no sweep {sweep}; it holds {', '.join(map(str, ids))}.")
        if (problem := table_problem(store, sweep if sweep is not None else ids[-1], table)) is not None:
            raise UserError(problem)
        if per_run and table not in (None, "database", "storage"):
            raise UserError(f"--per-run: one row per run is for the database table, not '{table}'; drop --per-run "
                            "or --table.")
        chosen = None
        if columns is not None:
            valid = selectable_columns(store, sweep, per_run)
            chosen = [c.strip() for c in columns.split(",") if c.strip()]
            unknown = [c for c in chosen if c not in valid]
            if unknown or not chosen:
                raise UserError(f"--columns: '{', '.join(unknown) or columns}' is no column of this table; choose "
                                f"from {', '.join(valid)}.")
        text = full_report(store, fmt, sweep, per_run=per_run, table=table, width=_terminal_width(), wide=wide,
                           columns=chosen)
        if html is not None:
            from pglab.report import html as html_report

            try:
                html_report.write(store, html, sweep)
            except OSError as exc:
                raise UserError(f"--html: cannot write '{html}' ({exc.strerror}).") from None
            err.print(f"HTML report: {html}")
    out.print(text, end="", soft_wrap=True, markup=False, highlight=False)


@app.command("export")
def export_command(
    results: Path = typer.Argument(..., help="results folder written by 'pglab run'"),
    fmt: str = typer.Option(..., "--format", help="csv|json|parquet (JSON: one array of records per file)",
                            autocompletion=_choices(*EXPORT_FORMATS)),
    to: Path | None = typer.Option(None, "--to", help="output folder (default: RESULTS/export)"),
    sweep: int | None = typer.Option(None, "--sweep", help="sweep id (default: the latest)"),
) -> None:
    """Write points, runs, series, events and storage tables as files, one per table, for other tools."""
    from pglab.report.export import FORMATS as EXPORT_FORMATS
    from pglab.report.export import export
    from pglab.store import Store

    if fmt not in EXPORT_FORMATS:
        raise UserError(f"--format: '{fmt}' is not one of {', '.join(EXPORT_FORMATS)}.")
    with closing(Store.open(results, create=False)) as store:
        ids = [s["id"] for s in store.sweeps()]
        if not ids:
            raise UserError(f"'{results}' holds no sweep yet; run a plan into it first.")
        if sweep is not None and sweep not in ids:
            raise UserError(f"--sweep: '{results}' holds no sweep {sweep}; it holds {', '.join(map(str, ids))}.")
        target = to if to is not None else results / "export"
        try:
            written = export(store, target, fmt, sweep)
        except OSError as exc:
            raise UserError(f"--to: cannot write into '{target}' ({exc.strerror or exc}).") from None
    for path in written:
        out.print(str(path), markup=False, highlight=False)


@app.command()
def compare(
    a: Path = typer.Argument(..., help="results folder A (the reference)"),
    b: Path | None = typer.Argument(None, help="results folder B (omit to compare two values of --axis in A)"),
    axis: str | None = typer.Option(None, "--axis", help="compare two configurations within A along this axis"),
    value_a: str | None = typer.Option(None, "--a", help="the --axis value of configuration A"),
    value_b: str | None = typer.Option(None, "--b", help="the --axis value of configuration B"),
    fmt: str = typer.Option("table", "--format", help="|".join(FORMATS), autocompletion=_choices(*FORMATS)),
    uplift: bool = typer.Option(False, "--uplift", help="the published shape: TPS of A and B per point, uplift % "
                                "with its interval and verdict (and $/TPS when both plans have a cost)"),
    wide: bool = typer.Option(False, "--wide", help="every column, however wide (default: a table that fits the "
                              "terminal)"),
) -> None:
    """Δ % of TPS and latency per matching point, B relative to A, with a Welch 95 % interval and a verdict; two
    folders: what differs between their plans and environments first."""
    from pglab.report.compare import compare_report

    _check_format(fmt)
    if b is None and not (axis and value_a is not None and value_b is not None):
        raise UserError("compare: give two results folders, or one folder with --axis, --a and --b.")
    if b is not None and axis:
        raise UserError("compare: --axis compares within one folder; give one folder or drop --axis.")
    preface, text = compare_report(a, b, axis, value_a, value_b, fmt, uplift,
                                   None if wide else _terminal_width())  # the terminal's, or 120 when piped
    for line in preface:  # before the figures; beside CSV/JSON on stderr, so that the data stays parseable
        (out if fmt in ("table", "markdown") else err).print(line, soft_wrap=True, markup=False, highlight=False)
    out.print(text, end="", soft_wrap=True, markup=False, highlight=False)


@app.command("fio")
def fio_command(
    paths: list[Path] = typer.Option(..., "--path", help="directory to measure (repeatable)"),
    profiles: list[str] = typer.Option([], "--profile", help="profile (repeatable; default: the four of a plan)"),
    job_files: list[Path] = typer.Option([], "--job-file", help="a custom fio job file (repeatable)"),
    runtime: str = typer.Option("30s", "--runtime", help="seconds per job"),
    size: str = typer.Option("1GiB", "--size", help="test file size per job"),
    results: Path | None = typer.Option(None, "--results", help="results folder (default results/fio-<time>; run "
                                        "again into it to resume)"),
    fmt: Format = typer.Option("table", "--format", "-f"),
    force_new: bool = typer.Option(False, "--force-new", help="start a new sweep in a results folder that holds "
                                   "another (or this finished) sweep, instead of resuming or refusing"),
) -> None:
    """Benchmark storage with fio on the given paths: 8 KiB random, WAL-like fdatasync, 1 MiB sequential.

    A sweep as 'pglab run's: one pglab at a time in a results folder, and the same command run again into the same
    --results after an interruption resumes it (its storage measured again)."""
    import shlex

    from pydantic import ValidationError

    from pglab.drivers.fio import FioDriver
    from pglab.engine.sweep import run_sweep
    from pglab.plan.schema import Storage
    from pglab.report.tables import full_report
    from pglab.storage import plan_jobs
    from pglab.store import Store

    reap()
    spec: dict[str, Any] = {"runtime": runtime, "size": size}
    if profiles:
        spec["profiles"] = profiles
    try:
        storage = Storage.model_validate(spec)
    except ValidationError as exc:
        from pglab.plan.load import format_errors

        raise UserError("; ".join(line.replace("profiles", "--profile", 1) for line in format_errors(exc))
                        + ".") from None
    for f in job_files:
        if not f.is_file():
            raise UserError(f"--job-file: no such file '{f}'.")
    jobs = plan_jobs(storage.profiles if (profiles or not job_files) else [], job_files)
    labelled = {str(p): (p.absolute(), "--path") for p in paths}  # fio runs in the results folder, not here
    if results is not None:
        from pglab.preflight import check_results_parent

        check_results_parent(results)
    results = results or Path("results") / f"fio-{time.strftime('%Y%m%d-%H%M%S')}"
    # the sweep's plan is this command, with absolute paths: what a rerun must repeat to resume it; the job files'
    # bytes are part of its identity as a plan's are (the plan's own job files are relative, these are not)
    given = [("--path", str(p)) for p, _ in labelled.values()] + [("--profile", x) for x in profiles] + [
        ("--job-file", str(f.absolute())) for f in job_files] + [("--runtime", runtime), ("--size", size)]
    plan = Plan(name="fio", storage=storage.model_copy(update={"job_files": [str(f.absolute()) for f in job_files]}))
    driver = FioDriver(labelled, jobs, storage.runtime, storage.size.bytes, lambda m: err.print(f"[dim]{m}[/dim]"))
    outcome = run_sweep(driver, plan, f"# pglab {shlex.join(['fio', *(w for pair in given for w in pair)])}\n",
                        Path.cwd(), results, force_new=force_new)
    if outcome.interrupted:
        err.print("[yellow]interrupted: fio stopped and its test files removed.")
        raise typer.Exit(interrupted_exit(outcome.interrupted_by))
    with closing(Store.open(results, create=False)) as store:
        out.print(full_report(store, fmt, outcome.sweep_id, table="storage"), end="", soft_wrap=True, markup=False,
                  highlight=False)
    resumed = f" (sweep {outcome.sweep_id} resumed; --force-new starts a new one)" if outcome.resumed else ""
    err.print(f"results: {results}{resumed}")


@app.command("sweeps")
def sweeps_command(
    results: Path = typer.Argument(..., help="results folder written by 'pglab run' (or 'pglab fio')"),
    fmt: Format = typer.Option("table", "--format", "-f"),
) -> None:
    """List the sweeps of a results folder: id, date, status, plan, points, runs ok and failed (the ids that
    'pglab report --sweep' and 'pglab export --sweep' take)."""
    from pglab.report.tables import render
    from pglab.store import Store

    with closing(Store.open(results, create=False)) as store:
        rows = store.sweep_summaries()
    if not rows:
        err.print(f"'{results}' holds no sweep yet; run a plan into it first.", markup=False, highlight=False)
        return
    for r in rows:
        r["date"] = time.strftime("%Y-%m-%d %H:%M %Z", time.localtime(r.pop("started")))
    columns = ["sweep", "date", "status", "plan", "points", "runs_ok", "runs_failed"]
    text = render(columns, rows, fmt, title=f"sweeps in {results}", shown=columns,
                  headers={"runs_ok": "ok runs", "runs_failed": "failed runs"})
    out.print(text if text.endswith("\n") else text + "\n", end="", soft_wrap=True, markup=False, highlight=False)


@plan_app.command("validate")
def plan_validate(plan_file: Path = typer.Argument(..., help="plan (YAML)")) -> None:
    """Check a plan as 'pglab run' would on this host (its parameters, programs, limits and paths); exit 0, or
    exit 2 with one line per problem naming the field path. Notes say what could not be checked here."""
    from pglab.plan.expand import expand
    from pglab.preflight import check_plan

    plan, _ = load_plan(plan_file)
    notes = check_plan(plan, plan_file.resolve().parent)  # run's checks; no PostgreSQL here: notes, not refusals
    n = len(expand(plan))
    run = plan.run
    if plan.capacity is not None:  # each point a search: the closed loop, then rates, each run min_repeats times
        most = plan.capacity.max_probes
        out.print(f"{plan_file}: valid — {n} points, each a capacity search of at most {most} rates × "
                  f"{run.min_repeats} repeats = up to {n * most * run.min_repeats} runs, {run.order}")
    elif run.target_ci_pct is None:
        out.print(f"{plan_file}: valid — {n} points × {run.min_repeats} repeats = {n * run.min_repeats} runs, "
                  f"{run.order}")
    else:
        out.print(f"{plan_file}: valid — {n} points × {run.min_repeats}–{run.max_repeats} repeats (until TPS's 95 % "
                  f"interval is within ±{run.target_ci_pct:g} %) = {n * run.min_repeats}–{n * run.max_repeats} runs, "
                  f"{run.order}")
    for note in notes:
        err.print(f"note: {note}", markup=False, highlight=False)


@plan_app.command("schema")
def plan_schema() -> None:
    """Print the plan's JSON Schema (for editors)."""
    print(json.dumps(Plan.model_json_schema(), indent=2))


@plan_app.command("reference")
def plan_reference() -> None:
    """Print the plan reference in Markdown: every field with its type, default and description, and the
    environment variables pglab reads (docs/plan.md is this output)."""
    from pglab.plan.reference import markdown

    sys.stdout.write(markdown())


@lab_app.command("clean")
def lab_clean(lab_dir: Path | None = typer.Argument(None, help="lab directory (printed by 'pglab run --keep'); omit "
                                                    "it to clean every lab left behind by a pglab that died")) -> None:
    """Stop the servers of a kept lab and remove its files; without a directory, clean up orphaned labs."""
    from pglab.targets.local.cluster import clean_lab
    from pglab.targets.local.ha import clean_ha_lab, is_ha_lab

    reap()
    if lab_dir is None:
        return
    stopped = (clean_ha_lab if is_ha_lab(lab_dir) else clean_lab)(lab_dir)
    out.print(f"{lab_dir}: removed" + (f"; stopped {', '.join(stopped)}" if stopped else ""))


@lab_app.command("list")
def lab_list() -> None:
    """Labs registered by this user's pglab: running with their pglab, kept (--keep), or orphaned."""
    from pglab.targets.local import registry

    entries = registry.entries()
    if not entries:
        err.print("no labs: none is running, kept (--keep) or left behind.", markup=False, highlight=False)
    for e in entries:
        state = "kept" if e.kept else ("in use by pglab pid " + str(e.owner_pid) if e.owner_alive() else "orphaned")
        out.print(f"{e.lab_dir}  {state}", markup=False, highlight=False)


@cache_app.command("list")
def cache_list(fmt: Literal["table", "json"] = typer.Option("table", "--format", "-f",
                                                          help="json: one JSON object instead of the table")) -> None:
    """The dataset cache's entries, least recently used first: key, PostgreSQL, scale, partitions, size, last
    use, and whether a lab uses it now or it is incomplete (a fill that did not finish; never used)."""
    from pglab.targets.local.dataset.cache import DatasetCache

    cache = DatasetCache()
    entries = cache.entries()
    rows = [{"key": e.name, "postgres": e.meta.get("key", {}).get("postgres"),
             "scale": e.meta.get("dataset", {}).get("scale"), "partitions": e.meta.get("dataset", {}).get("partitions"),
             "bytes": e.bytes, "created": e.meta.get("created"), "last_used": e.last_used,
             "state": "incomplete" if not e.complete else "in use" if e.in_use else "ready"} for e in entries]
    total = sum(e.bytes for e in entries)
    unfinished = len(list(cache.root.glob(".*.tmp-*"))) if cache.root.is_dir() else 0
    if unfinished:
        err.print(f"{unfinished} unfinished fill(s) in '{cache.root}' (a pglab that died, or one filling now); "
                  "'pglab cache clean' removes those no pglab is filling.", markup=False, highlight=False)
    if fmt == "json":
        out.print(json.dumps({"dir": str(cache.root), "bytes": total, "cap_bytes": cache.cap, "entries": rows}),
                  markup=False, highlight=False, soft_wrap=True)
        return
    if not rows:
        err.print(f"the dataset cache '{cache.root}' is empty: a local lab fills it on its first load.",
                  markup=False, highlight=False)
        return
    table = Table(title=f"dataset cache {cache.root}: {total / 2**30:.2f} of {cache.cap / 2**30:.1f} GiB", box=None)
    for column in ("key", "PostgreSQL", "scale", "partitions", "size", "last used", "state"):
        table.add_column(column, justify="right" if column in ("scale", "partitions", "size") else "left")
    for r in rows:
        table.add_row(r["key"], str(r["postgres"] or "?"), str(r["scale"] or "?"), str(r["partitions"] or 0),
                      f"{r['bytes'] / 2**20:,.0f} MiB", time.strftime("%Y-%m-%d %H:%M", time.localtime(r["last_used"])),
                      r["state"])
    out.print(table)


@cache_app.command("clean")
def cache_clean(keys: list[str] = typer.Argument(None, help="entries to remove (as 'pglab cache list' names them); "
                                                 "omit them to remove every entry no lab uses now")) -> None:
    """Remove dataset cache entries (and what fills that died left behind). An entry a running lab uses is kept;
    the exit code is then 1."""
    from pglab.targets.local.dataset.cache import DatasetCache

    cache = DatasetCache()
    known = {e.name for e in cache.entries()}
    unknown = [k for k in keys or [] if k not in known]
    if unknown:
        raise UserError(f"'{unknown[0]}' is not an entry of the dataset cache '{cache.root}'; 'pglab cache list' "
                        "shows them.")
    leftovers = cache.clean_leftovers()
    kept = []
    for name in keys or sorted(known):
        if cache.remove(name):
            out.print(f"removed {name}", markup=False, highlight=False)
        else:
            kept.append(name)
    if leftovers:
        out.print(f"removed {len(leftovers)} unfinished fill(s)", markup=False, highlight=False)
    if not known and not leftovers:
        err.print(f"the dataset cache '{cache.root}' is empty: nothing to remove.", markup=False, highlight=False)
    if kept:
        err.print(f"kept {', '.join(kept)}: in use by a running lab (or being filled); clean again once it is done.",
                  markup=False, highlight=False)
        raise typer.Exit(1)


@k8s_app.command("render")
def k8s_render(plan_file: Path = typer.Argument(..., help="plan (YAML) with 'target: kubernetes'"),
               out_dir: Path = typer.Option(..., "-o", "--output", help="folder for the YAML files")) -> None:
    """Write every manifest of a plan without a cluster: the environment (namespace, RBAC, Cluster) in DIR/cluster,
    the fio and pgbench Jobs in DIR/jobs, and DIR/run-jobs.sh to apply them in order, each waited for."""
    from pglab.targets.kubernetes.folder import CLUSTER_DIR, JOBS_DIR, write
    from pglab.targets.kubernetes.render import render

    plan, _ = load_plan(plan_file)
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"-o: {out_dir} exists and is not a folder.")
    try:
        w = write(plan, render(plan, plan_file.resolve().parent), out_dir)
    except OSError as exc:
        raise UserError(f"-o: cannot write into '{out_dir}' ({exc.strerror or exc}); choose a folder you can write "
                        "to.") from None
    d = str(out_dir)
    patches = f" and {len(w.patches)} Cluster patch{'es' if len(w.patches) > 1 else ''}" if w.patches else ""
    out.print(f"{d}: {len(w.cluster) + len(w.jobs)} manifests ({d}/{CLUSTER_DIR}: {len(w.cluster)}, {d}/{JOBS_DIR}: "
              f"{len(w.jobs)}{patches}) and {w.script}; run {w.script}: it applies {d}/{CLUSTER_DIR}, waits for the "
              f"Cluster, then runs {d}/{JOBS_DIR} one Job at a time (never kubectl apply -f {d}/{JOBS_DIR} at once: "
              f"every run would start together); check them with .tools/bin/cnpg-check {d}/*/*.yaml",
              markup=False, highlight=False)


@k8s_app.command("check")
def k8s_check(plan_file: Path = typer.Argument(..., help="plan (YAML) with 'target: kubernetes'")) -> None:
    """Ask the plan's cluster whether its sweep can run there, creating nothing: the API server, CloudNativePG's CRD
    and version, nodes for the instances and pgbench, storage classes, permissions; names the images (not pulled).
    One line per check; exit 2 at the first blocking problem (`pglab run` runs the same checks first)."""
    plan, _ = load_plan(plan_file)
    _preflight(plan, out)


def _preflight(plan: Plan, console: Console) -> Any:
    """The Kubernetes preflight's lines on ``console``; exit 2 after the first blocking one. Returns the API client
    (an unusable kubeconfig is refused before, in one sentence naming target.kubernetes.kubeconfig)."""
    from pglab.extras import require

    require("kubernetes", "k8s", "target.kubernetes")
    from pglab.drivers.kubernetes import connect
    from pglab.targets.kubernetes.preflight import PreflightError, run_checks

    api = connect(plan)
    try:
        run_checks(plan, api, lambda f: console.print(f.line, markup=False, highlight=False))
    except PreflightError:
        raise typer.Exit(2) from None
    return api


def _check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise UserError(f"--format: '{fmt}' is not one of {', '.join(FORMATS)}.")


def _psycopg_error() -> type[Exception]:
    """psycopg's base error, once psycopg is imported (nothing raises one before): pglab starts without it."""
    psycopg = sys.modules.get("psycopg")
    return psycopg.Error if psycopg is not None else LabError


def main() -> None:
    try:
        rc = app(prog_name="pglab", standalone_mode=False)  # click returns typer.Exit's code instead of raising it here
        sys.exit(rc if isinstance(rc, int) else 0)
    except PlanError as exc:
        for line in exc.problems:
            err.print(line, markup=False, highlight=False)
        sys.exit(2)
    except UserError as exc:
        err.print(f"error: {exc}", markup=False, highlight=False)
        sys.exit(2)
    except (LabError, LabUnsound, NoSpace, PgbenchError, FioError, _psycopg_error()) as exc:
        # not the user's input, but still no traceback: the tool's own words and a non-zero exit
        err.print(f"error: {str(exc).strip()}", markup=False, highlight=False)
        sys.exit(1)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        sys.exit(130)
    except Exception as exc:
        # usage errors of the command-line parser (typer vendors click, so match by shape, not by class)
        show = getattr(exc, "show", None)
        if callable(show) and hasattr(exc, "exit_code"):
            show()
            sys.exit(2)
        raise


if __name__ == "__main__":
    main()
