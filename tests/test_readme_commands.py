"""The README's commands run as written (issue 20): every shell command of its ```bash blocks, of the ```sh and ```bash
blocks of docs/*.md, and of the examples' opening comments, is either run here, in a folder holding the results
folders it names (built through the Store, shaped like what the plans it runs would store), or skipped by a pattern
below that says why. A command the README or an example shows and pglab no longer accepts fails this test; so does a
new command nobody classified. Nothing here starts a server."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from conftest import REPO
from pglab.store import Store

README = REPO / "README.md"

# commands that need a lab, root, a cluster or minutes: the pattern, and why it is not run here
SKIPPED: list[tuple[str, str]] = [
    (r"\./setup\.sh ", "installs packages and builds labs (minutes, root)"),
    (r"sudo ", "starts or stops the Kubernetes lab (root, a built lab)"),
    (r"\. \.venv/bin/activate$", "this test puts its own pglab on PATH"),
    (r"pglab run ", "builds a lab and runs a sweep (minutes)"),
    (r"pglab noise ", "A/A runs on a lab (minutes)"),
    (r"pglab fio ", "fio for minutes on /mnt paths this machine may not have"),
    (r"pglab cluster ", "starts etcd and Patroni"),
    (r"pglab k8s check ", "asks a Kubernetes cluster"),
    (r"pglab lab clean /tmp/pglab-lab-XXXX$", "a placeholder for the folder 'pglab run --keep' prints"),
    (r"\.tools/bin/cnpg-check ", "needs the checker ./setup.sh builds; tests/test_k8s.py runs it on every render"),
    (r"(time |PYTHONPATH=(\.\./(before|after)/)?src )?\.venv/bin/python (\.\./before/)?bench/",
     "a benchmark of pglab itself (or of the trees before and after a change): minutes on a lab, measured"),
    (r"(PGLAB_KUBE_LAB_IMAGES=.* )?\.venv/bin/python -m pytest ", "the test suite itself (what CI runs)"),
    (r"time (\./setup\.sh|sudo|tools/kube-lab/build\.sh) ", "timing installs and lab builds (minutes, root)"),
    (r"git clone ", "a fresh clone (the network, the repository's address)"),
    (r"(apt-get|truncate|mkfs\.xfs|mount) ", "makes and mounts an XFS filesystem for the reflink measurement (root)"),
    (r"rm -rf ~/\.cache/pglab/kube-lab", "removes the lab's build cache (a 20 min rebuild)"),
    (r"kubectl |sh m/run-jobs\.sh", "asks a Kubernetes cluster"),
    (r"mkdir (-p )?\S+ && git archive ", "extracts an older pglab a benchmark compares with (a commit of the clone)"),
    (r"flock /tmp/pglab-kube-lab\.lock ", "starts the Kubernetes lab (root, a built lab) for a benchmark"),
]
_COMMAND = r"(?:pglab|\./setup\.sh|sudo|\.tools/bin/)\S*(?: [^`#]*)?"


def readme_commands(text: str) -> list[str]:
    """The shell commands of the ```bash blocks, without their trailing comments (and comment-only lines)."""
    commands = []
    for block in re.findall(r"^```bash\n(.*?)^```", text, flags=re.S | re.M):
        for line in block.splitlines():
            command = re.split(r"\s+#\s", line, maxsplit=1)[0].strip()
            if command and not command.startswith("#"):
                commands.append(command)
    return commands


def docs_commands(text: str) -> list[str]:
    """The shell commands of a docs page's ```sh and ```bash blocks: lines continued by a backslash joined,
    trailing comments and comment-only lines left out."""
    commands = []
    for block in re.findall(r"^```(?:sh|bash)\n(.*?)^```", text, flags=re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            command = re.split(r"\s+#\s", line, maxsplit=1)[0].strip()
            if command and not command.startswith("#"):
                commands.append(re.sub(r"\s+", " ", command))
    return commands


def example_commands(text: str) -> list[str]:
    """The commands an example's opening comment gives: `in backticks`, or indented on a line of their own."""
    commands = []
    for line in text.split("\n"):
        if not line.startswith("#"):
            break
        commands += re.findall(rf"`({_COMMAND})`", line)
        if m := re.match(rf"#   ({_COMMAND})", line):
            commands.append(m.group(1).strip())
    return [c.strip() for c in commands]


def skip_reason(command: str) -> str | None:
    return next((why for pattern, why in SKIPPED if re.match(pattern, command)), None)


COMMANDS = list(dict.fromkeys(readme_commands(README.read_text()) + [  # each once, in order
    c for p in sorted((REPO / "examples").glob("*.yaml")) for c in example_commands(p.read_text())] + [
    c for p in sorted((REPO / "docs").glob("*.md")) for c in docs_commands(p.read_text())]))
RUN = [c for c in COMMANDS if skip_reason(c) is None]


def test_the_extraction_finds_the_commands() -> None:
    text = "a\n```bash\npglab x a   # note\n                  # more note\npglab y\n```\n```yaml\nname: z\n```\n"
    assert readme_commands(text) == ["pglab x a", "pglab y"]
    example = ("# Text, `pglab run a.yaml`, then `pglab report r --table t`.\n#   no-qos   not a command\n"
               "#   ./setup.sh kube-lab     # builds\n#   pglab k8s render a.yaml -o m\nname: a\n# `pglab late`\n")
    assert example_commands(example) == ["pglab run a.yaml", "pglab report r --table t", "./setup.sh kube-lab",
                                         "pglab k8s render a.yaml -o m"]
    assert docs_commands("```sh\nrun a \\\n    --b c   # note\n# only a note\n```\n") == ["run a --b c"]
    assert "pglab plan validate examples/quickstart.yaml" in RUN
    assert any(c.startswith("pglab report ") for c in RUN) and any(c.startswith("pglab run ") for c in COMMANDS)


def test_every_skip_pattern_still_matches_a_readme_command() -> None:
    """A pattern nothing matches any more is a stale excuse: remove it."""
    stale = [p for p, _ in SKIPPED if not any(re.match(p, c) for c in COMMANDS)]
    assert not stale, stale


T0 = 1_700_000_000.0


def _sweep(results: Path, plan: str, points: list[dict[str, Any]], tps: float = 100.0, *, storage: bool = False,
           tenants: int = 0) -> None:
    """A finished sweep of ``plan`` (an example's name): 3 ok runs per point, TPS falling with durability."""
    store = Store.open(results)
    sweep = store.begin_sweep(plan, (REPO / "examples" / f"{plan}.yaml").read_text(), plan, "0")
    keyed = [(i, f"k{i}", axes) for i, axes in enumerate(points)]
    ids = store.add_points(sweep, keyed)
    levels = {"off": 1.2, "local": 1.0, "remote_write": 0.9, "on": 0.8, "remote_apply": 0.7}
    for i, key, axes in keyed:
        base = tps * levels.get(axes.get("synchronous_commit", "on"), 1.0) * (1 + i / 10)
        for rep in (1, 2, 3):
            run_id, _ = store.start_run(sweep, ids[key], i, rep)
            start = T0 + 100 * (3 * i + rep)
            value = base * (1 + rep / 100)
            metrics: dict[str, float | None] = {"tps": value, "latency_avg_ms": 1000.0 / value,
                                                "latency_p99_ms": 3000.0 / value, "cpu_pct": 50.0}
            if "scenario" in axes:
                metrics |= {"rto_s": 20.0 + rep, "acked_lost": 0.0, "witness_acked": 50.0, "tps_before": value,
                            "tps_during": value / 2}
            if tenants:
                metrics |= {"tenants": float(tenants), "instances": float(tenants)}
            store.finish_run(run_id, "ok", window=(start, start + 60), metrics=metrics,
                             series=[(start + s, "pgbench", "tps", value) for s in range(3)],
                             tenants=[(f"t{t:02d}", "all", "tps", value / tenants) for t in range(1, tenants + 1)])
    if storage:
        store.save_fio(sweep, "data", "vda", [SimpleNamespace(
            path="/lab/data", profile="randread-8k", job="randread-8k", direction="read", iops=1000.0, bw_mb_s=7.8,
            lat_mean_ms=0.5, lat_p50_ms=0.4, lat_p99_ms=1.5, lat_p999_ms=3.0, sync_lat_mean_ms=None,
            sync_lat_p99_ms=None, sync_lat_p999_ms=None, started=T0 - 20, ended=T0 - 16, findings=[],
            json_file=None, options={"bs": "8k"}, series=[(T0 - 20 + s, 1000.0, 0.5) for s in range(4)])],
            {"randread_iops_qd32": 1000.0})
    store.end_sweep(sweep, "done")
    store.close()


def _matrix(**axes: list[Any]) -> list[dict[str, Any]]:
    points: list[dict[str, Any]] = [{"jobs": 1}]
    for name, values in axes.items():
        points = [{**p, name: v} for p in points for v in values]
    return points


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A folder like the checkout after the README's runs: examples/, and the results folders the commands read."""
    work = tmp_path_factory.mktemp("readme")
    (work / "examples").symlink_to(REPO / "examples")
    results = work / "results"
    quickstart = _matrix(workload=["tpcb-like", "select-only"], synchronous_commit=["local", "on", "remote_apply"],
                         clients=[1, 8])
    _sweep(results / "qs", "quickstart", quickstart, storage=True)
    _sweep(results / "a", "quickstart", quickstart)
    _sweep(results / "b", "quickstart", quickstart, tps=120.0)
    _sweep(results / "cpu-scaling", "cpu-scaling", _matrix(
        cpus=[0.5, 1.0, 1.5], workload=["tpcb-like"], synchronous_commit=["local", "on"], clients=[1, 4]))
    _sweep(results / "failover", "failover", _matrix(
        workload=["tpcb-like"], clients=[4], synchronous_commit=["off", "on"], scenario=["failover-node"]))
    _sweep(results / "backup-under-load", "backup-under-load", _matrix(
        workload=["select-only", "tpcb-like"], clients=[4], synchronous_commit=["on"],
        scenario=["backup", "backup max-rate=64M"]))
    _sweep(results / "s2", "kubernetes-storage-classes", _matrix(
        storage=["standard", "premium"], workload=["tpcb-like"], synchronous_commit=["on"], clients=[64]))
    _sweep(results / "s3", "kubernetes-cnpg", _matrix(workload=["tpcb-like"], synchronous_commit=["on"], clients=[64]))
    _sweep(results / "qos-tiers", "qos-tiers", [{"arrangement": "no-qos"}, {"arrangement": "qos-many-high"}],
           tenants=3)
    # the studies' examples (examples/study-*.yaml): the folders their opening comments' commands read
    _sweep(results / "study-cpu-sync-scaling", "study-cpu-sync-scaling", _matrix(
        cpus=[0.5, 1.0], workload=["tpcb-like"], synchronous_commit=["local", "on"], clients=[1, 4]))
    _sweep(results / "study-backup-under-load", "study-backup-under-load", _matrix(
        workload=["tpcb-like"], clients=[4], synchronous_commit=["on"], scenario=["backup"]))
    _sweep(results / "study-qos-tiers", "study-qos-tiers", [{"arrangement": "no-qos"}, {"arrangement": "qos-tiers"}],
           tenants=3)
    _sweep(results / "study-storage-classes", "study-storage-classes", _matrix(
        storage=["capped", "local"], workload=["tpcb-like"], synchronous_commit=["on"], clients=[8]))
    _sweep(results / "study-fio-then-pgbench", "study-fio-then-pgbench", _matrix(
        workload=["tpcb-like"], synchronous_commit=["on"], clients=[1, 4]), storage=True)
    managed = _matrix(workload=["tpcb-like", "select-only"], synchronous_commit=["on"], clients=[4, 8])
    _sweep(results / "managed-a", "study-managed-client-loop", managed)
    _sweep(results / "managed-b", "study-managed-client-loop", managed, tps=120.0)
    bindir = work / "bin"
    bindir.mkdir()
    wrapper = bindir / "pglab"  # this checkout's pglab, as `. .venv/bin/activate` would put one on PATH
    wrapper.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m pglab.cli \"$@\"\n")
    wrapper.chmod(0o755)
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")])),
           "PGLAB_STATE_DIR": str(work / "state")}  # lab list / lab clean look at this folder, not the user's
    return work, env


@pytest.mark.parametrize("command", RUN)
def test_readme_command_runs_as_written(command: str, workdir: tuple[Path, dict[str, str]]) -> None:
    work, env = workdir
    proc = subprocess.run(["bash", "-c", command], cwd=work, env=env, capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, f"{command!r} exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr


def test_the_readme_minimal_plan_validates(workdir: tuple[Path, dict[str, str]]) -> None:
    # "Save it as first.yaml, then pglab plan validate first.yaml": as written (the larger plan further down names
    # script files and a WAL device of the reader's, and is a tour of the fields, not a plan to paste)
    work, env = workdir
    found = re.search(r"^```yaml\n(name: first\n.*?)^```", README.read_text(), flags=re.S | re.M)
    assert found, "the README shows its minimal plan, first.yaml"
    (work / "first.yaml").write_text(found.group(1))
    proc = subprocess.run(["bash", "-c", "pglab plan validate first.yaml"], cwd=work, env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "valid — 4 points × 3 repeats = 12 runs" in proc.stdout, proc.stdout


BENCH = [c for c in COMMANDS if re.match(r"(time |PYTHONPATH=src )?\.venv/bin/python bench/", c)]


@pytest.mark.parametrize("command", BENCH)
def test_a_benchmark_command_names_a_script_and_options_it_has(command: str) -> None:
    """A benchmark takes minutes on a lab and is not run here, but its script and every option the docs give it
    must still exist (a renamed flag would make the recorded figures unreproducible as written)."""
    script = re.search(r"bench/\S+\.py", command)
    assert script and (REPO / script.group(0)).is_file(), command
    usage = subprocess.run([sys.executable, str(REPO / script.group(0)), "--help"], capture_output=True, text=True,
                           timeout=120, check=False, env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    assert usage.returncode == 0, usage.stderr
    missing = [o for o in re.findall(r"(?<!\S)(--[a-z][a-z0-9-]*)", command) if o not in usage.stdout]
    assert not missing, f"{command!r}: {script.group(0)} has no option {', '.join(missing)}"
