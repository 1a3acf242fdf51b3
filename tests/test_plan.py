"""Plans: validation names the field path, the CLI exits 2 and starts nothing; expansion is the product."""

from __future__ import annotations

import glob
import json
import tempfile
from pathlib import Path

import pytest
import yaml

from conftest import pglab, processes_mentioning
from k8s_support import k8s_plan
from pglab.errors import PlanError
from pglab.plan import expand, parse_plan

GOOD = """
name: t
matrix:
  workload: [tpcb-like, select-only]
  synchronous_commit: [local, "on", remote_apply]
  clients: [1, 4, 8]
  parameters: {work_mem: [4MB, 64MB]}
run: {duration: 5s, warmup: 1s, repeats: 2}
"""


def problems(text: str) -> list[str]:
    with pytest.raises(PlanError) as info:
        parse_plan(text)
    return info.value.problems


def test_every_combination_is_a_point() -> None:
    plan = parse_plan(GOOD)
    points = expand(plan, cores=2)
    assert len(points) == 2 * 3 * 3 * 2
    assert len({p.key for p in points}) == len(points)
    assert {p.jobs for p in points if p.clients == 1} == {1}
    assert {p.jobs for p in points if p.clients == 8} == {2}
    assert points[0].axes["parameters.work_mem"] == "4MB"
    assert plan.run.warmup == 1.0 and plan.run.measured_seconds == 5.0


def test_sizes_are_numbers_from_validation_and_the_users_text_everywhere_else() -> None:
    plan = parse_plan("name: t\nstorage: {size: ' 256 MiB'}\ntarget: {local: {resources: {memory: 1.5g}}}")
    assert plan.storage is not None and plan.target.local is not None and plan.target.local.resources is not None
    size, memory = plan.storage.size, plan.target.local.resources.memory
    assert memory is not None
    assert (size, size.bytes) == ("256 MiB", 256 * 2**20)
    assert (memory, memory.bytes) == ("1.5g", 3 * 2**29)
    dumped = plan.model_dump()
    assert type(dumped["storage"]["size"]) is str and dumped["storage"]["size"] == "256 MiB"
    assert type(dumped["target"]["local"]["resources"]["memory"]) is str
    assert yaml.safe_load(yaml.safe_dump(dumped))["storage"]["size"] == "256 MiB"  # plain text: safe_dump takes it
    assert json.loads(plan.model_dump_json())["target"]["local"]["resources"]["memory"] == "1.5g"
    default = parse_plan("name: t\nstorage: {}").storage
    assert default is not None and (default.size, default.size.bytes) == ("1GiB", 2**30)
    given_as_bytes = parse_plan("name: t\nstorage: {size: 1048576}").storage
    assert given_as_bytes is not None and (given_as_bytes.size, given_as_bytes.size.bytes) == ("1048576", 2**20)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("name: t\nmatrix: {clients: [1, 4, -8]}", "matrix.clients[2]: must be a positive integer"),
        ("name: t\nmatrix: {clients: [1, 'x']}", "matrix.clients[1]: must be a positive integer"),
        ("name: t\nmatrix: {synchronous_commit: [maybe]}", "matrix.synchronous_commit[0]: must be"),
        ("name: t\nmatrix: {workload: [tpcb-like, nope]}", "matrix.workload[1]: must be one of tpcb-like"),
        ("name: t\nrun: {duration: 10 parsecs}", "run.duration: must be a duration"),
        ("name: t\nrun: {duration: 5, transactions: 10}", "run: give either 'duration' or 'transactions'"),
        ("name: t\nrun: {overrun: soon}", "run.overrun: must be a duration"),
        ("name: t\nrun: {replay_stall: 500ms}", "run.replay_stall: must be at least 1 second"),
        ("name: t\nrun: {connect_timeout: 2.5}", "run.connect_timeout: must be a whole number of seconds, at least 2"),
        ("name: t\ndataset: {scale: 0}", "dataset.scale: must be a positive integer"),
        ("name: t\nbogus: 1", "bogus: unknown field"),
        ("name: t\ntarget: {local: {instances: 1, synchronous: {number: 1}}}", "target.local: synchronous.number"),
        ("name: t\npostgres: {parameters: {port: 5}}", "postgres.parameters: 'port' is managed by pglab"),
        ("matrix: {clients: [1]}", "name: is required"),
        ("name: t\nmatrix: [1, 2]", "matrix: must be a mapping"),
        ("- just\n- a list", "the plan must be a YAML mapping"),
        ("name: t\nmatrix: {clients: [1, 2}", "not valid YAML at line 2"),
        ("name: t\nstorage: {size: 1.3k}", "storage.size: must be a whole number of bytes"),
        ("name: t\nstorage: {size: 512k}", "storage.size: must be between 1 MiB and 1 PiB"),
        ("name: t\nstorage: {size: '99999999999999999999.3'}", "storage.size: must be between 1 MiB and 1 PiB"),
        ("name: t\nstorage: {size: 1e9}", "storage.size: must be a size such as 256MiB"),
        ("name: t\ntarget: {local: {resources: {memory: lots}}}", "target.local.resources.memory: must be a size"),
    ],
)
def test_invalid_plans_name_the_field(text: str, expected: str) -> None:
    got = problems(text)
    assert any(line.startswith(expected) or expected in line for line in got), got


def test_the_deadlines_for_a_silent_part_default_as_before_and_take_the_plans_values() -> None:
    """run.overrun, run.replay_stall, run.connect_timeout (pglab.drivers.local; tests/test_chaos.py waits them out)."""
    run = parse_plan("name: t\nrun: {duration: 4s}").run
    assert (run.overrun_s(4), run.overrun_s(120), run.replay_stall, run.connect_timeout) == (30.0, 120.0, 60.0, 10.0)
    run = parse_plan("name: t\nrun: {duration: 4s, overrun: 10s, replay_stall: 1m, connect_timeout: 3}").run
    assert (run.overrun_s(4), run.overrun_s(120), run.replay_stall, run.connect_timeout) == (10.0, 10.0, 60.0, 3.0)
    # the Kubernetes driver's deadlines are its own: a plan for it that sets one is refused, naming the field
    for field in ("overrun: 10s", "replay_stall: 60s", "connect_timeout: 10"):
        got = problems(k8s_plan("matrix: {clients: [1]}", f"run: {{duration: 4s, {field}}}"))
        assert got == [f"run.{field.split(':')[0]}: this deadline of local and external targets is not available on a "
                       "Kubernetes target yet; remove this"], got
    assert parse_plan(k8s_plan("matrix: {clients: [1]}", "run: {duration: 4s}")).run.overrun is None


def test_custom_script_file_must_exist(tmp_path: Path) -> None:
    text = "name: t\nmatrix:\n  workload: [{name: mix, scripts: [{file: missing.sql, weight: 2}]}]\n"
    with pytest.raises(PlanError) as info:
        parse_plan(text, base_dir=tmp_path)
    assert info.value.problems == [
        "matrix.workload[0].scripts[0].file: no such file 'missing.sql' (relative paths are relative to the "
        "plan's folder)"
    ]
    (tmp_path / "mine.sql").write_text("SELECT 1;\n")
    plan = parse_plan(text.replace("missing.sql", "mine.sql"), base_dir=tmp_path)
    assert expand(plan)[0].workload_name == "mix"


def test_yaml_alias_bomb_is_refused() -> None:
    lines = ["a: &a [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 16):
        prev = chr(ord("a") + i - 1)
        cur = chr(ord("a") + i)
        lines.append(f"{cur}: &{cur} [{', '.join(['*' + prev] * 9)}]")
    got = problems("\n".join(lines))
    assert "YAML aliases" in got[0]


def _labs() -> set[str]:
    return set(glob.glob(str(Path(tempfile.gettempdir()) / "pglab-lab-*")))


def test_cli_rejects_a_broken_plan_and_starts_nothing(plan_file, tmp_path: Path) -> None:
    bad = plan_file("name: broken\nmatrix:\n  clients: [1, 4, -8]\n  workload: [tpcb-like, nope]\nextra: 1\n")
    results = tmp_path / "results"
    before = _labs()
    for args in (["plan", "validate", str(bad)], ["run", str(bad), "--results", str(results)]):
        proc = pglab(*args)
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert "matrix.clients[2]: must be a positive integer" in lines
        assert any(line.startswith("matrix.workload[1]:") for line in lines)
        assert any(line.startswith("extra: unknown field") for line in lines)
        assert "Traceback" not in proc.stderr
    assert not results.exists()
    assert _labs() <= before  # no lab created (one left by a dead pglab may have been reaped meanwhile)
    assert processes_mentioning(str(tmp_path)) == []


def test_cli_validate_accepts_the_quickstart() -> None:
    proc = pglab("plan", "validate", "examples/quickstart.yaml", check=True)
    assert "valid — 12 points × 3 repeats = 36 runs, interleaved" in proc.stdout, proc.stdout


def test_cli_validate_counts_a_capacity_searchs_probes(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text("name: c\nmatrix: {clients: [2, 4]}\nrun: {duration: 4s, repeats: 2}\n"
                    "capacity: {percentile: 99, target: 200ms, max_probes: 6}\n")
    proc = pglab("plan", "validate", str(plan), check=True)
    assert ("valid — 2 points, each a capacity search of at most 6 rates × 2 repeats = up to 24 runs"
            in proc.stdout), proc.stdout


def test_cli_schema_is_json_schema() -> None:
    proc = pglab("plan", "schema", check=True)
    schema = json.loads(proc.stdout)
    assert schema["title"] == "Plan"
    assert "matrix" in schema["properties"]


def test_cli_errors_for_a_missing_file_and_a_non_utf8_plan(tmp_path: Path) -> None:
    proc = pglab("plan", "validate", str(tmp_path / "nope.yaml"))
    assert proc.returncode == 2 and "no such plan file" in proc.stderr
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"name: \xff\xfe\n")
    proc = pglab("plan", "validate", str(binary))
    assert proc.returncode == 2 and "not UTF-8" in proc.stderr and "Traceback" not in proc.stderr


def test_bare_on_and_off_are_synchronous_commit_levels() -> None:
    from pglab.plan import parse_plan

    plan = parse_plan("name: t\nmatrix: {synchronous_commit: [off, local, on]}\n")
    assert plan.matrix.synchronous_commit == ["off", "local", "on"]


def test_adaptive_repeats_with_max_below_min_are_refused_naming_the_field() -> None:
    with pytest.raises(PlanError) as info:
        parse_plan("name: x\nrun: {repeats: {min: 4, max: 3, target_ci: 5%}}\n")
    assert info.value.problems == ["run.repeats.max: max (3) must be at least min (4)"]


@pytest.mark.parametrize("example", sorted(p.name for p in (Path(__file__).resolve().parent.parent / "examples")
                                           .glob("*.yaml")))
def test_examples_are_named_by_purpose_and_say_what_they_reproduce(example: str) -> None:
    """Issue 20: an example's file name says what it is for, its plan carries the same name (so a default run
    lands in results/<file name>, where its comments read it back), and it opens with a comment about it."""
    path = Path(__file__).resolve().parent.parent / "examples" / example
    text = path.read_text()
    assert text.startswith("# ") and len(text.split("\n", 1)[0]) > 20, "open with a comment saying what it is"
    assert not example.startswith("seed-")
    assert parse_plan(text, base_dir=path.parent).name == path.stem
