"""How large a problem each command takes, checked before anything large is built.

The size of a problem is its number of (stage, microbatch, chunk) units, ``p x m x v``: every
schedule has about 3 compute ops per unit (and up to 2 copies), and every command's work grows
with it (the solver's first schedule faster than linearly, about ``n^1.5``). The limits below
keep each command within seconds on a 2-core machine (BENCHMARKS.md, "Size limits"):

| command | largest problem (units) | why |
|---|---|---|
| ``simulate`` | 262,144 (e.g. 64 x 2048 x 2) | the simulator times about 100k units a second |
| ``solve``, ``compare`` | 32,768 (e.g. 64 x 256 x 2) | the first schedule takes about a second there, and a |
| | | generator stopped at a deadline finishes its step (seconds at 65,536) |
| ``baseline`` | 65,536 | the slow generators stop at ``--time-limit`` |
| ``trace`` | 65,536 | about 1.1 kB of trace per unit: at most about 70 MB |

``solve`` also needs a time limit its first schedule fits in, so that it returns within a few
percent of the limit: ``min_time_limit`` is 4 s x (units / 32,768)^1.5 (the first schedule, with
room) plus twice the wind-down reserve of 40 us per unit: 6.6 s at the largest size, 2.7 s at
16,384 units, 0.5 s at 4,096; twice that for ``compare``, whose baselines take the first half
of its limit. The solver gets the command's limit less the reserve. A refusal is one line naming the size, the largest the command takes
and what to do.

Memory: the MILP backends (``--solver highs|gurobi``) build their model only up to
``solver.milp.MILP_MAX_VARIABLES`` (1,000,000 variables, about 1 GB in the command's process;
HiGHS then solves it in a child capped at 4 GiB); a larger model is skipped with a note.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Final

from .errors import UserError

if TYPE_CHECKING:
    from ..schedule.problem import Problem

MAX_UNITS: Final[dict[str, int]] = {
    "simulate": 262_144,
    "solve": 32_768,
    "compare": 32_768,
    "baseline": 65_536,
    "trace": 65_536,
}
FIRST_SCHEDULE_SECONDS: Final = 4.0
"""Time for ``solve``'s first schedule at the largest size it takes, with room (it took
0.7-1.2 s at 32,768 units and 2-3.5 s at 65,536 on an idle core)."""
TRACE_BYTES_PER_UNIT: Final = 1100
"""Chrome-trace JSON per (stage, microbatch, chunk): about 8 events of about 135 bytes."""
SCHEDULE_BYTES_PER_UNIT: Final = 5 * 80
"""The most a schedule file can hold per unit: 5 actions (F, B, W, OFFLOAD, RELOAD) of at most
about 80 bytes each, indented."""
MAX_PROBLEM_BYTES: Final = 64 * 2**20
"""The largest problem file (a [stage][chunk] list of every field at 1024 x 64 is about 10 MB)."""
MAX_TRACE_SCHEDULE_BYTES: Final = 64 * 2**20
"""The largest schedule file ``trace`` reads without ``--problem`` (the largest it traces is
about 27 MB, plus its embedded problem)."""
WIND_DOWN_SECONDS_PER_UNIT: Final = 40e-6
"""What ``solve`` may take past its limit, and the command after it, per unit: a generator
stopped at the deadline finishes its current step first (PipeOffload's bisection step took
1.8 s at 64 x 1024 x 1, V-Min's squeeze 2.8 s at 64 x 512 x 2 on a busy machine), then one
simulation and the output. The solver is given the command's limit less this
(``wind_down_reserve``: 1.3 s at the largest size, 0.66 s at 16,384 units)."""
STRONGEST_SHARE: Final = 0.85
"""The share of ``compare``'s limit until which its strongest baselines may run (the others stop
at half)."""
MAX_TIME_LIMIT: Final = 7 * 86400.0
"""The largest ``--time-limit`` (a week)."""


def units(problem: Problem) -> int:
    return problem.num_stages * problem.num_microbatches * problem.num_chunks


def _shape(problem: Problem) -> str:
    return f"{problem.num_stages}x{problem.num_microbatches}x{problem.num_chunks}"


def check_size(problem: Problem, command: str) -> None:
    """``UserError`` when ``problem`` is larger than ``command`` takes (``MAX_UNITS``)."""
    n, top = units(problem), MAX_UNITS[command]
    if n > top:
        raise UserError(
            f"problem {_shape(problem)} (stages x microbatches x chunks) has {n:,} units; "
            f"`optpipe {command}` takes at most {top:,} (e.g. 64x{top // 128}x2): "
            "use fewer microbatches or stages"
        )


def min_time_limit(problem: Problem, command: str = "solve") -> float:
    """The smallest time limit ``command`` holds within a few percent on this problem: the
    first schedule's time (``FIRST_SCHEDULE_SECONDS`` at the largest size, growing as
    units^1.5) plus twice the wind-down reserve; twice that for ``compare``."""
    n = units(problem)
    base = FIRST_SCHEDULE_SECONDS * (n / MAX_UNITS["solve"]) ** 1.5 + 2 * wind_down_reserve(problem)
    return base * (2.0 if command == "compare" else 1.0)


def check_time_limit(problem: Problem, time_limit: float, command: str) -> None:
    """``UserError`` for a time limit that is not a number of seconds the command can hold."""
    if not 0 < time_limit <= MAX_TIME_LIMIT:  # NaN fails too
        raise UserError(
            f"--time-limit must be > 0 and at most {MAX_TIME_LIMIT:g} seconds, got {time_limit:g}"
        )
    least = min_time_limit(problem, command)
    if time_limit < least:
        raise UserError(
            f"--time-limit {time_limit:g} s is too short for problem {_shape(problem)} "
            f"({units(problem):,} units): `optpipe {command}` needs at least {least:.2g} s there "
            "(its first schedule and what follows the solver take that much); raise --time-limit"
        )


def wind_down_reserve(problem: Problem) -> float:
    """Seconds a command keeps back from the solver for what comes after it (see above)."""
    return WIND_DOWN_SECONDS_PER_UNIT * units(problem)


def solver_seconds(problem: Problem, time_limit: float, started: float) -> float:
    """What is left of a command's ``time_limit`` (started at ``started``, a
    ``time.perf_counter()`` value) for the solver, less ``wind_down_reserve``."""
    left = started + time_limit - time.perf_counter() - wind_down_reserve(problem)
    return max(0.01, left)


def max_schedule_bytes(problem: Problem) -> int:
    """The largest file a schedule of ``problem`` can be (anything larger is not one)."""
    return units(problem) * SCHEDULE_BYTES_PER_UNIT + 2**20


def trace_bytes(problem: Problem) -> int:
    """About how large ``optpipe trace`` writes a schedule of ``problem``."""
    return units(problem) * TRACE_BYTES_PER_UNIT


def check_trace_size(problem: Problem) -> None:
    """``UserError`` naming the file size when a trace of ``problem`` would be too large."""
    n, top = units(problem), MAX_UNITS["trace"]
    if n > top:
        raise UserError(
            f"a trace of problem {_shape(problem)} ({n:,} units) would be about "
            f"{trace_bytes(problem) / 1e6:,.0f} MB; `optpipe trace` writes at most {top:,} units "
            f"(about {top * TRACE_BYTES_PER_UNIT / 1e6:.0f} MB): trace a smaller problem"
        )


class CompareBudget:
    """How ``compare`` spends its ``--time-limit``: baselines until half of it, the strongest
    (run first) until ``STRONGEST_SHARE`` (all of it with ``--no-solve``; one still running then
    is stopped and listed as not finished), the solver the rest, less ``wind_down_reserve``.
    Checks the size (for ``command``: ``baseline`` takes larger problems) and the limit first;
    ``started`` (default: now) is when the command started."""

    def __init__(
        self,
        problem: Problem,
        time_limit: float,
        solving: bool,
        started: float | None = None,
        command: str = "compare",
    ) -> None:
        check_size(problem, command)  # ``baseline`` takes larger problems than ``compare``
        self.problem = problem
        if solving:
            check_time_limit(problem, time_limit, "compare")
        elif not 0 < time_limit <= MAX_TIME_LIMIT:
            check_time_limit(problem, time_limit, "baseline")
        self.start = time.perf_counter() if started is None else started
        self.time_limit = time_limit
        self.baselines_until = self.start + (0.5 if solving else 1.0) * time_limit
        # the strongest baselines (``solver.candidates.STRONGEST_BASELINES``) run first and may
        # go on until STRONGEST_SHARE: on a busy machine they are worth more than the solver's
        # extra time (its first schedule still fits in the rest: the limit is at least twice
        # what ``solve`` needs)
        self.strongest_until = self.start + (STRONGEST_SHARE if solving else 1.0) * time_limit
        self.stopped = (
            f"not finished within {'its share of ' if solving else ''}the time limit "
            f"({time_limit:g} s); raise --time-limit"
        )  # (also for one not started: the time was spent before its turn)

    def solver_seconds(self) -> float:
        """What is left of the time limit for the solver (``solver_seconds``)."""
        return solver_seconds(self.problem, self.time_limit, self.start)
