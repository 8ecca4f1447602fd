"""The over-limit certificate (``schedule.sim_overlimit``): the first run without the memory wait
stops early only where it would have gone over the limit, so ``simulate`` gives exactly what it
gave when that run was always timed in full. Seeded random walks of the action search's moves
over several problem families (duplex and one lane, shared and private channels, interleaved
chunks); every candidate is compared with the full double run, bit for bit."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from bench_problems import bench_problem, brute_problem, one_lane
from search_problems import gpt_problem

from optpipe_lightning.schedule import Problem, SimResult, simulate, simulator
from optpipe_lightning.schedule.baselines import NotApplicable, generate
from optpipe_lightning.schedule.schedule import Action
from optpipe_lightning.schedule.simulator import _Simulator
from optpipe_lightning.solver import action_moves

Rows = list[list[Action]]


class _AlwaysOver(dict):
    """``simulate``'s per-problem record read as "the first runs go over": it always certifies."""

    def get(self, key: object, default: object = None) -> int:
        return simulator._SCORE_CAP


@pytest.fixture(autouse=True)
def _always_certify(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(simulator, "_OVER_SCORE", _AlwaysOver())


def _reference(pb: Problem, rows: Rows) -> SimResult:
    """``simulate`` as it was: the run without the wait timed in full, then the one with it."""
    if any(a.op == "OFFLOAD" for row in rows for a in row):
        plain = _Simulator(pb, rows, memory_wait=False).run()
        if plain.feasible or plain.timeline is None:
            return plain
    return _Simulator(pb, rows).run()


def _same(a: SimResult, b: SimResult) -> None:
    assert a.evaluation.model_dump() == b.evaluation.model_dump()
    if a.timeline is None or b.timeline is None:
        assert a.timeline is None and b.timeline is None
        return
    for x, y in zip(
        a.timeline.start + a.timeline.end, b.timeline.start + b.timeline.end, strict=True
    ):
        assert np.array_equal(x, y)
    assert a.timeline.memory_waits == b.timeline.memory_waits
    assert a.timeline.reload_waits == b.timeline.reload_waits
    for ca, cb in zip(a.memory, b.memory, strict=True):
        assert np.array_equal(ca.times, cb.times) and np.array_equal(ca.bytes, cb.bytes)


def _step(rng: random.Random, pb: Problem, rows: Rows) -> Rows | None:
    """One of the action search's moves, drawn at random (some break the schedule)."""
    s = rng.randrange(pb.num_stages)
    row = rows[s]
    kind = rng.random()
    a = row[rng.randrange(len(row))]
    if kind < 0.35:
        return action_moves.move(rows, s, rng.randrange(len(row)), rng.choice((-3, -1, 1, 2)))
    if kind < 0.5:
        return action_moves.drop(rows, s, {(a.mb, a.chunk)})
    if kind < 0.65:
        return action_moves.add_offload(rows, s, a.mb, a.chunk)
    return action_moves.swap_compute(rows, s, rng.randrange(len(row)))


def _starts(pb: Problem) -> list[Rows]:
    out = []
    for name in ("pipeoffload", "adaoffload", "1f1b"):
        with contextlib.suppress(NotApplicable):
            out.append([list(r) for r in generate(name, pb).actions])
    # every activation offloaded: copies queue on the lanes, forwards outrun them
    rows = [list(r) for r in out[-1]]
    for s in range(pb.num_stages):
        for a in [a for a in rows[s] if a.op == "F"]:
            rows = action_moves.add_offload(rows, s, a.mb, a.chunk) or rows
    return [*out, rows]


def _walk(pb: Problem, seed: int, steps: int) -> tuple[int, int]:
    """Random walks from each start; (candidates compared, first runs the certificate
    stopped)."""
    rng = random.Random(seed)
    compared = stopped = 0
    for rows in _starts(pb):
        for _ in range(steps):
            cand = _step(rng, pb, rows)
            if cand is None:
                continue
            got = simulate(pb, cand)
            _same(got, _reference(pb, cand))
            compared += 1
            if any(a.op == "OFFLOAD" for row in cand for a in row):
                stopped += _Simulator(pb, cand, memory_wait=False).run(True) is None
            if got.timeline is not None and rng.random() < 0.7:
                rows = cand  # walk on (also through schedules over the limit)
    return compared, stopped


@pytest.mark.parametrize(
    "make",
    [
        lambda tmp: gpt_problem(tmp, stages=4, microbatches=8, memory_microbatches=2),
        lambda tmp: gpt_problem(tmp, stages=4, microbatches=8, memory_microbatches=1),
        lambda tmp: bench_problem(4, 8, 2, 0.5, 0.5),
        lambda tmp: one_lane(bench_problem(4, 8, 1, 0.25, 0.5)),
        lambda tmp: brute_problem(3, 6, limit=4.0, offload=True, shared=True),
        lambda tmp: brute_problem(3, 6, limit=4.0, offload=True, duplex=False),
    ],
    ids=["gpt-2mb", "gpt-1mb", "bench-v2", "bench-one-lane", "shared-channel", "half-duplex"],
)
def test_the_certificate_changes_no_result(tmp_path: Path, make: Callable[[Path], Problem]) -> None:
    pb = make(tmp_path)
    compared, _stopped = _walk(pb, seed=7, steps=60)
    assert compared >= 50


def test_the_certificate_stops_first_runs_that_go_over() -> None:
    # forwards outrunning their copies: most first runs go over, and the certificate sees it
    pb = bench_problem(4, 8, 2, 0.5, 0.5)
    compared, stopped = _walk(pb, seed=1, steps=40)
    assert stopped > compared // 4


def test_the_certificate_runs_where_first_runs_go_over(monkeypatch: pytest.MonkeyPatch) -> None:
    pb = bench_problem(4, 8, 2, 0.5, 0.5)
    rows = _starts(pb)[-1]  # every activation offloaded: its first run goes over
    roomy = bench_problem(4, 8, 1, 10.0, 2.0)  # a limit never reached
    fits = _starts(roomy)[-1]
    monkeypatch.setattr(simulator, "_OVER_SCORE", {})
    simulate(pb, rows)
    assert simulator._OVER_SCORE[pb.hash] == 1
    for _ in range(10):
        assert simulate(roomy, fits).feasible
    assert simulator._OVER_SCORE[roomy.hash] == -simulator._SCORE_CAP  # off where they fit
    assert simulator._OVER_SCORE[pb.hash] == 1
