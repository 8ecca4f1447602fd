"""PipeOffload's published copy grid fitted to one compute order (shared by ``gis_search`` and
``order_search``).

For each rule, the copies of 1 to v offloaded chunks are laid out (``_offload_grid.place_copies``)
on the rule's planning timeline (``pipeoffload._plan``) and simulated, fewest chunks first; the
first that fits is the rule's answer (more chunks only add copies). A layout the grid rejects ends
the rule (the ``GridError`` of a timeline skips it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from ..schedule.baselines._offload_grid import GridError, Rule, place_copies
from ..schedule.baselines.pipeoffload import Member, _plan
from ..schedule.problem import Problem
from ..schedule.schedule import Action
from ..schedule.simulator import SimResult, simulate

Rows = list[list[Action]]


@dataclass(frozen=True)
class GridFit:
    """The fewest offloaded chunks of one rule that fit: the order with its copies."""

    rows: Rows
    offload_chunks: int
    rule: Rule
    makespan: float


def grid_fits(
    problem: Problem,
    group_size: int,
    rows: Rows,
    base: SimResult,
    rules: Iterable[Rule],
    late: Callable[[], bool],
    on_try: Callable[[], None] | None = None,
) -> Iterator[GridFit]:
    """For each of ``rules`` in turn, the copy grid on ``rows`` (PipeOffload's order of group
    size ``group_size``, ``base`` its simulation without copies) with the fewest offloaded chunks
    that fits, if one does. Stops once ``late()`` before a layout; ``on_try`` is called before
    each simulation (a caller counting tries)."""
    for rule in rules:
        try:
            plan = _plan(problem, Member(group_size, 1, rule), rows, base)
        except GridError:
            continue
        for k in range(1, problem.num_chunks + 1):
            if late():
                return
            try:
                with_copies, _ = place_copies(problem, plan, k, rule)
            except GridError:
                break
            if on_try is not None:
                on_try()
            res = simulate(problem, with_copies)
            if res.feasible and res.makespan is not None:
                yield GridFit(with_copies, k, rule, res.makespan)
                break  # more chunks only add copies
