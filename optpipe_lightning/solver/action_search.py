"""A local search over a schedule's action lists, judged by the one simulator (issue 32).

The baselines and list rules decide offload with one rule for every stage (PipeOffload: the first
``k`` chunks of every microbatch on every stage; AdaOffload: whatever removes the excess), and put
each copy where their rule says. This search starts from the best schedule found (usually a
baseline) and changes it where that pays, each change kept only when the simulator times the
whole schedule faster (or as fast with less work left waiting: ``_key``) within the memory limit:

1. Per-stage offload counts (coarse, first): drop every offload of one chunk on one stage, last
   stages and last chunks first (they hold the fewest activations, and a copy they do not make
   frees the copy lane they share with their neighbour); kept when it is no slower and fits.
2. Neighbourhoods (then, random, seeded): drop one activation's offload; issue one RELOAD earlier
   or later (one to three compute ops), or one OFFLOAD later; add an offload to an activation not
   offloaded (OFFLOAD right after its F, RELOAD two compute ops before its B); swap two adjacent
   compute ops of a stage (orders around the shared copy lanes). Moves on the stage that ends
   last (the one the makespan waits on) and its neighbours are drawn more often.

Every candidate is a whole schedule simulated from scratch, so the search is cheap to trust and
slow to converge: it runs until its deadline and reports each improvement as it finds it. Almost
no candidate here fits without the simulator's memory wait, and the simulator stops that first
timing as soon as it is certainly over the limit (``schedule.sim_overlimit``): 20-25 candidates
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

Rows = list[list[Action]]
Key = tuple[float, float]
# relative makespan change that counts as equal
_REL = 1e-9
# the search ends after this many candidates in a row without a change kept
PATIENCE = 300


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


def _drop(rows: Rows, s: int, keys: set[tuple[int, int]]) -> Rows | None:
    """Rows with stage ``s``'s OFFLOAD and RELOAD of the (mb, chunk) ``keys`` removed."""
    row = [a for a in rows[s] if not (a.op in ("OFFLOAD", "RELOAD") and (a.mb, a.chunk) in keys)]
    if len(row) == len(rows[s]):
        return None
    out = list(rows)
    out[s] = row
    return out


def _move(rows: Rows, s: int, i: int, steps: int) -> Rows | None:
    """Rows with stage ``s``'s action ``i`` moved past ``steps`` compute ops (negative: earlier)."""
    row = list(rows[s])
    a = row.pop(i)
    j = i
    k = abs(steps)
    if steps < 0:
        while k and j > 0:
            j -= 1
            if row[j].is_compute:
                k -= 1
    else:
        while k and j < len(row):
            if row[j].is_compute:
                k -= 1
            j += 1
    if j == i:
        return None
    row.insert(j, a)
    out = list(rows)
    out[s] = row
    return out


def _swap_compute(rows: Rows, s: int, i: int) -> Rows | None:
    """Rows with stage ``s``'s compute op ``i`` and the next compute op swapped."""
    row = list(rows[s])
    if not row[i].is_compute:
        return None
    j = i + 1
    while j < len(row) and not row[j].is_compute:
        j += 1
    if j >= len(row) or (row[i].mb, row[i].chunk) == (row[j].mb, row[j].chunk):
        return None
    row[i], row[j] = row[j], row[i]
    out = list(rows)
    out[s] = row
    return out


def _add_offload(rows: Rows, s: int, mb: int, chunk: int) -> Rows | None:
    """Rows with (mb, chunk) offloaded on stage ``s``: OFFLOAD right after its F, RELOAD two
    compute ops before its B (or BW)."""
    row = list(rows[s])
    f = next((i for i, a in enumerate(row) if a.op == "F" and (a.mb, a.chunk) == (mb, chunk)), None)
    b = next(
        (i for i, a in enumerate(row) if a.op in ("B", "BW") and (a.mb, a.chunk) == (mb, chunk)),
        None,
    )
    if f is None or b is None or b <= f + 1:
        return None
    row.insert(f + 1, Action("OFFLOAD", mb, chunk))
    b += 1
    j, k = b, 2
    while k and j > f + 2:
        j -= 1
        if row[j].is_compute:
            k -= 1
    row.insert(max(j, f + 2), Action("RELOAD", mb, chunk))
    out = list(rows)
    out[s] = row
    return out


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
        self.rows, self.res, self.key = cand, res, key
        self.kept += 1
        self.last_kept = self.tried
        if faster:
            self.on_better(cand, res)
        return True

    def offload_counts(self) -> None:
        """Neighbourhood 1 (module doc): per stage and chunk, drop all its offloads."""
        p, v = self.pb.num_stages, self.pb.num_chunks
        for s in reversed(range(p)):
            for c in reversed(range(v)):
                if not self.keep_going():
                    return
                keys = {(a.mb, a.chunk) for a in self.rows[s] if a.op == "OFFLOAD" and a.chunk == c}
                if keys:
                    self._try(_drop(self.rows, s, keys), plateau=True)

    def _stage(self) -> int:
        """A stage to change: half the time the one that ends last or a neighbour of it."""
        p = self.pb.num_stages
        tl = self.res.timeline
        if tl is not None and self.rng.random() < 0.5:
            last = max(range(p), key=lambda s: float(tl.end[s].max()) if len(tl.end[s]) else 0.0)
            return min(p - 1, max(0, last + self.rng.choice((-1, 0, 0, 1))))
        return self.rng.randrange(p)

    def neighbours(self) -> None:
        """Neighbourhood 2 (module doc), until ``keep_going`` says no."""
        rng = self.rng
        while self.keep_going():
            s = self._stage()
            row = self.rows[s]
            if not row:
                continue
            kind = rng.random()
            copies = [i for i, a in enumerate(row) if not a.is_compute]
            if kind < 0.15 and copies:
                a = row[rng.choice(copies)]
                self._try(_drop(self.rows, s, {(a.mb, a.chunk)}))
            elif kind < 0.5 and copies:
                reloads = [i for i in copies if row[i].op == "RELOAD"] or copies
                i = rng.choice(reloads)
                steps = rng.choice((-3, -2, -1, -1, 1)) if row[i].op == "RELOAD" else 1
                self._try(_move(self.rows, s, i, steps))
            elif kind < 0.6:
                offloaded = {(a.mb, a.chunk) for a in row if a.op == "OFFLOAD"}
                fs = [a for a in row if a.op == "F" and (a.mb, a.chunk) not in offloaded]
                if fs and self.pb.offload is not None:
                    a = rng.choice(fs)
                    self._try(_add_offload(self.rows, s, a.mb, a.chunk))
            else:
                self._try(_swap_compute(self.rows, s, rng.randrange(len(row))))


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
    without a change kept (both deterministic, whatever the machine) or ``stop``.
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
        if search.tried - search.last_kept > patience:
            return False  # a local optimum, as far as the draws tell
        return deadline is None or time.perf_counter() < deadline

    search = _Search(problem, rows, res, on_better or (lambda r, x: None), keep_going, seed)
    search.offload_counts()
    search.neighbours()
    return search.rows, search.res, search.tried
