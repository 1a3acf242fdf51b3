"""What the sweep's figures are turned into beyond the tables: the capacity search's latency target, and the
monthly price that makes TPS a cost per TPS."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Literal

from pydantic import Field, model_validator
from pydantic_core import PydanticCustomError

from pglab.plan.schema.base import Seconds, Strict, _int_between, _number_between, _text

_CURRENCY = re.compile(r"[A-Z]{3}")
_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_ .-]{0,62}")
MAX_PRICE = 1e12


class Capacity(Strict):
    """The highest rate whose latency stays under a target, per configuration: a closed-loop run brackets it
    (nothing beats the clients' own pace), then the rate is bisected; every probe is a stored run."""

    percentile: Literal[50, 95, 99] = Field(99, description="the latency percentile held to the target")
    target: Seconds = Field(description="the latency the percentile must stay under, e.g. '5ms' (from each "
                            "transaction's scheduled start)")
    max_skipped_pct: Annotated[float, _number_between(0, 100)] = Field(
        1.0, description="with run.latency_limit: the share of skipped transactions a passing rate may have")
    precision_pct: Annotated[float, _number_between(0.1, 50)] = Field(
        5.0, description="stop when the bracket (highest passing, lowest failing rate) is narrower than this share "
        "of its top")
    max_probes: Annotated[int, _int_between(2, 30)] = Field(
        10, description="rates probed per configuration at most, the closed-loop run included; each is run "
        "run.repeats times")

    def holds(self, figures: Mapping[str, float | None]) -> bool | None:
        """Whether a run's figures (or the mean of a rate's repeats) held the target (None: no such percentile)."""
        value = figures.get(f"latency_p{self.percentile}_ms")
        if value is None:
            return None
        return value <= self.target * 1000 and (figures.get("skipped_pct") or 0.0) <= self.max_skipped_pct


class Cost(Strict):
    """What the configuration costs per month, to turn TPS into cost per TPS."""

    monthly: Annotated[float, _number_between(0, MAX_PRICE, low_open=True)] = Field(
        description="price per month of the whole configuration")
    currency: Annotated[str, _text(64, pattern=_CURRENCY, what="a currency code such as USD or EUR")] = Field(
        "USD", description="ISO 4217 code of the price (three capitals)")
    breakdown: dict[Annotated[str, _text(63, pattern=_LABEL, what="a label (letters, digits, ' ', '-', '_', '.')")],
                    Annotated[float, _number_between(0, MAX_PRICE)]] = Field(
        default_factory=dict, description="optional parts (compute, storage …)")

    @model_validator(mode="after")
    def _parts_add_up(self) -> Cost:
        if self.breakdown:
            total = sum(self.breakdown.values())
            if abs(total - self.monthly) > 0.01 * self.monthly:
                raise PydanticCustomError("cost", "breakdown adds up to {total}, not to monthly ({monthly})",
                                          {"total": f"{total:g}", "monthly": f"{self.monthly:g}"})
        return self
