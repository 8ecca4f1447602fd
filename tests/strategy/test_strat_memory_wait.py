"""The executor honours the simulator's memory waits: before an F that the schedule has wait for
an offload, the compute stream waits on that copy and its device copies are dropped (on GPU a
stream wait, the host does not block; bookkeeping on CPU)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import torch
from torch import nn

from optpipe_lightning.schedule import Action, Problem, simulate
from optpipe_lightning.strategy.runtime.copy_engines import HostCopy, HostCopyEngine
from optpipe_lightning.strategy.runtime.offload import (
    OffloadManager,
    OffloadStateError,
    settle_points,
)
from optpipe_lightning.strategy.runtime.stage import RankCursor

F, BW, OFF, REL = "F", "BW", "OFFLOAD", "RELOAD"


class _RecordingEngine(HostCopyEngine):
    """The CPU copy engine's behaviour plus a log of the events handed out and waited on."""

    def __init__(self) -> None:
        self.log: list[str] = []

    def offload(self, flats: Sequence[torch.Tensor]) -> tuple[HostCopy, Any]:
        host, _ = super().offload(flats)
        self.log.append("offload-event")
        return host, "event"

    def done(self, event: Any) -> bool:
        return event is None  # the recorded copy is never seen done by a poll

    def wait(self, event: Any) -> None:
        if event is not None:
            self.log.append(f"compute-waits:{event}")


def _problem() -> Problem:
    return Problem(
        num_stages=1,
        num_microbatches=3,
        t_f=1.0,
        t_b=1.0,
        t_w=1.0,
        m_f=1.0,
        m_b=-0.5,
        m_w=-0.5,
        memory_limit=1.0,
        offload={"bytes": 1.0, "d2h_bandwidth": 1 / 3, "h2d_bandwidth": 1 / 3},
    )


ROWS = [
    Action(F, 0),
    Action(OFF, 0),
    Action(F, 1),
    Action(BW, 1),
    Action(REL, 0),
    Action(BW, 0),
    Action(F, 2),
    Action(BW, 2),
]


def test_the_cursor_waits_for_the_offload_before_the_forward_that_needs_its_memory() -> None:
    pb = _problem()
    res = simulate(pb, [ROWS])
    assert res.feasible and res.timeline is not None
    waits = res.timeline.memory_waits[0]
    assert waits == [(2, 1)]  # F1 waits for OFFLOAD 0
    w = nn.Parameter(torch.randn(4, 4))
    assert settle_points(res.timeline) == [[(2, 1)]]  # the wait is where the copy ends, too
    engine = _RecordingEngine()
    mgr = OffloadManager(torch.device("cpu"), [w], min_bytes=0, engine=engine)
    cursor = RankCursor(ROWS, mgr, torch.device("cpu"), waits=waits)
    losses = {}
    for a in ROWS:
        if not a.is_compute:
            continue
        cursor.begin(a.op, a.mb, a.chunk)
        engine.log.append(f"{a.op}{a.mb}")
        if a.op == F:
            x = torch.randn(2, 4)
            with cursor.forward_context(a.mb, a.chunk):
                losses[a.mb] = torch.tanh(x @ w).sum()
        else:
            losses[a.mb].backward()
        cursor.end(a.op, a.mb, a.chunk)
    assert engine.log == [
        "F0",
        "offload-event",
        "compute-waits:event",  # before F1 runs
        "F1",
        "BW1",
        "BW0",
        "F2",
        "BW2",
    ]
    assert ("WAIT", (0, 0, 0), mgr.history[0][2]) in mgr.history
    assert not mgr.pending  # the wait dropped the device copies the offload read


def test_a_wait_that_does_not_pair_an_f_with_an_earlier_offload_is_refused() -> None:
    with pytest.raises(ValueError, match="does not pair"):
        RankCursor(ROWS, None, torch.device("cpu"), waits=[(1, 2)])


def test_waiting_for_an_activation_never_offloaded_is_a_bug_named_as_such() -> None:
    mgr = OffloadManager(torch.device("cpu"), [], min_bytes=0)
    with pytest.raises(OffloadStateError, match="waits for the offload"):
        mgr.settle((0, 5, 0))
