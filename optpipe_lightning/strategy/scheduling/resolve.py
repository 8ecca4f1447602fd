"""Online re-solve: the solver runs in the background; better schedules switch in.

Global rank 0 starts ``BackgroundSolver``: a child process running
``optpipe_lightning.solver.solve`` at low priority (``nice`` 19) with the threads the machine can
spare (``spare_cores``: the cores this process may use, less the training processes on this host
times their torch threads; at least one). With ``start_method="spawn"`` (the default) the child
is a fresh interpreter running ``optpipe_lightning.solver.background``: it imports the solver
only, never torch, Lightning or the user's script. Each incumbent comes back as schedule JSON.

**When a solve starts** (``plan_solve``, global rank 0, every number logged): only when its
expected gain over the remaining steps exceeds its expected cost.

- gain = ``EXPECTED_GAP_CLOSED`` x (running schedule's makespan - the problem's lower bound)
  x pipeline steps per optimizer step x the optimizer steps left after the solve ends (the
  solver cannot beat the bound; we count on half the gap). Unknown remaining steps (no
  ``max_steps``/``max_epochs``) count as many.
- cost = the time training loses while the solver runs: the solve's seconds (``time_limit``
  plus ``SOLVER_START_SECONDS``) x the relative slowdown of a training step meanwhile. The
  slowdown is measured (``SlowdownMeter``: steps of one schedule overlapping a solve against
  steps of it that do not) once a solve has run; before that it is 0 when the solver has a
  core of its own and ``CONTENDED_SLOWDOWN`` when it must share the training's cores.
- and the gap must leave room for a switch at all (``min_gain`` of the makespan).

The first solve after profiling is planned the same way as the re-solves that calibration asks
for (calibrated costs more than ``RESOLVE_DRIFT`` from those of the last plan; at most
``MAX_CALIBRATED_RESOLVES`` of them start per run).

**Switching**: at every optimizer-step boundary while a solve runs, rank 0 drains the
incumbents, keeps the best one the simulator finds feasible that beats the running schedule by
``min_gain`` (relative makespan, on the calibrated costs when there are some), and posts its
decision as a one-number broadcast that no rank waits for (``_AsyncFlag``); every rank reads it
at the next boundary, and a switch then sends the schedule to all and all switch together. So
polling costs no synchronisation, and a switch comes one step after the incumbent.
"""

from __future__ import annotations

import json
import logging
import math
import multiprocessing as mp
import os
import queue
import signal
import statistics
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ...schedule import Action, Problem, Schedule, simulate
from ...schedule.bounds import lower_bound
from ..runtime.engine import ScheduleRejectedError, validate_for_execution
from ..runtime.fork_safety import inherited_objects_frozen
from ..runtime.process_groups import PipelineComm
from .calibration import max_cost_change

log = logging.getLogger(__name__)

RESOLVE_DRIFT = 0.10  # calibrated costs this far from the solved ones may start a new solve
MAX_CALIBRATED_RESOLVES = 2
EXPECTED_GAP_CLOSED = 0.5  # share of (makespan - lower bound) a solve is expected to win
SOLVER_START_SECONDS = 3.0  # a solver process's start (interpreter, OR-Tools import)
CONTENDED_SLOWDOWN = 0.25  # prior slowdown of training steps when the solver shares their cores
SOLVER_NICE = 19
MAX_SOLVER_WORKERS = 8

_NONE, _SWITCH, _DONE = 0, 1, 2


# ---- when a solve pays -------------------------------------------------------------------------


def spare_cores(training_processes: int, threads_per_process: int, cores: int | None = None) -> int:
    """Cores left over by the training processes of this host (never negative)."""
    if cores is None:
        try:
            cores = len(os.sched_getaffinity(0))
        except AttributeError:  # pragma: no cover - not Linux
            cores = os.cpu_count() or 1
    return max(0, cores - max(1, training_processes) * max(1, threads_per_process))


@dataclass(frozen=True)
class SolvePlan:
    """Whether a solve starts, and the numbers it was decided on (seconds)."""

    start: bool
    gain_seconds: float
    cost_seconds: float
    workers: int
    slowdown: float
    measured_slowdown: bool
    reason: str


def plan_solve(
    *,
    makespan: float,
    bound: float,
    pipeline_steps: int,
    step_seconds: float,
    remaining_steps: float,
    time_limit: float,
    spare: int,
    min_gain: float,
    slowdown: float | None = None,
) -> SolvePlan:
    """Start a solve only when its expected gain over the remaining steps exceeds its cost.

    ``makespan``: the running schedule's predicted pipeline step on the problem to solve;
    ``bound``: that problem's lower bound; ``step_seconds``: an optimizer step now (measured);
    ``slowdown``: measured relative slowdown of a step while a solve runs (None: the prior).
    """
    workers = max(1, min(spare, MAX_SOLVER_WORKERS))
    measured = slowdown is not None
    if slowdown is None:
        slowdown = 0.0 if spare >= 1 else CONTENDED_SLOWDOWN
    slowdown = max(0.0, slowdown)
    solve_seconds = time_limit + SOLVER_START_SECONDS
    step_seconds = max(step_seconds, 1e-9)
    overlapped = min(remaining_steps, solve_seconds / (step_seconds * (1.0 + slowdown)))
    cost = overlapped * step_seconds * slowdown
    gap = max(0.0, makespan - bound)
    per_step = EXPECTED_GAP_CLOSED * gap * max(1, pipeline_steps)
    after = max(0.0, remaining_steps - overlapped)
    gain = per_step * after if per_step > 0 else 0.0
    numbers = (
        f"expected gain {_fmt(gain)} s ({EXPECTED_GAP_CLOSED:g} x gap {1e3 * gap:.4g} ms to the "
        f"lower bound x {max(1, pipeline_steps)} x {_fmt(after)} steps after the solve) vs "
        f"cost {cost:.3g} s ({solve_seconds:g} s solve x {100 * slowdown:.3g}% "
        f"{'measured' if measured else 'assumed'} slowdown of {1e3 * step_seconds:.4g} ms "
        f"steps); {workers} solver thread(s), {spare} spare core(s)"
    )
    if gap <= min_gain * makespan:
        return SolvePlan(
            False, gain, cost, workers, slowdown, measured, f"no room to gain: {numbers}"
        )
    start = gain > cost
    return SolvePlan(start, gain, cost, workers, slowdown, measured, numbers)


def _fmt(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:.4g}"


@dataclass
class SlowdownMeter:
    """How much slower a step of a schedule runs while a solve runs (global rank 0's steps)."""

    window: int = 32
    steps: dict[str, tuple[deque[float], deque[float]]] = field(default_factory=dict)

    def note(self, schedule: str, seconds: float, overlapping: bool) -> None:
        free, busy = self.steps.setdefault(
            schedule, (deque(maxlen=self.window), deque(maxlen=self.window))
        )
        (busy if overlapping else free).append(float(seconds))

    def estimate(self, min_samples: int = 3) -> float | None:
        """median(steps during a solve) / median(steps without) - 1, over the schedules that
        have both (their median); None before there is any."""
        ratios = [
            statistics.median(busy) / statistics.median(free) - 1.0
            for free, busy in self.steps.values()
            if len(free) >= min_samples and len(busy) >= min_samples
        ]
        return max(0.0, statistics.median(ratios)) if ratios else None


@dataclass(frozen=True)
class RunContext:
    """What the plan needs to know of the run (global rank 0's view)."""

    step_seconds: float  # an optimizer step now
    remaining_steps: float  # optimizer steps left (inf: unknown)
    pipeline_steps: int = 1  # pipeline steps per optimizer step (gradient accumulation)
    training_processes: int = 1  # on this host
    threads_per_process: int = 1


# ---- the solver process ------------------------------------------------------------------------


def _solver_main(
    problem_json: str,
    backend: str,
    time_limit: float,
    workers: int,
    nice: int,
    out: Any,
    chunkings: list[tuple[int, str]] | None = None,
) -> None:
    """A forked (``fork``/``forkserver``) solver process: incumbents into ``out``."""
    try:
        if nice > 0:
            os.nice(nice)
        from ...solver import Incumbent, solve

        problem = Problem.model_validate_json(problem_json)

        def send(inc: Incumbent) -> None:
            if inc.schedule is not None:
                out.put(("incumbent", inc.schedule.to_json()))

        solve(
            problem,
            backend=backend,
            time_limit=time_limit,
            workers=workers,
            on_incumbent=send,
            chunkings=chunkings,
        )
    except Exception as e:  # reported to the parent, never raised into training
        out.put(("error", f"{type(e).__name__}: {e}"))
    finally:
        out.put(("done", ""))


def running_chunking(problem: Problem) -> tuple[int, str]:
    """(chunks per device, placement) of the running problem: the only chunking a switch
    while training can run (it keeps stages, microbatches, chunks and placement), so the only
    one a background solve searches, whatever ``layers_per_stage`` would allow."""
    return problem.num_chunks, problem.placement if problem.num_chunks > 1 else "interleaved"


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
        workers: int = 1,
        nice: int = SOLVER_NICE,
    ) -> None:
        self.problem = problem
        self.best = current_makespan
        self.min_gain = min_gain
        self.done = False
        # a switch keeps the running chunking: the solve searches only it (``running_chunking``)
        chunkings = [running_chunking(problem)]
        self.proc: Any = None
        self.queue: Any
        if start_method == "spawn":
            self.queue = queue.Queue()
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "optpipe_lightning.solver.background"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            request = {
                "problem": problem.model_dump_json(),
                "backend": backend,
                "time_limit": time_limit,
                "workers": workers,
                "nice": nice,
                "chunkings": chunkings,
            }
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            threading.Thread(target=self._read, daemon=True, name="optpipe-solver-io").start()
        else:
            ctx: Any = mp.get_context(start_method)
            self.queue = ctx.Queue()
            self.proc = ctx.Process(
                target=_solver_main,
                args=(
                    problem.model_dump_json(),
                    backend,
                    time_limit,
                    workers,
                    nice,
                    self.queue,
                    chunkings,
                ),
                daemon=True,
                name="optpipe-solver",
            )
            with inherited_objects_frozen():  # a forked solver never collects a training object
                self.proc.start()

    def _read(self) -> None:
        """The child's event lines into the queue (its own thread)."""
        assert self.proc.stdout is not None
        done = False
        for line in self.proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            kind = event.get("kind")
            if kind == "incumbent":
                self.queue.put(("incumbent", event["schedule"]))
            elif kind == "error":
                self.queue.put(("error", event.get("message", "")))
            elif kind == "done":
                done = True
                self.queue.put(("done", ""))
        if not done:  # the child ended without saying so: killed, or it crashed
            self.queue.put(("error", self._death()))
            self.queue.put(("done", ""))

    def _death(self) -> str:
        """Why the solver process ended early (its exit code or signal), for one warning."""
        proc = self.proc
        try:
            code = proc.wait(timeout=5) if isinstance(proc, subprocess.Popen) else proc.exitcode
        except subprocess.TimeoutExpired:
            code = None
        if code is not None and code < 0:
            try:
                how = f"killed by {signal.Signals(-code).name}"
            except ValueError:
                how = f"killed by signal {-code}"
        else:
            how = "ended" if code is None else f"exited with code {code}"
        return (
            f"the solver process {how} before it finished; given up for this run "
            "(training keeps its schedule)"
        )

    def poll(self) -> SwitchDecision:
        """Drain the queue: the best new feasible incumbent, if it beats the running schedule."""
        pick: Schedule | None = None
        pick_span = self.best
        while True:
            try:
                kind, payload = self.queue.get_nowait()
            except queue.Empty:
                proc = self.proc
                if (
                    not self.done
                    and isinstance(proc, mp.process.BaseProcess)
                    and not proc.is_alive()
                    and proc.exitcode != 0  # (0: its last events may still be on their way)
                ):  # died without a word
                    log.warning("optpipe: background solver stopped: %s", self._death())
                    self.done = True
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
                    try:  # what the executor refuses is never switched to
                        validate_for_execution(self.problem, sched)
                    except ScheduleRejectedError as e:
                        log.warning("optpipe: solver incumbent rejected (%s)", e)
                        continue
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
        proc = self.proc
        if isinstance(proc, subprocess.Popen):
            if proc.poll() is None:
                proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:  # pragma: no cover - a stuck child
                proc.kill()
                proc.wait()
        elif proc is not None:
            if proc.is_alive():
                proc.terminate()
            proc.join(timeout=5)
        self.done = True


class _AsyncFlag:
    """A number global rank 0 broadcasts at one boundary and every rank reads at the next: no
    rank waits for another when it is posted."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._pending: tuple[Any, torch.Tensor] | None = None

    def post(self, value: int) -> None:
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        if dist.is_available() and dist.is_initialized():
            self._pending = (dist.broadcast(t, 0, async_op=True), t)
        else:
            self._pending = (None, t)

    def take(self, timeout: float | None = None) -> int | None:
        """The number posted last (None if none is pending); with a ``timeout`` (seconds, at
        the end of a run) None when it does not come in time."""
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        if pending[0] is not None:
            if timeout is None:
                pending[0].wait()
            else:
                try:
                    pending[0].wait(timedelta(seconds=timeout))
                except Exception:  # a rank that died must not hang the others' end
                    return None
        return int(pending[1].item())


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
        device: torch.device | None = None,
    ) -> None:
        self.comm = comm
        self.backend = backend
        self.time_limit = time_limit
        self.min_gain = min_gain
        self.start_method = start_method
        self.solver: BackgroundSolver | None = None  # global rank 0 only
        self.active = False  # a solve runs (the same on every rank)
        self.solved_problem: Problem | None = None  # the last plan's problem (drift from it)
        self.calibrated_resolves = 0
        self.plans: list[dict[str, Any]] = []  # every plan (global rank 0's numbers)
        self.slowdown = SlowdownMeter()
        self._flag = _AsyncFlag(device or torch.device("cpu"))
        self._pending: SwitchDecision | None = None  # rank 0: the decision posted last
        self._message = on_message or (lambda text: log.info("%s", text))

    def plan(self, problem: Problem, current: Schedule, context: RunContext) -> SolvePlan:
        """Global rank 0's plan for solving ``problem`` now (see ``plan_solve``)."""
        span = simulate(problem, current.actions).makespan or float("inf")
        return plan_solve(
            makespan=span,
            bound=lower_bound(problem),
            pipeline_steps=context.pipeline_steps,
            step_seconds=context.step_seconds,
            remaining_steps=context.remaining_steps,
            time_limit=self.time_limit,
            spare=spare_cores(context.training_processes, context.threads_per_process),
            min_gain=self.min_gain,
            slowdown=self.slowdown.estimate(),
        )

    def start(
        self, problem: Problem, current: Schedule, context: RunContext, why: str = "solving"
    ) -> bool:
        """Start solving ``problem`` if it pays (rank 0 decides, every rank learns whether a
        solve runs); ``current`` is what an incumbent must beat."""
        ok = False
        if self.comm.is_global_zero:
            try:
                plan = self.plan(problem, current, context)
                self.plans.append({"why": why, **plan.__dict__})
                if plan.start:
                    span = simulate(problem, current.actions).makespan or float("inf")
                    self.solver = BackgroundSolver(
                        problem,
                        span,
                        self.backend,
                        self.time_limit,
                        min_gain=self.min_gain,
                        start_method=self.start_method,
                        workers=plan.workers,
                    )
                    ok = True
                self._message(
                    f"optpipe: {why} in the background: {plan.reason}"
                    if plan.start
                    else f"optpipe: not {why}: {plan.reason}"
                )
            except Exception as e:
                log.warning("optpipe: online re-solve unavailable (%s)", e)
        self.solved_problem = problem  # what calibration's drift is measured from
        self.active = bool(self.comm.broadcast(ok))
        return self.active

    def poll(self) -> SwitchDecision:
        """This boundary's decision, the same on every rank: what rank 0 posted at the
        previous boundary (see ``_AsyncFlag``); a switch sends its schedule to every rank."""
        if not self.active:
            return SwitchDecision("none")
        posted = self._flag.take()
        pending, self._pending = self._pending, None
        out = SwitchDecision("none")
        if posted == _SWITCH:
            out = self.comm.broadcast(pending)
        elif posted == _DONE:
            self.active = False
            return SwitchDecision("done")
        now = self.solver.poll() if self.solver is not None else SwitchDecision("none")
        self._pending = now
        self._flag.post({"switch": _SWITCH, "done": _DONE}.get(now.kind, _NONE))
        return out

    def note_step(self, schedule: str, seconds: float) -> None:
        """A step of ``schedule`` just ended (global rank 0's seconds): feeds the slowdown."""
        if self.comm.is_global_zero:
            self.slowdown.note(schedule, seconds, self.active)

    def on_calibrated(self, problem: Problem, current: Schedule, context: RunContext) -> None:
        """The costs were calibrated: judge incumbents on them, or plan a new solve when they
        moved away from the solved ones."""
        if self.solver is not None:
            self.solver.update_problem(problem, current.actions)
        if (
            not self.active
            and self.solved_problem is not None
            and self.calibrated_resolves < MAX_CALIBRATED_RESOLVES
            and max_cost_change(self.solved_problem, problem) > RESOLVE_DRIFT
        ):
            # planned again only once the costs moved that far from the last plan's; only
            # solves that start count against the limit
            self.stop()
            started = self.start(
                problem,
                current,
                context,
                why=f"solving again (costs moved > {round(100 * RESOLVE_DRIFT)}%)",
            )
            if started:
                self.calibrated_resolves += 1

    def stop(self, timeout: float | None = None) -> None:
        self._flag.take(timeout)  # every rank posted it: nothing is left in flight
        self._pending = None
        if self.solver is not None:
            self.solver.stop()
            self.solver = None
