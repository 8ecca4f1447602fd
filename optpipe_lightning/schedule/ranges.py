"""What the problem and schedule formats accept: strict number types and their documented ranges.

Strict: a time, a byte count or a bandwidth is a JSON number (an integer is taken as a float),
never a string (``"1.5"``) or a boolean; a count (stages, microbatches, chunks, an action's
microbatch) is a JSON integer. NaN and infinities are refused everywhere. The ranges keep every
number the tools compute (sums of millions of op times, byte-seconds, CP-SAT ticks) finite and
representable; docs/formats.md lists them. How large a problem each command takes is a separate,
tighter check (``optpipe_lightning.cli.size_guard``).
"""

from __future__ import annotations

from typing import Annotated, Final

from pydantic import AllowInfNan, Field, Strict

MAX_STAGES: Final = 1024
MAX_CHUNKS: Final = 64
MAX_MICROBATCHES: Final = 65_536

MIN_SECONDS: Final = 1e-9
"""The smallest nonzero time (one nanosecond): below it, time ratios overflow integer ticks."""
MAX_SECONDS: Final = 1e6
"""The largest time of one op or copy (about 11.6 days)."""
MIN_BYTES: Final = 1e-9
"""The smallest nonzero byte count (fractions are allowed: unit-memory models use 0.5)."""
MAX_BYTES: Final = 1e15
"""The largest byte count of one activation, memory change or limit (one petabyte)."""
MAX_BANDWIDTH: Final = 1e15
"""The largest copy bandwidth in bytes/s (a copy's time, bytes / bandwidth, is a time too)."""
MAX_NAME_LENGTH: Final = 2000
"""The longest problem name (a free-form label; the database's name column keeps its start)."""
MAX_GENERATOR_LENGTH: Final = 100

Number = Annotated[float, Strict(), AllowInfNan(False)]
"""A finite JSON number; an integer is taken as a float, a string or a boolean is refused."""

Count = Annotated[int, Strict()]
"""A JSON integer (not ``2.0``, ``"2"`` or ``true``)."""


def time_problem(name: str, value: float, *, positive: bool) -> str | None:
    """Why ``value`` is no valid time for field ``name`` (None when it is one)."""
    if value == 0 and not positive:
        return None
    lo = "> 0 and " if positive else "0 or "
    if not MIN_SECONDS <= value <= MAX_SECONDS:
        return (
            f"{name} must be {lo}between {MIN_SECONDS:g} and {MAX_SECONDS:g} seconds, got {value:g}"
        )
    return None


def bytes_problem(name: str, value: float, *, signed: bool = False) -> str | None:
    """Why ``value`` is no valid byte count for ``name``: 0 or magnitude in the byte range."""
    mag = abs(value) if signed else value
    if value == 0:
        return None
    if not MIN_BYTES <= mag <= MAX_BYTES:
        what = "its magnitude " if signed else ""
        return (
            f"{name} must be 0 or {what}between {MIN_BYTES:g} and {MAX_BYTES:g} bytes, "
            f"got {value:g}"
        )
    return None


Bandwidth = Annotated[Number, Field(gt=0, le=MAX_BANDWIDTH)]
Stages = Annotated[Count, Field(ge=1, le=MAX_STAGES)]
Microbatches = Annotated[Count, Field(ge=1, le=MAX_MICROBATCHES)]
Chunks = Annotated[Count, Field(ge=1, le=MAX_CHUNKS)]
StageIndex = Annotated[Count, Field(ge=0, lt=MAX_STAGES)]
Label = Annotated[str, Strict(), Field(max_length=MAX_NAME_LENGTH)]
