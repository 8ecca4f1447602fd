"""Headroom: a memory margin kept free below each device's activation-memory limit.

A margin is a fraction of the limit in [0, 1) (``0.05``: plan for 95% of it) or bytes (a number
>= 1, or with a unit: ``2GB``, ``2e9``, ``512MiB``). It is applied to the limit before a schedule
is solved or compared, so measurement noise, fragmentation or a later allocation do not push a
schedule that touches 100% of the limit over it. The strategy's ``memory_margin`` option and the
command line's ``--memory-margin`` use these functions.
"""

from __future__ import annotations

import math
import re

from .problem import Problem
from .schedule import Evaluation, Schedule

_UNITS = {
    "": 1.0,
    "b": 1.0,
    "kb": 1e3,
    "mb": 1e6,
    "gb": 1e9,
    "tb": 1e12,
    "kib": 2.0**10,
    "mib": 2.0**20,
    "gib": 2.0**30,
    "tib": 2.0**40,
}
_TEXT = re.compile(r"^\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_memory_margin(value: str | float) -> float:
    """The margin as a number: a fraction in [0, 1), or bytes (>= 1). Raises ``ValueError``
    naming the rule for a negative margin, a fraction of 1 or more, or text that is neither."""
    if isinstance(value, str):
        m = _TEXT.match(value)
        unit = m.group(2).lower() if m else ""
        if m is None or unit not in _UNITS:
            raise ValueError(
                f"memory margin {value!r} is neither a fraction in [0, 1) (e.g. 0.05) nor bytes "
                "(e.g. 2GB, 2e9, 512MiB)"
            )
        number = float(m.group(1))
        if number < 0:
            raise ValueError(f"memory margin must be >= 0, got {value!r}")
        x = number * _UNITS[unit]
        if unit and 0 < x < 1:
            raise ValueError(f"memory margin {value!r} is less than one byte")
    else:
        x = float(value)
    if not math.isfinite(x) or x < 0:
        raise ValueError(f"memory margin must be a finite number >= 0, got {value!r}")
    unitless = not isinstance(value, str) or not unit
    if unitless and x >= 1 and x != math.floor(x):
        # 1.5 is neither a fraction nor a byte count: most likely meant as 1.5% or 1.5 GB
        raise ValueError(
            f"memory margin {value!r} is {x:g} bytes, not a whole number: a fraction is below 1 "
            f"(e.g. {x / 100:g} for {x:g}%), bytes take a unit (e.g. {x:g}GB)"
        )
    return x


def limit_with_margin(limit: float, margin: str | float) -> float:
    """One device's limit less the margin: ``limit * (1 - margin)`` for a fraction, ``limit -
    margin`` for bytes. Raises ``ValueError`` when bytes leave nothing of the limit."""
    x = parse_memory_margin(margin)
    if x < 1:
        return limit * (1.0 - x)
    if x >= limit:
        raise ValueError(
            f"memory margin {x:.6g} bytes leaves nothing of the memory limit {limit:.6g} bytes; "
            "give a smaller margin (or a fraction such as 0.05)"
        )
    return limit - x


def apply_memory_margin(problem: Problem, margin: str | float) -> Problem:
    """The problem with every stage's memory limit less the margin (unchanged where a stage
    has no limit, and the problem itself for a zero margin)."""
    x = parse_memory_margin(margin)
    lim = problem.memory_limit
    if x == 0 or lim is None:
        return problem
    if isinstance(lim, int | float):
        return problem.with_changes(memory_limit=limit_with_margin(float(lim), x))
    return problem.with_changes(memory_limit=[limit_with_margin(float(y), x) for y in lim])


def budgeted_for(schedule: Schedule, problem: Problem) -> Schedule:
    """A schedule solved for ``problem`` less a margin (its embedded problem: that one or a
    re-chunking of it), re-targeted to ``problem`` itself: for the same chunking of ``problem``
    (hash, embedded problem), carrying the reduced limits as its ``memory_budget`` and evaluated
    there, so simulated (and executed) at the real limit it keeps the margin its memory waits
    were planned for. A schedule already for ``problem`` is returned as it is."""
    from .chunking import own_chunking, rechunk
    from .simulator import evaluate

    own = schedule.problem
    if own is None:
        raise ValueError("budgeted_for needs a schedule that embeds the problem it was solved for")
    if own.hash == problem.hash:
        return schedule
    v, pl = own_chunking(own)
    real = rechunk(problem, v, pl)
    if real.with_changes(memory_limit=own.memory_limit).hash != own.hash:
        raise ValueError(
            f"the schedule was solved for problem {own.hash}, which is not problem {problem.hash} "
            "(or a re-chunking of it) with a lower memory limit"
        )
    budget = [
        float(x) for x in own.memory_limits() if x is not None
    ]  # a margin keeps every stage limited
    out = schedule.model_copy(
        update={
            "problem_hash": real.hash,
            "problem": real,
            "memory_budget": budget if len(budget) == real.num_stages else None,
            "evaluation": None,
        }
    )
    return out.with_evaluation(evaluate(real, out))


def peak_share(ev: Evaluation) -> float:
    """How close a schedule comes to its memory limit: the largest share of a stage's limit its
    peak takes (the largest peak in bytes where no stage has a limit). Among equally fast
    schedules the solver and ``compare`` keep the one where this is lowest."""
    shares = [
        pk / lim
        for pk, lim in zip(ev.peak_memory, ev.memory_limit, strict=False)
        if lim is not None and lim > 0
    ]
    if shares:
        return max(shares)
    return max(ev.peak_memory, default=0.0)
