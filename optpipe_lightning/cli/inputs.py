"""What every ``optpipe`` command shares on the way in: the problem and schedule files, the
``--memory-margin`` option, and ``user_errors`` (a user's mistake as one line on stderr, exit 2).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from .command_errors import fail as _fail
from .errors import UserError
from .input_files import load_model

if TYPE_CHECKING:  # the schedule model (numpy, pydantic) loads when a command runs, not for --help
    from ..schedule import Problem, Schedule


@contextmanager
def user_errors() -> Iterator[None]:
    """Print a user's mistake as one line on stderr and exit with code 2."""
    try:
        yield
    except typer.Exit:
        raise
    except UserError as e:
        _fail(str(e))
    except Exception as e:
        # user errors of parts imported lazily (matched by name, subclasses included, so the
        # command line does not import the solver or the database to recognise them)
        if any(c.__name__ in _PART_USER_ERRORS for c in type(e).__mro__):
            _fail(str(e))
        raise


_PART_USER_ERRORS = frozenset(
    {
        "NotApplicable",
        "InfeasibleMemoryLimit",
        "DatabaseError",
        "TraceError",
        "ScheduleMismatchError",
    }
)


def load_problem(path: Path) -> Problem:
    from ..schedule import Problem
    from .size_guard import MAX_PROBLEM_BYTES

    return load_model(path, Problem, "problem", MAX_PROBLEM_BYTES)


def load_schedule(path: Path, max_bytes: int | None = None) -> Schedule:
    """A schedule file; ``max_bytes`` (``size_guard.max_schedule_bytes``) refuses one larger
    than any schedule of its problem before it is parsed."""
    from ..schedule import Schedule

    return load_model(path, Schedule, "schedule", max_bytes)


ProblemArg = Annotated[Path, typer.Argument(help="problem JSON (format optpipe.problem/1)")]


MarginOpt = Annotated[
    str | None,
    typer.Option(
        "--memory-margin",
        help="headroom kept free below each stage's memory limit: a fraction in [0, 1) "
        "(0.05) or bytes (2GB, 2e9, 512MiB)",
    ),
]


def with_margin(problem: Problem, margin: str | None) -> Problem:
    if margin is None:
        return problem
    from ..schedule.margin import apply_memory_margin

    try:
        return apply_memory_margin(problem, margin)
    except ValueError as e:
        raise UserError(f"--memory-margin: {e}") from None
