"""The driver of a tenants plan: every tenant's own pgbench at once, in the same window, per tenant and per tier.

Each arrangement × repeat is one run. What it records per tenant (``tenant_metrics``), per tier and per host
(``run_metrics``), and from where: docs/methodology.md, "Many tenants on one host"; the tenants' WAL, checkpoint
and backend-write figures come from a pg probe per tenant, their statements from each one's server
(``tenants/<tenant>/statements.json``).
"""

from __future__ import annotations

import contextlib
import shutil
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pglab.artifacts import write_json, write_samples
from pglab.drivers.local import MIB, ProcessDriver, close_window, watch
from pglab.engine.driver import MeasuredRun
from pglab.engine.types import Event, Observer, RunFailed, RunResult, TenantFigure
from pglab.plan.expand import Point
from pglab.plan.schema import Plan, Tier
from pglab.probes import CpuProbe, DiskProbe, MemoryProbe, PgStatsProbe, Probe, ProbeContext, Sample, Sampler
from pglab.probes._util import rows_in_window
from pglab.probes.base import now
from pglab.probes.pgstats import why_figures
from pglab.probes.statements import StatementsWindow
from pglab.targets.local.fleet import Fleet, Tenant
from pglab.workloads import pgbench
from pglab.workloads.pgbench import PgbenchError, PgbenchProcess, ProgressPoint, pgbench_metrics, pgbench_series


class TenantsDriver(ProcessDriver[Fleet]):
    """A fleet of local labs, one per tenant of the current arrangement."""

    def __init__(self, plan: Plan, plan_dir: Path, plan_text: str, results_dir: Path, fleet: Fleet, ui: Observer):
        super().__init__(plan, plan_dir, plan_text, results_dir, fleet, ui)
        self.fleet = fleet
        self._running: dict[str, PgbenchProcess] = {}

    def open(self, first: Point, with_storage: bool, resumed: bool) -> None:
        assert first.arrangement is not None
        self.fleet.use(first.arrangement)  # the fleet of the first arrangement to run
        super().open(first, with_storage, resumed)

    def _stop_pgbench(self) -> None:
        for proc in self._running.values():
            proc.stop()
        self._running.clear()
        super()._stop_pgbench()

    def start_run(self, point: Point, repeat: int, run_id: str, run_dir: Path) -> TenantsRun:
        """Every tenant at once; a tenant's failure fails the run, its server logs kept beside its output."""
        return TenantsRun(self, point, run_dir)

    def _all_at_once(self, dirs: dict[str, Path], name: str, seconds: float | None, transactions: int | None,
                     log: bool) -> tuple[dict[str, int], dict[str, float]]:
        """Start every tenant's pgbench, wait for all; their summed progress feeds the live display. Returns
        each tenant's exit code, and its server memory (PSS bytes) sampled half-way through, every client
        connected."""
        fleet, running = self.fleet, self._running
        first = fleet.tenants[0].name
        latest: dict[str, float] = {}

        def progress_of(tenant: str) -> Callable[[ProgressPoint], None]:
            def seen(p: ProgressPoint) -> None:  # the live display shows the host's TPS, once a second
                latest[tenant] = p.tps
                if tenant == first:
                    self.ui.progress(ProgressPoint(p.ts, sum(latest.values()), None, None, None, None))
            return seen

        for t in fleet.tenants:
            user = t.lab.plan_code_user()
            scripts, log_prefix = pgbench.stage_scripts(t.tier.workload, self.plan_dir, dirs[t.name], user is not None)
            args = pgbench.run_args(fleet.bindir, t.tier.workload, t.tier.clients, t.tier.jobs,
                                    self.plan.run, scripts, seconds=seconds, transactions=transactions,
                                    log_prefix=log_prefix if log else None)
            running[t.name] = PgbenchProcess(args, t.lab.endpoints().primary, dirs[t.name], name,
                                             on_progress=progress_of(t.name), run_as=user)
        memory_at = time.monotonic() + (seconds or 0) / 2
        memory: dict[str, float] = {}

        def sample_memory() -> None:  # half-way through, every client connected
            nonlocal memory
            if not memory and time.monotonic() >= memory_at:
                memory = fleet.memory()

        def stuck(names: list[str], late: float) -> str:
            return f"pgbench of tenant(s) {', '.join(names)} did not end {late:.0f} s after its {seconds:g} s"

        codes = watch(running, name, seconds, fleet.health, self.ui.log, stuck, tick=sample_memory,
                      overrun_s=self.plan.run.overrun_s(seconds) if seconds else None)
        if name == "warmup":
            bad = [t for t, rc in codes.items() if rc != 0]
            running.clear()
            if bad:
                raise PgbenchError(f"warm-up pgbench of tenant(s) {', '.join(bad)} failed")
        return codes, memory or fleet.memory()


class TenantsRun(MeasuredRun):
    """One run of every tenant of an arrangement at once, step by step (:func:`pglab.engine.run.measure`)."""

    def __init__(self, driver: TenantsDriver, point: Point, run_dir: Path):
        assert point.arrangement is not None
        self.d, self.fleet, self.point, self.arrangement, self.run_dir = driver, driver.fleet, point, \
            point.arrangement, run_dir
        self.warmup_s = driver.plan.run.warmup
        self.dirs: dict[str, Path] = {}
        self.sampler: Sampler | None = None
        self.pg: dict[str, TenantPgProbe] = {}  # each tenant's primary, by tenant
        self.statements: dict[str, StatementsWindow] = {}
        self.settings: dict[str, object] = {}
        self.events: list[Event] = []
        self.samples: list[Sample] = []

    def prepare(self) -> None:
        fleet = self.fleet
        fleet.use(self.arrangement)
        fleet.provision(dict(self.d.plan.postgres.parameters))
        self.d._events += fleet.take_events()
        if problem := fleet.health():
            raise RunFailed(problem)
        write_json(self.run_dir / "limits.json", fleet.limits_in_force())
        self.dirs = {t.name: self.run_dir / "tenants" / t.name for t in fleet.tenants}

    def reset(self) -> None:
        for t in self.fleet.tenants:
            self.dirs[t.name].mkdir(parents=True)
            self.d.prepare_dataset(t.lab, t.lab.endpoints(), self.dirs[t.name])
        self.d._events += [e for t in self.fleet.tenants for e in t.lab.take_events()]

    def start_probes(self) -> None:
        fleet, running = self.fleet, self.d._running
        self.settings = self.d.settings(fleet.tenants[0].lab.endpoints(), self.run_dir)
        ctx = ProbeContext(primary_conninfo=fleet.tenants[0].lab.endpoints().primary.conninfo(),
                           paths=fleet.probe_paths(), server_pids=fleet.server_pids,
                           client_pids=lambda: [p.pid for p in running.values()])
        probes: list[Probe] = [DiskProbe(ctx), CpuProbe(ctx), MemoryProbe(ctx)] if self.d.plan.probes.enabled else []
        if self.d.plan.probes.enabled:  # each tenant's own server: its WAL, checkpoints, statements
            for t in fleet.tenants:
                conninfo = t.lab.endpoints().primary.conninfo(application_name="pglab-probe")
                self.pg[t.name] = TenantPgProbe(ProbeContext(conninfo), t.name)
                self.statements[t.name] = StatementsWindow(conninfo, create=True)  # pglab owns the tenants' labs
        self.sampler = Sampler([*probes, *self.pg.values()])
        self.sampler.start()
        for window in self.statements.values():
            window.open()

    def warm_up(self) -> None:
        self.events.append((now(), "warmup-start", f"{self.warmup_s:g} s"))
        self.d._all_at_once(self.dirs, "warmup", self.warmup_s, None, log=False)
        self.events.append((now(), "warmup-end", ""))

    def measure(self) -> None:
        run = self.d.plan.run
        for window in self.statements.values():  # every tenant's, before any measured pgbench starts
            window.start(now())
        self.before, self.launched = self.fleet.usage(), now()
        self.codes, self.memory = self.d._all_at_once(self.dirs, "pgbench", run.measured_seconds, run.transactions,
                                                      log=True)
        self.after, self.ended = self.fleet.usage(), now()
        for window in self.statements.values():
            window.end(now())

    def close_probes(self) -> None:
        assert self.sampler is not None
        self.samples = close_window(self.sampler, self.ended)

    def summarize(self) -> RunResult:
        fleet, plan, run_dir, sampler = self.fleet, self.d.plan, self.run_dir, self.sampler
        assert sampler is not None
        results: dict[str, pgbench.PgbenchRun] = {}
        failed: list[str] = []
        for t in fleet.tenants:
            proc = self.d._running.pop(t.name)
            try:
                results[t.name] = pgbench.finish_run(proc, self.codes[t.name], self.dirs[t.name] / "pgbench_log",
                                                     self.launched, self.ended)
            except PgbenchError as exc:
                failed.append(f"tenant {t.name} ({t.tier.name}): {exc}")
        if failed:
            raise RunFailed("; ".join(failed))
        window = (min(x.window_start for x in results.values()), max(x.window_end for x in results.values()))
        instances = plan.tenants.instances if plan.tenants else 1
        rows, per_tenant = _tenant_rows(fleet.tenants, results, self.before, self.after, self.memory,
                                        self.ended - self.launched, instances)
        why = {name: probe.figures(self.samples, *window) for name, probe in self.pg.items()}
        for name, figures in why.items():  # the tenant's own server's figures, in its rows
            tier = per_tenant[name][0]
            per_tenant[name][1].update(figures)
            rows += [(name, tier, k, v) for k, v in figures.items()]
        metrics = _aggregates(self.point, fleet.tenants, per_tenant, instances)
        metrics.update(sampler.summarize(*window))
        metrics.update(host_why(self.samples, list(self.pg), *window))
        statements: dict[str, dict[str, Any]] = {}
        errors = list(sampler.errors)
        for name, statements_window in self.statements.items():
            if summary := statements_window.write(self.dirs[name]):
                statements[name] = summary
            errors += [f"tenant {name}: {e}" for e in statements_window.errors]
        if errors:
            (run_dir / "probe-errors.txt").write_text("\n".join(errors) + "\n")
        series = [pt for name, res in results.items()
                  for pt in pgbench_series(res, f"tenant:{name}", ("tps", "latency_ms"))]
        series += [(s.ts, s.source, s.metric, s.value) for s in self.samples]
        write_samples(run_dir / "probes.csv", self.samples)
        _keep_server_logs(fleet, self.dirs)
        return RunResult.of(window, metrics, series=series, events=self.events, settings=self.settings,
                            tenants=rows,
                            record={"tenants": {n: {"tier": t, "command": results[n].command, **m}
                                                for n, (t, m) in per_tenant.items()},
                                    **statements_record(statements)})

    def end(self, failure: BaseException | None) -> None:
        if failure is None:
            return
        self.d._stop_pgbench()
        if self.sampler:
            self.sampler.stop()
        for window in self.statements.values():
            window.close()
        if isinstance(failure, self.d.run_errors):
            _keep_server_logs(self.fleet, self.run_dir / "tenants")


class TenantPgProbe(PgStatsProbe):
    """One tenant's pg probe: its primary's counters (WAL, checkpoints, buffers written by backends), its samples
    under ``pg:<tenant>``. Its figures are the tenant's (:meth:`figures`, into the tenant's rows), not the host's:
    the sampler's summary gets none of them."""

    def __init__(self, ctx: ProbeContext, tenant: str):
        super().__init__(ctx)
        self.name = f"pg:{tenant}"

    def sample(self, ts: float) -> list[Sample]:
        return [Sample(s.ts, self.name, s.metric, s.value) for s in super().sample(ts)]

    def summarize(self, samples: Sequence[Sample], start: float, end: float) -> dict[str, float]:
        return {}

    def figures(self, samples: Sequence[Sample], start: float, end: float) -> dict[str, float]:
        """The tenant's figures over the window, as a single lab's pg probe gives them."""
        return super().summarize([s for s in samples if s.source == self.name], start, end)


def host_why(samples: Sequence[Sample], tenants: list[str], start: float, end: float) -> dict[str, float]:
    """The host's WAL and buffer figures: every tenant's counts over the window summed, WAL and full-page images
    per commit as ratios of the sums (each tenant's rows chosen as its own figures choose them)."""
    sources = {f"pg:{t}" for t in tenants}
    return why_figures([r for t in sources
                        for r in rows_in_window([s for s in samples if s.source == t], start, end, rate=True)])


def _keep_server_logs(fleet: Fleet, dirs: dict[str, Path] | Path) -> None:
    """Each tenant's server logs beside its pgbench output: an arrangement's tenants are gone before the sweep
    ends (the next arrangement gets new ones), so the runner's end-of-sweep copy would miss them."""
    for t in fleet.tenants:
        dest = dirs[t.name] if isinstance(dirs, dict) else dirs / t.name
        with contextlib.suppress(OSError):
            dest.mkdir(parents=True, exist_ok=True)
            for node, path in t.lab.server_logs().items():
                shutil.copyfile(path, dest / f"server-{node}.log")


def _tenant_rows(tenants: list[Tenant], results: dict[str, pgbench.PgbenchRun],
                 before: dict[str, dict[str, float]], after: dict[str, dict[str, float]], memory: dict[str, float],
                 seconds: float, instances: int) -> tuple[list[TenantFigure],
                                                          dict[str, tuple[str, dict[str, float | None]]]]:
    rows: list[TenantFigure] = []
    per: dict[str, tuple[str, dict[str, float | None]]] = {}
    for t in tenants:
        m = pgbench_metrics(results[t.name])
        b, a = before.get(t.name, {}), after.get(t.name, {})
        if seconds > 0:
            for key, out, scale in (("cpu_s", "cpu_cores", 1.0), ("read_ios", "read_iops", 1.0),
                                    ("write_ios", "write_iops", 1.0), ("read_bytes", "read_mb_s", MIB),
                                    ("write_bytes", "write_mb_s", MIB)):
                if key in a and key in b:
                    m[out] = (a[key] - b[key]) / seconds / scale
        if "read_iops" in m and "write_iops" in m:
            m["total_iops"] = (m["read_iops"] or 0) + (m["write_iops"] or 0)
        if t.name in memory:
            m["memory_mb"] = memory[t.name] / MIB
            m["memory_per_instance_mb"] = memory[t.name] / MIB / instances
        per[t.name] = (t.tier.name, m)
        rows += [(t.name, t.tier.name, k, v) for k, v in m.items()]
    return rows, per


def _aggregates(point: Point, tenants: list[Tenant], per: dict[str, tuple[str, dict[str, float | None]]],
                instances: int) -> dict[str, float | None]:
    """Host totals, and per tier: mean per tenant, spread between its tenants (fairness)."""
    assert point.arrangement is not None
    out: dict[str, float | None] = {}
    tps = [m["tps"] or 0.0 for _tier, m in per.values()]
    out["tps"] = sum(tps)
    out["tenants"] = float(len(tenants))
    out["instances"] = float(len(tenants) * instances)
    mem = [m["memory_per_instance_mb"] for _tier, m in per.values() if m.get("memory_per_instance_mb") is not None]
    if mem:
        out["memory_per_instance_mb"] = statistics.fmean(v for v in mem if v is not None)
    for key in ("read_iops", "write_iops", "cpu_cores"):  # from the tenants' cgroups; the disk probe adds its own
        vals = [v for _tier, m in per.values() if (v := m.get(key)) is not None]
        if vals:
            out[f"tenants_{key}"] = sum(vals)
    for tier in point.arrangement.tiers:
        out.update(tier_metrics(tier, [m for tname, m in per.values() if tname == tier.name]))
    return out


def statements_record(summaries: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """run.json's entry for the tenants' statements, on every target: each tenant's summary of the
    tenants/<tenant>/statements.json written for it (``probes.statements.write_statements``), under
    ``statements.tenants``; nothing when no tenant has one."""
    tenants = {name: {**s, "file": f"tenants/{name}/{s['file']}"} for name, s in summaries.items()}
    return {"statements": {"tenants": tenants}} if tenants else {}


def tier_metrics(tier: Tier, members: list[dict[str, float | None]]) -> dict[str, float | None]:
    """``tier.<name>.<metric>``: the tier's per-tenant means, and its fairness (how far apart its tenants are)."""
    p = f"tier.{tier.name}."
    out: dict[str, float | None] = {p + "tenants": float(len(members))}
    for key in ("tps", "latency_avg_ms", "latency_p95_ms", "latency_p99_ms", "total_iops", "cpu_cores",
                "memory_per_instance_mb"):
        vals = [float(v) for m in members if (v := m.get(key)) is not None]
        if vals:
            out[p + key] = statistics.fmean(vals)
    tps = [float(m.get("tps") or 0.0) for m in members]
    if len(tps) > 1 and statistics.fmean(tps) > 0:
        out[p + "tps_min"], out[p + "tps_max"] = min(tps), max(tps)
        out[p + "tps_spread_pct"] = (max(tps) - min(tps)) / statistics.fmean(tps) * 100
    return out
