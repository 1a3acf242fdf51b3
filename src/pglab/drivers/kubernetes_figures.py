"""A Kubernetes run's figures beside pgbench's, from one of two sources behind one interface: the instances'
exporters and the nodes' disks read while the Job runs (the disk sampler DaemonSet's logs, or node-exporter), or
the cluster's Prometheus asked once the run is over. Either way a run gets the same parts (PostgreSQL's figures,
the disks', the containers' CPU) under the same names; a source that cannot answer gives no figure of its kind
(said once per sweep), never a failed run."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pglab import interrupts
from pglab.artifacts import write_json
from pglab.engine.types import Observer
from pglab.errors import last_words
from pglab.plan.schema import Plan
from pglab.probes.base import now
from pglab.targets.kubernetes import disks, exporter, prometheus
from pglab.targets.kubernetes.orchestrate import POSTGRES_CONTAINER, K8sError, Orchestrator
from pglab.targets.kubernetes.prometheus import PrometheusError
from pglab.targets.kubernetes.render import DATABASE, Manifest, target_of, volume_probe
from pglab.targets.kubernetes.scripts import DISK_SAMPLE_S

DISK_LOG_MARGIN_S = 10.0  # the disk sampler's log is read from this long before the run's Job was created
DISK_LOG_WAIT_S = 10.0  # for the disk sampler's first sample after a run's window, its log read again until then


@dataclass
class NodeScrapes:
    """The node-exporter pods read during one run (node → pod) and what they answered."""

    pods: dict[str, str]
    scraper: exporter.Scraper


@dataclass
class Readers:
    """One run's readers while its Job runs (none with Prometheus: it is asked afterwards)."""

    launched: float
    scraper: exporter.Scraper | None = None  # the instances' exporters
    nodes: NodeScrapes | None = None  # node-exporter on the instances' nodes

    @property
    def all(self) -> list[exporter.Scraper]:
        return [r for r in (self.scraper, self.nodes.scraper if self.nodes else None) if r is not None]

    def stop(self) -> None:
        for reader in self.all:
            reader.stop()


@dataclass
class Probe:
    """A volume probe Job created on one node: the claims it probes (with their cache keys), and what it found
    once read (None until then, or why it could not be created)."""

    m: Manifest
    todo: list[tuple[str, str]]  # (claim, key)
    found: dict[str, disks.Volume] | str | None = None


def _claims(pods: list[Any]) -> dict[str, list[tuple[str, str, str]]]:
    """Node → (pod, claim, cache key) of every instance pod's claims; the key names the pod's uid (a recreated pod
    may have its volume attached anew)."""
    wanted: dict[str, list[tuple[str, str, str]]] = {}
    for pod in pods:
        node: str | None = pod.spec.node_name if pod.spec is not None else None
        if not node:
            continue
        for v in pod.spec.volumes or []:
            if v.persistent_volume_claim is not None:
                claim = v.persistent_volume_claim.claim_name
                key = f"{claim}@{node}#{pod.metadata.uid or ''}"
                wanted.setdefault(node, []).append((pod.metadata.name, claim, key))
    return wanted


class Once:
    """What is said once per sweep: the first message of each topic goes to the log, later ones are dropped."""

    def __init__(self, log: Callable[[str], None]) -> None:
        self.log = log
        self.told: set[str] = set()

    def say(self, topic: str, message: str) -> None:
        if topic not in self.told:
            self.told.add(topic)
            self.log(message)


@dataclass
class RunFigures:
    """What the sources gave for one run: each part None when its source could not say."""

    postgres: exporter.RunFigures | None
    disk: disks.RunDisks | None
    cpu: prometheus.RunCpu | None
    files: list[str] = field(default_factory=list)  # kept in the run's folder


class Figures:
    """A sweep's figure sources: what is said once per sweep, and the volume probes' findings (a pod's devices are
    probed once, unless it is recreated)."""

    def __init__(self, plan: Plan, orch: Callable[[], Orchestrator], results_dir: Path, ui: Observer,
                 scrape_s: float, prom: prometheus.Client | None):
        self.plan, self.k8s, self._orch, self.results_dir, self.ui = plan, target_of(plan), orch, results_dir, ui
        self.scrape_s = scrape_s  # how often the instances' exporters are read while a run's Job runs
        self.prom = prom
        self.once = Once(ui.log)  # what is said once per sweep, by topic
        self._probed: dict[str, disks.Volume | str] = {}  # claim@node#pod uid → its mount, or why unknown
        self._tries: dict[str, int] = {}  # probes of a key so far (a failure is tried once more)
        self._probes = 0

    @property
    def orch(self) -> Orchestrator:
        return self._orch()

    def resumed(self) -> None:
        """A resumed sweep's volume probes are numbered after the earlier ones (their folders stay)."""
        probes = self.results_dir / "volume-probes"
        self._probes = len(list(probes.iterdir())) if probes.is_dir() else 0

    def start(self) -> Readers:
        """One run's readers, started (none with Prometheus)."""
        readers = Readers(now())
        if self.prom is None and self.plan.probes.enabled:
            readers.scraper, readers.nodes = self._scraper(), self._node_scrapes()
        for reader in readers.all:  # in threads of their own: a slow read never delays a fault or the Job's end
            reader.start()
        return readers

    def end(self, readers: Readers, run_dir: Path) -> list[str]:
        """The readers stopped, one more read each after the Job, the exporters' scrapes kept (also for a run that
        fails after): the files written."""
        readers.stop()
        for reader in readers.all:
            reader.final()
        if (scraper := readers.scraper) is None:
            return []
        self._tell_exporter_errors(scraper)
        return scraper.write(run_dir / "exporter")

    def read(self, readers: Readers, run_dir: Path, window: tuple[float, float], job: str) -> RunFigures:
        """The run's figures over ``window`` from whichever source the sweep has (none with the probes off)."""
        if not self.plan.probes.enabled:
            return RunFigures(None, None, None)
        if self.prom is not None:
            return RunFigures(*self._from_prometheus(self.prom, run_dir, window, job))
        scraper = readers.scraper
        figures = exporter.summarize(scraper.scrapes, scraper.primary, window, DATABASE) if scraper else None
        return RunFigures(figures, self._disks(run_dir, readers.launched, window, readers.nodes), None)

    def _scraper(self) -> exporter.Scraper | None:
        """A reader of every instance's exporter for the coming run, or None when the instances cannot be listed."""
        try:
            pods = sorted(p.metadata.name for p in self.orch.instance_pods())
            primary = self.orch.cluster_status().get("currentPrimary")
        except K8sError as exc:
            self.ui.log(f"exporter: {exc}; no PostgreSQL figures for this run")
            return None
        if not pods or primary not in pods:
            self.ui.log(f"exporter: primary {primary or '?'} not among the instance pods {pods}; no PostgreSQL "
                        "figures for this run")
            return None
        return exporter.Scraper(self.orch.scrape, pods, self.scrape_s, str(primary))

    def _tell_exporter_errors(self, scraper: exporter.Scraper) -> None:
        """Say once per sweep when an exporter could not be read (RBAC without pods/proxy, say)."""
        if errors := scraper.errors():
            self.once.say("exporter", f"exporter not read: {errors[0]} (figures from the scrapes that worked only; "
                          "see exporter/*.prom in the run's folder)")

    def _disks(self, run_dir: Path, launched: float, window: tuple[float, float],
               nodes_read: NodeScrapes | None = None) -> disks.RunDisks | None:
        """The run's disk figures from the instances' nodes — the disk sampler's logs, or the node-exporter scrapes
        taken during the run (``nodes_read``) — and the devices the volume probe found (``disks.summarize``); the
        raw samples go to disk/<node>.log or .prom, what was chosen to disk.json. None (no figure, not zeros) when a
        node of an instance has no readable sampler or node-exporter pod or no sample in the window, or a volume
        has no block device, said once per sweep."""
        try:
            samplers = self.orch.sampler_pods() if self.k8s.node_exporter is None else {}
            pods = self.orch.instance_pods()
            primary = self.orch.cluster_status().get("currentPrimary")
        except K8sError as exc:
            self.tell_disk(str(exc))
            return None
        instances = {p.metadata.name: p.spec.node_name for p in pods if p.spec is not None and p.spec.node_name}
        nodes = sorted(set(instances.values()))
        if not nodes:
            self.tell_disk("the instance pods name no node")
            return None
        folder = run_dir / "disk"
        blocks: dict[str, list[disks.Block]] = {}
        files: list[str] = []  # the raw samples kept, relative to the run's folder
        if nodes_read is not None:
            problems = [f"no node-exporter pod on node {n}" for n in nodes if n not in nodes_read.pods]
            for node, pod in sorted(nodes_read.pods.items()):
                mine = [sc for sc in nodes_read.scraper.scrapes if sc.pod == pod]  # a failed read is a gap
                blocks[node] = [disks.node_exporter_block(sc.values, sc.ts, node) for sc in mine if sc.text]
            if nodes_read.pods:  # node-exporter's disk lines only: the rest is not ours to keep
                stems = {pod: node for node, pod in nodes_read.pods.items()}
                files = nodes_read.scraper.write(folder, stems, keep="node_disk_")
        else:
            problems = [f"no disk-sampler pod on node {n}" for n in nodes if n not in samplers]
            texts, blocks, unread = self._sampler_logs({n: samplers[n] for n in nodes if n in samplers}, launched,
                                                       window[1])
            problems += unread
            for node, text in sorted(texts.items()):
                folder.mkdir(parents=True, exist_ok=True)
                (folder / f"{node}.log").write_text(text)
                files.append(f"disk/{node}.log")
            problems += [f"the disk sampler of node {n} printed no sample after the run's window in "
                         f"{DISK_LOG_WAIT_S:g} s" for n, b in sorted(blocks.items()) if b and b[-1].ts < window[1]]
        volumes = self._volumes(pods) if blocks and not problems else {}
        hint = (" (node-exporter's diskstats filter leaves partitions, loop and ram devices out; the sampler "
                "DaemonSet, without node_exporter in the plan, does not)") if nodes_read is not None else ""
        result = disks.summarize(blocks, instances, primary, window, volumes, hint)
        result.files = files
        if nodes_read is not None and (errors := nodes_read.scraper.errors()):
            result.info["scrape_errors"] = errors
        problems += result.problems
        if problems:
            result.info["note"] = "; ".join(problems) + ": no disk figures"
        if files:
            write_json(folder / "disk.json", result.info)
            result.files.append("disk/disk.json")
        if problems or not result.metrics:
            self.tell_disk(str(result.info.get("note")))
            result.metrics, result.series = {}, []
        elif result.guessed:
            self.once.say("disk guess", f"disk figures: the volume devices of {', '.join(result.guessed)} are a guess "
                          "(the busiest device of the node; the volume probe could not run, see disk/disk.json)")
        return result

    def _sampler_logs(self, samplers: dict[str, str], launched: float, end: float
                      ) -> tuple[dict[str, str], dict[str, list[disks.Block]], list[str]]:
        """Each node's disk sampler log (node → its pod), read together, and read again every DISK_SAMPLE_S for
        DISK_LOG_WAIT_S at most while it has samples but none after the window's ``end`` yet: pgbench's end is seen
        at once, and the block after it can be a fraction of a second from the log (more on a loaded node); a
        window without its closing block would be figured short. Returns the texts, their blocks and what could not
        be read."""
        texts: dict[str, str] = {}
        blocks: dict[str, list[disks.Block]] = {}
        problems: list[str] = []
        waiting, deadline = sorted(samplers), now() + DISK_LOG_WAIT_S
        while waiting:
            since = max(1, math.ceil(now() - launched + DISK_LOG_MARGIN_S))
            with ThreadPoolExecutor(len(waiting), thread_name_prefix="pglab-disk-log") as pool:  # together
                logs = {node: pool.submit(self.orch.pod_log, samplers[node], since) for node in waiting}
            for node, log in logs.items():
                try:
                    texts[node] = log.result()
                except K8sError as exc:
                    problems.append(str(exc))
                    texts.pop(node, None)
                    blocks.pop(node, None)
                    continue
                blocks[node] = disks.parse_log(texts[node])
            waiting = [n for n in waiting if blocks.get(n) and blocks[n][-1].ts < end]
            if not waiting or now() >= deadline:
                break
            interrupts.sleep(DISK_SAMPLE_S)
        return texts, blocks, problems

    def _node_scrapes(self) -> NodeScrapes | None:
        """With ``node_exporter`` in the plan: a reader of the node-exporter pods on the instances' nodes for the
        coming run; None without it. Pods that cannot be listed give a reader of none: the run has no disk figures,
        said once."""
        ne = self.k8s.node_exporter
        if ne is None:
            return None
        selector = ",".join(f"{k}={v}" for k, v in sorted(ne.labels.items()))
        try:
            nodes = {p.spec.node_name for p in self.orch.instance_pods() if p.spec is not None and p.spec.node_name}
            found = self.orch.pods_by_node(selector, ne.namespace, what=f"the node-exporter pods in {ne.namespace}")
        except K8sError as exc:
            self.tell_disk(str(exc))
            return NodeScrapes({}, exporter.Scraper(lambda pod: "", [], self.scrape_s, ""))
        pods = {node: pod for node, pod in found.items() if node in nodes}

        def read(pod: str) -> str:
            return self.orch.scrape(pod, ne.port, ne.namespace, ne.scheme)

        return NodeScrapes(pods, exporter.Scraper(read, sorted(pods.values()), self.scrape_s, ""))

    def _volumes(self, pods: list[Any]) -> dict[str, list[disks.Volume] | str]:
        """Instance pod → its claims' devices, from a volume probe Job on each node with claims not probed there
        for that pod yet (a recreated pod — a rollout, a failover — may have its network volume attached anew,
        under another device), or why none could be had. A failed probe is tried once more at a later run. A probe
        is a figure's helper, not a step: its failure makes a guess, not a failed run."""
        wanted = _claims(pods)
        self.finish_probes(self._start_probes(wanted))
        out: dict[str, list[disks.Volume] | str] = {}
        for claims in wanted.values():
            for pod, _, key in claims:
                got, have = self._probed[key], out.get(pod, [])
                if not isinstance(have, str):  # one claim not found: the pod's devices are a guess
                    out[pod] = got if isinstance(got, str) else [*have, got]
        return out

    def probe_ahead(self) -> list[Probe]:
        """The volume probes the next run's disk figures will want, started now (``finish_probes`` reads them),
        so that they run beside something else (the dataset's load) and not after the run's window, while
        nothing else runs. None when the instance pods cannot be listed, or when the disk sampler's DaemonSet was
        refused: the runs then have no disk figure to probe for. (Its pods need not be running yet: the
        DaemonSet was created just before.)"""
        if self.prom is None and self.k8s.node_exporter is None and \
                not any(m.kind == "DaemonSet" for m in self.orch.created):
            return []
        try:
            pods = self.orch.instance_pods()
        except K8sError:
            return []  # the run's own reads say why, once
        return self._start_probes(_claims(pods))

    def _start_probes(self, wanted: dict[str, list[tuple[str, str, str]]]) -> list[Probe]:
        """A volume probe Job created on each node with claims to probe (all created before any is waited for:
        their pods start together)."""
        started: list[Probe] = []
        for node, claims in sorted(wanted.items()):
            todo = sorted({(c, k) for _, c, k in claims
                           if not isinstance(self._probed.get(k), disks.Volume) and self._tries.get(k, 0) < 2})
            if not todo:
                continue
            self._probes += 1
            m = volume_probe(self.plan, f"{self.k8s.cluster_name}-volumes-{self._probes}", node, [c for c, _ in todo])
            probe = Probe(m, todo)
            try:
                self.orch.create(m)
            except K8sError as exc:
                probe.found = str(exc)
            started.append(probe)
        return started

    def finish_probes(self, started: list[Probe]) -> None:
        """Each probe's Job waited for, its log read into what it found (or why not), the Job deleted."""
        for probe in started:
            m, found = probe.m, probe.found
            if found is None:
                try:
                    outcome = self.orch.finish_job(m, self.results_dir / "volume-probes" / m.name)
                    found = disks.parse_probe_log(outcome.log)
                    if not outcome.succeeded:
                        found = f"Job/{m.name} failed: {last_words(outcome.log)}"
                except K8sError as exc:
                    found = str(exc)
            for claim, key in probe.todo:
                self._tries[key] = self._tries.get(key, 0) + 1
                self._probed[key] = (found.get(claim) or f"Job/{m.name} did not see claim {claim}"
                                     if isinstance(found, dict) else found)

    def tell_disk(self, why: str) -> None:
        """Say once per sweep why a run has no disk figures (no DaemonSet permission, no sampler pod, …)."""
        self.once.say("disk", f"disk figures: {why.rstrip('.')} (none stored for such runs, not zeros; see disk/ in "
                      "the run's folder and docs/kubernetes.md)")

    def _from_prometheus(self, client: prometheus.Client, run_dir: Path, window: tuple[float, float], job: str
                         ) -> tuple[exporter.RunFigures | None, disks.RunDisks | None, prometheus.RunCpu | None,
                                    list[str]]:
        """The run's CloudNativePG, container CPU and node disk figures, asked of Prometheus once its last scrapes
        of the window are stored (``lag``); the samples used are kept in prometheus/*.json. A query that fails
        gives no figure of its kind (said once per sweep), not a failed run."""
        cfg = client.cfg
        lag = cfg.lag if cfg.lag is not None else 2 * cfg.interval + 1
        if (wait := window[1] + lag - now()) > 0:
            interrupts.sleep(wait)
        w = prometheus.Window(window[0], window[1], cfg.interval)
        try:
            pods = self.orch.instance_pods()
            primary = self.orch.cluster_status().get("currentPrimary")
        except K8sError as exc:
            self._tell_prometheus(str(exc))
            return None, None, None, []
        instances = {p.metadata.name: p.spec.node_name for p in pods if p.spec is not None and p.spec.node_name}
        names = sorted(instances)
        folder = run_dir / "prometheus"
        folder.mkdir(parents=True, exist_ok=True)
        files: list[str] = []
        where = {"source": "prometheus", "url": client.url}

        def keep(name: str, series: prometheus.Series) -> None:
            write_json(folder / f"{name}.json", prometheus.to_json(series))
            files.append(f"prometheus/{name}.json")

        figures = cpu = disk = None
        try:
            scrapes, raw = prometheus.exporter_scrapes(client, self.k8s.namespace, names, w)
            keep("exporter", raw)
            figures = exporter.summarize(scrapes, str(primary), window, DATABASE)
            figures.info.update(where)
        except PrometheusError as exc:
            self._tell_prometheus(str(exc))
        try:
            groups = {"server": ("|".join(re.escape(n) for n in names), POSTGRES_CONTAINER),
                      # the run's pgbench: the long-lived client pods it is exec'd in, or its Job's pods (a
                      # scenario run keeps its Job), one per load pod
                      "client": (f"{re.escape(self.k8s.cluster_name)}-clients-[0-9]+|{re.escape(job)}-.+", "main")}
            cpu, raw = prometheus.container_cpu(client, self.k8s.namespace, groups, primary, w)
            keep("cpu", raw)
        except PrometheusError as exc:
            self._tell_prometheus(str(exc))
        try:
            blocks, raw = prometheus.node_blocks(client, sorted(set(instances.values())), w)
            keep("disk", raw)
            volumes = self._volumes(pods) if blocks else {}
            disk = disks.summarize(blocks, instances, primary, window, volumes,
                                   " (node-exporter's diskstats filter leaves partitions, loop and ram devices out)")
            disk.info.update(where)
            disk.files = []
            if disk.problems or not disk.metrics:
                self.tell_disk(str(disk.info.get("note")))
                disk.metrics, disk.series = {}, []
            write_json(folder / "disk-figures.json", disk.info)
            files.append("prometheus/disk-figures.json")
        except PrometheusError as exc:
            self._tell_prometheus(str(exc))
        return figures, disk, cpu, files

    def _tell_prometheus(self, why: str) -> None:
        """Say once per sweep why a run lacks figures from Prometheus."""
        self.once.say("prometheus", f"prometheus: {why.rstrip('.')} (no such figures stored for the run, not zeros)")
