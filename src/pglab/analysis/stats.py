"""Statistics over the repeats of a point: mean and the half-width of the 95 % Student-t interval."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


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


def t_quantile(p: float, df: float) -> float:
    """Student's t quantile: scipy.stats' ``t.ppf`` is this very function (``special.stdtrit``), but importing
    scipy.stats costs about a second more than scipy.special, at the end of every sweep and report."""
    from scipy import special  # here, not at the top: one run has no interval

    return float(special.stdtrit(df, p))


def t_sf(x: float, df: float) -> float:
    """Student's t survival function, as scipy.stats' ``t.sf`` computes it (``special.stdtr(df, -x)``)."""
    from scipy import special

    return float(special.stdtr(df, -x))


def estimate(values: Sequence[float | None]) -> Estimate | None:
    xs = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    if not xs:
        return None
    n = len(xs)
    mean = sum(xs) / n
    if n == 1:
        return Estimate(mean, 1, None, None)
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    half = t_quantile(0.975, n - 1) * sd / math.sqrt(n)
    return Estimate(mean, n, sd, half)


@dataclass(frozen=True)
class Contrast:
    """B against A: the difference of means with its Welch interval, and the ratio B / A with its Fieller interval.

    Intervals are None when a side has fewer than two runs (no spread, no interval); ``ratio_ci`` is also None
    when A's mean cannot be told from 0 (Fieller's set is then unbounded) and ``ratio`` when A's mean is 0."""

    a: Estimate
    b: Estimate
    diff: float
    diff_ci: tuple[float, float] | None
    ratio: float | None
    ratio_ci: tuple[float, float] | None
    p_value: float | None
    df: float | None

    @property
    def significant(self) -> bool | None:
        """Whether the interval of B − A excludes 0 (None: too few runs to say)."""
        if self.diff_ci is None:
            return None
        return self.diff_ci[0] > 0 or self.diff_ci[1] < 0


def contrast(a_values: Sequence[float | None], b_values: Sequence[float | None], level: float = 0.95,
             ) -> Contrast | None:
    """Welch's interval for mean(B) − mean(A) and Fieller's for mean(B) / mean(A); None when a side has no value.

    Why Fieller for the percentage: a Δ % divides by A's mean, which is itself measured; dividing the Welch
    interval by it ignores that, the delta method assumes the ratio is near-normal (not so with 2–3 noisy runs),
    and a log-ratio interval needs positive, log-normal figures. Fieller's set — every ρ for which
    |mean(B) − ρ·mean(A)| / √(s²_B/n_B + ρ²·s²_A/n_A) ≤ t — is exact under normal errors, and with the same t
    (Welch–Satterthwaite df of the difference) it excludes 1 exactly when the Welch interval excludes 0, so the
    percentage interval and the verdict can never disagree."""
    xa, xb = _clean(a_values), _clean(b_values)
    ea, eb = estimate(xa), estimate(xb)
    if ea is None or eb is None:
        return None
    ma, mb = ea.mean, eb.mean
    diff = mb - ma
    ratio = mb / ma if ma != 0 else None
    if ea.n < 2 or eb.n < 2:
        return Contrast(ea, eb, diff, None, ratio, None, None, None)
    assert ea.sd is not None and eb.sd is not None
    sa2, sb2 = ea.sd ** 2 / ea.n, eb.sd ** 2 / eb.n  # squared standard errors of the means
    se2 = sa2 + sb2
    if se2 == 0:  # no spread on either side: the difference is exactly what was measured
        exact = (ratio, ratio) if ratio is not None else None
        return Contrast(ea, eb, diff, (diff, diff), ratio, exact, 1.0 if diff == 0 else 0.0, math.inf)
    df = se2 ** 2 / (sa2 ** 2 / (ea.n - 1) + sb2 ** 2 / (eb.n - 1))
    t = t_quantile(0.5 + level / 2, df)
    half = t * math.sqrt(se2)
    p_value = 2 * t_sf(abs(diff) / math.sqrt(se2), df)
    return Contrast(ea, eb, diff, (diff - half, diff + half), ratio, _fieller(ma, mb, sa2, sb2, t), p_value, df)


def _fieller(ma: float, mb: float, sa2: float, sb2: float, t: float) -> tuple[float, float] | None:
    """Roots of (mb − ρ·ma)² = t²·(sb2 + ρ²·sa2): a bounded interval only when ma² > t²·sa2."""
    qa = ma * ma - t * t * sa2
    if qa <= 0:
        return None
    disc = (ma * mb) ** 2 - qa * (mb * mb - t * t * sb2)
    root = math.sqrt(max(disc, 0.0))  # disc = t²·(sb2·qa + mb²·sa2) > 0 whenever qa > 0
    return ((ma * mb - root) / qa, (ma * mb + root) / qa)


def _clean(values: Sequence[float | None]) -> list[float]:
    return [float(v) for v in values if v is not None and not math.isnan(float(v))]


def within(values: Sequence[float | None], target_pct: float) -> bool:
    """The half-width of the mean's 95 % interval is at most ``target_pct`` of the mean (adaptive repeats' rule);
    never with fewer than two values."""
    e = estimate(values)
    return bool(e and e.ci95 is not None and e.mean and e.ci95 / abs(e.mean) * 100 <= target_pct)
