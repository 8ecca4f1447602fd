"""One memory rule for the model and the executor (issue 34), on every schedule family with
offloads: driven through each stage's action list at the simulator's times, with copies that end
when the simulator says (or later), the bytes the executor holds at the start of every compute
action equal the simulator's memory curve there, and a late copy makes compute wait at its
settle point instead of holding more.

The problem's memory rule is the executor's on CPU (``m_b = 0``: an activation's store is
released when its W, or BW, ends); copies are stand-ins timed by the test's clock
(``test_strat_reload_wait._TimedEngine``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from test_strat_reload_wait import NBYTES, _TimedEngine

from optpipe_lightning.schedule import Action, Problem, simulate
from optpipe_lightning.schedule.baselines import generate
from optpipe_lightning.strategy.runtime.offload import OffloadManager, execution_waits
from optpipe_lightning.strategy.runtime.stage import RankCursor


def _problem(v: int, placement: str, limit: float, split: bool) -> Problem:
    return Problem(
        num_stages=4,
        num_microbatches=8,
        num_chunks=v,
        placement=placement,
        t_f=1.0,
        t_b=1.0,
        t_w=1.0 if split else 0.0,
        t_bw=None if split else 2.0,
        m_f=float(NBYTES),
        m_b=0.0,
        m_w=-float(NBYTES),
        memory_limit=limit * NBYTES,
        offload={"bytes": float(NBYTES), "d2h_bandwidth": NBYTES / 0.5, "h2d_bandwidth": NBYTES},
    )


def _families() -> list[tuple[str, Problem, list[list[Action]]]]:
    """(name, problem, rows) of schedules with offloads, one per family that makes them."""
    from optpipe_lightning.solver.heuristics import default_rules, run_rule

    out: list[tuple[str, Problem, list[list[Action]]]] = []
    pb1 = _problem(1, "interleaved", 2.0, split=True)
    out.append(("adaoffload", pb1, [list(r) for r in generate("adaoffload", pb1).actions]))
    pb2 = _problem(2, "interleaved", 3.0, split=True)
    out.append(("pipeoffload", pb2, [list(r) for r in generate("pipeoffload", pb2).actions]))
    # V placement (two chunks, the device turns the microbatch round), copies twice as fast
    pbv = _problem(2, "vshape", 4.0, split=True).with_changes(
        offload={
            "bytes": float(NBYTES),
            "d2h_bandwidth": NBYTES / 0.25,
            "h2d_bandwidth": NBYTES / 0.25,
        }
    )
    out.append(("adaoffload vshape", pbv, [list(r) for r in generate("adaoffload", pbv).actions]))
    fused = _problem(1, "interleaved", 2.0, split=False)
    for name, pb in (("list rule", pb1), ("list rule fused", fused)):
        for rule in default_rules(pb):
            if rule.offload == "none":
                continue
            sched = run_rule(pb, rule)
            if sched is not None and sched.num_offloaded() > 0 and simulate(pb, sched).feasible:
                out.append((f"{name} {rule.name}", pb, [list(r) for r in sched.actions]))
                break
    return out


FAMILIES = _families()


def _drive(
    rows: list[Action], start: list[float], end: list[float], waits: Any, late: float
) -> Any:
    """Run one stage's list at the given times; (bytes held at each compute start, engine)."""
    ends = [end[k] + late for k, a in enumerate(rows) if a.op == "OFFLOAD"]
    engine = _TimedEngine(ends, seen_done=True)
    mgr = OffloadManager(torch.device("cpu"), [], min_bytes=0, engine=engine)
    engine.manager = mgr
    cursor = RankCursor(
        rows, mgr, torch.device("cpu"), waits=waits.settle, reload_waits=waits.reloads
    )
    moved = {(a.mb, a.chunk) for a in rows if a.op == "OFFLOAD"}
    kept = 0
    held: list[float] = []
    losses: dict[tuple[int, int], torch.Tensor] = {}
    for k, a in enumerate(rows):
        if not a.is_compute:
            continue
        key = (a.mb, a.chunk)
        engine.clock = start[k]
        mgr.poll()  # what a poll at this instant sees
        cursor.begin(a.op, a.mb, a.chunk)
        held.append(mgr.device_bytes() + kept)
        if a.op == "F":
            x = torch.randn(NBYTES // 4, requires_grad=True)
            with cursor.forward_context(a.mb, a.chunk):
                losses[key] = (x * x).sum()  # saves x: one storage of NBYTES
            if key not in moved:
                kept += NBYTES
        elif a.op in ("W", "BW"):
            losses.pop(key).backward()
            if key not in moved:
                kept -= NBYTES
        engine.clock = end[k]
        cursor.end(a.op, a.mb, a.chunk)
    assert cursor.finished()
    return held, engine


def _simulated_at(curve: Any, times: list[float]) -> list[float]:
    return [
        float(curve.bytes[int(np.searchsorted(curve.times, t, side="right")) - 1]) for t in times
    ]


def test_every_family_with_offloads_is_covered() -> None:
    names = [n for n, _pb, _rows in FAMILIES]
    assert {"adaoffload", "pipeoffload", "adaoffload vshape"} <= set(names)
    assert any(n.startswith("list rule fused") for n in names)
    assert sum(n.startswith("list rule") for n in names) == 2
    for _n, pb, rows in FAMILIES:
        assert sum(a.op == "OFFLOAD" for r in rows for a in r) > 0
        assert simulate(pb, rows).feasible


@pytest.mark.parametrize("late", [0.0, 0.75])
@pytest.mark.parametrize("name", [n for n, _pb, _rows in FAMILIES])
def test_the_executor_holds_what_the_simulator_says(name: str, late: float) -> None:
    _n, pb, rows = next(f for f in FAMILIES if f[0] == name)
    res = simulate(pb, rows)
    assert res.feasible and res.timeline is not None
    waits = execution_waits(res.timeline)
    waited = 0.0
    for s in range(pb.num_stages):
        row = res.timeline.actions[s]
        if not any(a.op == "OFFLOAD" for a in row):
            continue
        start = [float(x) for x in res.timeline.start[s]]
        end = [float(x) for x in res.timeline.end[s]]
        held, engine = _drive(row, start, end, waits[s], late)
        comp = [k for k, a in enumerate(row) if a.is_compute]
        sim = _simulated_at(res.memory[s], [start[k] for k in comp])
        # at the start of a zero-length op (a W of t_w = 0) the curve already has its own end's
        # free, which the executor makes when the op ends: compare where ops take time
        pairs = [(h, x) for h, x, k in zip(held, sim, comp, strict=True) if end[k] > start[k]]
        assert [h for h, _ in pairs] == pytest.approx([x for _, x in pairs]), (name, s)
        waited += engine.manager.settle_wait_seconds()
    if late == 0.0:
        assert waited == 0.0  # on time: the settle points cost nothing
