"""Baseline schedule generators: every fixed-rule schedule the solver is compared against.

Each generator takes a ``Problem`` and returns an ordinary ``Schedule`` (evaluated by the one
simulator, problem embedded), or raises ``NotApplicable`` saying why it does not apply (wrong chunk
count or placement, memory limit too small for its rule).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any

from ..chunking import chunkings, rechunk, stamped
from ..margin import peak_share
from ..problem import Problem
from ..schedule import Action, Schedule
from ..simulator import evaluate
from ._deadline import DeadlineExceeded, interruptible


class NotApplicable(ValueError):
    """This generator does not apply to this problem; the message says why."""


# name -> "module:function" (modules are imported on first use)
_REGISTRY: dict[str, str] = {
    "gpipe": "gpipe:gpipe",
    "1f1b": "one_f_one_b:one_f_one_b",
    "interleaved-1f1b": "one_f_one_b:interleaved_1f1b",
    "zb-h1": "zero_bubble:zb_h1",
    "zb-h2": "zero_bubble:zb_h2",
    "zb-auto": "zb_auto:zb_auto",
    "zbv": "vshape:zbv",
    "v-half": "vshape:v_half",
    "v-min": "vshape:v_min",
    "pipeoffload": "pipeoffload:pipeoffload",
    "adaoffload": "adaoffload:adaoffload",
}
BASELINE_NAMES: tuple[str, ...] = tuple(_REGISTRY)


def get_generator(name: str) -> Callable[[Problem], Schedule]:
    try:
        target = _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown schedule {name!r}; one of {', '.join(BASELINE_NAMES)}") from None
    module, func = target.split(":")
    fn: Callable[[Problem], Schedule] = getattr(
        importlib.import_module(f"{__name__}.{module}"), func
    )
    return fn


def generate(name: str, problem: Problem) -> Schedule:
    """The named baseline's schedule for the problem (raises ``NotApplicable``; inside
    ``_deadline.deadline_at``, ``DeadlineExceeded`` at the deadline)."""
    return interruptible(get_generator(name), problem)


def generate_all(problem: Problem) -> dict[str, Schedule | NotApplicable]:
    """Every baseline: its schedule, or the reason it does not apply."""
    out: dict[str, Schedule | NotApplicable] = {}
    for name in BASELINE_NAMES:
        try:
            out[name] = generate(name, problem)
        except NotApplicable as e:
            out[name] = e
    return out


# Generators whose best chunking is most often the one with the most chunks (PipeOffload's
# published sweep favours the largest v: a smaller group of chunks holds less per offload). At
# a deadline these try their chunkings most chunks first, so the one kept is the likely best.
MOST_CHUNKS_FIRST: frozenset[str] = frozenset({"pipeoffload", "adaoffload"})


def chunking_order(name: str, problem: Problem) -> list[int]:
    """The order ``generate_chunked`` tries the problem's chunkings in (indices into
    ``chunkings(problem)``): as listed, except most chunks first for ``MOST_CHUNKS_FIRST``."""
    tried = list(chunkings(problem))
    order = list(range(len(tried)))
    if name in MOST_CHUNKS_FIRST:
        order.sort(key=lambda i: -tried[i][0])
    return order


def generate_chunkings(
    name: str, problem: Problem, indices: Sequence[int]
) -> tuple[dict[int, Schedule], dict[int, NotApplicable]]:
    """The named baseline on the chunkings ``indices`` (into ``chunkings(problem)``), in that
    order: the schedules made (stamped, by index) and the reasons of those that do not apply.
    Stopped at the caller's deadline (``_deadline.deadline_at``) it returns what was finished
    by then, and raises ``DeadlineExceeded`` only when nothing was."""
    tried = list(chunkings(problem))
    done: dict[int, Schedule] = {}
    why: dict[int, NotApplicable] = {}
    for i in indices:
        v, placement = tried[i]
        pb = rechunk(problem, v, placement)
        try:
            done[i] = stamped(generate(name, pb), pb)
        except NotApplicable as e:
            why[i] = e
        except DeadlineExceeded:
            if done:
                break
            raise
    return done, why


def generate_chunked(name: str, problem: Problem) -> list[Schedule]:
    """The named baseline on every chunking the problem allows (``schedule.chunking``: only its
    own without ``layers_per_stage``), each schedule embedding the problem it was built for and
    recording its chunking, listed own chunking first, then as ``chunkings`` gives them. Raises
    the own chunking's ``NotApplicable`` (else the first one's) when it applies to none. Stopped
    at the caller's deadline (``_deadline.deadline_at``), it returns the chunkings finished by
    then, and raises ``DeadlineExceeded`` only when none was. The chunkings are tried in that
    order too, except for ``MOST_CHUNKS_FIRST`` generators (most chunks first, then that order):
    which finish before a deadline differs, never what a finished one gives."""
    done, why = generate_chunkings(name, problem, chunking_order(name, problem))
    if not done:
        raise why[min(why)]
    return [done[i] for i in sorted(done)]


def best_schedule(schedules: Sequence[Schedule]) -> Schedule:
    """The best of some evaluated schedules: one that fits before one that does not, then the
    lowest makespan, then the lowest peak share of the limit (``margin.peak_share``)."""

    def key(s: Schedule) -> tuple[bool, float, float]:
        ev = s.evaluation
        assert ev is not None
        mk = float("inf") if ev.makespan is None else ev.makespan
        return (not ev.feasible, mk, peak_share(ev))

    return min(schedules, key=key)


def make_schedule(
    problem: Problem,
    generator: str,
    actions: Sequence[Sequence[Action]],
    params: dict[str, Any] | None = None,
) -> Schedule:
    """Wrap per-stage action lists as an evaluated, self-contained schedule."""
    rows = [list(r) for r in actions]
    return Schedule.built(
        problem_hash=problem.hash,
        generator=generator,
        params=params or {},
        actions=rows,
        evaluation=evaluate(problem, rows),
        problem=problem,
    )
