"""Solving a built MILP (``milp.build_milp``): Gurobi in this process, HiGHS in a child process
(``highs_worker``) that is told to stop at the limit, killed ``HIGHS_KILL_AFTER`` seconds later,
and capped at ``HIGHS_MEMORY_BYTES`` of address space.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from typing import Any

from .milp import LinearModel, MilpOutcome, SolutionFn
from .ticks import OpKey


def solve_milp(
    lm: LinearModel,
    backend: str,
    *,
    hint: tuple[dict[OpKey, int], set[tuple[int, int, int]]] | None,
    time_limit: float,
    gap_target: float,
    seed: int,
    workers: int,
    on_solution: SolutionFn | None,
    stop: threading.Event | None,
    deadline: float | None = None,
) -> MilpOutcome:
    """Solve a built model with ``backend`` for at most ``time_limit`` seconds, and never past
    ``deadline`` (a ``time.perf_counter()`` value: what the start's completion took counts)."""
    start = lm.complete_start(*hint) if hint is not None else None
    if deadline is not None:
        left = deadline - time.perf_counter()
        if left <= 0:  # the build and the start took it all: no child started
            return MilpOutcome("unknown", None, None, message="no time left after the build")
        time_limit = max(0.01, min(time_limit, left))
    if backend == "gurobi":
        return _solve_gurobi(lm, start, time_limit, gap_target, seed, workers, on_solution, stop)
    if backend == "highs":
        return _solve_highs_isolated(
            lm, start, time_limit, gap_target, seed, workers, on_solution, stop
        )
    raise ValueError(f"unknown MILP backend {backend!r}")


def _decode(lm: LinearModel, x: list[float]) -> tuple[dict[OpKey, int], dict[OpKey, int]]:
    starts: dict[OpKey, int] = {}
    ends: dict[OpKey, int] = {}
    for key, i in lm.start.items():
        op, s, c, j = key
        if op in ("OFFLOAD", "RELOAD") and x[lm.offload[(s, c, j)]] < 0.5:
            continue
        st = round(x[i])
        starts[key] = st
        ends[key] = st + lm.dur[key]
    return starts, ends


def _solve_gurobi(
    lm: LinearModel,
    start: list[float] | None,
    time_limit: float,
    gap_target: float,
    seed: int,
    workers: int,
    on_solution: SolutionFn | None,
    stop: threading.Event | None,
) -> MilpOutcome:
    import gurobipy as gp
    from gurobipy import GRB

    env = gp.Env(empty=True)
    env.setParam("OutputFlag", 0)
    env.start()
    model = gp.Model(env=env)
    try:
        n = len(lm.lb)
        xl = [
            model.addVar(
                lb=lm.lb[i],
                ub=lm.ub[i] if lm.ub[i] != float("inf") else GRB.INFINITY,
                vtype=GRB.INTEGER if lm.integer[i] else GRB.CONTINUOUS,
            )
            for i in range(n)
        ]
        for idx, coefs, lo, hi in lm.rows:
            expr = gp.LinExpr(coefs, [xl[i] for i in idx])
            if lo == hi:
                model.addLConstr(expr, GRB.EQUAL, lo)
            elif hi == float("inf"):
                model.addLConstr(expr, GRB.GREATER_EQUAL, lo)
            elif lo == -float("inf"):
                model.addLConstr(expr, GRB.LESS_EQUAL, hi)
            else:
                model.addRange(expr, lo, hi)
        model.setObjective(gp.quicksum(c * xl[i] for i, c in lm.obj.items()), GRB.MINIMIZE)
        model.Params.TimeLimit = max(0.01, time_limit)
        model.Params.MIPGap = max(0.0, gap_target)
        model.Params.Seed = seed
        model.Params.Threads = max(1, workers)
        if start is not None:
            for i, val in enumerate(start):
                xl[i].Start = val

        def cb(mdl: gp.Model, where: int) -> None:
            if stop is not None and stop.is_set():
                mdl.terminate()
            if where == GRB.Callback.MIPSOL and on_solution is not None:
                vals = mdl.cbGetSolution(xl)
                obj = round(mdl.cbGet(GRB.Callback.MIPSOL_OBJ))
                bnd = mdl.cbGet(GRB.Callback.MIPSOL_OBJBND)
                st, en = _decode(lm, vals)
                on_solution(st, en, obj, int(-(-(bnd - 1e-6) // 1)) if abs(bnd) < 1e99 else 0)

        try:
            model.optimize(cb)
        except gp.GurobiError as e:
            return MilpOutcome("unknown", None, None, message=f"Gurobi error {e.errno}: {e}")
        code = model.Status
        status = {GRB.OPTIMAL: "optimal", GRB.INFEASIBLE: "infeasible"}.get(code, "unknown")
        if status == "unknown" and model.SolCount > 0:
            status = "feasible"
        out = MilpOutcome(status, None, None)
        if model.SolCount > 0:
            out.objective = round(model.ObjVal)
            out.starts, out.ends = _decode(lm, [x.X for x in xl])
        try:
            bnd = model.ObjBound
            out.bound = int(-(-(bnd - 1e-6) // 1))
        except (gp.GurobiError, AttributeError):
            out.bound = None
        return out
    finally:
        model.dispose()
        env.dispose()


def _solve_highs(
    lm: LinearModel,
    start: list[float] | None,
    time_limit: float,
    gap_target: float,
    seed: int,
    workers: int,
    on_solution: SolutionFn | None,
    stop: Any,
) -> MilpOutcome:
    import highspy
    import numpy as np

    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", max(0.01, float(time_limit)))
    h.setOptionValue("mip_rel_gap", max(0.0, float(gap_target)))
    h.setOptionValue("random_seed", int(seed))
    h.setOptionValue("threads", int(max(1, workers)))
    inf = highspy.kHighsInf
    n = len(lm.lb)
    lb = np.array(lm.lb, dtype=float)
    ub = np.array([u if u != float("inf") else inf for u in lm.ub], dtype=float)
    cost = np.zeros(n)
    for i, c in lm.obj.items():
        cost[i] = c
    h.addCols(
        n,
        cost,
        lb,
        ub,
        0,
        np.array([], dtype=np.int32),
        np.array([], dtype=np.int32),
        np.array([], dtype=float),
    )
    ints = np.array([i for i in range(n) if lm.integer[i]], dtype=np.int32)
    h.changeColsIntegrality(len(ints), ints, np.array([highspy.HighsVarType.kInteger] * len(ints)))
    for idx, val, lo, hi in lm.rows:
        h.addRow(
            lo if lo != -float("inf") else -inf,
            hi if hi != float("inf") else inf,
            len(idx),
            np.array(idx, dtype=np.int32),
            np.array(val, dtype=float),
        )
    if start is not None:
        h.setSolution(n, np.arange(n, dtype=np.int32), np.array(start, dtype=float))

    def improving(e: object) -> None:
        data = e.data_out  # type: ignore[attr-defined]
        if stop is not None and stop.is_set():
            e.interrupt()  # type: ignore[attr-defined]
        if on_solution is not None:
            vals = list(data.mip_solution)
            st, en = _decode(lm, vals)
            bnd = float(data.mip_dual_bound)
            on_solution(
                st,
                en,
                round(data.objective_function_value),
                int(-(-(bnd - 1e-6) // 1)) if math.isfinite(bnd) else 0,
            )

    def interrupt(e: object) -> None:
        if stop is not None and stop.is_set():
            e.interrupt()  # type: ignore[attr-defined]

    h.cbMipImprovingSolution.subscribe(improving)
    h.cbMipInterrupt.subscribe(interrupt)
    h.run()
    ms = h.getModelStatus()
    status = {
        highspy.HighsModelStatus.kOptimal: "optimal",
        highspy.HighsModelStatus.kInfeasible: "infeasible",
    }.get(ms, "unknown")
    info = h.getInfo()
    out = MilpOutcome(status, None, None)
    if info.primal_solution_status >= 2:  # feasible
        if status == "unknown":
            out.status = "feasible"
        sol = list(h.getSolution().col_value)
        out.objective = round(info.objective_function_value)
        out.starts, out.ends = _decode(lm, sol)
    bnd = float(info.mip_dual_bound)
    out.bound = int(-(-(bnd - 1e-6) // 1)) if math.isfinite(bnd) and abs(bnd) < 1e30 else None
    return out


HIGHS_KILL_AFTER = 1.0
"""Seconds the HiGHS child gets to stop after it is told to (at its limit) before it is killed."""
HIGHS_MEMORY_BYTES = 4 * 2**30
"""The HiGHS child's address-space cap (``RLIMIT_AS``): past it, its allocation fails, it reports
the failure and the solve keeps its incumbent (9.75 GB was measured uncapped, issue 32)."""


def _solve_highs_isolated(
    lm: LinearModel,
    start: list[float] | None,
    time_limit: float,
    gap_target: float,
    seed: int,
    workers: int,
    on_solution: SolutionFn | None,
    stop: threading.Event | None,
) -> MilpOutcome:
    """HiGHS in a child process (``python -m optpipe_lightning.solver.highs_worker``).

    The highspy and OR-Tools wheels both carry HiGHS, and loading both into one process fails
    with undefined symbols (whichever is imported second). The child gets the model on stdin,
    streams incumbents back on stdout, and stops when told to on stdin.
    """
    import base64
    import pickle
    import queue as queue_mod
    import subprocess
    import sys
    import time

    # the child's search ends at this instant (CLOCK_MONOTONIC is the same in every process),
    # whatever its start-up took on a busy machine
    ends_at = time.monotonic() + time_limit
    payload = pickle.dumps((lm, start, ends_at, gap_target, seed, workers))
    proc = subprocess.Popen(
        [sys.executable, "-m", "optpipe_lightning.solver.highs_worker"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(base64.b64encode(payload) + b"\n")
    proc.stdin.flush()
    lines: queue_mod.Queue[bytes] = queue_mod.Queue()
    out_stream = proc.stdout

    def reader() -> None:
        for line in out_stream:
            lines.put(line)
        lines.put(b"")

    threading.Thread(target=reader, daemon=True).start()
    deadline = ends_at  # HiGHS overruns its own limit (120 s against 60): told to stop at it
    out: MilpOutcome | None = None
    told = False
    try:
        while out is None:
            if not told and ((stop is not None and stop.is_set()) or time.monotonic() > deadline):
                try:
                    proc.stdin.write(b"stop\n")
                    proc.stdin.flush()
                except OSError:
                    pass
                told = True
                deadline = time.monotonic() + HIGHS_KILL_AFTER  # then killed (incumbents kept)
            elif told and time.monotonic() > deadline:
                break
            try:
                line = lines.get(timeout=0.1)
            except queue_mod.Empty:
                continue
            if not line:
                break
            try:
                msg = pickle.loads(base64.b64decode(line.strip(), validate=True))
            except (ValueError, pickle.UnpicklingError, EOFError):
                continue  # not a protocol line (a stray print of the child): skip it
            if msg[0] == "solution":
                if on_solution is not None:
                    on_solution(msg[1], msg[2], msg[3], msg[4])
            else:
                out = msg[1]
    finally:
        with contextlib.suppress(OSError):
            proc.stdin.close()
        try:
            proc.wait(timeout=HIGHS_KILL_AFTER)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return out or MilpOutcome("unknown", None, None, message="HiGHS stopped without a result")
