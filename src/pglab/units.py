"""Sizes as users write them ("256MiB", "1G", "8k") and the bytes they mean, parsed by one grammar.

The plan validates its sizes into :class:`Size` (the text as written, which still prints, serialises and renders
unchanged, plus ``.bytes``), so that nothing downstream parses them again; fio job files use :func:`parse_size`.
Units are binary, as fio reads them with its default kb_base=1024: k, KB and KiB all mean 1024.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmgtp]?)(i?b?)\s*", re.IGNORECASE | re.ASCII)
_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4, "p": 5}
_MAX_LEN = 64  # longer text is not a size (and is not worth turning into a number)


class NotASize(ValueError):
    """The text does not follow the grammar (number, optional binary unit)."""


class NotWholeBytes(ValueError):
    """The text is a size, but not a whole number of bytes (1.3k); ``exact`` is what it means."""

    def __init__(self, message: str, exact: Fraction):
        super().__init__(message)
        self.exact = exact


def size_bytes(value: str | int) -> int:
    """Bytes from "256MiB", "1G", "512m", "8k", "100b", "1048576" or an int, exactly (no float rounding), 0 and
    more. Raises :class:`NotASize` or :class:`NotWholeBytes`; ranges are the caller's to check."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise NotASize(f"not a size: {value!r}")
    if isinstance(value, int):
        return value
    m = _SIZE.fullmatch(value) if len(value) <= _MAX_LEN else None
    if not m or (m.group(2) == "" and m.group(3).lower() not in ("", "b")):
        raise NotASize(f"not a size: {value!r} (use e.g. 256MiB, 1G, 512m or a number of bytes)")
    exact = Fraction(m.group(1)) * 1024 ** _POWERS[m.group(2).lower()]
    if exact.denominator != 1:
        raise NotWholeBytes(f"not a whole number of bytes: {value!r}", exact)
    return int(exact)


def parse_size(value: str | int) -> int:
    """Bytes from a size (see :func:`size_bytes`) that must be positive. Raises ValueError."""
    n = size_bytes(value)
    if n <= 0:
        raise ValueError(f"a size must be positive: {value!r}")
    return n


class Size(str):
    """A size as the user wrote it (stripped), with the bytes it means in ``.bytes``.

    A ``str``, so that plan dumps, stored plan text, manifests and messages show what the user wrote."""

    bytes: int

    def __new__(cls, value: str | int) -> Size:
        n = size_bytes(value)
        self = super().__new__(cls, str(value).strip())
        self.bytes = n
        return self


def human_bytes(n: float) -> str:
    """Bytes for a message: "1.5 GiB", "512.0 KiB", "100 bytes"."""
    for unit, power in (("TiB", 4), ("GiB", 3), ("MiB", 2), ("KiB", 1)):
        if n >= 1024**power:
            return f"{n / 1024**power:.1f} {unit}"
    return f"{int(n)} bytes"


def money(value: float) -> str:
    """A price to three significant digits: 0.0598 stays 0.0598 (a fixed number of decimals turns it to 0.1)."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    digits = max(0, 2 - math.floor(math.log10(abs(value))))
    return f"{value:,.{digits}f}"
