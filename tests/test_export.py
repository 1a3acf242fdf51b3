"""`pglab export`: files written from a store built through the real Store API, read back and checked against
what was stored."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import polars as pl
import pytest

from conftest import pglab
from pglab.report.export import write
from pglab.report.tables import point_table
from pglab.store import Store

T0 = 1_700_000_000.0  # whole seconds: ts - window_start is exact in binary floating point
TABLES = ["points", "runs", "series", "events", "storage", "fio_series"]


def _build(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """Two sweeps: an older one with one run, and the latest with 2 points × 2 repeats, series, events and fio."""
    store = Store.open(tmp_path / "r")
    old = store.begin_sweep("old", "name: old\n", "h", "0")
    ids = store.add_points(old, [(0, "k0", {"workload": "select-only", "synchronous_commit": "on", "clients": 2})])
    old_run, _ = store.start_run(old, ids["k0"], 0, 1)
    store.finish_run(old_run, "ok", window=(T0 - 500, T0 - 400), metrics={"tps": 5.0},
                     series=[(T0 - 450, "pgbench", "tps", 5.0)])
    store.end_sweep(old, "done")

    sweep = store.begin_sweep("t", "name: t\n", "h", "0")
    points = [(i, f"k{i}", {"workload": "tpcb-like", "synchronous_commit": "on", "clients": c})
              for i, c in enumerate((1, 4))]
    ids = store.add_points(sweep, points)
    tps = {0: [100.0, 110.0], 1: [400.5, 390.25]}
    runs: dict[str, dict[str, Any]] = {}
    series_rows = 0
    for i, key, _axes in points:
        for rep, value in enumerate(tps[i], 1):
            run_id, _ = store.start_run(sweep, ids[key], i, rep)
            start = T0 + 100 * len(runs)
            series: list[tuple[float, str, str, float | None]] = []
            for s in range(10):
                series.append((start + s, "pgbench", "tps", value + s))
                series.append((start + s, "pgbench", "latency_ms", 1000.0 / (value + s)))
                series.append((start + s, "disk", "write_iops", None if s == 3 else 50.0 * s))
                series.append((start + s, "pg", "wal_mb_s", 0.125 * s))
            store.finish_run(run_id, "ok", window=(start, start + 9), metrics={
                "tps": value, "latency_avg_ms": 1000.0 / value, "write_iops": 7.0 * value},
                series=series, events=[(start - 5, "phase", "warm-up")])
            runs[run_id] = {"tps": value, "start": start}
            series_rows += len(series)
    failed, _ = store.start_run(sweep, ids["k1"], 1, 3)
    store.finish_run(failed, "failed", reason="pgbench exited 1")
    runs[failed] = {"tps": None, "start": None}
    first = next(iter(runs))
    store.add_events(sweep, [(runs[first]["start"] + 4.5, "checkpoint", "time"), (T0 - 50, "checkpoint", "xlog")])
    fio_series = [(T0 - 200 + s, 1000.0 + s, 0.5) for s in range(5)]
    store.save_fio(sweep, "data", "nvme0n1", [SimpleNamespace(
        path="/mnt/data", profile="randread", job="randread", direction="read", iops=1002.0, bw_mb_s=7.8,
        lat_mean_ms=0.5, lat_p50_ms=0.4, lat_p99_ms=1.5, lat_p999_ms=3.0, sync_lat_mean_ms=None,
        sync_lat_p99_ms=None, sync_lat_p999_ms=None, started=T0 - 201, ended=T0 - 195, findings=[], json_file=None,
        options={"bs": "8k"}, series=fio_series)], {"randread_iops_qd32": 1002.0})
    store.end_sweep(sweep, "done")
    store.close()
    return tmp_path / "r", {"runs": runs, "series_rows": series_rows, "first": first, "old_run": old_run,
                            "sweep": sweep, "old": old}


def _read(path: Path, fmt: str) -> list[dict[str, Any]]:
    """Records as a reader other than pglab would see them; CSV cells stay text (empty = missing)."""
    if fmt == "parquet":
        return pl.read_parquet(path).to_dicts()
    if fmt == "json":
        data = json.loads(path.read_text())
        assert isinstance(data, list)
        return data
    with path.open(newline="") as f:
        return [{k: (v if v != "" else None) for k, v in row.items()} for row in csv.DictReader(f)]


def _num(v: Any) -> float | None:
    return None if v is None else float(v)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    return _build(tmp_path_factory.mktemp("export"))


@pytest.mark.parametrize("fmt", ["csv", "json", "parquet"])
def test_export_round_trips_what_was_stored(built: tuple[Path, dict[str, Any]], tmp_path: Path, fmt: str) -> None:
    results, known = built
    out = tmp_path / "out"
    proc = pglab("export", str(results), "--format", fmt, "--to", str(out), check=True)
    assert proc.stdout.split() == [str(out / f"{t}.{fmt}") for t in TABLES]
    assert sorted(p.name for p in out.iterdir()) == sorted(f"{t}.{fmt}" for t in TABLES)  # no temporary files left

    runs = _read(out / f"runs.{fmt}", fmt)
    assert {r["run_id"]: _num(r["tps"]) for r in runs} == {k: v["tps"] for k, v in known["runs"].items()}
    assert known["old_run"] not in {r["run_id"] for r in runs}  # the latest sweep only
    failed = next(r for r in runs if r["status"] == "failed")
    assert failed["reason"] == "pgbench exited 1" and failed["tps"] is None

    series = _read(out / f"series.{fmt}", fmt)
    assert len(series) == known["series_rows"] == 4 * 40
    first, start = known["first"], known["runs"][known["first"]]["start"]
    by_key = {(r["run_id"], r["source"], r["metric"], _num(r["ts"])): r for r in series}
    row = by_key[(first, "pgbench", "tps", start + 7)]
    assert _num(row["value"]) == 107.0 and _num(row["t_s"]) == 7.0
    assert _num(by_key[(first, "pg", "wal_mb_s", start + 9)]["value"]) == 1.125
    assert by_key[(first, "disk", "write_iops", start + 3)]["value"] is None  # a missing sample stays missing
    assert _num(by_key[(first, "disk", "write_iops", start + 4)]["value"]) == 200.0
    assert {r["source"] for r in series} == {"pgbench", "disk", "pg"}

    store = Store.open(results, create=False)
    _, expected = point_table(store)
    store.close()
    points = _read(out / f"points.{fmt}", fmt)
    assert [_num(p["clients"]) for p in points] == [1.0, 4.0]
    for got, want in zip(points, expected, strict=True):
        assert _num(got["tps"]) == want["tps"] and _num(got["tps_ci95"]) == want["tps_ci95"]
        assert _num(got["tps_cv_pct"]) == want["tps_cv_pct"] and got["bottleneck"] == want["bottleneck"]
        assert _num(got["repeats"]) == 2
    assert points[0]["tps"] is not None and _num(points[0]["tps"]) == 105.0
    assert _num(points[1]["failed_runs"]) == 1

    events = _read(out / f"events.{fmt}", fmt)
    checkpoints = {r["detail"]: r for r in events if r["kind"] == "checkpoint"}
    assert checkpoints["time"]["run_id"] == first and checkpoints["time"]["scope"] == "sweep"
    assert checkpoints["xlog"]["run_id"] is None  # between runs
    phases = [r for r in events if r["kind"] == "phase"]
    assert len(phases) == 4 and all(r["scope"] == "run" for r in phases)
    assert _num(phases[0]["ts"]) == start - 5 and phases[0]["run_id"] == first

    storage = _read(out / f"storage.{fmt}", fmt)
    assert len(storage) == 1 and _num(storage[0]["iops"]) == 1002.0 and storage[0]["device"] == "nvme0n1"
    fio = _read(out / f"fio_series.{fmt}", fmt)
    assert [_num(r["iops"]) for r in fio] == [1000.0, 1001.0, 1002.0, 1003.0, 1004.0]
    assert _num(fio[0]["t_s"]) == 1.0 and fio[0]["job"] == "randread"


def test_types_are_kept(built: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    results, _ = built
    pglab("export", str(results), "--format", "parquet", "--to", str(tmp_path / "p"), check=True)
    points = pl.read_parquet(tmp_path / "p" / "points.parquet")
    assert points.schema["tps"] == pl.Float64 and points.schema["clients"] == pl.Int64
    assert points.schema["unstable"] == pl.Boolean and points.schema["repeats"] == pl.Int64
    assert points.schema["read_iops"] == pl.Float64  # never measured here: all nulls, still a number column
    series = pl.read_parquet(tmp_path / "p" / "series.parquet")
    assert dict(series.schema) == {"run_id": pl.String, "ts": pl.Float64, "t_s": pl.Float64, "source": pl.String,
                                   "metric": pl.String, "value": pl.Float64}
    runs = pl.read_parquet(tmp_path / "p" / "runs.parquet")
    assert runs.schema["repeat"] == pl.Int64 and runs.schema["latency_avg_ms"] == pl.Float64
    assert pl.read_parquet(tmp_path / "p" / "storage.parquet").schema["lat_p99_ms"] == pl.Float64
    pglab("export", str(results), "--format", "json", "--to", str(tmp_path / "j"), check=True)
    record = json.loads((tmp_path / "j" / "points.json").read_text())[0]
    assert isinstance(record["tps"], float) and isinstance(record["clients"], int)
    assert record["unstable"] is True  # 100 vs 110: cv 6.7 %


def test_sweep_option_and_default_folder(built: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    results, known = built
    copy = tmp_path / "r"
    copy.mkdir()
    (copy / "results.db").write_bytes(_snapshot(results))
    pglab("export", str(copy), "--format", "csv", "--sweep", str(known["old"]), check=True)
    runs = _read(copy / "export" / "runs.csv", "csv")
    assert [(r["run_id"], _num(r["tps"])) for r in runs] == [(known["old_run"], 5.0)]
    assert len(_read(copy / "export" / "series.csv", "csv")) == 1
    assert not (copy / "export" / "fio_series.csv").exists()  # no fio in that sweep


def _snapshot(results: Path) -> bytes:
    import sqlite3

    src = sqlite3.connect(results / "results.db")
    data = src.serialize()
    src.close()
    return data


def test_bad_input_is_one_sentence_and_exit_2(built: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    results, _ = built
    bad = pglab("export", str(results), "--format", "xlsx", "--to", str(tmp_path / "x"))
    assert bad.returncode == 2 and bad.stderr.strip() == "error: --format: 'xlsx' is not one of csv, json, parquet."
    assert not (tmp_path / "x").exists()
    missing = pglab("export", str(tmp_path / "nothing"), "--format", "csv")
    assert missing.returncode == 2 and "no pglab results" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1
    Store.open(tmp_path / "empty").close()
    empty = pglab("export", str(tmp_path / "empty"), "--format", "csv")
    assert empty.returncode == 2 and "holds no sweep yet" in empty.stderr
    sweep = pglab("export", str(results), "--format", "csv", "--sweep", "99", "--to", str(tmp_path / "s"))
    assert sweep.returncode == 2 and "--sweep" in sweep.stderr and "no sweep 99" in sweep.stderr
    blocked = tmp_path / "file"
    blocked.write_text("")
    to = pglab("export", str(results), "--format", "csv", "--to", str(blocked))
    assert to.returncode == 2 and to.stderr.startswith("error: --to: cannot write")


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    df = pl.DataFrame({"x": [1.0, 2.0]})
    target = write(df, tmp_path / "t.parquet", "parquet")
    before = target.read_bytes()

    def crash(self: pl.DataFrame, f: Any, **_: Any) -> None:
        f.write(b"PAR1 half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pl.DataFrame, "write_parquet", crash)
    with pytest.raises(OSError):
        write(pl.DataFrame({"x": [3.0]}), target, "parquet")
    assert target.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["t.parquet"]
