"""A deadline for the slow generators (used by the solver and the commands, never by plain calls).

A generator is pure Python, so the long ones (AdaOffload's offload rounds and pruning,
PipeOffload's share bisection, the V-shape squeezing) call ``check_deadline()`` between their
steps. Inside ``deadline_at(t)`` (``time.perf_counter()`` value) a call after ``t`` raises
``DeadlineExceeded``; the generator is abandoned, never cut short into a different schedule.
Outside any ``deadline_at`` block the check does nothing, so a generator's schedule does not
depend on it.

A step between two checks can be long on a large problem (AdaOffload's pruning took 18.8 s past
a 7.9 s share at 32,768 units, issue 33), so ``interruptible`` also raises ``DeadlineExceeded``
at the deadline from a timer signal (``SIGALRM``), wherever the generator is: where a process
has such a timer and the call runs in the main thread. Elsewhere (a worker thread, Windows) the
checks alone stop it. The timer is armed only around one generator call, so what a caller does
between calls (keeping the chunkings finished so far) is never interrupted.
"""

from __future__ import annotations

import contextvars
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "optpipe_baseline_deadline", default=None
)
T = TypeVar("T")
# a timer fire before the deadline by at most this (the timer's resolution) counts as at it
_EARLY = 1e-3


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


def timer_available() -> bool:
    """Whether ``interruptible`` can stop a call between its checks here (module doc)."""
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


def interruptible(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, stopped with ``DeadlineExceeded`` at the enclosing deadline even between
    its ``check_deadline`` calls, where ``timer_available`` (else only at those)."""
    at = _DEADLINE.get()
    if at is None or not timer_available():
        return fn(*args)
    check_deadline()

    def fire(signum: int, frame: object) -> None:
        left = at - time.perf_counter()
        if left > _EARLY:
            signal.setitimer(signal.ITIMER_REAL, left)
            return
        raise DeadlineExceeded(f"stopped at the deadline ({-left:.2f} s late, by the timer)")

    old_handler = signal.signal(signal.SIGALRM, fire)
    armed_at = time.perf_counter()
    old_delay, _ = signal.setitimer(signal.ITIMER_REAL, max(_EARLY, at - armed_at))
    try:
        return fn(*args)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_handler)
        if old_delay > 0:  # an outer timer: what is left of it
            signal.setitimer(
                signal.ITIMER_REAL, max(_EARLY, old_delay - (time.perf_counter() - armed_at))
            )
