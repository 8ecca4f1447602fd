"""Online re-solve: the solver runs in a background process; better schedules switch in.

Global rank 0 starts ``BackgroundSolver`` (a ``spawn`` process running
``optpipe_lightning.solver.solve`` with an incumbent callback). Each incumbent comes back as
schedule JSON through a queue. At every optimizer-step boundary, rank 0 drains the queue, keeps the
best incumbent that the simulator finds feasible on the problem and that beats the running
schedule by ``min_gain`` (relative makespan), and broadcasts a decision to all ranks
(``SwitchDecision``); every rank then switches before the next step. So all ranks change schedule
at the same optimizer-step boundary, and a schedule that fails the simulator never reaches the
executor. When the strategy calibrates the costs from the running schedule
(``calibration.py``), ``update_problem`` makes the solver judge incumbents on the calibrated
problem.

``OnlineResolve`` is the strategy's side, the same on every rank: ``start`` (rank 0 starts the
solver, every rank learns whether it runs), ``poll`` at each optimizer-step boundary (rank 0's
decision, broadcast), ``on_calibrated`` (the solver judges incumbents on the calibrated costs; a
solver that has finished solves again when the costs moved by more than ``RESOLVE_DRIFT`` from
the ones it solved, at most ``MAX_CALIBRATED_RESOLVES`` times per run) and ``stop``.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import queue
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..schedule import Action, Problem, Schedule, simulate
from .calibration import max_cost_change
from .process_groups import PipelineComm

log = logging.getLogger(__name__)

RESOLVE_DRIFT = 0.10  # calibrated costs this far from the solved ones start a new solve
MAX_CALIBRATED_RESOLVES = 2


def _solver_main(problem_json: str, backend: str, time_limit: float, out: Any) -> None:
    """Child process: one solve; every improved incumbent's schedule goes to the parent as JSON
    the moment the solver finds it, then ``done``."""
    try:
        from ..solver import Incumbent, solve

        problem = Problem.model_validate_json(problem_json)

        def send(inc: Incumbent) -> None:
            if inc.schedule is not None:
                out.put(("incumbent", inc.schedule.to_json()))

        solve(problem, backend=backend, time_limit=time_limit, on_incumbent=send)
    except Exception as e:  # reported to the parent, never raised into training
        out.put(("error", f"{type(e).__name__}: {e}"))
    finally:
        out.put(("done", ""))


@dataclass
class SwitchDecision:
    """What rank 0 tells every rank at a step boundary."""

    kind: str  # "none" | "switch" | "done"
    schedule_json: str = ""
    reason: str = ""


class BackgroundSolver:
    """The solver process and its incumbent queue (global rank 0 only)."""

    def __init__(
        self,
        problem: Problem,
        current_makespan: float,
        backend: str = "auto",
        time_limit: float = 60.0,
        min_gain: float = 0.01,
        start_method: str = "spawn",
    ) -> None:
        self.problem = problem
        self.best = current_makespan
        self.min_gain = min_gain
        self.done = False
        ctx: Any = mp.get_context(start_method)
        self.queue: Any = ctx.Queue()
        self.proc = ctx.Process(
            target=_solver_main,
            args=(problem.model_dump_json(), backend, time_limit, self.queue),
            daemon=True,
            name="optpipe-solver",
        )
        self.proc.start()

    def poll(self) -> SwitchDecision:
        """Drain the queue: the best new feasible incumbent, if it beats the running schedule."""
        pick: Schedule | None = None
        pick_span = self.best
        while True:
            try:
                kind, payload = self.queue.get_nowait()
            except queue.Empty:
                break
            if kind == "done":
                self.done = True
            elif kind == "error":
                log.warning("optpipe: background solver stopped: %s", payload)
            elif kind == "incumbent":
                try:
                    sched = Schedule.from_json(payload)
                    res = simulate(self.problem, sched.actions)
                except Exception as e:
                    log.warning("optpipe: solver incumbent rejected (%s)", e)
                    continue
                span = res.makespan
                if not res.feasible or span is None:
                    log.warning("optpipe: solver incumbent rejected by the simulator")
                    continue
                if span < pick_span * (1 - self.min_gain):
                    pick, pick_span = sched, span
        if pick is not None:
            reason = f"solver incumbent: predicted {pick_span:.6g}s vs {self.best:.6g}s"
            self.best = pick_span
            return SwitchDecision("switch", pick.to_json(), reason)
        if self.done:
            return SwitchDecision("done")
        return SwitchDecision("none")

    def update_problem(self, problem: Problem, current: Sequence[Sequence[Action]]) -> None:
        """Judge incumbents on ``problem`` from now on (calibrated costs, same shape); the bar
        they must beat becomes the running schedule's makespan on it."""
        self.problem = problem
        span = simulate(problem, current).makespan
        if span is not None:
            self.best = float(span)

    def stop(self) -> None:
        if self.proc.is_alive():
            self.proc.terminate()
        self.proc.join(timeout=5)
        self.done = True


class OnlineResolve:
    """The background solver seen from the training loop (every rank holds one)."""

    def __init__(
        self,
        comm: PipelineComm,
        backend: str = "auto",
        time_limit: float = 30.0,
        min_gain: float = 0.01,
        start_method: str = "spawn",
        on_message: Any = None,
    ) -> None:
        self.comm = comm
        self.backend = backend
        self.time_limit = time_limit
        self.min_gain = min_gain
        self.start_method = start_method
        self.solver: BackgroundSolver | None = None  # global rank 0 only
        self.active = False  # a solve runs (the same on every rank)
        self.solved_problem: Problem | None = None  # what the solver last solved
        self.calibrated_resolves = 0
        self._message = on_message or (lambda text: log.info("%s", text))

    def start(self, problem: Problem, current: Schedule) -> None:
        """Start solving ``problem`` (rank 0); ``current`` is what an incumbent must beat."""
        self.solved_problem = problem
        ok = False
        if self.comm.is_global_zero:
            try:
                import optpipe_lightning.solver as solver_mod

                if hasattr(solver_mod, "solve"):
                    span = simulate(problem, current.actions).makespan or float("inf")
                    self.solver = BackgroundSolver(
                        problem,
                        span,
                        self.backend,
                        self.time_limit,
                        min_gain=self.min_gain,
                        start_method=self.start_method,
                    )
                    ok = True
            except Exception as e:
                log.warning("optpipe: online re-solve unavailable (%s)", e)
        self.active = bool(self.comm.broadcast(ok))

    def poll(self) -> SwitchDecision:
        """Rank 0's decision at this boundary, on every rank (a collective while active)."""
        if not self.active:
            return SwitchDecision("none")
        decision = self.solver.poll() if self.solver is not None else SwitchDecision("none")
        decision = self.comm.broadcast(decision)
        if decision.kind == "done":
            self.active = False
        return decision

    def on_calibrated(self, problem: Problem, current: Schedule) -> None:
        """The costs were calibrated: judge incumbents on them, or solve again when they moved."""
        if self.solver is not None:
            self.solver.update_problem(problem, current.actions)
        if (
            not self.active
            and self.solved_problem is not None
            and self.calibrated_resolves < MAX_CALIBRATED_RESOLVES
            and max_cost_change(self.solved_problem, problem) > RESOLVE_DRIFT
        ):
            self.calibrated_resolves += 1
            self.stop()
            self._message(f"optpipe: costs moved > {round(100 * RESOLVE_DRIFT)}%: solving again")
            self.start(problem, current)

    def stop(self) -> None:
        if self.solver is not None:
            self.solver.stop()
            self.solver = None
