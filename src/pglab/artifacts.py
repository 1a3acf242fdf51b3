"""Files kept beside a run's figures (run.json, settings.json, probes.csv …), each written whole or not at all."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol


class _Sample(Protocol):
    @property
    def ts(self) -> float: ...
    @property
    def source(self) -> str: ...
    @property
    def metric(self) -> str: ...
    @property
    def value(self) -> float | None: ...


def write_json(path: Path, data: Any) -> None:
    """A crash never leaves half a JSON file: written beside, then renamed over."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    tmp.replace(path)


def write_samples(path: Path, samples: Iterable[_Sample]) -> None:
    """The probes' samples of a run (probes.csv)."""
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["ts", "source", "metric", "value"])
        for s in samples:
            w.writerow([f"{s.ts:.3f}", s.source, s.metric, "" if s.value is None else s.value])
    tmp.replace(path)
