"""Needless offloads dropped from the answer, at no cost in makespan.

The rules that build most answers offload by one count on every stage (PipeOffload: the first
``k`` chunks of every microbatch everywhere), and the searches keep a change only when it is
faster, so an answer can carry copies that buy nothing: a stage whose activations fit anyway,
or a margin met with room to spare (a 5% margin answered with 192 offloads where a few on the
first two stages fit). The simulator does not charge a copy that runs beside compute, but a
real one takes PCIe and host memory, and on a GPU it slows the compute it overlaps. So before
``solve`` answers, the offloads of one (stage, chunk) at a time are dropped -- last stages
first, which hold the fewest activations -- then, where a (stage, chunk) still needs some, the
later half of them and so on down to single microbatches, each drop kept only when the one
simulator finds the schedule within the memory limit and no slower. A bounded number of
simulations, deterministic, stopped by a deadline.
"""

from __future__ import annotations

import time

from ..schedule.baselines import make_schedule
from ..schedule.schedule import Action, Schedule
from ..schedule.simulator import simulate
from .action_moves import drop

Rows = list[list[Action]]
# the most simulations ``solve`` spends on it: every (stage, chunk) dropped whole, plus a few
# halvings where some must stay (``solve`` also stops it at its time limit)
TRIM_TRIES = 400


def trim_offloads(
    schedule: Schedule, deadline: float | None = None, max_tries: int | None = None
) -> tuple[Schedule, int]:
    """``schedule`` with the offloads dropped that cost nothing to drop (module doc), and how
    many were dropped (0: ``schedule`` itself is returned)."""
    pb = schedule.problem
    ev = schedule.evaluation
    if pb is None or pb.offload is None or ev is None or not ev.feasible or ev.makespan is None:
        return schedule, 0
    rows: Rows = [list(r) for r in schedule.actions]
    if not any(a.op == "OFFLOAD" for r in rows for a in r):
        return schedule, 0
    limit = ev.makespan  # never slower, not even by rounding: compare's rows promise it
    tries = 0

    def more() -> bool:
        if max_tries is not None and tries >= max_tries:
            return False
        return deadline is None or time.perf_counter() < deadline

    def kept(cand: Rows) -> bool:
        nonlocal tries
        tries += 1
        res = simulate(pb, cand)
        return res.feasible and res.makespan is not None and res.makespan <= limit

    dropped = 0
    for s in reversed(range(pb.num_stages)):
        for c in reversed(range(pb.num_chunks)):
            todo = sorted({a.mb for a in rows[s] if a.op == "OFFLOAD" and a.chunk == c})
            # all of them, then the later half of what is left, a quarter, ... one microbatch
            size = len(todo)
            while todo and size >= 1 and more():
                part = todo[-size:]
                cand = drop(rows, s, {(mb, c) for mb in part})
                if cand is not None and kept(cand):
                    rows, dropped = cand, dropped + len(part)
                    todo = todo[: len(todo) - len(part)]
                    size = min(size, len(todo))
                else:
                    size //= 2
    if not dropped:
        return schedule, 0
    return make_schedule(pb, schedule.generator, rows, dict(schedule.params)), dropped
