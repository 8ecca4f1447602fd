"""Human units for bytes and times, one convention for the command line and the inspector.

Bytes are shown in decimal SI units (kB, MB, GB, TB: powers of 1000), like the GB/s of a copy
bandwidth, so ``bytes / bandwidth`` reads as the time it takes. Times are shown in the unit that
fits their size (ns, µs, ms, s; minutes and hours only for long runs). Nothing is ever printed in
scientific notation.

``distinct(a, b)`` prints two numbers with as many significant digits as it takes to tell them
apart (at least 6), for messages that say one value differs from another.
``format_bytes`` / ``format_seconds`` format one value; ``byte_unit`` / ``time_unit`` pick one
unit for a whole axis or table column (from its largest value), so a chart reads in one unit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = [
    "Unit",
    "byte_unit",
    "distinct",
    "format_bandwidth",
    "format_bytes",
    "format_seconds",
    "time_unit",
]


@dataclass(frozen=True)
class Unit:
    """A display unit: ``value / scale`` is the number shown with ``name``."""

    name: str
    scale: float

    def of(self, value: float) -> float:
        return value / self.scale


BYTE_UNITS = (Unit("TB", 1e12), Unit("GB", 1e9), Unit("MB", 1e6), Unit("kB", 1e3))
BYTES = Unit("B", 1.0)
TIME_UNITS = (Unit("s", 1.0), Unit("ms", 1e-3), Unit("µs", 1e-6))
NANOSECONDS = Unit("ns", 1e-9)


def byte_unit(max_bytes: float) -> Unit:
    """The largest decimal unit in which ``max_bytes`` is at least 1 (B below 1 kB)."""
    x = abs(max_bytes) if math.isfinite(max_bytes) else 0.0
    for u in BYTE_UNITS:
        if x >= u.scale:
            return u
    return BYTES


def time_unit(max_seconds: float) -> Unit:
    """The largest unit (s, ms, µs, ns) in which ``max_seconds`` is at least 1."""
    x = abs(max_seconds) if math.isfinite(max_seconds) else 0.0
    for u in TIME_UNITS:
        if x >= u.scale:
            return u
    return NANOSECONDS


def _number(x: float, decimals: int) -> str:
    return f"{x:.{decimals}f}"


def format_bytes(x: float | None, *, none: str = "-", decimals: int = 2) -> str:
    """``52_750_000_000`` -> ``"52.75 GB"``; ``none`` for None (or NaN)."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return none
    if math.isinf(x):
        return "∞"
    u = byte_unit(x)
    return f"{_number(x / u.scale, 0 if u is BYTES else decimals)} {u.name}"


def format_bandwidth(bytes_per_second: float | None, *, none: str = "-") -> str:
    """``2.0e10`` -> ``"20.0 GB/s"``."""
    if bytes_per_second is None or (
        isinstance(bytes_per_second, float) and math.isnan(bytes_per_second)
    ):
        return none
    return f"{format_bytes(bytes_per_second, decimals=1)}/s"


def format_seconds(x: float | None, *, none: str = "-", decimals: int = 3) -> str:
    """A duration in the unit that fits: ``0.0061329`` -> ``"6.133 ms"``, ``28.0`` -> ``"28.000 s"``,
    ``5400`` -> ``"1.50 h"``; ``none`` for None (or NaN)."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return none
    if math.isinf(x):
        return "∞"
    if abs(x) >= 7200:
        return f"{_number(x / 3600, 2)} h"
    if abs(x) >= 600:
        return f"{_number(x / 60, 1)} min"
    if x == 0:
        return "0 s"
    u = time_unit(x)
    return f"{_number(x / u.scale, decimals)} {u.name}"


def distinct(a: float, b: float, digits: int = 6) -> tuple[str, str]:
    """``a`` and ``b`` with ``digits`` significant digits, or more until the two texts differ
    (equal values, or values that differ only past double precision, read the same)."""
    for d in range(digits, 18):
        x, y = f"{a:.{d}g}", f"{b:.{d}g}"
        if x != y:
            return x, y
    return f"{a!r}", f"{b!r}"
