"""The order of a sweep's runs, and how many each point gets.

Interleaved (the default): the points run in rounds, each point once per round, in an order shuffled anew for every
round from the sweep's recorded seed, so machine drift (a neighbour's build, a cloud disk's burst credits running out)
spreads over every point instead of landing on one configuration, as pgbench-tools runs 1,4,8,1,4,8. Points that
need a restart or a rolling update to reach (a CPU step, a parameter set, a tenants arrangement) form blocks, run one
after the other, so the rounds never pay a restart per run. Sequential: the plan's order, repeats back to back.

Adaptive repeats (``run.repeats: {min, max, target_ci}``) add rounds after ``min`` for the points whose TPS interval
is still wider than the target, until ``max``; which point reached its target is read back from the store by reports.

The schedule is a pure function of the points, the seed and the TPS of the runs done so far: a resumed sweep
computes the same order and skips what is done."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from pglab.analysis.stats import within
from pglab.plan.expand import Point
from pglab.plan.schema import Run


@dataclass(frozen=True)
class Schedule:
    """What the sweep records about its order (``sweeps.schedule``), so a resume and a reader see the same."""

    order: str
    seed: int
    min_repeats: int
    max_repeats: int
    target_ci_pct: float | None = None

    @classmethod
    def of(cls, run: Run, seed: int) -> Schedule:
        return cls(run.order, seed, run.min_repeats, run.max_repeats, run.target_ci_pct)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Schedule:
        return cls(str(data["order"]), int(data["seed"]), int(data["min_repeats"]), int(data["max_repeats"]),
                   None if data.get("target_ci_pct") is None else float(data["target_ci_pct"]))

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        repeats = (f"{self.min_repeats}–{self.max_repeats} repeats until TPS's 95 % interval is within "
                   f"±{self.target_ci_pct:g} %" if self.target_ci_pct is not None else f"{self.min_repeats} repeats")
        order = f"interleaved (seed {self.seed})" if self.order == "interleaved" else "sequential"
        return f"{repeats}, {order}"

    def reached(self, tps: Sequence[float]) -> bool:
        """The point's TPS is known within the target (always, for a fixed number of repeats)."""
        return self.target_ci_pct is None or within(tps, self.target_ci_pct)

    def runs(self, points: Sequence[Point], done: set[tuple[str, int]],
             tps_of: Callable[[Point], Sequence[float]]) -> Iterator[tuple[Point, int]]:
        """(point, repeat) to run, in order, skipping ``done``. Lazy: the decision to add a round reads ``tps_of``
        after the runs before it were recorded."""
        for number, block in enumerate(blocks(points)):
            if self.order == "sequential":
                for point in block:
                    yield from self._repeats_of(point, done, tps_of)
                continue
            for repeat in range(1, self.max_repeats + 1):
                todo = block if repeat <= self.min_repeats else [p for p in block if not self.reached(tps_of(p))]
                if not todo:
                    break
                shuffled = list(todo)
                random.Random(f"{self.seed}/{number}/{repeat}").shuffle(shuffled)
                yield from ((p, repeat) for p in shuffled if (p.key, repeat) not in done)

    def _repeats_of(self, point: Point, done: set[tuple[str, int]],
                    tps_of: Callable[[Point], Sequence[float]]) -> Iterator[tuple[Point, int]]:
        for repeat in range(1, self.max_repeats + 1):
            if repeat > self.min_repeats and self.reached(tps_of(point)):
                return
            if (point.key, repeat) not in done:
                yield point, repeat


def block_key(point: Point) -> tuple[Any, ...]:
    """What a target must restart or roll out to change: runs differing only in the rest can interleave."""
    return (point.storage.name if point.storage is not None else None, point.cpus,
            tuple(sorted((k, str(v)) for k, v in point.parameters.items())),
            point.arrangement.name if point.arrangement is not None else None)


def blocks(points: Sequence[Point]) -> list[list[Point]]:
    """Points grouped by ``block_key``, blocks in the order of their first point (the plan's order)."""
    out: dict[tuple[Any, ...], list[Point]] = {}
    for p in points:
        out.setdefault(block_key(p), []).append(p)
    return list(out.values())


def new_seed() -> int:
    return random.SystemRandom().randrange(2**31)
