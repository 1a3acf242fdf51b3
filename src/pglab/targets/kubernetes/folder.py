"""``pglab k8s render``'s folder: the environment in cluster/, what runs in jobs/ (the Cluster's merge patches
between points among them), and run-jobs.sh applying them in order, each waited for; an earlier render in the
folder replaced, any other refused."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pglab.plan.expand import Point, expand
from pglab.plan.schema import Plan
from pglab.targets.kubernetes.render import (
    COPY_FROM,
    Manifest,
    client_cores,
    cluster_patch,
    cpu_quantity,
    first_point,
    instance_parameters,
    millicores,
    object_store,
    target_of,
    to_yaml,
)

# ------------------------------------------------------------------ the rendered folder: cluster/, jobs/, run-jobs.sh
CLUSTER_DIR = "cluster"  # what makes the environment: applied at once, then waited for
JOBS_DIR = "jobs"  # what runs: never applied at once (every run would start together); run-jobs.sh, in order
RUN_JOBS = "run-jobs.sh"
RENDER_MARKER = ".pglab-render"  # the files of the render in a folder: a later render replaces exactly these
HEALTHY_PHASE = "Cluster in healthy state"  # CloudNativePG's status.phase (as the orchestration waits for it)
INSTANCE_PODS = "cnpg.io/podRole=instance"  # the Cluster's PostgreSQL pods, by the operator's own labels
_RUNNING_KINDS = ("Job", "PersistentVolumeClaim")


@dataclass(frozen=True)
class ClusterPatch:
    """The merge patch between two points whose Cluster differs, applied before the later point's first run."""

    filename: str
    body: dict[str, Any]
    what: str  # "CPU step cpus=2", "parameters work_mem=8MB", as the sweep says it
    cpus: float | None  # the CPU step every instance pod must carry once rolled out, None for parameters alone
    point_key: str  # the point it is applied for


@dataclass(frozen=True)
class Written:
    """What ``write`` put where: the environment, the Jobs (and their PVCs), the Cluster patches, the script."""

    cluster: list[Path]
    jobs: list[Path]
    patches: list[Path]
    script: Path


def cluster_change(plan: Plan, before: Point, point: Point) -> str | None:
    """What ``point`` changes in a Cluster made for ``before`` (a CPU step, parameters), None when nothing: the
    sweep's rule for patching between points (sweep._step_to)."""
    cpus = point.cpus if point.cpus != before.cpus else None
    was = instance_parameters(plan, before)
    changed = {k: v for k, v in instance_parameters(plan, point).items() if was.get(k) != v}
    if cpus is None and not changed:
        return None
    params = ", ".join(f"{k}={v}" for k, v in changed.items())
    if cpus is None:
        return f"parameters {params}"
    return f"CPU step cpus={cpus:g}" + (f" (with {params})" if params else "")


def job_sequence(plan: Plan, manifests: list[Manifest]) -> list[Manifest | ClusterPatch]:
    """What runs, in run order: the fio PVCs and Jobs, the dataset Job, each run's Jobs, with the Cluster's merge
    patch before the first run of a point whose Cluster differs from the last one's (as ``pglab run`` steps)."""
    points = {p.key: p for p in expand(plan, cores=client_cores(target_of(plan)))}
    current = first_point(plan)  # the Cluster of cluster/ is made as the first point needs it
    out: list[Manifest | ClusterPatch] = []
    for m in manifests:
        if m.kind not in _RUNNING_KINDS:
            continue
        key = (m.body["metadata"].get("annotations") or {}).get("pglab/point-key")
        point = points.get(key) if key is not None else None
        if point is not None and (what := cluster_change(plan, current, point)) is not None:
            out.append(ClusterPatch(f"50-run-{point.index:04d}-0-cluster-patch.json", cluster_patch(plan, point),
                                    what, point.cpus if point.cpus != current.cpus else None, point.key))
            current = point
        out.append(m)
    return out


def _claims(job: Manifest) -> list[str]:
    return [v["persistentVolumeClaim"]["claimName"] for v in job.body["spec"]["template"]["spec"].get("volumes", [])
            if "persistentVolumeClaim" in v]


# run-jobs.sh's functions: plain POSIX sh, kubectl only (jsonpath for what is read back)
_RUN_JOBS_FUNCTIONS = r"""
say() { printf '%s run-jobs: %s\n' "$(date +%H:%M:%S)" "$*"; }
die() { printf '%s run-jobs: %s\n' "$(date +%H:%M:%S)" "$*" >&2; exit 1; }
k() { $KUBECTL -n "$NS" "$@"; }

apply() {  # $1: a file or folder of this render
  $KUBECTL apply -f "$HERE/$1" || die "kubectl apply -f $1 failed"
}

healthy() {  # the Cluster healthy with every instance ready; $1: millicores every instance pod must have (or empty)
  state=$(k get cluster "$CLUSTER" -o 'jsonpath={.status.phase}/{.status.readyInstances}' 2>/dev/null) || state=
  [ "$state" = "$HEALTHY/$INSTANCES" ] || return 1
  [ -z "$1" ] && return 0
  state="$state, instance pods not all at ${1}m CPU"
  pods='{range .items[*]}{.metadata.deletionTimestamp}|{.spec.containers[?(@.name=="postgres")].resources.requests.cpu}'
  pods="$pods"'|{.spec.containers[?(@.name=="postgres")].resources.limits.cpu}{"\n"}{end}'
  k get pods -l "cnpg.io/cluster=$CLUSTER,$INSTANCE_PODS" -o "jsonpath=$pods" 2>/dev/null |
    awk -F'|' -v want="$1" -v n="$INSTANCES" '
      function mc(q) { return q ~ /m$/ ? int(q + 0.5) : int(q * 1000 + 0.5) }
      $1 != "" { next }
      { live++ }
      $2 != "" && $3 != "" && mc($2) == want && mc($3) == want { ok++ }
      END { exit !(ok == n && live == n) }'
}

wait_cluster() {  # $1: what is waited for; $2: millicores every instance pod must have once rolled out (or empty)
  end=$(( $(date +%s) + CLUSTER_TIMEOUT_S ))
  until healthy "${2:-}"; do
    [ "$(date +%s)" -lt "$end" ] || die "$1: Cluster/$CLUSTER not '$HEALTHY' with $INSTANCES ready instances" \
      "after $CLUSTER_TIMEOUT_S s (last seen: ${state:-not readable}); see kubectl -n $NS describe cluster $CLUSTER"
    sleep "$POLL_S"
  done
  say "$1: Cluster/$CLUSTER is healthy"
}

filled() {  # $1: the rendered copy of a Secret (its data empty), $2: the Secret it copies: nothing applied until filled
  ! grep -q "^  [A-Z_]*: ''$" "$HERE/$1" || die "$1 is an empty copy of Secret $2: fill its data with that" \
    "Secret's (kubectl -n ${2%%/*} get secret ${2#*/} -o jsonpath='{.data}'), then run this again"
}

patch_cluster() {  # $1: the merge patch file; $2: what it changes; $3: millicores after a CPU step (or empty)
  say "$2: patching Cluster/$CLUSTER with $1"
  k patch cluster "$CLUSTER" --type merge --patch-file "$HERE/$1" || die "$2: kubectl patch cluster $CLUSTER failed"
  wait_cluster "$2" "${3:-}"
}

wait_job() {  # $1: a Job's name: until its Complete condition; its Failed one, or the deadline, stops the script
  end=$(( $(date +%s) + JOB_TIMEOUT_S ))
  while :; do
    conds=$(k get job "$1" -o 'jsonpath={range .status.conditions[*]}{.type}={.status} {end}' 2>/dev/null) || conds=
    case " $conds " in
      *" Complete=True "*) say "Job/$1 complete"; return 0 ;;
      *" Failed=True "*) die "Job/$1 failed; see kubectl -n $NS logs job/$1" ;;
    esac
    [ "$(date +%s)" -lt "$end" ] || die "Job/$1 not complete after $JOB_TIMEOUT_S s; see kubectl -n $NS describe job $1"
    sleep "$POLL_S"
  done
}

delete_pvc() {  # a measured fio volume: its space back before the database phase, as pglab run does
  k delete pvc "$1" --wait=false || say "could not delete PersistentVolumeClaim/$1 (kubectl -n $NS delete pvc $1)"
}
"""


def run_jobs_script(plan: Plan, sequence: list[Manifest | ClusterPatch]) -> str:
    """``run-jobs.sh``: cluster/ applied and waited for (healthy), then jobs/ one Job at a time in run order, each
    waited for (Complete; Failed or past its deadline stops it, naming the Job), the Cluster patched and waited for
    between points whose Cluster differs. Faults are pglab run's: a scenario run is its Jobs without the fault."""
    k8s = target_of(plan)
    q = shlex.quote
    seconds = (plan.run.measured_seconds or 3600) + plan.run.warmup
    job_timeout = round(max(600.0, 3 * seconds + 600))  # the orchestration's deadline for a Job
    scenarios = sorted({p.scenario.label for p in expand(plan, cores=client_cores(k8s)) if p.scenario is not None})
    ns, name = k8s.namespace, k8s.cluster_name
    head = [
        "#!/bin/sh",
        f"# {RUN_JOBS}: written by pglab k8s render from plan '{plan.name}'. Run it instead of kubectl apply -f",
        f"# {JOBS_DIR}/, which would start every Job at once, before the Cluster is healthy and the dataset loaded:",
        f"#   sh DIR/{RUN_JOBS}    (from any folder; KUBECTL='kubectl --context NAME' for another kubectl or context)",
        f"# 1. kubectl apply -f {CLUSTER_DIR}/ (namespace, RBAC, the Cluster, ...), then wait until CloudNativePG",
        f"#    reports Cluster/{name} '{HEALTHY_PHASE}' with {k8s.instances} ready instances (CLUSTER_TIMEOUT_S).",
        f"# 2. {JOBS_DIR}/ in run order, one Job at a time, each waited for until Complete (JOB_TIMEOUT_S); a Job that",
        "#    fails or outlives that stops the script, exit 1, naming it. A witness Job is applied just before its",
        "#    run's Job and both are waited for. A fio volume is deleted once measured, as pglab run does.",
        "# 3. Between points whose Cluster differs (a CPU step, parameters): its merge patch",
        f"#    ({JOBS_DIR}/50-run-NNNN-0-cluster-patch.json), then the wait again (after a CPU step, until every",
        "#    instance pod has the new CPU; new parameters are waited for by the run's Job itself).",
    ]
    if scenarios:
        head.append(f"# Faults (matrix.scenario: {', '.join(scenarios)}) are injected only by pglab run: here those "
                    "runs get no fault.")
    head += [
        f"# Results stay in the Jobs' logs (kubectl -n {ns} logs job/NAME: a base64 tarball between the pglab results",
        "# markers). Run again after a failure: Jobs already complete are passed over; delete the failed one first.",
        *([f"# Each run's Job has {plan.run.load_pods} pods (run.load_pods, one per index): kubectl -n {ns} logs "
           "-l job-name=NAME --prefix shows each one's."] if plan.run.load_pods > 1 else []),
        f"# At the end: kubectl delete namespace {ns}.",
        "set -eu",
        'KUBECTL=${KUBECTL:-kubectl}',
        "CLUSTER_TIMEOUT_S=${CLUSTER_TIMEOUT_S:-1800}  # the Cluster healthy, at first and after each patch",
        f"JOB_TIMEOUT_S=${{JOB_TIMEOUT_S:-{job_timeout}}}  # each Job: 3 x (warm-up + duration) + 10 min, as pglab run",
        "POLL_S=${POLL_S:-5}",
        f"NS={q(ns)}",
        f"CLUSTER={q(name)}",
        f"INSTANCES={k8s.instances}",
        f"HEALTHY={q(HEALTHY_PHASE)}",
        f"INSTANCE_PODS={q(INSTANCE_PODS)}",
        'HERE=$(CDPATH= cd -- "$(dirname -- "$0")" && pwd)',
    ]
    body = ["", f"say {q(f'plan {plan.name}: namespace {ns}, Cluster/{name}')}"]
    body += [f"filled {CLUSTER_DIR}/{m.filename} {q(m.body['metadata']['annotations'][COPY_FROM])}"
             for m in object_store(plan) if COPY_FROM in (m.body["metadata"].get("annotations") or {})]
    body += [f"apply {CLUSTER_DIR}", f"wait_cluster {q(f'the environment ({CLUSTER_DIR}/)')}"]
    pending_witness: Manifest | None = None
    pvcs = {m.name for m in sequence if isinstance(m, Manifest) and m.kind == "PersistentVolumeClaim"}
    points = {p.key: p for p in expand(plan, cores=client_cores(k8s))}
    seen_points: set[str] = set()
    for item in sequence:
        notes = {} if isinstance(item, ClusterPatch) else item.body["metadata"].get("annotations") or {}
        key = item.point_key if isinstance(item, ClusterPatch) else notes.get("pglab/point-key")
        if key in points and key not in seen_points:
            seen_points.add(key)
            body += ["", f"# point {points[key].index:04d}: {points[key].label()}"]
        if isinstance(item, ClusterPatch):
            cpu = str(millicores(cpu_quantity(item.cpus))) if item.cpus is not None else ""
            body.append(f"patch_cluster {JOBS_DIR}/{item.filename} {q(item.what)} {cpu}".rstrip())
            continue
        if item.kind == "PersistentVolumeClaim":
            body += ["", f"# storage phase: fio on PersistentVolumeClaim/{item.name}",
                     f"apply {JOBS_DIR}/{item.filename}"]
            continue
        component = item.body["metadata"]["labels"]["pglab/component"]
        if component == "witness":
            pending_witness = item
            continue
        if component == "pgbench-init":
            body += ["", "# the dataset"]
        if "pglab/scenario" in notes:
            text = f"matrix.scenario {notes['pglab/scenario']}: injected only by pglab run; {item.name} runs here " \
                   "without the fault"
            body += [f"# {text}", f"say {q(text)}"]
        waits = [item.name]
        if pending_witness is not None:
            body.append(f"apply {JOBS_DIR}/{pending_witness.filename}")
            waits.append(pending_witness.name)
            pending_witness = None
        body.append(f"apply {JOBS_DIR}/{item.filename}")
        body += [f"wait_job {q(w)}" for w in waits]
        if component == "pgbench-run" and plan.run.pause:
            body.append(f"sleep {plan.run.pause:g}  # run.pause")
        body += [f"delete_pvc {q(c)}" for c in _claims(item) if c in pvcs]
    body += ["", f"say \"done: every Job of {JOBS_DIR}/ complete; their results are in their logs\""]
    return "\n".join(head) + "\n" + _RUN_JOBS_FUNCTIONS + "\n".join(body) + "\n"


def _refuse_foreign(out_dir: Path) -> list[str]:
    """The files an earlier render wrote into ``out_dir`` (to replace), or a refusal: a folder that is neither empty
    nor pglab's, or one whose cluster/ or jobs/ holds files no render wrote (they would be applied with them)."""
    from pglab.errors import UserError

    if not out_dir.is_dir() or not any(out_dir.iterdir()):
        return []
    marker = out_dir / RENDER_MARKER
    if not marker.is_file():
        raise UserError(f"-o: {out_dir} is not empty and holds no earlier pglab k8s render (no {RENDER_MARKER}); "
                        "name a new or empty folder, so that no other files are applied with this render's.")
    listed = [line for line in marker.read_text().splitlines()
              if line and not line.startswith("#") and not Path(line).is_absolute() and ".." not in Path(line).parts]
    stray = sorted(str(p.relative_to(out_dir)) for d in (CLUSTER_DIR, JOBS_DIR) if (out_dir / d).is_dir()
                   for p in (out_dir / d).rglob("*") if not p.is_dir() and str(p.relative_to(out_dir)) not in listed)
    if stray:
        raise UserError(f"-o: {out_dir} holds files no pglab k8s render wrote ({', '.join(stray[:3])}"
                        f"{', ...' if len(stray) > 3 else ''}); move them away or name a new folder, so that they are "
                        "not applied with this render's.")
    return listed


def write(plan: Plan, manifests: list[Manifest], out_dir: Path) -> Written:
    """The render, safe to apply: the environment (namespace, RBAC, Cluster, disk sampler, scripts' ConfigMap) in
    ``cluster/``, what runs (fio PVCs and Jobs, the dataset Job, the runs' Jobs, the Cluster patches between
    points) in ``jobs/``, and ``run-jobs.sh`` applying them in order, each waited for. An earlier render in the
    folder is replaced (the files its marker lists); any other non-empty folder is refused."""
    from pglab.errors import UserError

    if plan.matrix.storage or plan.tenants:  # run-jobs.sh drives one Cluster
        field = "matrix.storage" if plan.matrix.storage else "tenants"
        raise UserError(f"{field}: a rendered folder holds one Cluster, and this plan needs one per "
                        f"{'value' if plan.matrix.storage else 'tenant'}; run it with 'pglab run'.")
    if plan.storage is not None and plan.storage.host_path is not None:
        raise UserError("storage.host_path: its fio pod runs on each instance's node after that node's PVC run, "
                        "which no Job written ahead can place; run it with 'pglab run', or remove it to render.")
    if plan.capacity is not None:  # run-jobs.sh runs a fixed list of Jobs
        raise UserError("capacity: a search picks each rate from the runs before it, which no Job written ahead "
                        "can; run it with 'pglab run', or render fixed rates (matrix.rate) instead.")
    if plan.run.target_ci_pct is not None:
        raise UserError("run.repeats: adaptive repeats decide after each round whether to run another, which no "
                        "Job written ahead can; render a fixed number (repeats: N) or run it with 'pglab run'.")
    old = _refuse_foreign(out_dir)
    for rel in old:
        (out_dir / rel).unlink(missing_ok=True)
    sequence = job_sequence(plan, manifests)
    environment = [m for m in manifests if m.kind not in _RUNNING_KINDS]
    cluster_files = [out_dir / CLUSTER_DIR / m.filename for m in environment]
    job_files = [out_dir / JOBS_DIR / m.filename for m in sequence if isinstance(m, Manifest)]
    patch_files = [out_dir / JOBS_DIR / m.filename for m in sequence if isinstance(m, ClusterPatch)]
    script = out_dir / RUN_JOBS
    for d in (CLUSTER_DIR, JOBS_DIR):
        (out_dir / d).mkdir(parents=True, exist_ok=True)
    listing = [str(p.relative_to(out_dir)) for p in (*cluster_files, *job_files, *patch_files, script)]
    (out_dir / RENDER_MARKER).write_text(  # first: an interrupted write still names every file it may have left
        f"# pglab k8s render of plan '{plan.name}': these files; a later render into this folder replaces them\n"
        + "\n".join(listing) + "\n")
    for m, path in zip(environment, cluster_files, strict=True):
        path.write_text(to_yaml(m.body))
    for item in sequence:
        folder = out_dir / JOBS_DIR
        if isinstance(item, ClusterPatch):
            (folder / item.filename).write_text(json.dumps(item.body, indent=2) + "\n")
        else:
            (folder / item.filename).write_text(to_yaml(item.body))
    script.write_text(run_jobs_script(plan, sequence))
    script.chmod(0o755)
    for d in (CLUSTER_DIR, JOBS_DIR):  # an earlier render's folder left empty
        if not any((out_dir / d).iterdir()):
            (out_dir / d).rmdir()
    return Written(cluster_files, job_files, patch_files, script)
