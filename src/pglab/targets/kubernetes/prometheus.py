"""A Kubernetes run's node disk, container CPU and CloudNativePG figures from the cluster's own Prometheus.

Instead of pglab's disk sampler and its reads of the exporters through the API server, the run's window is asked
of Prometheus with range queries (step: the plan's scrape interval) once the run is over, and the answers go
through the same summaries as the other sources (``disks.summarize``, ``exporter.summarize``), so the figures keep
their names. What Prometheus holds are scrapes, each stamped with when it was taken (cAdvisor stamps its samples
with when it read the cgroup): every query is asked twice, for the values and for ``timestamp()`` of a series of
the same scrape (the same series for cAdvisor's), so each value is used at the time it was read, once, however
the steps fall. (``timestamp()`` of a regex over names would drop the names and collide: hence one reference
series per scrape.)

Clocks: the samples carry Prometheus's (or cAdvisor's) clock, the window the client node's (pgbench's log); on
NTP-synchronised machines the difference is far below a scrape interval.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import ssl
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import urllib3

from pglab.plan.schema import PrometheusSource
from pglab.targets.kubernetes import disks, exporter
from pglab.targets.kubernetes.exporter import Key

Labels = frozenset[tuple[str, str]]
Series = dict[Labels, list[tuple[float, float]]]  # a series' labels (``__name__`` included) → (ts, value), by ts
TARGET_LABELS = ("job", "instance", "endpoint", "service", "container", "pod", "namespace")  # Prometheus's own


class PrometheusError(Exception):
    """Prometheus could not be asked, or refused a query; the message says which and why."""


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


class Client:
    """The HTTP API of one Prometheus: range queries, with the plan's token and TLS settings."""

    def __init__(self, cfg: PrometheusSource, base_dir: Path):
        self.cfg = cfg
        self.url = cfg.url.rstrip("/")

        def path(p: str | None) -> str | None:
            return None if p is None else str(base_dir / p)  # relative to the plan's folder (absolute stays)

        self.token_file = path(cfg.bearer_token_file)
        kw: dict[str, Any] = {}
        if self.url.startswith("https://"):
            if cfg.insecure_skip_verify:
                kw.update(cert_reqs=ssl.CERT_NONE, assert_hostname=False)
            else:
                kw.update(cert_reqs=ssl.CERT_REQUIRED, ca_certs=path(cfg.ca_file))
            if cfg.cert_file is not None:
                kw.update(cert_file=path(cfg.cert_file), key_file=path(cfg.key_file))
        self.http = urllib3.PoolManager(timeout=urllib3.Timeout(connect=min(10.0, cfg.timeout), read=cfg.timeout),
                                        retries=False, **kw)

    def matchers(self, **labels: str) -> str:
        """``{k="v",…}``: the plan's selector and ``labels`` (a value starting with ``~`` is a regex match)."""
        items = {**self.cfg.selector, **labels}
        return "{" + ",".join(f"{k}=~{_quote(v[1:])}" if v.startswith("~") else f"{k}={_quote(v)}"
                              for k, v in items.items()) + "}"

    def _get(self, path: str, fields: dict[str, str]) -> Any:
        headers = {}
        if self.token_file is not None:
            try:
                headers["Authorization"] = "Bearer " + Path(self.token_file).read_text().strip()
            except OSError as exc:
                raise PrometheusError(f"target.kubernetes.prometheus.bearer_token_file: cannot read {self.token_file}: "
                                      f"{exc.strerror or exc}") from None
        try:
            resp = self.http.request("GET", f"{self.url}{path}", fields=fields, headers=headers)
        except urllib3.exceptions.HTTPError as exc:
            raise PrometheusError(f"Prometheus at {self.url} cannot be reached: {exc}") from None
        try:
            body = json.loads(resp.data)
        except ValueError:
            body = None
        if resp.status != 200 or not isinstance(body, dict) or body.get("status") != "success":
            why = body.get("error") if isinstance(body, dict) else resp.data[:200].decode(errors="replace")
            raise PrometheusError(f"Prometheus at {self.url} answered {resp.status} to {fields.get('query')!r}: {why}")
        return body["data"]

    def version(self) -> str:
        """The server's version (``/api/v1/status/buildinfo``): also proves the URL, token and TLS work."""
        return str(self._get("/api/v1/status/buildinfo", {}).get("version", "unknown"))

    def range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        """``/api/v1/query_range``: the answer's series (``metric`` labels, ``values`` [ts, "value"])."""
        data = self._get("/api/v1/query_range", {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}",
                                                  "step": f"{step:g}"})
        if data.get("resultType") != "matrix":
            raise PrometheusError(f"Prometheus at {self.url} answered a {data.get('resultType')} to {expr!r}")
        return list(data.get("result") or [])

    def samples(self, selector: str, stamps: str, by: tuple[str, ...] | None, start: float, end: float,
                step: float) -> Series:
        """The samples of the series ``selector`` matches, each at the time it was taken, a sample seen at several
        steps kept once. ``stamps`` gives those times at the same steps: ``timestamp()`` of one series per ``by``
        labels (the series of one scrape share its time), or of the same series when ``by`` is None (then its
        labels, ``__name__`` aside, are the join)."""
        def join(metric: dict[str, str]) -> tuple[tuple[str, str], ...]:
            if by is None:
                return tuple(sorted((k, v) for k, v in metric.items() if k != "__name__"))
            return tuple((k, metric.get(k, "")) for k in by)

        when = {join(r["metric"]): {float(t): float(v) for t, v in r["values"]}
                for r in self.range(stamps, start, end, step)}
        out: Series = {}
        for r in self.range(selector, start, end, step):
            at = when.get(join(r["metric"]), {})
            seen: dict[float, float] = {}
            for t, v in r["values"]:
                ts, value = at.get(float(t)), float(v)
                if ts is not None and math.isfinite(value):
                    seen[ts] = value
            out[frozenset(r["metric"].items())] = sorted(seen.items())
        return out


def _by(series: Series, label: str) -> dict[str, Series]:
    out: dict[str, Series] = {}
    for labels, points in series.items():
        value = dict(labels).get(label)
        if value is not None:
            out.setdefault(value, {})[labels] = points
    return out


def _snapshots(series: Series, strip: Iterable[str]) -> list[tuple[float, dict[Key, float]]]:
    """Series → one ``{(metric, labels): value}`` per sample time, as one scrape would have given them; the labels
    Prometheus adds (``strip``) are removed, so the keys are the exporter's own."""
    drop = set(strip) | {"__name__"}
    at: dict[float, dict[Key, float]] = {}
    for labels, points in series.items():
        d = dict(labels)
        key: Key = (d.get("__name__", ""), frozenset((k, v) for k, v in labels if k not in drop))
        for ts, value in points:
            at.setdefault(ts, {})[key] = value
    return sorted(at.items())


def to_json(series: Series) -> list[dict[str, Any]]:
    """The samples as kept in the run's folder: each series' labels and [ts, value] pairs."""
    return [{"metric": dict(sorted(labels)), "samples": points} for labels, points in
            sorted(series.items(), key=lambda kv: sorted(kv[0]))]


@dataclass
class Window:
    """What one run asks: the window, and the span queried around it (edges need a sample outside). A range query
    answers at each step the latest sample at or before it, so the span ends two steps past the window: one step
    past it the last step can still fall before the first scrape after the end (a 9.9 s window's did, and the disk
    rate of its last 0.7 s was extrapolated, not read)."""

    start: float
    end: float
    step: float

    @property
    def span(self) -> tuple[float, float]:
        return self.start - 2 * self.step, self.end + 2 * self.step


# ------------------------------------------------------------------ node disk (node-exporter's series)
def node_blocks(client: Client, nodes: list[str], w: Window) -> tuple[dict[str, list[disks.Block]], Series]:
    """Each node's node-exporter disk counters (and ``node_disk_info``) as the disk sampler's blocks, one per
    scrape. A node is matched by ``node_label`` = the node's name, or name:port."""
    cfg = client.cfg
    names = "|".join(re.escape(n) for n in nodes)
    on = {cfg.node_label: f"~({names})(:[0-9]+)?"}
    stamps = f"max by ({cfg.node_label}) (timestamp(node_disk_reads_completed_total{client.matchers(**on)}))"
    series = client.samples(client.matchers(__name__="~node_disk_.*", **on), stamps, (cfg.node_label,), *w.span,
                            w.step)
    out: dict[str, list[disks.Block]] = {}
    for value, mine in _by(series, cfg.node_label).items():
        node = next((n for n in nodes if value == n or value.startswith(n + ":")), None)
        if node is None:
            continue
        for ts, values in _snapshots(mine, ()):
            out.setdefault(node, []).append(disks.node_exporter_block(values, ts, node))
    return out, series


# ------------------------------------------------------------------ CloudNativePG's exporter
def exporter_scrapes(client: Client, namespace: str, pods: list[str], w: Window) -> tuple[list[exporter.Scrape],
                                                                                         Series]:
    """The instances' exporter series as the scrapes ``exporter.summarize`` reads, one per pod and sample time."""
    cfg = client.cfg
    on = {cfg.namespace_label: namespace, cfg.pod_label: "~" + "|".join(re.escape(p) for p in pods)}
    stamps = f"max by ({cfg.pod_label}) (timestamp(cnpg_collector_up{client.matchers(**on)}))"  # one per scrape
    series = client.samples(client.matchers(__name__="~cnpg_.*", **on), stamps, (cfg.pod_label,), *w.span, w.step)
    strip = {*TARGET_LABELS, cfg.pod_label, cfg.namespace_label, cfg.node_label, *cfg.selector}
    scrapes = []
    for pod, mine in sorted(_by(series, cfg.pod_label).items()):
        for ts, values in _snapshots(mine, strip):
            scrapes.append(exporter.Scrape(pod, ts, "", values=values))
    scrapes.sort(key=lambda s: s.ts)
    return scrapes, series


# ------------------------------------------------------------------ container CPU (the kubelets' cAdvisor)
CPU_METRICS = ("container_cpu_usage_seconds_total", "container_cpu_cfs_periods_total",
               "container_cpu_cfs_throttled_periods_total")


@dataclass
class RunCpu:
    metrics: dict[str, float] = field(default_factory=dict)
    series: list[tuple[float, str, str, float | None]] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)


def _inside(points: list[tuple[float, float]], w: Window) -> list[tuple[float, float]]:
    return [(t, v) for t, v in points if w.start <= t <= w.end]


def _increase(points: list[tuple[float, float]]) -> tuple[float, float, float] | None:
    """(first ts, last ts, increase) over the samples given, None with fewer than two or a counter reset."""
    if len(points) < 2 or points[-1][0] <= points[0][0] or any(b[1] < a[1] for a, b in itertools.pairwise(points)):
        return None
    return points[0][0], points[-1][0], points[-1][1] - points[0][1]


def container_cpu(client: Client, namespace: str, groups: dict[str, tuple[str, str]], primary: str | None,
                  w: Window) -> tuple[RunCpu, Series]:
    """CPU per container from cAdvisor's counters: ``groups`` is figure → (pod regex, container), e.g.
    server → (instances, "postgres"), client → (the load pods, "main"). A group's cores are the sum over its pods
    of each pod's increase between its first and last sample inside the window over their distance; the primary
    alone gives ``primary_cpu_cores`` and its throttled share."""
    cfg = client.cfg
    pods = "|".join(f"(?:{rx})" for rx, _ in groups.values())
    containers = "|".join(sorted({re.escape(c) for _, c in groups.values()}))
    on = client.matchers(**{cfg.namespace_label: namespace, cfg.pod_label: f"~{pods}",
                            cfg.container_label: f"~{containers}"})
    series: Series = {}
    for metric in CPU_METRICS:  # cAdvisor stamps each container's samples with its own read of the cgroup
        series.update(client.samples(f"{metric}{on}", f"timestamp({metric}{on})", None, *w.span, w.step))
    out = RunCpu(info={"source": "prometheus", "window": [w.start, w.end]})
    per: dict[tuple[str, str], dict[str, list[tuple[float, float]]]] = {}  # (pod, container) → metric → points
    for labels, points in series.items():
        d = dict(labels)
        pod, container = d.get(cfg.pod_label), d.get(cfg.container_label)
        if pod is None or container is None or d.get("cpu", "total") != "total":
            continue
        have = per.setdefault((pod, container), {}).get(d["__name__"])  # one series each (no per-CPU split), but
        if have is None or len(_inside(points, w)) > len(_inside(have, w)):  # a container of a pod of the same
            per[(pod, container)][d["__name__"]] = points  # name gone before the window: the one in the window
    groups_used: dict[str, dict[str, Any]] = {}
    for figure, (rx, container) in groups.items():
        total, mine = 0.0, {}  # type: float, dict[str, dict[str, float]]
        for (pod, cont), metrics in sorted(per.items()):
            if cont != container or not re.fullmatch(rx, pod):
                continue
            pts = _inside(metrics.get(CPU_METRICS[0], []), w)
            inc = _increase(pts)
            if inc is None:
                continue
            t0, t1, used_s = inc
            cores = used_s / (t1 - t0)
            total += cores
            mine[pod] = {"cores": cores, "first": t0, "last": t1, "samples": len(pts)}
            out.series += [(b[0], f"cpu:{pod}", "cores", (b[1] - a[1]) / (b[0] - a[0]))
                           for a, b in itertools.pairwise(pts) if b[0] > a[0] and b[1] >= a[1]]
            if pod == primary and figure == "server":
                out.metrics["primary_cpu_cores"] = cores
                periods = _increase(_inside(metrics.get(CPU_METRICS[1], []), w))
                throttled = _increase(_inside(metrics.get(CPU_METRICS[2], []), w))
                if periods is not None and throttled is not None and periods[2] > 0:
                    out.metrics["cpu_throttled_pct"] = throttled[2] / periods[2] * 100
        if mine:
            out.metrics[{"server": "server_cpu_cores", "client": "client_cgroup_cpu_cores"}[figure]] = total
        groups_used[figure] = {"pods": rx, "container": container, "per_pod": mine}
    out.info["groups"] = groups_used
    if not out.metrics:
        out.info["note"] = "fewer than two cAdvisor samples of a container inside the window: no CPU figures"
    return out, series
