"""A cooperative deadline for the slow generators (used by the solver, never by plain calls).

A generator is pure Python and cannot be interrupted from outside, so the long ones
(AdaOffload's offload rounds and pruning, PipeOffload's share bisection, the V-shape squeezing)
call ``check_deadline()`` between their steps. Inside ``deadline_at(t)`` (``time.perf_counter()``
value) a call after ``t`` raises ``DeadlineExceeded``; the generator is abandoned, never cut
short into a different schedule. Outside any ``deadline_at`` block the check does nothing, so a
generator's schedule does not depend on it.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Iterator
from contextlib import contextmanager

_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "optpipe_baseline_deadline", default=None
)


class DeadlineExceeded(Exception):
    """The generator was stopped at the caller's deadline (its schedule is not available)."""


@contextmanager
def deadline_at(at: float | None) -> Iterator[None]:
    """Stop generators run inside this block at ``at`` (``time.perf_counter()``; None: never)."""
    token = _DEADLINE.set(at)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def check_deadline() -> None:
    """Raise ``DeadlineExceeded`` when the enclosing ``deadline_at`` has passed."""
    at = _DEADLINE.get()
    if at is not None and time.perf_counter() > at:
        raise DeadlineExceeded(f"stopped at the deadline ({time.perf_counter() - at:.2f} s late)")
