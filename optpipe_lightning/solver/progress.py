"""A Rich live display of a running solve, usable as the ``on_incumbent`` callback.

    with RichSolveProgress(problem, time_limit) as cb:
        result = solve(problem, time_limit=time_limit, on_incumbent=cb)

Shows elapsed time (against the limit), best makespan, bound, gap and the incumbent count; it
refreshes on its own between incumbents, so the clock keeps moving while the solver works.
"""

from __future__ import annotations

import threading
import time
from types import TracebackType

from rich.console import Console
from rich.live import Live
from rich.table import Table

from ..schedule.problem import Problem
from .results import Incumbent, SolveResult


class RichSolveProgress:
    """Callable progress display: call it with every ``Incumbent``."""

    def __init__(self, problem: Problem, time_limit: float, console: Console | None = None) -> None:
        self.problem = problem
        self.time_limit = time_limit
        self.console = console or Console(stderr=True)
        self._lock = threading.Lock()
        self._t0 = time.perf_counter()
        self.best: Incumbent | None = None
        self.count = 0
        self._live: Live | None = None

    def __call__(self, inc: Incumbent) -> None:
        with self._lock:
            self.count += 1
            if self.best is None or inc.makespan <= self.best.makespan:
                self.best = inc
            elif inc.bound is not None and self.best is not None:
                self.best = Incumbent(
                    self.best.wall_time,
                    self.best.makespan,
                    max(self.best.bound or 0.0, inc.bound),
                    self.best.source,
                )
        if self._live is not None:
            self._live.update(self.render())

    def finish(self, result: SolveResult) -> None:
        """Show the final answer (its proven bound may be newer than the last incumbent)."""
        with self._lock:
            self.best = Incumbent(
                result.first_solution_seconds if self.best is None else self.best.wall_time,
                result.makespan,
                result.lower_bound,
                result.status if self.best is None else f"{self.best.source} ({result.status})",
            )
        if self._live is not None:
            self._live.update(self.render())

    def render(self) -> Table:
        """The table shown (also usable without a live display)."""
        pb = self.problem
        title = f"optpipe solve: {pb.num_stages} stages x {pb.num_microbatches} microbatches" + (
            f" x {pb.num_chunks} chunks" if pb.num_chunks > 1 else ""
        )
        t = Table(title=title, show_header=True, header_style="bold")
        for col in ("elapsed", "best makespan", "bound", "gap", "incumbents", "found by"):
            t.add_column(col, justify="right")
        elapsed = time.perf_counter() - self._t0
        with self._lock:
            best, count = self.best, self.count
        if best is None:
            t.add_row(f"{elapsed:.1f}s / {self.time_limit:g}s", "-", "-", "-", "0", "-")
            return t
        bound = best.bound
        gap = (
            (best.makespan - bound) / best.makespan if bound is not None and best.makespan else None
        )
        t.add_row(
            f"{elapsed:.1f}s / {self.time_limit:g}s",
            f"{best.makespan:.6g} s",
            "-" if bound is None else f"{bound:.6g} s",
            "-" if gap is None else f"{100 * max(gap, 0.0):.2f}%",
            str(count),
            best.source,
        )
        return t

    def __enter__(self) -> RichSolveProgress:
        self._t0 = time.perf_counter()
        self._live = Live(
            self.render(), console=self.console, refresh_per_second=4, get_renderable=self.render
        )
        self._live.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._live is not None:
            self._live.update(self.render())
            self._live.__exit__(exc_type, exc, tb)
            self._live = None
