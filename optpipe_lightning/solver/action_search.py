"""A local search over a schedule's action lists, judged by the one simulator (issue 32).

The baselines and list rules decide offload with one rule for every stage (PipeOffload: the first
``k`` chunks of every microbatch on every stage; AdaOffload: whatever removes the excess), and put
each copy where their rule says. This search starts from the best schedule found (usually a
baseline) and changes it where that pays, each change kept only when the simulator times the
whole schedule faster (or as fast with less work left waiting: ``_key``) within the memory limit:

1. Per-stage offload counts (coarse, first): drop every offload of one stage, last stages
   first (they hold the fewest activations, and a copy they do not make frees the copy lane
   they share with their neighbour); kept when it is no slower and fits.
2. Moves aimed at the makespan's critical chain (``CRITICAL_SHARE`` of the candidates then; the
   chain from the simulator's timeline: ``action_moves.critical_chain``): ``defer`` moves one to
   three compute ops (mostly W's) of a run of the chain on one stage past the run's end, so the
   run no longer waits for them; ``advance`` moves the op behind one of the chain's waits (a
   dependency on another stage, a reload, the offload a forward waited for, a transfer ahead on
   the copy lane) one to three compute ops earlier, or drops that copy's offload. Kept when no
   slower (``PLATEAU``): where two chains are tied, the first move times the same and the
   second gains. On bench_peer's problems 2, 7 and 9 these found nearly every gain from the
   starts ``solve`` hands the search, where the single moves had stopped at local optima
   (issue 32, BENCHMARKS.md).
3. Single moves (the rest, random, seeded): drop every offload of one chunk on one stage (kept
   when no slower); drop one activation's offload; issue one RELOAD earlier or later (one to
   three compute ops), or one OFFLOAD later; add an offload to an activation not offloaded
   (OFFLOAD right after its F, RELOAD two compute ops before its B); swap two adjacent compute
   ops of a stage (orders around the shared copy lanes). Moves on the stage that ends last (the
   one the makespan waits on) and its neighbours are drawn more often.

Measured and not kept (issue 32): an iterated local search (from the best, a kick of two to
four random moves, the neighbourhoods until 100 candidates in a row changed nothing, the best
kept) and swapping which microbatch of a chunk a stage offloads: neither found a gain on
problems 2 and 7 at the same number of candidates (two seeds each).

Every candidate is a whole schedule simulated from scratch, so the search is cheap to trust and
slow to converge: it runs until its deadline and reports each improvement as it finds it. Almost
no candidate here fits without the simulator's memory wait, and the simulator stops that first
timing as soon as it is certainly over the limit (``schedule.sim_overlimit``): 20-30 candidates
per second at 16 stages x 32 microbatches x 4 chunks (12-15 before), 5.4 at 32 x 64 x 4 (4.0),
on a loaded 2-core machine; ``solve`` reports its count in ``params["candidates"]``.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence

from ..schedule.problem import Problem
from ..schedule.schedule import Action, Schedule
from ..schedule.simulator import SimResult, simulate
from .action_moves import (
    Chain,
    add_offload,
    advance,
    critical_chain,
    defer,
    drop,
    move,
    swap_compute,
)

Rows = list[list[Action]]
Key = tuple[float, float]
# relative makespan change that counts as equal
_REL = 1e-9
# the search ends after this many candidates in a row without a change kept
PATIENCE = 600
# the share of the neighbourhoods' candidates that aim at the critical chain (``defer``,
# ``advance``)
CRITICAL_SHARE = 0.9
# the critical moves are kept when no slower (a run tied with another chain shortens only when
# both do: the first of two such moves times the same)
PLATEAU = True


def _key(res: SimResult) -> Key | None:
    """(makespan, sum of the stages' last ends) of a feasible result; None otherwise. The second
    part rewards a change that lets stages other than the last finish earlier (a step towards
    a faster schedule that the makespan alone does not see)."""
    if not res.feasible or res.makespan is None or res.timeline is None:
        return None
    ends = sum(float(e.max()) if len(e) else 0.0 for e in res.timeline.end)
    return (res.makespan, ends)


def _better(a: Key, b: Key) -> bool:
    if a[0] < b[0] * (1 - _REL):
        return True
    return a[0] <= b[0] * (1 + _REL) and a[1] < b[1] * (1 - _REL)


def _no_worse(a: Key, b: Key) -> bool:
    return a[0] <= b[0] * (1 + _REL)


class _Search:
    def __init__(
        self,
        problem: Problem,
        rows: Rows,
        res: SimResult,
        on_better: Callable[[Rows, SimResult], object],
        keep_going: Callable[[], bool],
        seed: int,
    ) -> None:
        self.pb = problem
        self.rows = rows
        self.res = res
        key = _key(res)
        assert key is not None
        self.key = key
        self.on_better = on_better
        self.keep_going = keep_going
        self.rng = random.Random(seed)
        self.tried = 0
        self.kept = 0
        self.last_kept = 0  # ``tried`` when the last change was kept
        self._chain: Chain | None = None  # of ``rows``, made when a move asks for it

    def chain(self) -> Chain | None:
        if self._chain is None and self.res.timeline is not None:
            self._chain = critical_chain(self.pb, self.rows, self.res.timeline)
        return self._chain

    def _try(self, cand: Rows | None, plateau: bool = False) -> bool:
        """Simulate ``cand``; keep it when better (or, with ``plateau``, no slower)."""
        if cand is None:
            return False
        self.tried += 1
        res = simulate(self.pb, cand)
        key = _key(res)
        if key is None:
            return False
        improved = _better(key, self.key)
        if not improved and not (plateau and _no_worse(key, self.key)):
            return False
        faster = key[0] < self.key[0] * (1 - _REL)
        self.rows, self.res, self.key, self._chain = cand, res, key, None
        self.kept += 1
        if improved:  # (a walk on a plateau does not reset the patience)
            self.last_kept = self.tried
        if faster:
            self.on_better(cand, res)
        return True

    def offload_counts(self) -> None:
        """The coarse first step (module doc): per stage, last first, drop all its offloads."""
        for s in reversed(range(self.pb.num_stages)):
            if not self.keep_going():
                return
            keys = {(a.mb, a.chunk) for a in self.rows[s] if a.op == "OFFLOAD"}
            if keys:
                self._try(drop(self.rows, s, keys), plateau=True)

    def _stage(self) -> int:
        """A stage to change: half the time the one that ends last or a neighbour of it."""
        p = self.pb.num_stages
        tl = self.res.timeline
        if tl is not None and self.rng.random() < 0.5:
            last = max(range(p), key=lambda s: float(tl.end[s].max()) if len(tl.end[s]) else 0.0)
            return min(p - 1, max(0, last + self.rng.choice((-1, 0, 0, 1))))
        return self.rng.randrange(p)

    def neighbours(self, patience: int) -> None:
        """Neighbourhood 2 (module doc), until ``keep_going`` says no or ``patience`` candidates
        in a row changed nothing."""
        rng = self.rng
        while self.keep_going() and self.tried - self.last_kept <= patience:
            kind = rng.random()
            if kind < CRITICAL_SHARE:
                chain = self.chain()
                if chain is not None:
                    if rng.random() < 0.6:
                        self._try(defer(self.rows, chain, rng), plateau=PLATEAU)
                    else:
                        self._try(advance(self.rows, chain, rng), plateau=PLATEAU)
                continue
            kind = (kind - CRITICAL_SHARE) / (1 - CRITICAL_SHARE)
            s = self._stage()
            row = self.rows[s]
            if not row:
                continue
            copies = [i for i, a in enumerate(row) if not a.is_compute]
            if kind < 0.1 and copies:
                c = row[rng.choice(copies)].chunk
                keys = {(a.mb, a.chunk) for a in row if a.op == "OFFLOAD" and a.chunk == c}
                self._try(drop(self.rows, s, keys), plateau=True)
            elif kind < 0.25 and copies:
                a = row[rng.choice(copies)]
                self._try(drop(self.rows, s, {(a.mb, a.chunk)}))
            elif kind < 0.5 and copies:
                reloads = [i for i in copies if row[i].op == "RELOAD"] or copies
                i = rng.choice(reloads)
                steps = rng.choice((-3, -2, -1, -1, 1)) if row[i].op == "RELOAD" else 1
                self._try(move(self.rows, s, i, steps))
            elif kind < 0.6:
                offloaded = {(a.mb, a.chunk) for a in row if a.op == "OFFLOAD"}
                fs = [a for a in row if a.op == "F" and (a.mb, a.chunk) not in offloaded]
                if fs and self.pb.offload is not None:
                    a = rng.choice(fs)
                    self._try(add_offload(self.rows, s, a.mb, a.chunk))
            else:
                self._try(swap_compute(self.rows, s, rng.randrange(len(row))))


def improve(
    problem: Problem,
    start: Schedule | Sequence[Sequence[Action]],
    *,
    deadline: float | None = None,
    max_tries: int | None = None,
    patience: int = PATIENCE,
    on_better: Callable[[Rows, SimResult], object] | None = None,
    seed: int = 0,
    stop: threading.Event | None = None,
) -> tuple[Rows, SimResult, int]:
    """The search (module doc) from ``start`` (a schedule that fits), until ``deadline``
    (``time.perf_counter()``), ``max_tries`` simulations, ``patience`` simulations in a row
    without a faster (or as fast, less waiting: ``_key``) schedule (both deterministic, whatever
    the machine) or ``stop``.
    Returns the best rows, their simulation, and the number of candidates simulated; each faster
    one found on the way goes to ``on_better``. A start that does not fit is returned as is."""
    rows = [list(r) for r in (start.actions if isinstance(start, Schedule) else start)]
    res = simulate(problem, rows)
    if _key(res) is None:
        return rows, res, 0
    search: _Search

    def keep_going() -> bool:
        if stop is not None and stop.is_set():
            return False
        if max_tries is not None and search.tried >= max_tries:
            return False
        return deadline is None or time.perf_counter() < deadline

    search = _Search(problem, rows, res, on_better or (lambda r, x: None), keep_going, seed)
    search.offload_counts()
    search.neighbours(patience)
    return search.rows, search.res, search.tried
