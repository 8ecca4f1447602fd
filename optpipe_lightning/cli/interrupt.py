"""Ctrl-C and SIGTERM during ``optpipe solve``/``compare``: stop the search, keep what it found.

``signals_stop(stop)`` turns SIGINT and SIGTERM into setting ``stop`` (the solver's cooperative
stop event) for the duration of a ``with`` block in the main thread. ``run_stoppable`` runs the
search in a worker thread so that the main thread is free to receive the signal at once (a
CP-SAT or HiGHS search holds the main thread in native code otherwise); once a signal came it
waits at most ``GRACE`` seconds for the search to return and otherwise gives up on it (the caller
then uses the best incumbent it was sent). ``best_found`` turns that incumbent into a
``SolveResult`` after the simulator checked it once more.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, suppress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, NoReturn, TypeVar

if TYPE_CHECKING:  # the schedule model loads when a solve runs: ``--help`` stays fast
    from ..schedule import Problem, Schedule

T = TypeVar("T")

# seconds the search gets to return after the signal before its incumbent is used instead
GRACE = 0.7
EXIT_INTERRUPTED = 130


@dataclass
class Caught:
    """The signal that interrupted the block (None: none came)."""

    signum: int | None = None
    at: float = 0.0

    @property
    def name(self) -> str:
        return "" if self.signum is None else signal.Signals(self.signum).name


_last: list[str] = []


def last_signal() -> str:
    """The name of the last signal that interrupted a block here ("" if none did)."""
    return _last[-1] if _last else ""


def _remember(caught: Caught, signum: int) -> None:
    caught.signum = signum
    caught.at = time.perf_counter()
    _last.append(caught.name)


Handler = Callable[[int, Any], None]


@contextmanager
def _handling(make: Callable[[Caught, dict[signal.Signals, Any]], Handler]) -> Iterator[Caught]:
    """Inside the block SIGINT and SIGTERM go to the handler ``make(caught, previous)`` returns;
    the previous handlers come back after it. Outside the main thread nothing is installed
    (signals only reach the main thread)."""
    caught = Caught()
    if threading.current_thread() is not threading.main_thread():
        yield caught
        return
    previous: dict[signal.Signals, Any] = {}
    handler = make(caught, previous)
    for sig in (signal.SIGINT, signal.SIGTERM):
        previous[sig] = signal.signal(sig, handler)
    try:
        yield caught
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def signals_stop(stop: threading.Event) -> AbstractContextManager[Caught]:
    """Inside the block SIGINT and SIGTERM set ``stop`` and are remembered in the ``Caught``
    yielded; a second signal falls back to the previous handlers (the default: end now)."""

    def make(caught: Caught, previous: dict[signal.Signals, Any]) -> Handler:
        def on_signal(signum: int, frame: Any) -> None:
            if caught.signum is None:
                _remember(caught, signum)
                stop.set()
            for sig, handler in previous.items():  # a second signal ends the process as before
                signal.signal(sig, handler)

        return on_signal

    return _handling(make)


def terminate_as_interrupt() -> AbstractContextManager[Caught]:
    """Inside the block SIGTERM raises ``KeyboardInterrupt`` like SIGINT (in the main thread;
    the ``Caught`` yielded names the signal)."""

    def make(caught: Caught, previous: dict[signal.Signals, Any]) -> Handler:
        def on_signal(signum: int, frame: Any) -> None:
            _remember(caught, signum)
            raise KeyboardInterrupt

        return on_signal

    return _handling(make)


@dataclass
class Outcome(Generic[T]):
    """What the search thread gave: its value, its exception, or nothing yet (abandoned)."""

    value: T | None = None
    error: BaseException | None = None
    done: bool = False
    thread: threading.Thread | None = field(default=None, repr=False)


def run_stoppable(fn: Callable[[], T], caught: Caught, grace: float = GRACE) -> Outcome[T]:
    """Run ``fn`` in a daemon thread and wait for it; after a signal (``caught``) wait at most
    ``grace`` seconds more. The outcome is ``done`` when ``fn`` returned or raised."""
    outcome: Outcome[T] = Outcome()

    def work() -> None:
        try:
            outcome.value = fn()
        except BaseException as e:
            outcome.error = e
        finally:
            outcome.done = True

    t = threading.Thread(target=work, name="optpipe-solve", daemon=True)
    outcome.thread = t
    t.start()
    while t.is_alive():
        if caught.signum is not None:
            t.join(max(0.0, caught.at + grace - time.perf_counter()))
            break
        t.join(0.05)
    return outcome


@dataclass
class LatestIncumbent:
    """The newest (best) incumbent schedule the solver sent (an ``on_incumbent`` callback)."""

    schedule: Schedule | None = None
    bound: float | None = None
    first_at: float | None = None
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __call__(self, inc: Any) -> None:
        with self.lock:
            if inc.schedule is not None:
                self.schedule = inc.schedule
            if inc.bound is not None:
                self.bound = inc.bound
            if self.first_at is None:
                self.first_at = inc.wall_time


def best_found(
    problem: Problem, latest: LatestIncumbent, backend: str, started: float, time_limit: float
) -> Any:
    """A ``SolveResult`` (status ``interrupted``) of the best incumbent, re-checked by the
    simulator; None when the search had found nothing that fits yet."""
    from ..schedule import Schedule
    from ..schedule.bounds import lower_bound
    from ..schedule.chunking import stamped
    from ..schedule.simulator import evaluate
    from ..solver.results import SolveResult

    with latest.lock:
        sched = latest.schedule
        bound = latest.bound
        first = latest.first_at or 0.0
    if sched is None:
        return None
    own = sched.problem if sched.problem is not None else problem
    ev = evaluate(own, sched)  # never trust it blindly: the simulator times it again
    if not ev.feasible or ev.makespan is None:
        return None
    makespan = ev.makespan
    if bound is None:
        bound = lower_bound(own)
    bound = min(bound, makespan)
    gap = (makespan - bound) / makespan if makespan > 0 else 0.0
    final = stamped(
        Schedule.built(
            problem_hash=own.hash,
            generator="optpipe",
            params={
                "backend": backend,
                "time_limit": time_limit,
                "lower_bound": bound,
                "gap": gap,
                "status": "interrupted",
                "source": sched.generator,
            },
            actions=list(sched.actions),
            evaluation=ev,
            problem=own,
        ),
        own,
    )
    return SolveResult(
        schedule=final,
        makespan=makespan,
        lower_bound=bound,
        gap=gap,
        status="interrupted",
        backend=backend,
        solve_seconds=time.perf_counter() - started,
        first_solution_seconds=first,
        message="interrupted: the best schedule found so far",
    )


def exit_interrupted() -> NoReturn:
    """Exit with 130 after an interrupted solve. A search thread that has not returned yet is
    not waited for (it was told to stop; its process ends here)."""
    import os
    import sys

    import typer

    if any(t.name == "optpipe-solve" and t.is_alive() for t in threading.enumerate()):
        for stream in (sys.stdout, sys.stderr):
            with suppress(OSError, ValueError):
                stream.flush()
        logging.shutdown()
        os._exit(EXIT_INTERRUPTED)
    raise typer.Exit(EXIT_INTERRUPTED)
