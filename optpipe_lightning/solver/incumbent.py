"""The time budget of one solve and its incumbent (the best simulator-checked schedule so far).

One ``Best`` per chunking the solve searches (its schedules are all for that chunking's problem,
so they hint its backend) reports to the solve's overall ``Best`` (its ``parent``), which streams
every improvement to the caller. Among schedules of equal makespan the one with the lowest peak
memory wins (``peak_score``): equally fast, more headroom.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ..schedule.chunking import stamped
from ..schedule.margin import peak_share as peak_score
from ..schedule.problem import Problem
from ..schedule.schedule import Evaluation, Schedule
from .results import Incumbent

_REL = 1e-9
# peaks that differ by less than this share of the limit count as equal
_PEAK_REL = 1e-9


class Budget:
    """The deadline of one solve, how long one simulation takes, and where the time went."""

    def __init__(self, t0: float, time_limit: float) -> None:
        self.t0 = t0
        self.limit = time_limit
        self.end = t0 + time_limit
        self.sim_seconds = 0.0  # the longest simulation (or hint conversion) measured
        # seconds of each heuristic rule that made a schedule (a list scheduling and one
        # simulation: an upper bound of one simulation before one is measured)
        self.rule_seconds: list[float] = []
        self.phase_seconds: dict[str, float] = {}
        # schedules simulated by the search phases that count them (``params["candidates"]``)
        self.candidates: dict[str, int] = {}
        self.skipped: list[str] = []

    def now(self) -> float:
        return time.perf_counter()

    def at(self, share: float) -> float:
        """The moment ``share`` of the time limit has passed."""
        return self.t0 + share * self.limit

    def left(self, until: float | None = None) -> float:
        return (self.end if until is None else until) - time.perf_counter()

    def saw_simulation(self, seconds: float) -> None:
        self.sim_seconds = max(self.sim_seconds, seconds)

    def skip(self, what: str) -> None:
        self.skipped.append(what)

    def add(self, name: str, seconds: float) -> None:
        self.phase_seconds[name] = self.phase_seconds.get(name, 0.0) + seconds

    def count(self, name: str, candidates: int) -> None:
        """``candidates`` more schedules simulated in phase ``name``."""
        self.candidates[name] = self.candidates.get(name, 0) + candidates

    def candidate_rates(self) -> dict[str, dict[str, float]]:
        """Per counting phase: candidates simulated and candidates per second of the phase."""
        out: dict[str, dict[str, float]] = {}
        for name, n in self.candidates.items():
            secs = self.phase_seconds.get(name, 0.0)
            out[name] = {"candidates": n, "per_second": round(n / secs, 2) if secs > 0 else 0.0}
        return out

    def rest(self) -> Budget:
        """A budget from now to the same end that books its phases and skips here (the shares
        of its phases count from now)."""
        sub = Budget(time.perf_counter(), max(0.0, self.end - time.perf_counter()))
        sub.end = self.end
        sub.sim_seconds = self.sim_seconds
        sub.rule_seconds = self.rule_seconds
        sub.phase_seconds = self.phase_seconds
        sub.candidates = self.candidates
        sub.skipped = self.skipped
        return sub

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - t)


class Best:
    """The incumbent: best simulator-checked schedule so far, and the stream of improvements.

    A schedule is better when it is faster (by more than a relative 1e-9), or equally fast with a
    lower ``peak_score``. With a ``parent`` every schedule offered here is offered there too (each
    stamped with this problem: embedded, its chunking recorded).
    """

    def __init__(
        self,
        problem: Problem,
        t0: float,
        cb: Callable[[Incumbent], None] | None,
        lb: float,
        parent: Best | None = None,
    ) -> None:
        self.pb = problem
        self.t0 = t0
        self.cb = cb
        self.parent = parent
        self.lock = threading.Lock()
        self.schedule: Schedule | None = None
        self.makespan = float("inf")
        self.peak = float("inf")
        self.source = ""
        self.bound = lb
        self.incumbents: list[Incumbent] = []
        # the overall incumbent also keeps the schedules near its makespan (``robust``)
        self.near: list[Schedule] = []

    def better(self, ev: Evaluation) -> bool:
        """Whether a feasible evaluation beats the incumbent (faster, or as fast and lower)."""
        assert ev.makespan is not None
        if ev.makespan < self.makespan * (1 - _REL) - 1e-12:
            return True
        if ev.makespan > self.makespan * (1 + _REL) + 1e-12:
            return False
        return peak_score(ev) < self.peak * (1 - _PEAK_REL)

    def offer(self, sched: Schedule | None, source: str) -> bool:
        if sched is None or sched.evaluation is None:
            return False
        ev = sched.evaluation
        if not ev.feasible or ev.makespan is None:
            return False
        if self.parent is not None:
            sched = stamped(sched, self.pb)
        with self.lock:
            if self.parent is None:
                self._keep_near(sched, ev.makespan)
            if not self.better(ev):
                return False
            self.schedule = sched
            self.makespan = ev.makespan
            self.peak = peak_score(ev)
            self.source = source
            inc = Incumbent(
                wall_time=time.perf_counter() - self.t0,
                makespan=ev.makespan,
                bound=self.bound,
                source=source,
            )
            self.incumbents.append(inc)
        if self.parent is not None:
            self.parent.offer(sched, source)
        if self.cb is not None:
            self.cb(dataclasses.replace(inc, schedule=sched))
        return True

    def _keep_near(self, sched: Schedule, makespan: float) -> None:
        """Keep ``sched`` among the schedules within ``robust.NEAR_SHARE`` of the best makespan
        (at most ``robust.NEAR_MAX``, fastest first)."""
        from .robust import NEAR_MAX, NEAR_SHARE

        top = min(self.makespan, makespan) * (1 + NEAR_SHARE)
        if makespan > top:
            return

        def ms(s: Schedule) -> float:
            assert s.evaluation is not None and s.evaluation.makespan is not None
            return s.evaluation.makespan

        kept = [s for s in self.near if ms(s) <= top and s.actions != sched.actions]
        kept.append(sched)
        kept.sort(key=ms)
        self.near = kept[:NEAR_MAX]

    def raise_bound(self, b: float) -> None:
        with self.lock:
            self.bound = max(self.bound, b)

    def meets(self, gap_target: float) -> bool:
        """Whether the best schedule is within the gap target of the bound (or meets it)."""
        slack = max(gap_target * self.makespan, self.bound * 1e-9)
        return self.schedule is not None and self.makespan - self.bound <= slack
