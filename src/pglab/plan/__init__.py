"""Plans: schema (pydantic), load (YAML → Plan with field-path errors), expand (matrix → points)."""

from pglab.plan.expand import expand
from pglab.plan.load import parse_plan

__all__ = ["expand", "parse_plan"]
