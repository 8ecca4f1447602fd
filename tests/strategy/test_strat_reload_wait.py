"""The executor honours the simulator's reload waits (``Timeline.reload_waits``): with duplex
copy lanes a RELOAD whose bytes would not fit waits until an earlier offload of its stage has
freed its room. The cursor issues such a reload only once that offload's device copies are gone
(a poll saw the copy done, or the compute stream waited on it at its settle point), and its
host-to-device copy waits on that offload's event; later reloads stay behind it.

The copies here are stand-ins with the problem's timing (an offload's event completes when the
test's clock passes the simulator's end of that copy), driven in the simulator's order; the
bytes the offload manager holds on the device, plus the activations the test keeps on the
device itself, are checked against the simulator's peak at every instant."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch

from optpipe_lightning.schedule import Action, Problem, simulate
from optpipe_lightning.strategy.runtime.copy_engines import HostCopy, HostCopyEngine
from optpipe_lightning.strategy.runtime.engine import validate_for_execution
from optpipe_lightning.strategy.runtime.offload import OffloadManager, StageWaits, execution_waits
from optpipe_lightning.strategy.runtime.stage import RankCursor

F, BW, OFF, REL = "F", "BW", "OFFLOAD", "RELOAD"
NBYTES = 4096  # one activation: 1024 float32


def _problem() -> Problem:
    """One stage, room for two activations, F = 1 s, BW = 2 s, a copy 2 s each way (duplex)."""
    return Problem(
        num_stages=1,
        num_microbatches=3,
        t_f=1.0,
        t_b=1.0,
        t_w=1.0,
        m_f=float(NBYTES),
        m_b=-NBYTES / 2,
        m_w=-NBYTES / 2,
        memory_limit=2.0 * NBYTES,
        offload={"bytes": float(NBYTES), "d2h_bandwidth": NBYTES / 2, "h2d_bandwidth": NBYTES / 2},
    )


# F2 would fill the stage at 3: it starts when offload 0's copy ends (3, its settle point);
# reload 0, issued at 4, would hold a third activation: it waits for offload 1 (4..6) and runs
# 6..8 (tests/test_simulator_duplex.py has the timing by hand)
ROWS = [
    *(Action(F, 0), Action(OFF, 0), Action(F, 1), Action(F, 2), Action(OFF, 1)),
    *(Action(REL, 0), Action(BW, 2), Action(BW, 0), Action(REL, 1), Action(BW, 1)),
]


@dataclass(frozen=True)
class _Copy:
    name: str
    end: float


class _TimedEngine(HostCopyEngine):
    """CPU copies whose events complete when the clock passes the simulator's end of that
    OFFLOAD (``done=False``: never seen done by a poll, as when the host runs ahead of a GPU)."""

    def __init__(self, offload_ends: Sequence[float], seen_done: bool = True) -> None:
        self.clock = 0.0
        self.ends = list(offload_ends)
        self.seen_done = seen_done
        self.issued = 0
        self.log: list[str] = []
        self.manager: Any = None

    def offload(self, flats: Sequence[torch.Tensor]) -> tuple[HostCopy, Any]:
        host, _ = super().offload(flats)
        ev = _Copy(f"off{self.issued}", self.ends[self.issued])
        self.issued += 1
        self.log.append(f"offload:{ev.name}")
        return host, ev

    def done(self, event: Any) -> bool:
        return event is None or (self.seen_done and self.clock >= event.end - 1e-9)

    def wait(self, event: Any) -> None:
        if event is not None:
            self.log.append(f"compute-waits:{event.name}")

    def timed_wait(self, event: Any) -> Any:
        """As ``wait``; the compute waits until the copy's end when it is still running."""
        self.wait(event)
        waited = max(0.0, event.end - self.clock) if event is not None else 0.0
        return lambda: waited

    def reload(
        self, host: HostCopy, device: torch.device, after: Any, also: Sequence[Any] = ()
    ) -> tuple[list[torch.Tensor], Any]:
        waits = ",".join(e.name for e in (after, *also) if e is not None)
        self.log.append(f"reload@{self.clock:g}:h2d-waits[{waits}]")
        return super().reload(host, device, after)


def _run(
    rows: list[Action], waits: StageWaits, seen_done: bool, late: float = 0.0
) -> tuple[list[float], Any]:
    """Drive the cursor through ``rows`` at the simulator's times; the device bytes after each
    instant (the manager's, plus the activations that are not offloaded), and the engine."""
    res = simulate(_problem(), [rows])
    assert res.feasible and res.timeline is not None
    start = [float(x) for x in res.timeline.start[0]]
    end = [float(x) for x in res.timeline.end[0]]
    engine = _TimedEngine([end[k] + late for k, a in enumerate(rows) if a.op == OFF], seen_done)
    mgr = OffloadManager(torch.device("cpu"), [], min_bytes=0, engine=engine)
    engine.manager = mgr
    cursor = RankCursor(
        rows, mgr, torch.device("cpu"), waits=waits.settle, reload_waits=waits.reloads
    )
    offloaded = {a.mb for a in rows if a.op == OFF}
    kept = 0  # bytes of activations that stay on the device (not offloaded)
    levels: list[float] = []
    losses: dict[int, torch.Tensor] = {}
    for k, a in enumerate(rows):
        if not a.is_compute:
            continue
        engine.clock = start[k]
        cursor.begin(a.op, a.mb, a.chunk)
        levels.append(mgr.device_bytes() + kept)
        if a.op == F:
            x = torch.randn(NBYTES // 4, requires_grad=True)
            with cursor.forward_context(a.mb, a.chunk):
                losses[a.mb] = (x * x).sum()  # saves x: one storage of NBYTES
        else:
            losses.pop(a.mb).backward()
        engine.clock = end[k]
        cursor.end(a.op, a.mb, a.chunk)
        if a.mb not in offloaded:
            kept += NBYTES if a.op == F else -NBYTES
        mgr.poll()  # what the next action's poll would see at this instant
        levels.append(mgr.device_bytes() + kept)
    assert cursor.finished()
    return levels, engine


def test_execution_waits_carry_the_simulators_reload_waits() -> None:
    pb = _problem()
    waits = validate_for_execution(pb, _schedule(pb))
    assert waits == [StageWaits(settle=[(3, 1), (7, 4)], reloads=[(5, 4)])]
    res = simulate(pb, [ROWS])
    assert res.timeline is not None and execution_waits(res.timeline) == waits


def _schedule(pb: Problem) -> Any:
    from optpipe_lightning.schedule.baselines import make_schedule

    return make_schedule(pb, "hand", [ROWS])


def test_a_reload_that_waits_never_holds_more_than_the_simulated_peak() -> None:
    pb = _problem()
    res = simulate(pb, [ROWS])
    assert res.timeline is not None
    peak = res.evaluation.peak_memory[0]
    assert peak == pytest.approx(2 * NBYTES)
    (waits,) = execution_waits(res.timeline)
    levels, engine = _run(ROWS, waits, seen_done=True)
    assert max(levels) <= peak
    # the reload starts when offload 1's copy has ended (6), as simulated, not at its list
    # position (4), and its copy waits on that offload
    assert "reload@6:h2d-waits[off0,off1]" in engine.log
    # without the wait the executor holds a third activation at 3: the simulator's limit broken
    plain, _ = _run(ROWS, StageWaits(waits.settle, []), seen_done=True)
    assert max(plain) == 3 * NBYTES


def test_a_reload_waits_for_the_settle_point_when_no_poll_sees_the_copy_done() -> None:
    """As on a GPU whose host runs ahead: the reload is issued at the settle point of the offload
    it waits for (the compute stream waits on that copy first), before its own backward; F2
    is offload 0's settle point (it waited for that copy), so the compute stream waits there."""
    res = simulate(_problem(), [ROWS])
    assert res.timeline is not None
    (waits,) = execution_waits(res.timeline)
    _, engine = _run(ROWS, waits, seen_done=False)
    assert engine.log == [
        "offload:off0",
        "compute-waits:off0",  # F2: offload 0's settle point (its memory wait)
        "offload:off1",  # after F2, at 4; reload 0 (listed next) is held
        "compute-waits:off1",  # BW0: offload 1's settle point, then reload 0
        "reload@8:h2d-waits[off0,off1]",
        "reload@10:h2d-waits[off1]",  # reload 1 at its list position, after BW0
    ]


@pytest.mark.parametrize("seen_done", [True, False])
def test_the_executor_holds_the_simulated_bytes_at_every_action_start(seen_done: bool) -> None:
    """The settle-point rule is one rule: at the start of every compute action the bytes the
    executor holds (offload manager plus kept activations) equal the simulator's memory curve
    at that instant, whether a poll sees each copy done or the compute stream waits for it."""
    res = simulate(_problem(), [ROWS])
    assert res.timeline is not None
    (waits,) = execution_waits(res.timeline)
    levels, _ = _run(ROWS, waits, seen_done=seen_done)
    curve = res.memory[0]
    starts = [float(res.timeline.start[0][k]) for k, a in enumerate(ROWS) if a.is_compute]
    simulated = [
        float(curve.bytes[int(np.searchsorted(curve.times, t, side="right")) - 1]) for t in starts
    ]
    assert levels[0::2] == pytest.approx(simulated)
    assert simulated == pytest.approx([x * NBYTES for x in (0, 1, 1, 2, 1, 1)])


def test_a_reload_wait_that_does_not_pair_a_reload_with_an_earlier_offload_is_refused() -> None:
    with pytest.raises(ValueError, match="does not pair a RELOAD"):
        RankCursor(ROWS, None, torch.device("cpu"), reload_waits=[(4, 5)])


def test_reloads_listed_behind_a_waiting_one_keep_their_order() -> None:
    """One host-to-device lane runs reloads in list order: a reload listed after a held one is
    held behind it (the wait is given by hand here; the last offload has no settle point, so
    the next compute action is where the compute stream waits on it)."""
    rows = [
        *(Action(F, 0), Action(OFF, 0), Action(F, 1), Action(OFF, 1), Action(F, 2)),
        *(Action(REL, 0), Action(REL, 1), Action(BW, 2), Action(BW, 0), Action(BW, 1)),
    ]
    engine = _TimedEngine([1.0, 2.0], seen_done=False)
    mgr = OffloadManager(torch.device("cpu"), [], min_bytes=0, engine=engine)
    cursor = RankCursor(rows, mgr, torch.device("cpu"), reload_waits=[(5, 3)])
    losses: dict[int, torch.Tensor] = {}
    for a in rows:
        if not a.is_compute:
            continue
        cursor.begin(a.op, a.mb, a.chunk)
        engine.log.append(f"{a.op}{a.mb}")
        if a.op == F:
            x = torch.randn(8, requires_grad=True)
            with cursor.forward_context(a.mb, a.chunk):
                losses[a.mb] = (x * x).sum()
        else:
            losses.pop(a.mb).backward()
        cursor.end(a.op, a.mb, a.chunk)
    assert cursor.finished()
    assert engine.log == [
        *("F0", "offload:off0", "F1", "offload:off1", "F2"),
        "compute-waits:off1",  # before BW2, where offload 1 settles: then both reloads, in order
        "reload@0:h2d-waits[off0,off1]",
        "reload@0:h2d-waits[off1]",
        *("BW2", "BW0", "compute-waits:off0", "BW1"),  # BW0's release: offload 0 never seen done
    ]


def test_a_copy_that_runs_late_makes_the_executor_wait_not_hold_more() -> None:
    """Each offload's copy ends 1.5 s after the simulator says: no poll sees it done at its
    settle point, so the compute waits there (the wait is measured) and the bytes held at every
    action start are still the simulator's."""
    res = simulate(_problem(), [ROWS])
    assert res.timeline is not None
    (waits,) = execution_waits(res.timeline)
    on_time, engine0 = _run(ROWS, waits, seen_done=True)
    late, engine = _run(ROWS, waits, seen_done=True, late=1.5)
    assert late[0::2] == on_time[0::2]  # the same bytes at every action start
    assert max(late) <= res.evaluation.peak_memory[0]
    assert engine0.manager.settle_wait_seconds() == 0.0
    # F2 waits for offload 0 (ends 4.5, F2 starts at 3), BW0 for offload 1 (ends 7.5, BW0
    # starts at 8: done by then, its poll drops it)
    assert "compute-waits:off0" in engine.log
    assert engine.manager.settle_wait_seconds() == pytest.approx(1.5)
