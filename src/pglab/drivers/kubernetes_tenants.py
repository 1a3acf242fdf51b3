"""Tenants on Kubernetes: a CloudNativePG Cluster per tenant, every tenant's pgbench Job started in the same window.

Each arrangement × repeat is one run, recorded in the same tables, names and files as a local tenants run
(``drivers.tenants``). What is built, measured and read, and how (the common start, each tenant's primary's figures
from Prometheus, its WAL and checkpoint counters, its statements and parameters): docs/kubernetes.md, "Tenants: a
Cluster per tenant". Not measured here (yet): the standbys' figures, the exporters' figures, and any CPU, memory or
disk figure without a Prometheus.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pglab import interrupts
from pglab.artifacts import write_json
from pglab.drivers.kubernetes import KubernetesDriver, _job_failure
from pglab.drivers.kubernetes_figures import Figures
from pglab.drivers.tenants import statements_record, tier_metrics
from pglab.engine.driver import FioMeasurement, MeasuredRun, SweepInfo
from pglab.engine.types import Event, Observer, RunFailed, RunResult, TenantFigure
from pglab.errors import last_words
from pglab.plan.expand import Point
from pglab.plan.schema import Arrangement, Plan
from pglab.probes.base import now
from pglab.targets.kubernetes import pgstats, prometheus, statements
from pglab.targets.kubernetes.orchestrate import POSTGRES_CONTAINER, JobOutcome, K8sError, Orchestrator
from pglab.targets.kubernetes.prometheus import PrometheusError
from pglab.targets.kubernetes.render import (
    Manifest,
    cluster,
    fio_manifests,
    fio_volumes,
    monitoring_queries,
    namespace,
    pgbench_init,
    target_of,
    to_yaml,
)
from pglab.targets.kubernetes.tenants import (
    K8sTenant,
    PrimaryFigures,
    cpu_cores,
    mark_shared,
    primary_figures,
    tenant_point,
    tenant_run,
    tenants_of,
)
from pglab.workloads.pgbench import PgbenchError, PgbenchRun, pgbench_metrics, pgbench_series

START_MARGIN_S = 10.0  # from the first run Job's creation to the common start: pods scheduled and started
START_PER_TENANT_S = 1.0  # … and this much more per tenant (each Job is one API call, each pod one start)


class KubernetesTenantsDriver(KubernetesDriver):
    """The tenants of the current arrangement, each a Cluster with its own Orchestrator (which deletes what it made);
    the namespaces are made (and deleted last) by one Orchestrator each."""

    def __init__(self, plan: Plan, plan_text: str, plan_dir: Path, results_dir: Path, ui: Observer,
                 **kw: Any) -> None:
        super().__init__(plan, plan_text, plan_dir, results_dir, ui, **kw)
        self.tenants: list[K8sTenant] = []
        self._orchs: dict[str, Orchestrator] = {}  # tenant → its Orchestrator
        self._namespaces: dict[str, Orchestrator] = {}  # namespace → the Orchestrator that made it
        self._arrangement: Arrangement | None = None
        self._figures: dict[str, Figures] = {}  # tenant → its volume probes (a pod's devices, probed once)

    def _orch_for(self, tenant: K8sTenant) -> Orchestrator:
        assert self.api is not None, "preflight() connects first"
        return Orchestrator(tenant.plan, self.plan_dir, self.api, poll_s=self.poll_s,
                            ready_timeout_s=self.ready_timeout_s, job_timeout_s=self.job_timeout_s, log=self.ui.log)

    # ------------------------------------------------------------ the sweep's steps
    def open(self, first: Point, with_storage: bool, resumed: bool) -> None:
        assert first.arrangement is not None
        self.current = first
        self._build(first.arrangement)

    def storage_phase(self, results_dir: Path) -> Iterator[FioMeasurement]:
        """fio on a PVC of each storage class the tiers' volumes use, in every arrangement (data, and WAL where a
        tier has a volume of its own; a class several tiers use, once), labelled ``<class>/<role>@<node>``: made in
        the namespace of the first tenant on that class, on the node of a current tenant's primary on that class
        (else another current tenant's primary's), where that tier's instances run; its host path too when given."""
        assert self.plan.tenants is not None and self._arrangement is not None
        arrangements = [self._arrangement, *(a for a in self.plan.tenants.arrangements if a is not self._arrangement)]
        volumes: dict[tuple[str, str | None], tuple[K8sTenant, list[str]]] = {}  # (role, class) → first tenant, tiers
        for arrangement in arrangements:
            for t in tenants_of(self.plan, arrangement):
                for key in _classes(t):
                    tiers = volumes.setdefault(key, (t, []))[1]
                    tiers += [] if t.tier.name in tiers else [t.tier.name]
        for index, ((role, storage_class), (t, tiers)) in enumerate(volumes.items(), 1):
            manifests = fio_manifests(t.plan)
            (job,) = [m for m in manifests if m.kind == "Job" and m.body["metadata"]["annotations"]["pglab/volume"]
                      == role]
            (claim,) = [m for m in manifests if m.kind == "PersistentVolumeClaim" and m.name == job.name]
            volume = f"{storage_class or 'default'}/{role}"
            node = self._node_of(role, storage_class)
            if t.namespace not in self._namespaces:  # a later arrangement's: made now, deleted with the others
                self._namespaces[t.namespace] = orch = self._orch_for(t)
                orch.create(namespace(t.plan))
            self.ui.log(f"storage: the {volume} volume, as tiers {', '.join(tiers)} have it")
            # through the namespace's Orchestrator: a volume left by a failed fio goes with it at the end
            yield from self.fio_volume(self._namespaces[t.namespace], claim, job, node, index, volume, storage_class,
                                       results_dir / "storage" / volume / node)

    def _node_of(self, role: str, storage_class: str | None) -> str:
        """The node of the primary of the first current tenant whose ``role`` volume is of ``storage_class``, else
        of the first current tenant's primary that is on a node."""
        for t in [t for t in self.tenants if (role, storage_class) in _classes(t)] + self.tenants:
            orch = self._orchs[t.name]
            primary = str(orch.cluster_status().get("currentPrimary") or "")
            for pod in orch.instance_pods():
                if pod.metadata.name == primary and pod.spec is not None and pod.spec.node_name:
                    return str(pod.spec.node_name)
        raise K8sError(f"no tenant's primary is on a node to measure the {storage_class or 'default'} class on")

    def load_dataset(self) -> None:
        """pgbench -i in every tenant's Cluster at once: one Job each, all created, then each waited for."""
        ds = self.plan.dataset
        self.ui.log(f"loading the dataset into {len(self.tenants)} tenants: pgbench -i -s {ds.scale}, at once")
        started = time.monotonic()
        jobs = [(t, pgbench_init(t.plan)) for t in self.tenants]
        for t, m in jobs:
            self._orchs[t.name].create(m)
        failed = []
        for t, m in jobs:
            outcome = self._orchs[t.name].finish_job(m, self.results_dir / "dataset" / t.name)
            if not outcome.succeeded:
                failed.append(f"tenant {t.name} ({t.tier.name}): pgbench -i failed in Job/{m.name}: "
                              f"{last_words(outcome.log)}")
        if failed:
            raise PgbenchError("; ".join(failed))
        self.ui.log(f"datasets loaded in {time.monotonic() - started:.1f} s (pods' start included)")

    def before_run(self, point: Point) -> None:
        """A new arrangement: the last one's Clusters deleted with their claims, the new ones made and loaded."""
        assert point.arrangement is not None
        if self._arrangement is not None and point.arrangement.name == self._arrangement.name:
            return
        started = time.monotonic()
        self._teardown()
        self.current = point
        self._build(point.arrangement)
        self.load_dataset()
        self._events.append((now(), "arrangement", f"{point.arrangement.name}: {len(self.tenants)} Clusters made "
                             f"and loaded in {time.monotonic() - started:.1f} s"))

    def close(self, keep: bool) -> list[str]:
        problems: list[str] = []
        for name in list(self._orchs):
            problems += self._orchs.pop(name).cleanup()
        for ns in list(self._namespaces):
            self.ui.log(f"deleting namespace {ns}")
            problems += self._namespaces.pop(ns).cleanup()
        return problems

    # ------------------------------------------------------------ the tenants' Clusters
    def _orch_of(self, tenant: str) -> Callable[[], Orchestrator]:
        return lambda: self._orchs[tenant]

    def _build(self, arrangement: Arrangement) -> None:
        """Namespaces (as needed), every tenant's Cluster created, then each waited for until healthy."""
        self._arrangement = arrangement
        self.tenants = tenants_of(self.plan, arrangement)
        for t in self.tenants:
            if t.namespace not in self._namespaces:
                orch = self._orch_for(t)
                orch.create(namespace(t.plan))  # an existing namespace is used and left in place
                self._namespaces[t.namespace] = orch
        started = time.monotonic()
        self._figures = {t.name: Figures(t.plan, self._orch_of(t.name), self.results_dir, self.ui,
                                         self.figures.scrape_s, self.figures.prom) for t in self.tenants}
        for t in self.tenants:
            self._orchs[t.name] = orch = self._orch_for(t)
            for m in monitoring_queries(t.plan):  # the ConfigMap the tenant's Cluster names, in its namespace
                orch.create(m)
            orch.create(Manifest("10-cluster.yaml", cluster(t.plan, tenant_point(self.current, t.tier))))
        self.ui.log(f"arrangement {arrangement.name}: {len(self.tenants)} Clusters created ("
                    + ", ".join(f"{t.tier.name}: {t.cluster} in {t.namespace}" for t in self.tenants)
                    + "); waiting for them to be healthy")
        statuses = {t.name: self._orchs[t.name].wait_cluster_ready() for t in self.tenants}
        self.ui.log(f"{len(self.tenants)} Clusters healthy after {time.monotonic() - started:.1f} s")
        if self._info is None:
            first = statuses[self.tenants[0].name]
            env = self._environment(first)
            env["tenants"] = {t.name: {"tier": t.tier.name, "cluster": t.cluster, "namespace": t.namespace}
                              for t in self.tenants}
            self._info = SweepInfo(env, self.k8s.model_dump(mode="json"))

    def _teardown(self) -> None:
        """The arrangement's Clusters deleted, and waited for with their claims: the next one reuses the names."""
        for t in self.tenants:
            orch = self._orchs.pop(t.name)
            problems = orch.cleanup()
            if problems:
                raise K8sError(f"tenant {t.name}: {'; '.join(problems)}")
            orch.wait_cluster_gone(t.cluster)
        self.tenants = []

    # ------------------------------------------------------------ each tenant's primary's figures
    def primary_figures(self, windows: dict[str, tuple[float, float]], dirs: dict[str, Path]
                        ) -> dict[str, PrimaryFigures]:
        """Each tenant's primary's CPU, memory and disk figures over its own window (``primary_figures``), once
        Prometheus stored its last scrapes (``lag``); the series used kept in tenants/<tenant>/prometheus/. A tenant
        Prometheus or the API cannot answer for has none (said once per sweep), never a failed run."""
        prom = self.figures.prom
        if not self.plan.probes.enabled:
            return {}
        if prom is None:
            self._tell_system("they are read from the cluster's Prometheus: give target.kubernetes.prometheus")
            return {}
        cfg = prom.cfg
        lag = cfg.lag if cfg.lag is not None else 2 * cfg.interval + 1
        if windows and (wait := max(end for _, end in windows.values()) + lag - now()) > 0:
            interrupts.sleep(wait)
        out: dict[str, PrimaryFigures] = {}
        for t in self.tenants:
            if t.name not in windows:
                continue
            try:
                orch = self._orchs[t.name]
                primary = str(orch.cluster_status().get("currentPrimary") or "")
                pod = next((p for p in orch.instance_pods() if p.metadata.name == primary and p.spec is not None
                            and p.spec.node_name), None)
                if pod is None:
                    self._tell_system(f"tenant {t.name}: its primary {primary or '?'} is not among its running "
                                      "instance pods")
                    continue
                volumes = self._figures[t.name]._volumes([pod])
                figures = primary_figures(prom, t.namespace, primary, pod.spec.node_name, POSTGRES_CONTAINER,
                                          windows[t.name], volumes, cpu_cores(target_of(t.plan).resources.cpu))
            except (K8sError, PrometheusError) as exc:
                self._tell_system(f"tenant {t.name}: {exc}")
                continue
            folder = dirs[t.name] / "prometheus"
            folder.mkdir(parents=True, exist_ok=True)
            for name, series in figures.raw.items():
                write_json(folder / f"{name}.json", prometheus.to_json(series))
            out[t.name] = figures
        mark_shared(out)
        return out

    def _tell_system(self, why: str) -> None:
        self.figures.once.say("tenants' figures", f"tenants' CPU, memory and disk figures: {why.rstrip('.')} (none "
                              "stored for such tenants, not zeros)")

    # ------------------------------------------------------------ one run: every tenant at once
    def start_run(self, point: Point, repeat: int, run_id: str, run_dir: Path) -> KubernetesTenantsRun:
        """Every tenant's run Job created back to back, all held to one start time; each one's files parsed as a
        one-Cluster run's (``collect``); a tenant's failure fails the run."""
        return KubernetesTenantsRun(self, point, repeat, run_dir)


class KubernetesTenantsRun(MeasuredRun):
    """One run of every tenant's Job at once (:func:`pglab.engine.run.measure`); no probes of its own yet."""

    load_phase = "job"

    def __init__(self, driver: KubernetesTenantsDriver, point: Point, repeat: int, run_dir: Path):
        assert point.arrangement is not None
        self.d, self.point, self.arrangement, self.repeat = driver, point, point.arrangement, repeat
        self.dirs = {t.name: run_dir / "tenants" / t.name for t in driver.tenants}
        self.run_dir = run_dir

    def prepare(self) -> None:
        tenants = self.d.tenants
        self.start_at = math.ceil(time.time() + START_MARGIN_S + START_PER_TENANT_S * len(tenants))
        self.jobs = [(t, tenant_run(t, self.point, self.repeat, self.start_at)) for t in tenants]

    def measure(self) -> None:
        orchs = self.d._orchs
        self.launched = now()
        created: list[tuple[K8sTenant, Manifest]] = []
        try:
            for t, m in self.jobs:
                self.dirs[t.name].mkdir(parents=True, exist_ok=True)
                (self.dirs[t.name] / "job.yaml").write_text(to_yaml(m.body))
                orchs[t.name].create(m)
                created.append((t, m))
            self.outcomes: dict[str, JobOutcome] = {}
            for t, m in self.jobs:
                self.outcomes[t.name] = orchs[t.name].finish_job(m, self.dirs[t.name])
        finally:
            for t, m in created:
                orchs[t.name].discard(m)
        self.ended = now()

    def summarize(self) -> RunResult:
        jobs, dirs, outcomes = self.jobs, self.dirs, self.outcomes
        failed: list[str] = []
        for t, m in jobs:  # first: a parameter the tenant's primary did not run with fails its Job, named
            try:
                self.d._check_settings(dirs[t.name], tenant_point(self.point, t.tier), m.name)
            except RunFailed as exc:
                failed.append(f"tenant {t.name} ({t.tier.name}): {exc}")
        failed += [f"tenant {t.name} ({t.tier.name}): {_job_failure(outcomes[t.name], dirs[t.name])}"
                   for t, _ in jobs if not outcomes[t.name].succeeded and not any(
                       f.startswith(f"tenant {t.name} ") for f in failed)]
        if failed:
            raise RunFailed("; ".join(failed))
        results: dict[str, PgbenchRun] = {}
        for t, m in jobs:
            try:
                results[t.name], _, _ = self.d.collect(dirs[t.name], m, self.launched, self.ended)
            except PgbenchError as exc:
                failed.append(f"tenant {t.name} ({t.tier.name}): {exc}")
        if failed:
            raise RunFailed("; ".join(failed))
        starts = [r.window_start for r in results.values()]
        ends = [r.window_end for r in results.values()]
        window = (min(starts), max(ends))
        rows: list[TenantFigure] = []
        per: dict[str, tuple[str, dict[str, float | None]]] = {}
        system = self.d.primary_figures({n: (r.window_start, r.window_end) for n, r in results.items()}, dirs)
        # each tenant's primary's WAL, checkpoints and backend writes, as its Job read them around its window
        why = {t.name: w for t in self.d.tenants if (w := pgstats.record(dirs[t.name])) is not None}
        for t in self.d.tenants:
            figures = pgbench_metrics(results[t.name])
            if t.name in system:
                figures.update(system[t.name].metrics)
            if t.name in why:
                figures.update(why[t.name][0])
            per[t.name] = (t.tier.name, figures)
            rows += [(t.name, t.tier.name, k, v) for k, v in figures.items()]
        plan = self.d.plan
        metrics: dict[str, float | None] = {
            "tps": sum(f["tps"] or 0.0 for _, f in per.values()),
            "tenants": float(len(self.d.tenants)),
            "instances": float(len(self.d.tenants) * (plan.tenants.instances if plan.tenants else 1)),
            # how far apart the tenants' windows began, and how long all of them ran together
            "start_spread_s": max(starts) - min(starts),
            "common_window_s": max(0.0, min(ends) - max(starts)),
        }
        if cores := [c for _, f in per.values() if (c := f.get("cpu_cores")) is not None]:
            metrics["tenants_cpu_cores"] = sum(cores)  # every tenant's primary's container, added up
        for tier in self.arrangement.tiers:
            metrics.update(tier_metrics(tier, [f for tier_name, f in per.values() if tier_name == tier.name]))
        if why:  # every tenant's counts added up, as a local tenants run's host figures
            metrics.update(pgstats.summed(w[2] for w in why.values()))
        series = [pt for name, res in results.items()
                  for pt in pgbench_series(res, f"tenant:{name}", ("tps", "latency_ms"))]
        series += [(ts, f"tenant:{name}", metric, value) for name, f in system.items()
                   for ts, _, metric, value in f.series]
        record: dict[str, Any] = {
            "start_at": self.start_at,
            "tenants": {t.name: {"tier": t.tier.name, "cluster": t.cluster, "namespace": t.namespace,
                                 "job": m.name, "command": results[t.name].command,
                                 "window": [results[t.name].window_start, results[t.name].window_end],
                                 **per[t.name][1],
                                 **({"primary_figures": system[t.name].info} if t.name in system else {}),
                                 **({"pgstats": why[t.name][1]} if t.name in why else {})}
                        for t, m in jobs}}
        # what each tenant's Job read of pg_stat_statements (where loaded): tenants/<tenant>/statements.json
        summaries = {t.name: s for t in self.d.tenants if (s := statements.record(dirs[t.name]).get("statements"))}
        record.update(statements_record(summaries))
        write_json(self.run_dir / "tenants.json", record)
        events: list[Event] = []
        if metrics["start_spread_s"] and metrics["start_spread_s"] > 2:
            events.append((now(), "tenants-start-spread", f"the tenants' windows began {metrics['start_spread_s']:.1f}"
                           " s apart (a pod started after the common start)"))
        return RunResult.of(window, metrics, series=series, events=events, tenants=rows, record=record)


def _classes(tenant: K8sTenant) -> list[tuple[str, str | None]]:
    """(role, storage class) of each volume of the tenant that the storage phase measures."""
    return [(role, v.storage_class) for role, v in fio_volumes(tenant.plan)]
