"""The dataset cache against real servers: a lab started from the cache has the dataset a fresh load builds (and
pgbench -i builds), its standbys stream from it; an entry for another key, a tampered, corrupted or incomplete one
is never used; least recently used entries are evicted under the cap, never one in use; ``pglab cache list|clean``;
and a run records that its dataset came from the cache."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import pglab, processes_mentioning
from helpers import PGBENCH_STATS, pgbench_dump
from pglab.plan.schema import Dataset, LocalTarget
from pglab.targets.local import dataset as df
from pglab.targets.local.cluster import LocalLab, Node
from pglab.targets.local.dataset import cache

pytestmark = pytest.mark.postgres

SCALE = 1


def _on(root: Path) -> dict[str, str]:
    return {"PGLAB_CACHE": "on", "PGLAB_CACHE_DIR": str(root)}


@pytest.fixture
def cache_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    for k, v in _on(root).items():
        monkeypatch.setenv(k, v)
    return root


def _lab(base: Path, instances: int = 1, scale: int = SCALE, **dataset: Any) -> LocalLab:
    sync = {"method": "any", "number": 1} if instances > 1 else None
    return LocalLab(LocalTarget(instances=instances, synchronous=sync), base,
                    dataset=Dataset(scale=scale, **dataset))


def _teardown(lab: LocalLab) -> None:
    lab_dir = lab.lab_dir
    lab.teardown()
    assert lab_dir is not None and processes_mentioning(str(lab_dir)) == []


def _state(lab: LocalLab, node: Node) -> tuple[Any, ...]:
    with lab.connect(node) as conn:
        return (*pgbench_dump(conn), conn.execute(PGBENCH_STATS).fetchall(),
                conn.execute("SELECT system_identifier FROM pg_control_system()").fetchone())


@pytest.fixture(scope="module")
def filled() -> Iterator[dict[str, Any]]:
    """A cache filled by a first lab (a fresh load), and what that lab held."""
    base = Path(tempfile.mkdtemp(prefix="pglab-test-"))
    os.chmod(base, 0o711)
    root = base / "cache"
    saved = {k: os.environ.get(k) for k in _on(root)}
    os.environ.update(_on(root))
    lab = _lab(base)
    try:
        lab.provision({})
        info = lab.describe()["dataset"]
        fresh = _state(lab, lab.nodes[0])
        key = cache.make_key(lab.bindir, scale=SCALE, partitions=None,
                             owner_uid=lab.server_user.uid if lab.server_user else os.getuid(), parameters={})
        _teardown(lab)
        yield {"base": base, "root": root, "info": info, "fresh": fresh, "key": key, "bindir": lab.bindir}
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(base, ignore_errors=True)


def test_the_first_load_fills_the_cache(filled: dict[str, Any]) -> None:
    info, key = filled["info"], filled["key"]
    assert info["load_s"] > 0 and info["cache"]["hit"] is False and info["cache"]["stored"] is True
    assert info["cache"]["key"] == key.name and info["cache"]["miss"] == "no entry"
    entry = filled["root"] / key.name
    meta = json.loads((entry / "entry.json").read_text())
    assert meta["key"] == key.fields and meta["dataset"] == {"scale": SCALE, "partitions": 0}
    assert (entry / "secret").stat().st_mode & 0o777 == 0o600 and filled["root"].stat().st_mode & 0o777 == 0o700
    control = df.control_data(filled["bindir"], entry / "data")
    assert control["Database cluster state"] == "shut down"
    assert meta["control"]["Database system identifier"] == control["Database system identifier"]
    assert str(filled["fresh"][3][0]) == control["Database system identifier"]  # the lab's snapshot was the entry


def test_a_lab_from_the_cache_has_the_dataset_a_fresh_load_has(filled: dict[str, Any]) -> None:
    base = Path(tempfile.mkdtemp(prefix="pglab-test-", dir=filled["base"]))
    os.chmod(base, 0o711)
    lab = _lab(base, instances=2)
    try:
        endpoints = lab.provision({})
        primary, standby = lab.nodes
        info = lab.describe()["dataset"]
        assert info["cache"]["hit"] is True and info["cache"]["key"] == filled["key"].name
        assert "load_s" not in info and info["cache"]["method"] in ("reflink", "copy_file_range")
        log = primary.log.read_text()
        assert "database system was shut down at" in log and "redo starts" not in log  # no crash recovery
        assert lab.lab_dir is not None and not (lab.lab_dir / "dataset").exists()  # nothing loaded: no pgbench -i
        cached = _state(lab, primary)
        assert cached == filled["fresh"]  # tables, keys, sizes, rows, vacuum/analyze state, system identifier
        # and what pgbench -i builds, side by side on the same server
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")} | endpoints.primary.env()
        with lab.connect(primary) as conn:
            conn.execute("CREATE DATABASE ref")
        subprocess.run([str(lab.bindir / "pgbench"), "-i", "-q", "-s", str(SCALE)], env=env | {"PGDATABASE": "ref"},
                       check=True, capture_output=True)
        with lab.connect(primary, dbname="ref") as conn:
            assert pgbench_dump(conn) == cached[:2]
        # the standby is the entry too, and streams: a write on the primary arrives
        lab.wait_streaming(30)
        with lab.connect(primary) as conn:
            conn.execute("UPDATE pgbench_branches SET bbalance = 7 WHERE bid = 1")  # waits for n1 (ANY 1)
        with lab.connect(standby) as conn:
            assert conn.execute("SELECT bbalance FROM pgbench_branches WHERE bid = 1").fetchone() == (7,)
            assert conn.execute("SELECT count(*) FROM pgbench_accounts").fetchone() == (SCALE * 100_000,)
        # a reset puts the primary back to the entry, which the lab holds: no clean removes it meanwhile
        assert cache.DatasetCache().remove(filled["key"].name) is False
        lab.reset_dataset()
        with lab.connect(primary) as conn:
            assert conn.execute("SELECT bbalance FROM pgbench_branches WHERE bid = 1").fetchone() == (0,)
    finally:
        _teardown(lab)
    entry = cache.DatasetCache().entries()[0]
    assert entry.name == filled["key"].name and not entry.in_use  # released with the lab


def _copy_cache(filled: dict[str, Any], tmp_path: Path) -> tuple[cache.DatasetCache, Path]:
    root = tmp_path / "c"
    root.mkdir(mode=0o700, parents=True)
    name = filled["key"].name
    subprocess.run(["cp", "-a", str(filled["root"] / name), str(root / name)], check=True)
    meta_file = root / name / "snapshot.json"
    meta = json.loads(meta_file.read_text())
    meta["wal"] = str(root / name / "wal")  # the copy's own WAL
    meta_file.write_text(json.dumps(meta))
    return cache.DatasetCache(root), root / name


def _lookup(c: cache.DatasetCache, filled: dict[str, Any]) -> str:
    found = c.lookup(filled["key"], filled["bindir"])
    if isinstance(found, str):
        return found
    found[1].release()
    return "used"


def test_an_intact_copy_is_used(filled: dict[str, Any], tmp_path: Path) -> None:
    c, _entry = _copy_cache(filled, tmp_path)
    assert _lookup(c, filled) == "used"  # so the refusals below are the tampering's doing


def test_another_scale_is_another_key(filled: dict[str, Any], tmp_path: Path) -> None:
    c, _ = _copy_cache(filled, tmp_path)
    key = filled["key"]
    other = cache.Key({**key.fields, "scale": 2})
    assert other.name != key.name and c.lookup(other, filled["bindir"]) == "no entry"
    (c.root / key.name).rename(c.root / other.name)  # and an entry under the wrong name is refused
    assert "made for another key (differs in scale)" in str(c.lookup(other, filled["bindir"]))


def test_an_entry_of_another_postgresql_version_is_not_used(filled: dict[str, Any], tmp_path: Path) -> None:
    c, entry = _copy_cache(filled, tmp_path)
    meta = json.loads((entry / "entry.json").read_text())
    meta["key"]["postgres"] = "postgres (PostgreSQL) 9.6.24"
    (entry / "entry.json").write_text(json.dumps(meta))
    assert "differs in postgres" in _lookup(c, filled)
    c, entry = _copy_cache(filled, tmp_path / "2")
    (entry / "data" / "PG_VERSION").write_text("9.6\n")  # the entry's record intact, the files another version's
    assert "PostgreSQL 9.6's" in _lookup(c, filled)


def test_an_entry_whose_control_file_changed_is_not_used(filled: dict[str, Any], tmp_path: Path) -> None:
    # another cluster's control file, put in place of the entry's
    base = Path(tempfile.mkdtemp(prefix="pglab-test-", dir=filled["base"]))
    os.chmod(base, 0o711)
    other = LocalLab(LocalTarget(instances=1, synchronous=None), base)
    try:
        other.provision({})
        other.stop_node(other.nodes[0])
        foreign = (other.nodes[0].data / "global" / "pg_control").read_bytes()
    finally:
        _teardown(other)
    c, entry = _copy_cache(filled, tmp_path)
    (entry / "data" / "global" / "pg_control").write_bytes(foreign)
    assert "control file is not the one recorded" in _lookup(c, filled)
    # the checksum forged too: pg_controldata still tells it from the recorded one
    meta = json.loads((entry / "entry.json").read_text())
    meta["control_sha256"] = cache._sha256(entry / "data" / "global" / "pg_control")
    (entry / "entry.json").write_text(json.dumps(meta))
    why = _lookup(c, filled)
    assert "control file differs from the one recorded (Database system identifier)" in why, why


def test_an_incomplete_or_damaged_entry_is_not_used(filled: dict[str, Any], tmp_path: Path) -> None:
    c, entry = _copy_cache(filled, tmp_path)
    (entry / "entry.json").unlink()  # a fill killed before its last step
    assert "incomplete" in _lookup(c, filled)
    assert [(e.name, e.complete) for e in c.entries()] == [(filled["key"].name, False)]
    c, entry = _copy_cache(filled, tmp_path / "2")
    table = max((entry / "data" / "base").rglob("*"), key=lambda p: p.stat().st_size)  # pgbench_accounts
    os.truncate(table, table.stat().st_size // 2)
    assert "files are not those recorded" in _lookup(c, filled)
    c, entry = _copy_cache(filled, tmp_path / "3")
    next(p for p in (entry / "wal").iterdir() if p.is_file()).unlink()
    assert "files are not those recorded" in _lookup(c, filled)


def test_a_lab_loads_afresh_over_a_damaged_entry_and_replaces_it(filled: dict[str, Any], tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    c, entry = _copy_cache(filled, tmp_path)
    (entry / "entry.json").unlink()
    leftover = c.root / f".{entry.name}.tmp-999999"  # a fill killed mid-copy
    leftover.mkdir()
    monkeypatch.setenv("PGLAB_CACHE_DIR", str(c.root))
    base = tmp_path / "lab"
    base.mkdir(mode=0o711)
    os.chmod(tmp_path, 0o711)
    lab = _lab(base)
    try:
        lab.provision({})
        info = lab.describe()["dataset"]
        assert info["load_s"] > 0 and info["cache"]["hit"] is False and "incomplete" in info["cache"]["miss"]
        assert info["cache"]["stored"] is True
        assert _state(lab, lab.nodes[0])[:3] == filled["fresh"][:3]
    finally:
        _teardown(lab)
    assert not leftover.exists()
    assert _lookup(c, filled) == "used"  # the refilled entry is complete


def test_the_cache_off_loads_and_stores_nothing(filled: dict[str, Any], tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGLAB_CACHE_DIR", str(filled["root"]))
    os.chmod(tmp_path, 0o711)
    before = sorted(p.name for p in filled["root"].iterdir())
    lab = _lab(tmp_path, cache=False)  # the plan's dataset.cache: false, with an entry there to use
    try:
        lab.provision({})
        info = lab.describe()["dataset"]
        assert info["load_s"] > 0 and "cache" not in info
    finally:
        _teardown(lab)
    assert sorted(p.name for p in filled["root"].iterdir()) == before


# ------------------------------------------------------------------ eviction and the command line
def _stopped_cluster(filled: dict[str, Any], where: Path) -> tuple[Path, Path]:
    """A cleanly stopped cluster to store: the entry restored into ``where``."""
    snap = df.Snapshot.load(filled["root"] / filled["key"].name)
    data, wal = where / "data", where / "wal"
    where.mkdir(parents=True, exist_ok=True)
    df.restore(snap, data, wal, durable=False)
    return data, wal


def _fake_key(filled: dict[str, Any], n: int) -> cache.Key:
    return cache.Key({**filled["key"].fields, "scale": 1000 + n})  # a name of its own; the files are the same


def test_least_recently_used_entries_are_evicted_never_one_in_use(filled: dict[str, Any], tmp_path: Path) -> None:
    data, wal = _stopped_cluster(filled, tmp_path)
    size = json.loads((filled["root"] / filled["key"].name / "entry.json").read_text())["bytes"]
    c = cache.DatasetCache(tmp_path / "c", cap=int(size * 2.5))  # room for two entries
    keys = [_fake_key(filled, n) for n in range(4)]
    logged: list[str] = []

    def store(key: cache.Key) -> None:
        stored = c.store(key, data, wal, bindir=filled["bindir"], password="pw", log=logged.append)
        assert not isinstance(stored, str), stored
        stored[1].release()
        time.sleep(0.05)  # distinct last-use times

    store(keys[0])
    store(keys[1])
    assert _lookup(c, {**filled, "key": keys[0]}) == "used"  # k0 used after k1 was stored: k1 is now the oldest
    store(keys[2])
    assert [e.name for e in c.entries()] == [keys[0].name, keys[2].name]
    assert logged == [f"dataset cache: evicted {keys[1].name} (least recently used)"]
    # k0 is the least recently used again, but a lab holds it: k2 goes instead
    found = c.lookup(keys[0], filled["bindir"])
    assert not isinstance(found, str)
    os.utime(c.root / f"{keys[0].name}.lock", (1, 1))
    store(keys[3])
    assert sorted(e.name for e in c.entries()) == sorted([keys[0].name, keys[3].name])
    assert sum(e.bytes for e in c.entries()) <= c.cap
    found[1].release()
    # larger than the cap: not stored, said why
    small = cache.DatasetCache(tmp_path / "small", cap=size // 2)
    why = small.store(keys[0], data, wal, bindir=filled["bindir"], password="pw")
    assert isinstance(why, str) and "larger than the cache's cap" in why and small.entries() == []


def test_cache_list_and_clean(filled: dict[str, Any], tmp_path: Path) -> None:
    data, wal = _stopped_cluster(filled, tmp_path)
    root = tmp_path / "c"
    env = {**os.environ, **_on(root)}
    empty = pglab("cache", "list", env=env)
    assert empty.returncode == 0 and empty.stdout == "" and "is empty" in empty.stderr
    c = cache.DatasetCache(root)
    keys = [_fake_key(filled, n) for n in range(2)]
    for key in keys:
        stored = c.store(key, data, wal, bindir=filled["bindir"], password="pw")
        assert not isinstance(stored, str), stored
        stored[1].release()
    (root / f".{keys[0].name}.tmp-999999").mkdir()  # a fill that died
    listed = pglab("cache", "list", "--format", "json", env=env)
    assert listed.returncode == 0, listed.stderr
    assert "1 unfinished fill(s)" in listed.stderr
    doc = json.loads(listed.stdout)
    assert doc["dir"] == str(root) and [e["key"] for e in doc["entries"]] == [k.name for k in keys]
    assert {e["state"] for e in doc["entries"]} == {"ready"} and doc["bytes"] == sum(e["bytes"] for e in doc["entries"])
    assert {e["scale"] for e in doc["entries"]} == {1000, 1001} and all(e["bytes"] > 0 for e in doc["entries"])
    table = pglab("cache", "list", env={**env, "COLUMNS": "200"})
    assert table.returncode == 0 and keys[0].name in table.stdout and "ready" in table.stdout
    unknown = pglab("cache", "clean", "no-such-entry", env=env)
    assert unknown.returncode == 2 and "'no-such-entry' is not an entry" in unknown.stderr
    assert "Traceback" not in unknown.stderr
    one = pglab("cache", "clean", keys[1].name, env=env)
    assert one.returncode == 0 and f"removed {keys[1].name}" in one.stdout
    assert [e.name for e in c.entries()] == [keys[0].name] and not (root / f".{keys[0].name}.tmp-999999").exists()
    found = c.lookup(keys[0], filled["bindir"])  # a lab uses it: clean keeps it and says so
    assert not isinstance(found, str)
    kept = pglab("cache", "clean", env=env)
    assert kept.returncode == 1 and "in use by a running lab" in kept.stderr
    assert json.loads(pglab("cache", "list", "-f", "json", env=env).stdout)["entries"][0]["state"] == "in use"
    found[1].release()
    done = pglab("cache", "clean", env=env)
    assert done.returncode == 0 and f"removed {keys[0].name}" in done.stdout
    assert c.entries() == [] and sorted(p.name for p in root.iterdir() if not p.name.startswith(".")) == []


def test_a_run_records_that_its_dataset_came_from_the_cache(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o711)
    plan = tmp_path / "plan.yaml"
    plan.write_text("""
name: cached
target: {local: {instances: 1}}
dataset: {scale: 1}
matrix: {workload: [select-only], clients: [1]}
run: {duration: 1s, repeats: 1}
""")
    env = {**os.environ, **_on(tmp_path / "cache")}
    records = []
    for n in range(2):
        proc = pglab("run", str(plan), "--results", str(tmp_path / f"r{n}"), env=env)
        assert proc.returncode == 0, proc.stderr
        (run,) = (tmp_path / f"r{n}" / "runs").iterdir()
        records.append((json.loads((run / "run.json").read_text())["dataset"], proc.stdout + proc.stderr))
    (first, first_out), (second, second_out) = records
    assert first["cache"]["hit"] is False and first["cache"]["stored"] is True and first["load_s"] > 0
    assert second["cache"]["hit"] is True and second["cache"]["key"] == first["cache"]["key"]
    assert "load_s" not in second
    assert f"dataset from cache {first['cache']['key']}" in second_out and "dataset from cache" not in first_out
    assert "loading the dataset: pgbench -i" not in second_out  # the runner found it there: no pgbench -i either


_FILL = """
import json, sys
from pathlib import Path
from pglab.targets.local.dataset import cache
root, data, wal, bindir, fields = sys.argv[1:6]
c = cache.DatasetCache(Path(root))
out = c.store(cache.Key(json.loads(fields)), Path(data), Path(wal), bindir=Path(bindir), password="pw")
print("stored" if not isinstance(out, str) else "not stored: " + out)
"""


def test_two_pglab_filling_one_key_leave_one_complete_entry(filled: dict[str, Any], tmp_path: Path) -> None:
    key = _fake_key(filled, 7)
    root = tmp_path / "c"
    clusters = [_stopped_cluster(filled, tmp_path / f"n{i}") for i in range(2)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(Path(cache.__file__).parents[4]),
                                                                    os.environ.get("PYTHONPATH")) if p)}
    procs = [subprocess.Popen([sys.executable, "-c", _FILL, str(root), str(data), str(wal), str(filled["bindir"]),
                               json.dumps(key.fields)], env=env, stdout=subprocess.PIPE, text=True)
             for data, wal in clusters]
    said = sorted(p.communicate(timeout=300)[0].strip() for p in procs)
    assert all(p.returncode == 0 for p in procs)
    assert said[1] == "stored" and said[0].startswith("not stored: "), said  # one filled it, the other held back
    assert said[0] in ("not stored: another pglab is filling or using this key",
                       "not stored: filled meanwhile by another pglab")
    c = cache.DatasetCache(root)
    assert [e.name for e in c.entries()] == [key.name] and not list(root.glob(".*.tmp-*"))
    assert _lookup(c, {**filled, "key": key}) == "used"
    # a fill in progress (its key's lock held) is neither used nor filled a second time
    fd = c._try_lock(key.name, cache.fcntl.LOCK_EX)
    assert fd is not None
    try:
        assert c.lookup(key, filled["bindir"]) == "another pglab is filling or removing it"
        assert c.store(key, *clusters[0], bindir=filled["bindir"], password="pw") == \
            "another pglab is filling or using this key"
    finally:
        os.close(fd)


def test_a_bad_cache_size_is_refused_before_anything_starts(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text("name: x\ntarget: {local: {instances: 1}}\ndataset: {scale: 1}\n"
                    "matrix: {workload: [select-only], clients: [1]}\nrun: {duration: 1s}\n")
    env = {**os.environ, **_on(tmp_path / "cache"), "PGLAB_CACHE_SIZE": "lots"}
    for args in (["cache", "list"], ["run", str(plan), "--results", str(tmp_path / "r")]):
        proc = pglab(*args, env=env)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "PGLAB_CACHE_SIZE: 'lots' is not a size" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "cache").exists() and processes_mentioning(str(tmp_path)) == []


def test_a_lab_on_a_reflink_filesystem_keeps_reflink_resets_with_the_cache_elsewhere(tmp_path: Path,
                                                                                    monkeypatch: pytest.MonkeyPatch
                                                                                    ) -> None:
    """The cache on a filesystem without reflinks into the lab's (here: pytest's tmp), the lab on one with them
    ($PGLAB_TEST_REFLINK_DIR: XFS with reflink=1, btrfs): standbys and resets copy from a reflink snapshot beside
    the primary, as without the cache, on a miss and on a hit."""
    given = os.environ.get("PGLAB_TEST_REFLINK_DIR")
    if not given:
        pytest.skip("set PGLAB_TEST_REFLINK_DIR to a directory on a reflink filesystem (XFS, btrfs)")
    top = Path(tempfile.mkdtemp(dir=given))
    os.chmod(top, 0o711)
    root = tmp_path / "cache"
    for k, v in _on(root).items():
        monkeypatch.setenv(k, v)
    try:
        assert df.reflink_supported(top, top) and not df.reflink_supported(tmp_path, top)
        for n, hit in ((0, False), (1, True)):
            lab = LocalLab(LocalTarget(instances=2, synchronous=None, paths={"lab": str(top / f"lab{n}")}), top,
                           dataset=Dataset(scale=SCALE, reset="snapshot"))
            try:
                lab.provision({})
                info = lab.describe()["dataset"]["cache"]
                assert info["hit"] is hit and info["lab_snapshot"] == "reflink", info
                assert lab.dataset.snapshot is not None and lab.dataset.snapshot.dir.is_relative_to(top / f"lab{n}")
                assert lab.reset_dataset()["method"] == {"n0": "reflink", "n1": "reflink"}
            finally:
                _teardown(lab)
    finally:
        shutil.rmtree(top, ignore_errors=True)
