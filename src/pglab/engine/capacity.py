"""The capacity search (issue 29): for each point of the matrix, the highest rate (transactions/s) whose latency
percentile stays under the plan's target.

A closed-loop run first: its TPS is what the clients reach at their own pace, so no rate above it can be held. Then
open-loop runs (latency from each transaction's scheduled start): at that pace first (if it passes, the clients, not
the server, bound the capacity), then bisecting between the highest passing rate (0 at first) and the lowest
failing one, until the bracket is narrower than ``precision_pct`` of its top or ``max_probes`` rates were probed.
Every probe is a run of its own point (the configuration with ``rate``), stored as any run: a resumed sweep replays
the decisions from the runs already stored and measures only what is missing.

With ``run.repeats: N`` each rate is run N times and judged on the mean of its repeats (the percentile, the skipped
share, the TPS), as every other pglab figure is; the 95 % Student-t interval of those means says whether the rate
*surely* held or failed. The highest rate that surely held and the lowest that surely failed bound the capacity at
the machine's noise (:func:`summarize`); a single run per rate gives the bracket and no interval."""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass

from pglab.analysis.stats import Estimate, estimate
from pglab.engine.types import Event
from pglab.plan.expand import Point
from pglab.plan.schema import Capacity


@dataclass(frozen=True)
class Verdict:
    """A probe rate's repeats judged together: ``held`` on their means; ``sure`` when the 95 % interval of each
    figure judged lies wholly on that side of its limit (never with a single run)."""

    latency: Estimate  # the plan's percentile (ms) over the repeats
    skipped: Estimate | None  # skipped share (%); None: no latency limit, nothing skipped
    tps: Estimate | None
    held: bool
    sure: bool

    @property
    def surely_held(self) -> bool:
        return self.held and self.sure

    @property
    def surely_failed(self) -> bool:
        return not self.held and self.sure


def judge(spec: Capacity, values: Mapping[str, Sequence[float | None]]) -> Verdict | None:
    """The verdict on one rate from its runs' figures (metric → one value per run; None: no percentile at all)."""
    latency = estimate(values.get(f"latency_p{spec.percentile}_ms", ()))
    if latency is None:
        return None
    skipped = estimate(values.get("skipped_pct", ()))
    held = bool(spec.holds({f"latency_p{spec.percentile}_ms": latency.mean,
                            "skipped_pct": skipped.mean if skipped else None}))
    target = spec.target * 1000
    limits = [(latency, target)] + ([(skipped, spec.max_skipped_pct)] if skipped is not None else [])
    if latency.ci95 is None:
        sure = False
    elif held:  # every figure's interval under its limit
        sure = all(e.mean + (e.ci95 or 0.0) <= limit for e, limit in limits)
    else:  # some figure's interval wholly above its limit
        sure = any(e.mean - (e.ci95 or 0.0) > limit for e, limit in limits)
    return Verdict(latency, skipped, estimate(values.get("tps", ())), held, sure)


@dataclass(frozen=True)
class Answer:
    """What a configuration's probes say: ``capacity`` (the highest rate held on the mean) and ``failing`` (the
    lowest rate above it that was not), and the interval at the noise: ``low`` the highest rate that surely held
    (0 if none did), ``high`` the lowest above it that surely failed (None: none did). ``low``/``high`` are None
    without repeats (no interval)."""

    capacity: float | None
    failing: float | None
    low: float | None
    high: float | None


def summarize(verdicts: Mapping[float, Verdict]) -> Answer:
    """The answer from the open-loop probes' verdicts (rate → verdict); the search's own bracket, as passing rates
    only rise and failing ones only fall."""
    capacity = max((r for r, v in verdicts.items() if v.held), default=None)
    failing = min((r for r, v in verdicts.items() if not v.held and (capacity is None or r > capacity)), default=None)
    if not any(v.latency.n > 1 for v in verdicts.values()):
        return Answer(capacity, failing, None, None)
    low = max((r for r, v in verdicts.items() if v.surely_held), default=0.0)
    high = min((r for r, v in verdicts.items() if v.surely_failed and r > low), default=None)
    return Answer(capacity, failing, low, high)


@dataclass(frozen=True)
class Found:
    """One configuration's answer: ``capacity`` (tx/s) in [``capacity``, ``failing``) at the given precision; with
    repeats, in [``low``, ``high``) at the noise."""

    point: Point
    capacity: float | None  # None: not even the lowest probe passed, or a probe failed
    failing: float | None  # the lowest rate that missed the target (None: the closed loop met it)
    probes: int  # rates probed, the closed loop included
    why: str
    runs: int = 0  # runs those probes took (probes × repeats)
    low: float | None = None
    high: float | None = None

    def event(self, spec: Capacity) -> Event:
        target = f"p{spec.percentile} ≤ {spec.target * 1000:g} ms"
        took = f"{self.probes} runs" if self.runs in (0, self.probes) else f"{self.probes} rates, {self.runs} runs"
        if self.capacity is None:
            detail = f"{self.point.label()}: {target}: no capacity found ({self.why}, {took})"
        else:
            upper = f" (below {self.failing:g})" if self.failing is not None else ""
            noise = ""
            if self.low is not None:
                noise = f", 95 % interval [{self.low:g}, {'∞' if self.high is None else f'{self.high:g}'})"
            detail = f"{self.point.label()}: {target}: {self.capacity:g} tx/s{upper}{noise}, {self.why}, {took}"
        return time.time(), "capacity", detail


FIGURES = ("tps", "skipped_pct")


def runs(points: list[Point], spec: Capacity, repeats: int, probe: Callable[[Point, float | None], Point],
         done: Callable[[Point, int], bool], figures: Callable[[Point, str], list[float]],
         found: Callable[[Found], None]) -> Iterator[tuple[Point, int]]:
    """The probe runs, one at a time: each of a rate's ``repeats`` is yielded (unless ``done`` already) and their
    figures read back (``figures``: one value per run that ended ok) before the next rate is chosen; ``probe`` gives
    (and registers) a configuration's point at a rate."""
    for base in points:
        verdicts: dict[float, Verdict] = {}
        why, capacity, failing, n = yield from _search(base, spec, repeats, probe, done, figures, verdicts)
        answer = summarize(verdicts)
        found(Found(base, capacity, failing, n, why, n * repeats, answer.low, answer.high))


def _search(base: Point, spec: Capacity, repeats: int, probe: Callable[[Point, float | None], Point],
            done: Callable[[Point, int], bool], figures: Callable[[Point, str], list[float]],
            verdicts: dict[float, Verdict]) -> Generator[tuple[Point, int], None,
                                                          tuple[str, float | None, float | None, int]]:
    """One configuration's search: its runs yielded, each rate's verdict kept in ``verdicts``; returns why it
    stopped, the capacity, the lowest failing rate and the rates probed."""
    key = f"latency_p{spec.percentile}_ms"
    lo, hi, top, rate, n = 0.0, None, 0.0, None, 0
    while True:
        point = probe(base, rate)
        for repeat in range(1, repeats + 1):
            if not done(point, repeat):
                yield point, repeat
        n += 1
        values = {k: figures(point, k) for k in (key, *FIGURES)}
        verdict = judge(spec, values)
        if verdict is None or verdict.tps is None or min(len(values[key]), len(values["tps"])) < repeats:
            return "a probe run failed", lo or None, hi, n  # no figures to decide on
        if rate is None:  # the closed loop: the clients' own pace, above which no rate can be held
            top = rate = float(max(1, round(verdict.tps.mean)))
            continue
        verdicts[rate] = verdict
        if verdict.held:
            lo = rate
        else:
            hi = rate
        if lo == top:
            return "held at the closed loop's pace: the clients bound it", lo, None, n
        assert hi is not None
        narrow = hi - lo <= hi * spec.precision_pct / 100
        if narrow or n >= spec.max_probes:
            return "bracket within precision" if narrow else "max_probes reached", lo or None, hi, n
        rate = float(max(1, round((lo + hi) / 2)))
        if rate in (lo, hi):  # whole transactions/s: nothing left between them
            return "bracket within 1 tx/s", lo or None, hi, n
