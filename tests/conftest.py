"""Shared helpers for tests that run the real thing: pglab's CLI, PostgreSQL servers, pgbench; and the test layers.

Layers (docs/testing.md): a module that starts real servers says so with ``pytestmark = pytest.mark.postgres`` (or
``kube_lab``); a test using a fixture of ``SERVER_FIXTURES`` is marked ``postgres`` whatever its module says; every
other test is marked ``unit``, so ``-m unit`` and ``-m "not postgres and not kube_lab"`` select the same tests.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from helpers import Ran

# The dataset cache (src/pglab/targets/local/dataset/cache.py) is off in every test unless the test turns it on:
# a test loads the dataset it means to test, and nothing is written into the user's cache folder.
os.environ["PGLAB_CACHE"] = "off"
os.environ["PGLAB_CACHE_DIR"] = str(Path(tempfile.gettempdir()) / f"pglab-test-cache-{os.getpid()}")

if TYPE_CHECKING:
    from kubernetes import client

    from k8s_fake import FakeAPI
    from kube_lab_support import kubelab

REPO = Path(__file__).resolve().parent.parent
CHECKER = REPO / ".tools" / "bin" / "cnpg-check"
LAYERS = ("postgres", "kube_lab")
SERVER_FIXTURES = {"postgres"}  # fixtures that start a real PostgreSQL (tests/test_k8s_axes.py's, for one)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Put every test in exactly one layer: by its fixtures, its module's ``pytestmark``, or ``unit``."""
    for item in items:
        if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())) and item.get_closest_marker("postgres") is None:
            item.add_marker(pytest.mark.postgres)
        layers = [name for name in LAYERS if item.get_closest_marker(name) is not None]
        if len(layers) > 1:
            raise pytest.UsageError(f"{item.nodeid} is marked {' and '.join(layers)}: a test belongs to one layer")
        if not layers:
            item.add_marker(pytest.mark.unit)


def pglab(*args: str, timeout: float = 600, check: bool = False, **kwargs: object) -> subprocess.CompletedProcess[str]:
    """Run the pglab CLI as a user would, in a subprocess."""
    proc = subprocess.run(
        [sys.executable, "-m", "pglab.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        **kwargs,
    )  # type: ignore[call-overload]
    if check and proc.returncode != 0:
        raise AssertionError(f"pglab {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def run_plan(plan: Path, results: Path, *args: str, check: bool = True, timeout: float = 600,
             **kwargs: object) -> Ran:
    """``pglab run PLAN --results RESULTS ARGS…`` as a user would; ``check``: a non-zero exit fails the test with
    pglab's output. Read what it stored through the returned ``Ran`` (tests/helpers.py)."""
    proc = pglab("run", str(plan), "--results", str(results), *args, check=check, timeout=timeout, **kwargs)
    return Ran(proc, results)


@pytest.fixture
def run_in_tmp(tmp_path: Path) -> Callable[..., Ran]:
    """Run a plan given as YAML text in this test's folder (plan.yaml, results/), then read its store:
    ``run_in_tmp(PLAN, "--format", "csv")``; ``check=False`` when the test expects pglab to refuse or fail."""

    def run(text: str, *args: str, check: bool = True, timeout: float = 600, **kwargs: object) -> Ran:
        plan = write_plan(tmp_path / "plan.yaml", text)
        return run_plan(plan, tmp_path / "results", *args, check=check, timeout=timeout, **kwargs)

    return run


def shell_complete(words: str) -> list[str]:
    """What pglab's bash completion offers for the command line ``words`` (a trailing space: the next word)."""
    env = {**os.environ, "_PGLAB_COMPLETE": "complete_bash", "COMP_WORDS": words,
           "COMP_CWORD": str(len(words.split()) - (0 if words.endswith(" ") else 1))}
    proc = pglab(env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def processes_mentioning(text: str) -> list[str]:
    """Command lines of running processes that mention ``text`` (e.g. a lab directory)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmd:
            found.append(f"{entry.name}: {cmd.strip()}")
    return found


def write_plan(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.fixture
def plan_file(tmp_path: Path):
    def make(text: str, name: str = "plan.yaml") -> Path:
        return write_plan(tmp_path / name, text)

    return make


# ------------------------------------------------------------------ the Kubernetes tests (imported when used)
@pytest.fixture
def k8s_api() -> Iterator[tuple[FakeAPI, client.ApiClient]]:
    """The fake Kubernetes API server (tests/k8s_fake/) as it starts, and an official client pointed at it."""
    from k8s_fake import serve

    with serve() as pair:
        yield pair


@pytest.fixture
def fake(k8s_api: tuple[FakeAPI, client.ApiClient]) -> tuple[FakeAPI, client.ApiClient]:
    """The fake whose Jobs print what real pgbench and fio printed (tests/data/k8s); a module that needs more
    overrides this fixture and asks for it by the same name."""
    from k8s_support import pod_log

    api, _ = k8s_api
    api.default_log = pod_log
    return k8s_api


POD_NETNS_BEFORE_LAB: set[str] = set()  # the pods' network namespaces on the machine before the session's lab


@pytest.fixture(scope="session")
def lab() -> Iterator[kubelab.KubeLab]:
    """The Kubernetes lab (tools/kube-lab), started once for every kube_lab test of this pytest run and stopped
    after them, also when they fail or are interrupted (tests/test_kube_z_lab_down.py stops it first, with
    ``kubelab.py down``, and checks it left nothing; stopping it again here is then a no-op)."""
    from kube_lab_support import cni_netns, kubelab

    POD_NETNS_BEFORE_LAB.update(cni_netns())

    images = os.environ.get("PGLAB_KUBE_LAB_IMAGES")
    try:
        lab = kubelab.KubeLab(Path(images) if images else None)
    except kubelab.LabError as exc:
        pytest.fail(f"the Kubernetes lab cannot start: {exc}", pytrace=False)
    try:
        lab.start()
        print(f"kube-lab: {lab.timings}", file=sys.stderr)
    except kubelab.LabError as exc:
        lab.stop()
        pytest.fail(f"the Kubernetes lab cannot start: {exc}", pytrace=False)
    except BaseException:
        lab.stop()
        raise
    try:
        yield lab
    finally:
        lab.stop()


@pytest.fixture(scope="module")
def checker() -> Path:
    """tools/cnpg-check, which ./setup.sh test builds."""
    if not CHECKER.is_file():
        pytest.fail(f"{CHECKER} is missing: ./setup.sh test builds it (tools/cnpg-check)")
    return CHECKER
