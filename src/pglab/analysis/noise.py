"""How much this host's runs of one identical configuration differ: the noise floor a comparison must clear.

The runs of ``pglab noise`` are split into two sides by parity (A: runs 1, 3, 5 …; B: 2, 4, 6 …) and compared as
any two configurations are (Welch): an honest host gives "no significant difference". The resolvable difference
for n runs per side is the half-width of the 95 % interval of a difference of two means of n runs with the
measured spread — a difference smaller than that reads as noise in ``pglab compare`` and the durability table."""

from __future__ import annotations

import math
from dataclasses import dataclass

from pglab.analysis.compare import Difference, difference
from pglab.analysis.stats import estimate, t_quantile
from pglab.store.sqlite import Store

SIDES = (2, 3, 5, 10)  # runs per side a user might plan


@dataclass(frozen=True)
class NoiseFloor:
    tps: list[float]             # every ok run, in the order they ran
    mean: float
    cv_pct: float
    aa: Difference | None        # B (even runs) against A (odd runs)
    resolvable_pct: dict[int, float]  # runs per side → smallest |Δ %| a comparison can tell from noise

    def lines(self) -> list[str]:
        out = [f"TPS of {len(self.tps)} identical runs: mean {self.mean:.1f}, run-to-run CV {self.cv_pct:.2f} %",
               "runs: " + ", ".join(f"{t:.1f}" for t in self.tps)]
        if self.aa is not None and self.aa.ci95_pct is not None:
            low, high = self.aa.ci95_pct
            interval = "[unbounded]" if math.isnan(low) or math.isnan(high) else f"[{low:+.2f} %, {high:+.2f} %]"
            out.append(f"A/A (even runs vs odd runs, {self.aa.a_n} each): {self.aa.delta_pct:+.2f} % {interval} — "
                       f"{self.aa.verdict}")
        out.append("smallest difference a comparison can resolve here (95 %): " + ", ".join(
            f"±{pct:.1f} % with {n} runs per side" for n, pct in self.resolvable_pct.items()))
        return out


def noise_floor(store: Store, sweep_id: int) -> NoiseFloor | None:
    """None when fewer than two runs ended ok (no spread to measure)."""
    tps = [v for values in store.ok_values(sweep_id, "tps").values() for v in values]
    e = estimate(tps)
    if e is None or e.sd is None or not e.mean:
        return None
    aa = difference("tps", tps[0::2], tps[1::2]) if len(tps) >= 4 else None
    resolvable = {n: t_quantile(0.975, 2 * n - 2) * e.sd * math.sqrt(2 / n) / abs(e.mean) * 100
                  for n in SIDES}
    return NoiseFloor(tps, e.mean, e.sd / abs(e.mean) * 100, aa, resolvable)
