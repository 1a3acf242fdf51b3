"""The A/A plan of ``pglab noise``: the plan's first point, run again and again in one lab, to measure how much two
identical configurations differ on this host — the smallest difference a sweep here can resolve."""

from __future__ import annotations

from typing import Any

import yaml

from pglab.errors import UserError
from pglab.plan.load import parse_plan
from pglab.plan.schema import Plan


def noise_plan(text: str, repeats: int) -> tuple[Plan, str]:
    """The plan (and its text, stored with the sweep) of an A/A measurement of ``text``'s first point: every axis at
    its first value, no scenario, no storage phase, ``repeats`` runs in sequence (interleaving one point is moot)."""
    plan = parse_plan(text)
    if plan.tenants is not None:
        raise UserError("pglab noise measures one point of a plan with a matrix; a tenants plan has none — use "
                        "one of its tiers as a plan with target.local.")
    if repeats < 4 or repeats % 2:
        raise UserError(f"--repeats: {repeats} cannot be split into two equal sides of at least 2 runs; give an even "
                        "number of at least 4.")
    data: dict[str, Any] = yaml.safe_load(text)
    matrix = dict(data.get("matrix") or {})
    for axis, values in list(matrix.items()):
        if axis == "scenario":
            del matrix[axis]
        elif axis == "parameters":
            matrix[axis] = {name: list(v[:1]) for name, v in (values or {}).items()}
        elif isinstance(values, list):
            matrix[axis] = values[:1]
    data["matrix"] = matrix
    data.pop("storage", None)
    run = {k: v for k, v in (data.get("run") or {}).items() if k != "seed"}
    data["run"] = {**run, "repeats": repeats, "order": "sequential"}
    data["name"] = f"{plan.name}-noise"
    derived = yaml.safe_dump(data, sort_keys=False)
    return parse_plan(derived), derived
