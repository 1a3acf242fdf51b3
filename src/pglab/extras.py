"""The optional parts of the install (pyproject.toml's extras): a local lab needs none of them, so the base install
leaves them out, and a plan that needs one says which to install instead of failing on an import."""

from __future__ import annotations

import importlib

from pglab.errors import UserError


def require(module: str, extra: str, what: str) -> None:
    """UserError naming the extra unless ``module`` imports (imported here once, so later imports are cheap)."""
    try:
        importlib.import_module(module)
    except ImportError:
        raise UserError(f"{what} needs the Python package '{module}', not in the base install; install it with "
                        f"./setup.sh install {extra} (or pip install -e '.[{extra}]').") from None
