"""The Kubernetes driver: a CloudNativePG Cluster, Jobs and long-lived client pods underneath the engine's sweep.

The results folder, its rows and its resume rules are the engine's, as for every target, so ``pglab report`` and
``compare`` read a Kubernetes sweep unchanged. What differs is where the figures come from: every Job ships its
files back through its pod's log (``Orchestrator.run_job``), the dataset's and every run's script exec'd in the
client pods through its output (``run_in_clients``), and they are parsed here with the functions a local run uses
(pgbench's summary, progress lines and per-transaction log; fio's JSON and per-second logs). Whatever pglab
created in the cluster is deleted at the end, also after a failure, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import math
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.rest import ApiException
from kubernetes.config.config_exception import ConfigException

from pglab import __version__, interrupts
from pglab.artifacts import write_json
from pglab.drivers.fio import host_directory, job_results
from pglab.drivers.kubernetes_figures import Figures, Probe, Readers
from pglab.engine.driver import FioMeasurement, MeasuredRun, SweepInfo, load_summary_modules
from pglab.engine.types import Event, Observer, RunFailed, RunResult
from pglab.errors import UserError, first_line, last_words
from pglab.plan.expand import Point, expand
from pglab.plan.schema import Plan
from pglab.probes.base import now
from pglab.scenarios.witness import evaluate
from pglab.targets.kubernetes import exporter, prometheus, statements
from pglab.targets.kubernetes.clients import client_pods, pools_apart, run_command
from pglab.targets.kubernetes.orchestrate import (
    POLL_S,
    POSTGRES_CONTAINER,
    Exec,
    JobOutcome,
    K8sError,
    LoadOutcome,
    Orchestrator,
    api_client,
    extract_results,
)
from pglab.targets.kubernetes.prometheus import PrometheusError
from pglab.targets.kubernetes.render import (
    LOAD_DIR,
    Manifest,
    client_cores,
    cluster,
    cluster_patch,
    cpu_quantity,
    fio_on_host,
    fio_on_node,
    fio_volumes,
    instance_parameters,
    instance_resources,
    load_shares,
    millicores,
    pgbench_init,
    pgbench_run,
    render,
    storage_volumes,
    target_of,
    to_yaml,
    with_storage,
    witness_job,
)
from pglab.targets.kubernetes.scenario import Injector, WitnessLogError, parse_witness_log
from pglab.targets.kubernetes.scripts import (
    RESULTS_DIR,
    SETTINGS_FILE,
    SETTINGS_WAIT_S,
    VOLUME_MOUNT_FILE,
    WITNESS_STOP,
)
from pglab.workloads import fio
from pglab.workloads.fio import FioError
from pglab.workloads.pgbench import PgbenchError, PgbenchRun, pgbench_metrics, pgbench_series

SCENARIO_TIMEOUT_S = 300.0  # from a fault (or a fenced standby let go) to a healthy Cluster again
RUN_OVERHEAD_S = 4.0  # the replay check, the exec's start, the files read back: for the ETA only (a scenario
# run's Job adds its pod's start, about 10 s more)
REPLAY_TIMEOUT_S = 60.0  # before each run, for the standbys to replay what the last one wrote (as a local lab)


def connect(plan: Plan) -> client.ApiClient:
    """The plan's kubeconfig and context as an API client; a kubeconfig that cannot be used is the user's to fix."""
    k8s = target_of(plan)
    try:
        return api_client(plan)
    except (ConfigException, OSError, ValueError) as exc:
        where = k8s.kubeconfig or "$KUBECONFIG or ~/.kube/config"
        first = first_line(exc).rstrip(".")
        raise UserError(f"target.kubernetes.kubeconfig: cannot use {where}"
                        f"{' (context ' + k8s.context + ')' if k8s.context else ''}: {first}; point it at a "
                        "kubeconfig for the cluster to benchmark.") from None


class KubernetesDriver:
    """One sweep over one Orchestrator: what it creates, it deletes; each run's figures go back to the engine."""

    run_overhead_s = RUN_OVERHEAD_S
    run_errors: tuple[type[BaseException], ...] = (RunFailed, PgbenchError, K8sError, WitnessLogError, OSError)

    def __init__(self, plan: Plan, plan_text: str, plan_dir: Path, results_dir: Path, ui: Observer, *,
                 api: client.ApiClient | None = None, poll_s: float = POLL_S, ready_timeout_s: float = 1800.0,
                 job_timeout_s: float | None = None, scrape_s: float = 2.0,
                 scenario_timeout_s: float = SCENARIO_TIMEOUT_S):
        self.plan, self.plan_text, self.plan_dir, self.ui = plan, plan_text, plan_dir, ui
        self.results_dir = results_dir.resolve()
        self.manifests = render(plan, plan_dir)  # refusals (the plan, its script files) before anything exists
        self.api = api
        self.poll_s, self.ready_timeout_s, self.job_timeout_s = poll_s, ready_timeout_s, job_timeout_s
        self._orch: Orchestrator | None = None
        self.scenario_timeout_s = scenario_timeout_s  # from the fault (the fence lifted) to a healthy Cluster
        self._stop: str | None = None  # why the sweep cannot go on (a standby left fenced)
        self._replay_unknown = False  # the primary's exporter cannot say whether the standbys caught up
        self.replay_timeout_s = REPLAY_TIMEOUT_S
        self._events: list[Event] = []
        self._info: SweepInfo | None = None
        self._failed_health: str | None = None
        self.k8s = target_of(plan)
        self.points = expand(plan, cores=client_cores(self.k8s))  # the same points (and Job names) render made
        self.current: Point = self.points[0]  # the point the Cluster is shaped for (CPU step, parameters)
        self._load = plan.run.load_pods > 1  # each run over several pgbench pods
        self._clients: dict[str, str] = {}  # the long-lived client pods (pod → node), waited for at the dataset's load
        self._clients_made: list[Manifest] = []  # created (while the Cluster comes up), not yet waited for
        self._clients_since = 0.0  # when they were created
        self._coming = ComingUp(load=False)  # what began while the last Cluster came up (none yet)
        self._pools_apart = pools_apart(plan)  # client pods may start before the standbys have nodes
        self._sampler_asked = False  # the disk sampler's DaemonSet created (or refused)
        prom = (prometheus.Client(self.k8s.prometheus, plan_dir) if self.k8s.prometheus is not None
                else None)  # the figures' source instead of the samplers and exporter reads
        self.figures = Figures(plan, lambda: self.orch, self.results_dir, ui, scrape_s, prom)
        # what reads the runs' files (numpy, the log scanner) and the closing tables' intervals (scipy.special) load
        # while the Cluster comes up, not before it is asked for nor at the sweep's end
        self._summary_modules = threading.Thread(target=load_summary_modules, name="summary-modules", daemon=True)

    @property
    def orch(self) -> Orchestrator:
        assert self._orch is not None, "preflight() connects before anything is asked of the cluster"
        return self._orch

    # ------------------------------------------------------------ the sweep's steps
    def preflight(self) -> None:
        """Connect with the plan's kubeconfig (an unusable one is the user's to fix, in one sentence)."""
        if self.api is None:
            self.api = connect(self.plan)
        if (prom := self.figures.prom) is not None:
            try:
                self._prom_version = prom.version()
            except PrometheusError as exc:
                raise UserError(f"target.kubernetes.prometheus: {str(exc).rstrip('.')}; check url, "
                                "bearer_token_file and the TLS settings.") from None
        self._orch = Orchestrator(self.plan, self.plan_dir, self.api, poll_s=self.poll_s,
                                  ready_timeout_s=self.ready_timeout_s, job_timeout_s=self.job_timeout_s,
                                  log=self.ui.log)

    def open(self, first: Point, with_storage: bool, resumed: bool) -> None:
        """Namespace, RBAC, the Cluster (waited for until healthy), fio volumes, the scripts' ConfigMap."""
        self.figures.resumed()  # a resumed sweep's volume probes go beside the earlier ones
        self._summary_modules.start()
        self.current = first  # the first point to run (a resume may start further on) decides the Cluster's shape
        for m in self.manifests:
            if m.kind == "Job" or (m.kind == "PersistentVolumeClaim" and _component(m) == "fio"):
                continue  # the Jobs run later; fio's volumes are made per node by the storage phase
            if m.kind == "Cluster":
                m = Manifest(m.filename, cluster(self.plan, self.current))
            if m.kind == "DaemonSet":
                self._start_sampler()  # unless the dataset's load, begun while the Cluster came up, did
                continue
            self.orch.create(m)
            if m.kind == "Cluster":
                self.ui.log(f"waiting for Cluster/{m.name} to be healthy ({self.k8s.instances} instances)")
                self._coming = ComingUp(load=not with_storage)  # fio measures the volumes before any write
                status = self._wait_coming_up()
                self.ui.log(f"Cluster/{m.name} healthy, primary {status.get('currentPrimary', '?')}")
                self._info = SweepInfo(self._environment(status), self.k8s.model_dump(mode="json"))

    def describe(self) -> SweepInfo | None:
        """Known once the Cluster is healthy (kept also when a later object of ``open`` is refused)."""
        return self._info

    def before_run(self, point: Point) -> None:
        if self._stop:
            raise K8sError(self._stop)
        self._step_to(point)

    def health(self) -> str | None:
        """The Cluster's health when the last run failed, read before its fence was lifted or its witness went."""
        health, self._failed_health = self._failed_health, None
        return health

    def take_events(self) -> list[Event]:
        events, self._events = self._events, []
        return events

    def explain(self, exc: BaseException) -> BaseException | None:
        if isinstance(exc, urllib3.exceptions.HTTPError):
            return K8sError(f"the Kubernetes API server cannot be reached: {exc}")
        return None

    def close(self, keep: bool) -> list[str]:
        if self._orch is None:
            return []
        self.ui.log(f"deleting what pglab created in namespace {self.k8s.namespace}")
        return self.orch.cleanup()

    # ------------------------------------------------------------ between points
    def _step_to(self, point: Point) -> None:
        """Patch the Cluster into what ``point`` needs (CPU step, parameters) and wait for CloudNativePG's rollout.

        A CPU step is over when the operator reports the Cluster healthy again and every instance pod carries the
        new limits (the pods are recreated one by one, primary last). A parameter change is over when it is healthy
        again; the run's Job then waits out any pending restart and ships the settings it found, checked in
        ``_check_settings``. A rollout that does not end fails the sweep (the Cluster is in no known state)."""
        plan, before = self.plan, self.current
        if point.storage is not None and (before.storage is None or point.storage.name != before.storage.name):
            self._replace_cluster(point)  # a new Cluster is made as the point needs it: nothing to patch
            return
        cpus = point.cpus if point.cpus != before.cpus else None
        changed = {k: v for k, v in instance_parameters(plan, point).items()
                   if instance_parameters(plan, before).get(k) != v}
        if cpus is None and not changed:
            return
        what = (f"CPU step cpus={cpus:g}" if cpus is not None else
                "parameters " + ", ".join(f"{k}={v}" for k, v in changed.items()))
        self.ui.log(f"{what}: patching Cluster/{self.k8s.cluster_name} and waiting for the rolling update")
        kind = "cpu-step" if cpus is not None else "parameters-applied"
        try:
            self.orch.patch_cluster(cluster_patch(plan, point))
            self.current = point  # patched: the Cluster is no longer what ``before`` needed
            seconds = self.orch.wait_rollout(what, self._pods_have(cpus) if cpus is not None else None)
        except K8sError as exc:
            self._events.append((now(), f"{kind}-failed", str(exc)))
            raise
        detail = f"cpus={cpus:g}: rolling update took {seconds:.1f} s" if cpus is not None else \
            f"{', '.join(f'{k}={v}' for k, v in changed.items())}: applied in {seconds:.1f} s"
        if cpus is not None and changed:
            detail += f" (with {', '.join(f'{k}={v}' for k, v in changed.items())})"
        self._events.append((now(), kind, detail))
        self.ui.log(f"{what}: {detail.split(': ', 1)[1]}")

    def _replace_cluster(self, point: Point) -> None:
        """The storage axis: the Cluster of the last value is deleted with its volumes, one is made for ``point``'s
        value (its classes and sizes, the point's CPU and parameters), waited for until healthy, and the dataset
        loaded into it as into the first. One Cluster at a time: a single node holds one."""
        assert point.storage is not None
        name, value = self.k8s.cluster_name, point.storage.name
        classes = ", ".join(f"{role} on {c or 'the default class'}" for role, c in
                            storage_volumes(self.plan, point.storage).items())
        self.ui.log(f"storage {value}: replacing Cluster/{name} by one with {classes}")
        started = time.monotonic()
        try:
            self._drop_clients()  # their credentials are the old Cluster's: new pods for the new one
            old = next((m for m in self.orch.created if m.kind == "Cluster"), None)
            if old is not None:
                self.orch.discard(old)
            self.orch.wait_cluster_gone(name)
            self.current = point
            new = Manifest(old.filename if old is not None else "10-cluster.yaml", cluster(self.plan, point))
            self.orch.create(new)
            self._coming = ComingUp(load=True)
            status = self._wait_coming_up()
        except K8sError as exc:
            self._events.append((now(), "storage-switch-failed", f"{value}: {exc}"))
            raise
        seconds = time.monotonic() - started
        self.ui.log(f"Cluster/{name} healthy on storage {value} after {seconds:.1f} s, primary "
                    f"{status.get('currentPrimary', '?')}")
        self.load_dataset()
        self._events.append((now(), "storage-switch", f"{value}: new Cluster with {classes}, healthy and loaded in "
                             f"{time.monotonic() - started:.1f} s"))

    def _pods_have(self, cpus: float) -> Callable[[list[Any]], str | None]:
        """None once every instance pod (none of them being deleted) has the step's CPU as request and limit."""
        want = millicores(cpu_quantity(cpus))
        n = self.k8s.instances

        def check(pods: list[Any]) -> str | None:
            live = [p for p in pods if p.metadata.deletion_timestamp is None]
            done = 0
            for pod in live:
                res = next((c.resources for c in pod.spec.containers if c.name == POSTGRES_CONTAINER), None)
                limit, request = ((res.limits or {}).get("cpu"), (res.requests or {}).get("cpu")) if res else (None,
                                                                                                          None)
                done += bool(limit and request and millicores(limit) == millicores(request) == want)
            return None if done == n == len(live) else f"instance pods with cpu {cpu_quantity(cpus)}: {done} of {n}"

        return check

    def _environment(self, status: dict[str, Any]) -> dict[str, Any]:
        """What can be known from outside the pods: the API server's version, the operator's status, the image."""
        try:
            server: str | None = client.VersionApi(self.api).get_code().git_version
        except (ApiException, urllib3.exceptions.HTTPError, ValueError):  # best effort: a figure, not a step
            server = None
        cpu = instance_resources(self.plan, self.current)["limits"]["cpu"]
        cores = float(cpu[:-1]) / 1000 if cpu.endswith("m") else float(cpu)
        return {
            "pglab_version": __version__,
            "python": sys.version.split()[0],
            "target": "kubernetes",
            "kubernetes": {"server_version": server, "context": self.k8s.context, "namespace": self.k8s.namespace},
            # the instances' CPU limit: what the report's CPU figures are read against
            "cpu": {"affinity": max(1, math.ceil(cores)), "limit": cpu, "source": "instance limit"},
            "memory": {"limit": self.k8s.resources.memory},
            "postgres": {"image": self.k8s.image, "parameters": instance_parameters(self.plan, self.current)},
            "cluster_status": status,
            **({"prometheus": {"url": prom.url, "version": self._prom_version}} if (prom := self.figures.prom) else {}),
            "plan": self.plan_text,
        }

    # ------------------------------------------------------------ storage phase and dataset
    def storage_phase(self, results_dir: Path) -> Iterator[FioMeasurement]:
        """fio Jobs on PVCs of the Cluster's storage classes, one per instance's node (the primary's first), parsed
        and stored as the local storage phase does, each volume labelled with its node (``data@<node>``)."""
        options = {o.name: o for o in self.plan.matrix.storage or []}
        nodes = self._instance_nodes()
        fio_claims = {m.name: m for m in self.manifests if m.kind == "PersistentVolumeClaim" and _component(m) == "fio"}
        for template in [m for m in self.manifests if m.kind == "Job" and _component(m) == "fio"]:
            notes = template.body["metadata"]["annotations"]
            role, option = notes["pglab/volume"], notes.get("pglab/storage")  # option: a value of the storage axis
            classes = {r: s.storage_class for r, s in fio_volumes(with_storage(self.plan, options.get(option)))}
            volume = f"{option}/{role}" if option is not None else role
            for index, node in enumerate(nodes, 1):
                yield from self.fio_volume(self.orch, fio_claims[template.name], template, node, index, volume,
                                           classes.get(role), results_dir / "storage" / volume / node)

    def fio_volume(self, orch: Orchestrator, claim: Manifest, template: Manifest, node: str, index: int,
                   volume: str, storage_class: str | None, dest: Path) -> Iterator[FioMeasurement]:
        """The plan's fio jobs on a PVC of ``claim`` (``storage_class``) made on ``node``, labelled
        ``<volume>@<node>``; then, with a ``storage.host_path`` for that class, the same jobs on the node's
        directory, without the volume layer. The PVC is deleted once measured: its space goes back before the next
        node's and the database phase."""
        spec = self.plan.storage
        assert spec is not None
        jobs = [job for profile in spec.profiles for job in fio.jobs_for(profile)]
        pvc, m = fio_on_node(claim, template, node, index)
        where = f"pvc/{m.name} ({storage_class or 'default storage class'}) on node {node}"
        label = f"{volume}@{node}"
        self.ui.log(f"storage: fio on the {label} volume, {where}: {len(jobs)} jobs of {spec.runtime:g} s")
        orch.create(pvc)
        outcome = orch.run_job(m, dest)
        if not outcome.succeeded:
            raise FioError(f"fio failed in Job/{m.name} on the {label} volume: {last_words(outcome.log)}")
        results = job_results(dest, jobs, label, where, m.name)
        for r in results:
            for finding in r.findings:
                self.ui.log(f"storage: {label} {r.job} {r.direction}: {finding.message}")
        yield FioMeasurement(label, _mount_of(dest), results, fio.ceilings(results))
        orch.discard(pvc)
        directory = host_directory(spec.host_path, storage_class, node)
        if directory is None:
            return
        host = fio_on_host(claim, template, directory, node, index)
        host_label, host_dest = f"host:{directory}@{node}", dest / "host"
        self.ui.log(f"storage: fio on host path {directory} of node {node}, beside {label}")
        outcome = orch.run_job(host, host_dest)
        if not outcome.succeeded:
            raise FioError(f"fio failed in Job/{host.name} on host path {directory} of node {node}: "
                           f"{last_words(outcome.log)}")
        results = job_results(host_dest, jobs, host_label, f"host:{directory} on node {node} beside {label}",
                              host.name)
        yield FioMeasurement(host_label, _mount_of(host_dest), results, fio.ceilings(results))

    def _instance_nodes(self) -> list[str]:
        """The nodes of the Cluster's instances, the primary's first: where the storage phase measures."""
        primary = str(self.orch.cluster_status().get("currentPrimary") or "")
        pods = {p.metadata.name: p.spec.node_name for p in self.orch.instance_pods()
                if p.spec is not None and p.spec.node_name}
        if not pods:
            raise K8sError(f"Cluster/{self.k8s.cluster_name} has no instance on a node to measure the storage of")
        first = [pods[primary]] if primary in pods else []
        return first + sorted(set(pods.values()) - set(first))

    def _start_load(self, why: str = "") -> InClients:
        """pgbench -i started: the dataset Job's script exec'd in the first client pod."""
        m = pgbench_init(self.plan)
        on = f" on storage {self.current.storage.name}" if self.current.storage is not None else ""
        self.ui.log(f"loading the dataset{on}: pgbench -i -s {self.plan.dataset.scale} (Job/{m.name}'s script in a "
                    f"client pod){why}")
        return self._start_in_clients(m, first_only=True)

    def load_dataset(self) -> None:
        """pgbench -i: the dataset Job's script exec'd in the first client pod, which started while the Cluster came
        up, so no pod starts for it and its end is known at once. It began then too, once that pod ran, unless a
        storage phase came between (``_while_coming_up``); it is waited for here. Every sweep (and resume) starts
        on a new Cluster, so the dataset is loaded each time. A plan of scenario runs only, whose runs are Jobs,
        drops the pods then."""
        underway, self._coming.loading = self._coming.loading, None
        if underway is None:
            underway = self._start_load()
        dest = self.results_dir / "dataset"
        probes, self._coming.probes = self._coming.probes, None

        def probe_ahead() -> None:  # the first run's volume probes, beside the load (under way), not after a window
            nonlocal probes
            if probes is None:
                probes = self.figures.probe_ahead()

        outcome = self._finish_in_clients(underway, dest / self.current.storage.name if self.current.storage
                                          else dest, on_poll=probe_ahead)
        self.figures.finish_probes(probes or [])
        if not outcome.succeeded:
            raise PgbenchError(f"pgbench -i failed in pod/{underway.names[0]}: {last_words(outcome.log)}")
        if all(p.scenario is not None for p in self.points):
            self._drop_clients()
        self.ui.log(f"dataset loaded in {time.monotonic() - underway.started:.1f} s")

    # ------------------------------------------------------------ one run
    def start_run(self, point: Point, repeat: int, run_id: str, run_dir: Path) -> MeasuredRun:
        """The run's Job (and the witness's), the exporters read meanwhile, the files it shipped parsed."""
        if self._summary_modules.ident is not None:  # started with the Cluster: done long before
            interrupts.join(self._summary_modules)
        return KubernetesRun(self, point, repeat, run_dir)

    def _wait_coming_up(self) -> dict[str, Any]:
        """The Cluster waited for until healthy (its status), with what may start meanwhile
        (``_while_coming_up``); a load started then is stopped if the Cluster fails or the wait is interrupted."""
        try:
            return self.orch.wait_cluster_ready(on_poll=self._while_coming_up)
        except BaseException:
            coming = self._coming
            underway, coming.loading, coming.probes = coming.loading, None, None  # the probes' Jobs go at the end
            if underway is not None:
                self._stop_in_clients(underway)
            raise

    def _while_coming_up(self, status: dict[str, Any]) -> None:
        """At each read of the Cluster's status while it comes up, once the primary is ready: the client pods
        created, at once when no node can take both (``pools_apart``), else once every instance has its node
        (their anti-affinity to the instances cannot turn one away then); an idle pod costs its node nothing once
        started. Then, when no storage phase comes first, the dataset's load started once every instance pod
        exists, so once every standby has its base backup: CloudNativePG's join waits for a checkpoint that
        PostgreSQL spreads over the dirty buffers, so a join after a load took 111 s instead of 5 s on the lab. The
        last standby then starts while pgbench -i writes, and streams what it wrote (every run waits for the
        standbys' replay first). Any trouble leaves both to ``load_dataset``, after the Cluster, which makes the
        pods again and says what is wrong."""
        coming = self._coming
        if coming.loading is not None:
            for e in coming.loading.execs:
                e.drain()  # its output read as it comes, so that none backs up while the Cluster is waited for
            return
        if not coming.ahead or (status.get("readyInstances") or 0) < 1:
            return
        try:
            if not self._clients_made and self._pools_apart:
                self._make_clients()
            if (not self._clients_made or coming.load) and not self._instances_placed():
                return
            self._make_clients()
            if not coming.load:
                return
            if not self._clients:
                names = [m.name for m in self._clients_made]
                running = self.orch.pods_running(names, "the pgbench client pods")
                if len(running) < len(names):
                    return
                self._clients = running  # seen running at this look, maybe long after they started
                self.ui.log(f"client pods running on {', '.join(sorted(set(running.values())))} (created "
                            f"{time.monotonic() - self._clients_since:.1f} s before)")
            coming.loading = self._start_load(" while the last standby starts")
            # the first run's volume probes beside it, not after that run's window (the load may end before the
            # Cluster is healthy); they are for the disk figures, so the sampler is asked for first
            self._start_sampler()
            coming.probes = self.figures.probe_ahead()
        except K8sError:
            coming.ahead = False
            self._drop_clients()

    def _start_sampler(self) -> None:
        """The disk sampler's DaemonSet created, once a sweep. The disk figures are a figure, not a step: refused,
        that is told and the sweep goes on."""
        if self._sampler_asked:
            return
        self._sampler_asked = True
        for m in self.manifests:
            if m.kind == "DaemonSet":
                try:
                    self.orch.create(m)
                except K8sError as exc:
                    self.figures.tell_disk(f"{exc}")

    def _instances_placed(self) -> bool:
        """Whether every instance pod of the Cluster coming up exists with its node (once true, not asked again)."""
        if not self._coming.placed:
            pods = self.orch.instance_pods()
            self._coming.placed = len(pods) >= self.k8s.instances and all(p.spec is not None and p.spec.node_name
                                                                          for p in pods)
        return self._coming.placed

    def _make_clients(self) -> list[Manifest]:
        """The sweep's client pods (``clients.client_pods``) created, not waited for."""
        if not self._clients_made:
            pods = client_pods(self.plan)
            self.ui.log(f"starting {len(pods)} pgbench client pod{'s' if len(pods) > 1 else ''} for the runs")
            self._clients_since = time.monotonic()
            self._clients_made = pods
            for m in pods:
                self.orch.create(m)
        return self._clients_made

    def _client_pods(self) -> dict[str, str]:
        """The sweep's client pods, made if the Cluster's wait did not, and waited for when first needed (the
        dataset's load); pod → node."""
        if not self._clients:
            pods = self._make_clients()
            try:
                self._clients = self.orch.wait_pods_running([m.name for m in pods], "the pgbench client pods")
            except BaseException:
                self._drop_clients(pods)
                raise
            self.ui.log(f"client pods running {time.monotonic() - self._clients_since:.1f} s after their creation, "
                        f"on {', '.join(sorted(set(self._clients.values())))}")
        return self._clients

    def _drop_clients(self, pods: list[Manifest] | None = None) -> None:
        """Delete the client pods now (a new Cluster, or pods found unusable): the next run makes new ones."""
        self._clients, self._clients_made = {}, []
        for m in pods if pods is not None else [m for m in self.orch.created if m.kind == "Pod"]:
            self.orch.discard(m)

    def run_in_clients(self, m: Manifest, run_dir: Path, first_only: bool = False,
                       on_poll: Callable[[], None] | None = None) -> JobOutcome | LoadOutcome:
        """The Job ``m``'s script exec'd in the client pods (one per load pod; ``first_only``: in the first, as a
        one-pod Job), read until each ended (``on_poll`` at every look): its output and files as the Job's pod
        would have shipped them (its log)."""
        return self._finish_in_clients(self._start_in_clients(m, first_only), run_dir, on_poll)

    def _start_in_clients(self, m: Manifest, first_only: bool = False) -> InClients:
        """The Job ``m``'s script started by exec in the client pods (made and waited for if need be); if one
        cannot start, those started are stopped."""
        pods = self._client_pods()
        names = list(pods)[:1] if first_only else list(pods)
        load = self._load and not first_only
        token = f"{m.name}-{uuid.uuid4().hex[:12]}"  # the barrier's key: new for every attempt of the run
        underway = InClients(m, pods, names, load, [], time.monotonic())
        try:
            for index, pod in enumerate(names):
                underway.execs.append(self.orch.exec_start(pod, run_command(m, index if load else None, token)))
        except BaseException as exc:
            self._stop_in_clients(underway, dropped=isinstance(exc, K8sError) and not underway.execs)
            raise
        return underway

    def _stop_in_clients(self, underway: InClients, dropped: bool = False) -> None:
        """Whatever ``underway`` started stopped in every pod and its connections closed; ``dropped``: the pods
        cannot be used (no command could start in them), new ones for the next run."""
        try:
            for problem in self.orch.exec_stop(underway.names):
                self.ui.log(f"the run {underway.m.name} could not be stopped in {problem}")
        finally:
            for e in underway.execs:
                e.close()
            if dropped:
                self._drop_clients()

    def _finish_in_clients(self, underway: InClients, run_dir: Path,
                           on_poll: Callable[[], None] | None = None) -> JobOutcome | LoadOutcome:
        """Read ``underway`` until each pod's command ended, within a Job's deadline from now. Whatever ends the
        wait early (Ctrl-C, SIGTERM, the deadline, a lost connection) stops what it started in every pod before it
        goes on, and one load pod that failed stops the others (as the load Job's backoffLimit 0 does)."""
        m, pods, names, load, execs = underway.m, underway.pods, underway.names, underway.load, underway.execs
        try:
            self.orch.exec_wait(execs, f"the run {m.name} in pod {', '.join(names)}", on_poll)
            if running := [e.pod for e in execs if e.returncode is None]:
                for problem in self.orch.exec_stop(running):  # another load pod failed: these would wait in vain
                    self.ui.log(f"the run {m.name} could not be stopped in {problem}")
                for e in execs:
                    while e.pump(interrupts.POLL_S):  # what the stopped pods printed
                        pass
        except BaseException:
            self._stop_in_clients(underway)
            raise
        finally:
            for e in execs:
                e.close()
        if not load:
            e = execs[0]
            try:
                text, files = extract_results(e.output, run_dir)
            except K8sError:
                run_dir.mkdir(parents=True, exist_ok=True)
                (run_dir / "pod.log").write_text(e.output)  # as read: what was wrong with it stays to be seen
                raise
            (run_dir / "pod.log").write_text(text)
            return JobOutcome(m.name, e.returncode == 0, text, files, pods[e.pod])
        outcome = LoadOutcome(m.name, all(e.returncode == 0 for e in execs), [])
        for index, e in enumerate(execs):
            where = run_dir / LOAD_DIR.format(index=index)
            try:
                text, files = extract_results(e.output, where)
            except K8sError as exc:  # a pod stopped because another one failed printed no end
                text, files = f"{e.output}\n{exc}", []
            where.mkdir(parents=True, exist_ok=True)
            (where / "pod.log").write_text(text)
            outcome.pods.append(JobOutcome(e.pod, e.returncode == 0, text, [f"{where.name}/{f}" for f in files]))
            outcome.nodes[index] = pods[e.pod]
        return outcome

    def _placement(self, outcome: JobOutcome | LoadOutcome) -> dict[str, Any]:
        """Which node each pod of the run was on: the instances (as they are at the run's end: a scenario may have
        moved them) and pgbench's pod or pods."""
        try:
            instances = {p.metadata.name: p.spec.node_name for p in self.orch.instance_pods()
                         if p.spec is not None and p.spec.node_name}
        except K8sError:
            instances = {}
        load = ({str(i): n for i, n in sorted(outcome.nodes.items())} if isinstance(outcome, LoadOutcome)
                else {"0": outcome.node} if outcome.node else {})
        return {"instances": dict(sorted(instances.items())), "pgbench": load}

    def _restore(self, injector: Injector) -> None:
        """Lift the fence of a run that ended early, or bring its node back; if that fails the next runs would find
        an instance or a node missing, so it is said, kept as an event, and the sweep ends before its next run (the
        Cluster, fence and all, is deleted then)."""
        fenced = injector.fenced
        try:
            injector.release()
        except (K8sError, urllib3.exceptions.HTTPError) as exc:
            if fenced:
                why, kind = f"the fence of {injector.standby} could not be lifted: {first_line(exc)}", "unfence-failed"
                missing = "that standby"
            else:
                why, kind = f"node {injector.node} could not be brought back: {first_line(exc)}", "node-back-failed"
                missing = "that node"
            self.ui.log(why)
            self._events.append((now(), kind, why))
            self._stop = f"{why}; the sweep stops (its next runs would miss {missing})"

    def _scenario_metrics(self, injector: Injector, run_dir: Path,
                          window: tuple[float, float]) -> dict[str, float | None]:
        """The local runner's scenario figures: when the fault fell in the window, how long until the operator
        reported the new primary or the standby was let go (``recovered_s``), TPS and latency before, during and
        after (per-transaction log)."""
        from pglab.scenarios.figures import fault_phases, phase_metrics
        from pglab.workloads import shipped

        fault, back = injector.fault_time, injector.recovered_time
        assert fault is not None and back is not None
        out: dict[str, float | None] = {"fault_at_s": fault - window[0], "recovered_s": back - fault}
        if injector.kind not in ("standby-loss", "backup"):
            out["leader_changed"] = 1.0 if injector.new != injector.old else 0.0
        out.update(injector.backup_figures())  # a backup's duration and the WAL it spans
        phases, unmeasured = fault_phases(window[0], fault, back, window[1])
        if unmeasured:
            self.ui.log(unmeasured)
            self._events.append((now(), "after-unmeasured", unmeasured))
        out.update(phase_metrics(sorted(f for f in run_dir.iterdir() if shipped.TXN_LOG.match(f.name)),
                                 self.plan.run.sampling_rate, phases))
        return out

    def _witness(self, wm: Manifest, run_dir: Path, fault_time: float | None) -> dict[str, float | None]:
        """The witness Job's log, evaluated by the local witness's own ``evaluate``; its figures under the local
        runner's names, and witness.json beside them."""
        from pglab.scenarios.figures import witness_metrics

        outcome = self.orch.finish_job(wm, run_dir / "witness")
        log = parse_witness_log(outcome.log)
        w = evaluate(log.attempts, log.present, fault_time=fault_time, verified_on=f"{self.k8s.cluster_name}-rw",
                     timeline=log.timeline)
        write_json(run_dir / "witness.json", w.as_dict())
        if not outcome.succeeded:
            raise RunFailed(f"the witness failed in Job/{wm.name}: {last_words(outcome.log)}")
        return witness_metrics(w)

    def _wait_replay(self) -> None:
        """Start every run with the standbys caught up, as a local run does, so one run's replication backlog never
        leaks into the next: the primary's exporter must list every other instance with no WAL left to replay. An
        exporter that cannot be read cannot say: refused (no pods/proxy permission), that is told once and the
        runs start without the wait; else (a pod restarting, a timeout) it is asked again until the deadline, and
        this run starts without it."""
        if self.k8s.instances < 2 or self._replay_unknown:
            return
        deadline = time.monotonic() + self.replay_timeout_s
        while True:
            try:
                primary = self.orch.cluster_status().get("currentPrimary")
                standbys = {p.metadata.name for p in self.orch.instance_pods()} - {primary}
                behind = exporter.standbys_behind(exporter.parse(self.orch.scrape(str(primary))), standbys)
                unreadable = None
            except (K8sError, urllib3.exceptions.HTTPError) as exc:  # a refusal, a pod restarting, a timeout
                unreadable, behind = exc, []
                if not (isinstance(exc, K8sError) and exc.status in (401, 403)):  # else it will not come back
                    behind = [str(exc) or type(exc).__name__]  # asked again until the deadline
            if not behind and unreadable is None:
                return
            if unreadable is not None and not behind:  # refused: cannot be known in this sweep
                self._replay_unknown = True
                self.ui.log(f"standbys' replay not checked before the runs: {unreadable}")
                return
            if unreadable is not None and time.monotonic() > deadline:  # this run starts without; the next asks
                self.ui.log(f"standbys' replay not checked before this run: {unreadable}")
                return
            if time.monotonic() > deadline:
                raise RunFailed(f"the standbys did not catch up within {self.replay_timeout_s:.0f} s before the run "
                                f"({', '.join(behind)}, as the primary's exporter showed)")
            interrupts.sleep(self.orch.poll_s)

    def _check_settings(self, run_dir: Path, point: Point, job: str) -> dict[str, Any]:
        """The parameters the primary ran with (the Job's settings.txt), each as asked or the run fails, naming it.

        The Job waited for them (``render.settings_sql`` lets PostgreSQL compare units); what it shipped says
        whether they arrived, or still waited for a restart, when it gave up."""
        wanted = instance_parameters(self.plan, point)
        if not wanted:
            return {}
        path = run_dir / SETTINGS_FILE
        rows = {}
        if path.is_file():
            rows = {f[0]: f for line in path.read_text().splitlines() if len(f := line.split("|")) == 5}
        settings: dict[str, Any] = {}
        for name, value in sorted(wanted.items()):
            if name not in rows:
                err = run_dir / "settings.err"
                why = last_words(err.read_text(errors="replace")) if err.is_file() else "no settings.txt shipped"
                raise RunFailed(f"parameter {name}: Job/{job} could not read it on the primary ({why})")
            _, setting, unit, pending, ok = rows[name]
            if pending == "t":
                raise RunFailed(f"parameter {name}: {value} still waited for a restart of the primary after "
                                f"{SETTINGS_WAIT_S} s (CloudNativePG had not restarted it)")
            if ok != "t":
                raise RunFailed(f"parameter {name}: the primary ran with {setting}{unit}, not {value} "
                                f"(CloudNativePG had not applied it after {SETTINGS_WAIT_S} s)")
            settings[name] = {"setting": setting, "unit": unit or None}
        write_json(run_dir / "settings.json", settings)
        return settings

    def collect(self, run_dir: Path, m: Manifest, launched: float,
                ended: float) -> tuple[PgbenchRun, dict[str, float | None], float | None]:
        """One pod's pgbench files of the run Job ``m`` (:func:`pglab.workloads.shipped.one_pod`)."""
        from pglab.workloads import shipped

        scenario = m.body["metadata"]["annotations"].get("pglab/scenario") is not None
        return shipped.one_pod(run_dir, m.name, _command(m), self.plan.run, scenario, launched, ended)


class KubernetesRun(MeasuredRun):
    """One run on the Cluster, step by step (:func:`pglab.engine.run.measure`): the run's Job script (warm-up and
    measured window in one pgbench) exec'd in the sweep's long-lived client pods, so no pod starts per run; a
    scenario run keeps its Job (pod start included), whose log the fault's injector reads pgbench's start from."""

    load_phase = "job"

    def __init__(self, driver: KubernetesDriver, point: Point, repeat: int, run_dir: Path):
        self.d, self.point, self.run_dir = driver, point, run_dir
        self.m = pgbench_run(driver.plan, point, repeat)
        sc = point.scenario
        self.injector = (Injector(driver.orch, sc, self.m.name, driver.plan.run.warmup,
                                  node_fault=driver.k8s.node_fault) if sc is not None else None)
        self.wm = witness_job(driver.plan, point, repeat) if sc is not None and sc.witness else None
        self.readers: Readers | None = None
        self.figure_files: list[str] = []
        self.outcome: JobOutcome | LoadOutcome | None = None

    def prepare(self) -> None:
        (self.run_dir / "job.yaml").write_text(to_yaml(self.m.body))

    def reset(self) -> None:
        self.d._wait_replay()

    def start_probes(self) -> None:
        self.readers = self.d.figures.start()

    def measure(self) -> None:
        d, m, injector = self.d, self.m, self.injector
        if self.wm is not None:
            (self.run_dir / "witness-job.yaml").write_text(to_yaml(self.wm.body))
            d.orch.create(self.wm)  # writing before pgbench starts, so the fault falls inside its log
        if injector is None:
            self.outcome = d.run_in_clients(m, self.run_dir)
        else:
            self.outcome = (d.orch.run_load_job(m, self.run_dir, d.plan.run.load_pods) if d._load else
                            d.orch.run_job(m, self.run_dir, on_poll=injector.poll))
        if injector is not None and (self.outcome.succeeded or injector.fault_time is not None):
            injector.finish(d.scenario_timeout_s)
        if self.wm is not None and self.outcome.succeeded:  # pgbench has ended: so has the witness's time (else it
            # writes its margin out; a failed run's witness is deleted instead)
            stop = ["/bin/sh", "-c", f"touch {RESULTS_DIR}/{WITNESS_STOP}"]
            if why := d.orch.tell_job(self.wm.name, stop):
                d.ui.log(f"the witness was not told that pgbench ended ({why}); it stops at its own time")

    def close_probes(self) -> None:
        assert self.readers is not None
        self.figure_files = self.d.figures.end(self.readers, self.run_dir)

    def summarize(self) -> RunResult:
        d, m, run_dir, point, outcome, readers = self.d, self.m, self.run_dir, self.point, self.outcome, self.readers
        assert outcome is not None and readers is not None
        # first: an unapplied parameter fails the Job (with several load pods, pod 0 waited for them)
        settings = d._check_settings(run_dir / LOAD_DIR.format(index=0) if d._load else run_dir, point, m.name)
        load_info: dict[str, Any] | None = None
        load_series: list[tuple[float, str, str, float | None]] = []
        if isinstance(outcome, LoadOutcome):
            if not outcome.succeeded:
                raise RunFailed(_load_failure(outcome, run_dir))
            from pglab.workloads import shipped

            result, extra, warmup_start, load_info, load_series = shipped.load_pods(
                run_dir, m.name, _command(m), d.plan.run, load_shares(d.plan, point),
                lambda i: (outcome.pods[i].name if i < len(outcome.pods) else None, outcome.nodes.get(i)), LOAD_DIR)
        else:
            if not outcome.succeeded:
                raise RunFailed(_job_failure(outcome, run_dir))
            result, extra, warmup_start = d.collect(run_dir, m, readers.launched, now())
        window = (result.window_start, result.window_end)
        metrics = {**pgbench_metrics(result), **extra}
        if point.cpus is not None:
            metrics["limit_cpus"] = point.cpus  # the step's CPU limit per instance, as a local run stores it
        parts = d.figures.read(readers, run_dir, window, m.name)
        figures, disk, cpu = parts.postgres, parts.disk, parts.cpu
        series = pgbench_series(result, "pgbench") + load_series
        for part in (figures, cpu, disk):
            if part is not None:
                metrics.update(part.metrics)
                series += part.series
        events: list[Event] = []
        if warmup_start is not None:
            events += [(warmup_start, "warmup-start", f"{d.plan.run.warmup:g} s"), (window[0], "warmup-end", "")]
        if self.injector is not None:
            metrics.update(d._scenario_metrics(self.injector, run_dir, window))
        if self.wm is not None:
            metrics.update(d._witness(self.wm, run_dir, self.injector.fault_time if self.injector else None))
            if self.injector is not None:  # a backup's restore check, once the witness's writes are known
                metrics.update(self.injector.check_restore(self.wm, run_dir, d.ready_timeout_s))
        if self.injector is not None:
            events += self.injector.events
        return RunResult.of(window, metrics, series=series, events=events, settings=settings or None,
                            record={"job": m.name, "command": result.command,
                                    "placement": d._placement(outcome),
                                    "files": [*outcome.files, *self.figure_files, *parts.files,
                                              *(disk.files if disk else [])],
                                    "exporter": figures.info if figures else None,
                                    "disk": disk.info if disk else None,
                                    **({"load": load_info} if load_info is not None else {}),
                                    **({"cpu": cpu.info} if cpu is not None else {}),
                                    **statements.record(run_dir)})  # what the Job read of pg_stat_statements

    def end(self, failure: BaseException | None) -> None:
        d, injector = self.d, self.injector
        try:
            if failure is not None and self.readers is not None:
                self.readers.stop()
            if isinstance(failure, d.run_errors):
                try:
                    d._failed_health = d.orch.cluster_health()
                except Exception:  # a health check that fails adds nothing to the run's reason
                    d._failed_health = None
                if injector is not None and injector.events:
                    d._events += injector.events  # what the fault did, kept with the failed run's sweep
        finally:
            if injector is not None and injector.disrupted:  # a run that failed with a standby fenced or a node
                d._restore(injector)                          # away: that first
            if self.wm is not None:
                d.orch.discard(self.wm)  # a witness still writing after a failed run goes now, not at the end


@dataclass
class ComingUp:
    """What may begin while one Cluster comes up (``KubernetesDriver._while_coming_up``), and what did: a new one
    for each Cluster created."""

    load: bool  # the dataset's load may begin: nothing is measured between the Cluster and it
    ahead: bool = True  # anything may still begin (not after a refusal: load_dataset does it all after the Cluster)
    placed: bool = False  # every instance pod exists with its node
    loading: InClients | None = None  # the dataset's load, begun
    probes: list[Probe] | None = None  # the first run's volume probes, begun beside it


@dataclass
class InClients:
    """A Job's script under way by exec in the sweep's client pods (``KubernetesDriver._start_in_clients``)."""

    m: Manifest
    pods: dict[str, str]  # every client pod → its node
    names: list[str]  # the pods it runs in
    load: bool  # a share per load pod (run.load_pods), rather than the whole script in the first pod
    execs: list[Exec]
    started: float  # time.monotonic() at its start


def _load_failure(outcome: LoadOutcome, run_dir: Path) -> str:
    """One line: the first failed load pod's own last words (dataset reset, barrier, pgbench), else the pods'."""
    for index, pod in enumerate(outcome.pods):
        if pod.succeeded:
            continue
        d = run_dir / LOAD_DIR.format(index=index)
        for name, what in (("reset.log", "dataset reset before the run"), ("pgbench.err", "pgbench")):
            f = d / name
            if f.is_file() and (words := last_words(f.read_text(errors="replace"))) != "no output":
                if name == "reset.log" and (d / "pgbench.out").is_file():
                    continue
                return f"{what} failed in load pod {index} of Job/{outcome.name}: {words}"
        return f"load pod {index} of Job/{outcome.name} failed: {last_words(pod.log)}"
    return f"Job/{outcome.name} failed: {last_words(outcome.log)}"


def _mount_of(dest: Path) -> str | None:
    """The fio Job's volume as its node's kernel mounted it ("major:minor fstype source"), from the mountinfo line
    it shipped; None when it shipped none."""
    path = dest / VOLUME_MOUNT_FILE
    line = path.read_text(errors="replace").strip().splitlines()[0] if path.is_file() and path.stat().st_size else ""
    fields, _, rest = line.partition(" - ")
    f, r = fields.split(), rest.split()
    return f"{f[2]} {r[0]} {r[1]}" if len(f) > 4 and len(r) > 1 else None


def _command(m: Manifest) -> list[str]:
    """The run Job's pgbench command line, as its pod ran it."""
    return list(m.body["spec"]["template"]["spec"]["containers"][0]["command"])


def _component(m: Manifest) -> str:
    return str(m.body["metadata"]["labels"].get("pglab/component"))


def _job_failure(outcome: JobOutcome, run_dir: Path) -> str:
    """One line: the dataset reset's or pgbench's own last words, else the pod's."""
    out, err, reset = run_dir / "pgbench.out", run_dir / "pgbench.err", run_dir / "reset.log"
    if not out.is_file() and reset.is_file():
        return f"dataset reset before the run failed in Job/{outcome.name}: {last_words(reset.read_text())}"
    if err.is_file() and (words := last_words(err.read_text(errors="replace"))) != "no output":
        return f"pgbench failed in Job/{outcome.name}: {words}"
    return f"Job/{outcome.name} failed: {last_words(outcome.log)}"
