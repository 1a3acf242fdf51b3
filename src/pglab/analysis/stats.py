"""Statistics over the repeats of a point: mean and the half-width of the 95 % Student-t interval."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from scipy import stats


@dataclass(frozen=True)
class Estimate:
    mean: float
    n: int
    sd: float | None
    ci95: float | None  # half-width; None for a single run

    @property
    def cv(self) -> float | None:
        if self.sd is None or self.mean == 0:
            return None
        return self.sd / abs(self.mean)


def estimate(values: Sequence[float | None]) -> Estimate | None:
    xs = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    if not xs:
        return None
    n = len(xs)
    mean = sum(xs) / n
    if n == 1:
        return Estimate(mean, 1, None, None)
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    half = float(stats.t.ppf(0.975, n - 1)) * sd / math.sqrt(n)
    return Estimate(mean, n, sd, half)
