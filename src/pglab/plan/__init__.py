"""Plans: schema (pydantic), load (YAML → Plan with field-path errors), expand (matrix → points)."""

from pglab.plan.expand import Point, expand
from pglab.plan.load import load_plan, parse_plan
from pglab.plan.schema import Plan

__all__ = ["Plan", "Point", "expand", "load_plan", "parse_plan"]
