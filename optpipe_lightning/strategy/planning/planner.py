"""Which schedule runs: the problem before and after profiling, and the schedule chosen for it.

- ``chunks_for(name)``: V-shape schedules run 2 chunks per device (vshape placement), interleaved
  1F1B 2 chunks (interleaved placement), everything else 1.
- ``initial_problem``: before any measurement, costs proportional to the layers' relative costs
  (unit per layer by default) and no memory limit -- enough to order ops safely.
- ``choose_schedule``: a baseline by name, or ``"optimal"`` (the solver when it is installed, else
  the best feasible baseline); always simulator-checked; ``NoScheduleError`` with the reason when
  nothing fits. ``best_baseline``: the fastest feasible baseline alone (what runs while the
  background solver works).
- ``profiling_schedule``: what the profiling steps run: all forwards, then for each microbatch in
  reverse order B then W on every stage (split backward, one op at a time per stage), so every op
  kind is timed on its own.
- ``forward_order``: the forwards of validation, test and predict.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Literal

from ...schedule import Action, Problem, Schedule, simulate
from ...schedule.baselines import BASELINE_NAMES, NotApplicable, generate, make_schedule

log = logging.getLogger(__name__)

V_SCHEDULES = ("zbv", "v-half", "v-min")
INTERLEAVED_SCHEDULES = ("interleaved-1f1b",)
SCHEDULE_CHOICES = ("optimal", *BASELINE_NAMES)


class NoScheduleError(ValueError):
    """No schedule fits this pipeline (memory limit, microbatch count); the message says why."""


Placement = Literal["interleaved", "vshape"]


def chunks_for(
    name: str, num_chunks: int | None = None, placement: Placement | None = None
) -> tuple[int, Placement]:
    """(chunks per device, placement) a schedule name runs with.

    V schedules run 2 chunks in V placement; interleaved 1F1B any ``v >= 2`` (default 2),
    interleaved; ``"optimal"`` and the other baselines any ``v`` in either placement (default
    one chunk; whether a named baseline applies to that shape is checked with the sizes).
    ``NoScheduleError`` when the schedule cannot run as asked.
    """
    if num_chunks is not None and (not isinstance(num_chunks, int) or num_chunks < 1):
        raise NoScheduleError(f"num_chunks must be an integer >= 1, got {num_chunks!r}")
    if placement not in (None, "interleaved", "vshape"):
        raise NoScheduleError(f"placement must be 'interleaved' or 'vshape', got {placement!r}")
    if name in V_SCHEDULES:
        if num_chunks not in (None, 2) or placement not in (None, "vshape"):
            raise NoScheduleError(
                f"{name} runs 2 chunks per device in V placement; leave num_chunks and "
                "placement out (or use schedule='optimal' for other chunkings)"
            )
        return 2, "vshape"
    if name in INTERLEAVED_SCHEDULES:
        if placement == "vshape" or num_chunks == 1:
            raise NoScheduleError(
                f"{name} runs 2 or more chunks per device in interleaved placement; use zbv, "
                "v-half or v-min for the V placement and 1f1b for one chunk"
            )
        return num_chunks or 2, "interleaved"
    return num_chunks or 1, placement or "interleaved"


def initial_problem(
    num_stages: int,
    num_microbatches: int,
    num_chunks: int,
    placement: Literal["interleaved", "vshape"],
    group_costs: Sequence[float],
) -> Problem:
    """Costs proportional to each layer group's relative cost; F = B = W; no memory limit."""
    p, v = num_stages, num_chunks
    probe = Problem(
        num_stages=p,
        num_microbatches=num_microbatches,
        num_chunks=v,
        placement=placement,
        t_f=1.0,
        t_b=1.0,
        t_w=1.0,
    )
    cost = [
        [max(float(group_costs[probe.group_of(s, c)]), 1e-9) for c in range(v)] for s in range(p)
    ]
    return probe.with_changes(t_f=cost, t_b=cost, t_w=cost, name="unprofiled")


def profiling_schedule(problem: Problem) -> Schedule:
    """The safe schedule of the profiling steps.

    Even microbatches run a split backward (B then W), odd ones a fused BW, so one profiling
    step measures F, B, W and the fused backward (``t_bw``) of every stage and chunk. With one
    chunk the order is 1F1B's (warm-up ``p - s - 1`` forwards, then one forward and one backward
    in turn): at most ``p`` microbatches in flight, the working set the real schedules have, so
    op times are not inflated by a larger one and profiling needs no more activation memory than
    1F1B. With several chunks: all F in layer order, then the backwards (last microbatch first).
    """
    p, m = problem.num_stages, problem.num_microbatches
    rows: list[list[Action]] = [[] for _ in range(p)]

    def backward(row: list[Action], mb: int, c: int) -> None:
        if mb % 2 == 1:
            row.append(Action("BW", mb, c))
        else:
            row.append(Action("B", mb, c))
            row.append(Action("W", mb, c))

    if problem.num_chunks == 1:
        for s, row in enumerate(rows):
            warm = min(p - s - 1, m)
            row.extend(Action("F", mb) for mb in range(warm))
            for mb in range(m):
                if warm + mb < m:
                    row.append(Action("F", warm + mb))
                backward(row, mb, 0)
    else:
        for mb in range(m):
            for g in range(problem.num_virtual_stages):
                s, c = problem.group_table[g]
                rows[s].append(Action("F", mb, c))
        for mb in reversed(range(m)):
            for g in reversed(range(problem.num_virtual_stages)):
                s, c = problem.group_table[g]
                backward(rows[s], mb, c)
    return make_schedule(
        problem.with_changes(memory_limit=None, offload=None), "optpipe-profiling", rows
    )


def forward_order(problem: Problem) -> list[list[Action]]:
    """Forwards only (validation, test, predict), per device.

    In rounds of ``p`` microbatches, each chunk in model order: sorted by (round, chunk,
    microbatch, layer group), every forward comes after the one that feeds it, so no rank waits
    on a rank that waits on it, and a round keeps every device busy.
    """
    p = problem.num_stages
    keyed = []
    for g, (s, c) in enumerate(problem.group_table):
        for mb in range(problem.num_microbatches):
            keyed.append(((mb // p, c, mb, g), s, Action("F", mb, c)))
    rows: list[list[Action]] = [[] for _ in range(p)]
    for _, s, action in sorted(keyed, key=lambda k: k[0]):
        rows[s].append(action)
    return rows


def _feasible(problem: Problem, schedule: Schedule) -> bool:
    return simulate(problem, schedule.actions).feasible


def choose_schedule(
    name: str,
    problem: Problem,
    solver_backend: str = "auto",
    time_limit: float = 30.0,
    chunkings: Sequence[tuple[int, str]] | None = None,
) -> Schedule:
    """The schedule to run for ``problem``; feasible by the simulator, or ``NoScheduleError``.
    ``chunkings``: the (chunk count, placement) pairs the solver may choose from (the ones the
    executor can run, ``partition.runnable_chunkings``; None: the solver's default)."""
    if name != "optimal":
        if name not in BASELINE_NAMES:
            raise NoScheduleError(
                f"unknown schedule {name!r}; one of {', '.join(SCHEDULE_CHOICES)}"
            )
        try:
            sched = generate(name, problem)
        except NotApplicable as e:
            raise NoScheduleError(f"schedule {name!r} does not apply: {e}") from e
        if not _feasible(problem, sched):
            ev = simulate(problem, sched.actions).evaluation
            why = "; ".join(v.message for v in ev.violations[:2])
            raise NoScheduleError(
                f"schedule {name!r} does not fit this pipeline: {why}; raise memory_limit, "
                "allow offload, use more microbatches/stages or schedule='optimal'"
            )
        return sched
    best: Schedule | None = None
    best_span = float("inf")
    try:
        from ...solver import InfeasibleMemoryLimit, solve
    except ImportError:  # the solver is optional at run time: the best baseline is used
        pass
    else:
        try:
            res = solve(problem, backend=solver_backend, time_limit=time_limit, chunkings=chunkings)
            # a schedule for another chunking is checked on the problem it embeds (the
            # re-chunking it was made for), not on this one's shape
            target = res.schedule.problem if res.schedule.problem is not None else problem
            if _feasible(target, res.schedule):
                best = res.schedule
                best_span = float(simulate(target, res.schedule.actions).makespan or best_span)
        except InfeasibleMemoryLimit as e:
            raise NoScheduleError(
                f"no schedule fits the memory limit: {e}; raise memory_limit"
                + ("" if problem.offload else " or enable offload")
            ) from e
        except Exception as e:  # the solver failing must not stop training: fall back
            log.warning("optpipe: solver failed (%s); using the best baseline", e)
    base, span = _fastest_baseline(problem)
    if base is not None and span < best_span - 1e-12:
        best = base
    if best is None:
        raise _nothing_fits(problem)
    return best


def best_baseline(problem: Problem) -> Schedule:
    """The fastest feasible baseline (what runs while the background solver works)."""
    best, _ = _fastest_baseline(problem)
    if best is None:
        raise _nothing_fits(problem)
    return best


def _fastest_baseline(problem: Problem) -> tuple[Schedule | None, float]:
    best: Schedule | None = None
    span = float("inf")
    for name in BASELINE_NAMES:
        try:
            sched = generate(name, problem)
        except (NotApplicable, ImportError, KeyError):
            continue
        except Exception as e:  # a broken generator must not stop training
            log.debug("optpipe: baseline %s failed: %s", name, e)
            continue
        res = simulate(problem, sched.actions)
        if res.feasible and (res.makespan or float("inf")) < span - 1e-12:
            best, span = sched, float(res.makespan or float("inf"))
    return best, span


def _nothing_fits(problem: Problem) -> NoScheduleError:
    return NoScheduleError(
        f"no schedule fits the memory limit {problem.memory_limits()} bytes per stage for "
        f"{problem.num_microbatches} microbatches on {problem.num_stages} stages"
        + ("" if problem.offload else " (offload is off)")
        + "; raise memory_limit, enable offload, or use more stages"
    )
