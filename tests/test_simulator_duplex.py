"""Full-duplex copy channels in the simulator (``offload.duplex``, docs/formats.md).

Duplex (the default): a channel's OFFLOADs and RELOADs run on two lanes at once, each lane one
transfer at a time (stages of one channel group share each lane). Half duplex: one lane for both.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schedule_strategies import problems, random_valid_actions

from optpipe_lightning.schedule import Action, Problem, simulate
from optpipe_lightning.schedule.lanes import lane_of, lane_seconds, stage_lanes

F, BW = "F", "BW"
OFF, REL = "OFFLOAD", "RELOAD"


def _problem(duplex: bool, stages: int = 1, groups: list[list[int]] | None = None) -> Problem:
    """F = 1, BW = 2, one activation = 1 byte, a copy takes 2 s each way."""
    return Problem(
        num_stages=stages,
        num_microbatches=2,
        t_f=1.0,
        t_b=1.0,
        t_w=1.0,
        m_f=1.0,
        m_b=-0.5,
        m_w=-0.5,
        memory_limit=2.0,
        offload={
            "bytes": 1.0,
            "d2h_bandwidth": 0.5,
            "h2d_bandwidth": 0.5,
            "channel_groups": groups or [],
            "duplex": duplex,
        },
    )


def _times(res: Any, stage: int = 0) -> dict[Action, tuple[float, float]]:
    tl = res.timeline
    return {
        a: (float(s), float(e))
        for a, s, e in zip(tl.actions[stage], tl.start[stage], tl.end[stage], strict=True)
    }


ONE_STAGE = [
    [
        Action(F, 0),
        Action(OFF, 0),
        Action(F, 1),
        Action(OFF, 1),
        Action(REL, 0),
        Action(BW, 0),
        Action(REL, 1),
        Action(BW, 1),
    ]
]


def test_an_offload_and_a_reload_overlap_only_when_duplex() -> None:
    # F0 0..1, OFF0 1..3, F1 1..2, OFF1 queued behind OFF0: 3..5. REL0 waits for OFF0 (3):
    # duplex, on its own lane, 3..5 beside OFF1; one lane, behind OFF1, 5..7
    duplex = simulate(_problem(True), ONE_STAGE)
    half = simulate(_problem(False), ONE_STAGE)
    assert duplex.feasible and half.feasible
    d, h = _times(duplex), _times(half)
    for t in (d, h):
        assert t[Action(OFF, 0)] == (1.0, 3.0)
        assert t[Action(OFF, 1)] == (3.0, 5.0)
    assert d[Action(REL, 0)] == (3.0, 5.0)
    assert h[Action(REL, 0)] == (5.0, 7.0)
    assert d[Action(BW, 0)] == (5.0, 7.0) and h[Action(BW, 0)] == (7.0, 9.0)
    # REL1 is issued when BW0 ends; its lane is free in both
    assert d[Action(REL, 1)] == (7.0, 9.0) and h[Action(REL, 1)] == (9.0, 11.0)
    assert duplex.makespan == pytest.approx(11.0)
    assert half.makespan == pytest.approx(13.0)
    assert duplex.evaluation.peak_memory == [pytest.approx(2.0)]


def test_stages_of_one_channel_group_share_each_lane() -> None:
    """Stage 0 reloads while stage 1 offloads: together only when duplex; two offloads (and two
    reloads) of the group queue on one lane either way."""
    rows = [
        [Action(F, 0), Action(OFF, 0), Action(F, 1), Action(REL, 0), Action(BW, 0), Action(BW, 1)],
        [Action(F, 0), Action(OFF, 0), Action(REL, 0), Action(BW, 0), Action(F, 1), Action(BW, 1)],
    ]
    got = {}
    for duplex in (True, False):
        res = simulate(_problem(duplex, 2, [[0, 1]]), rows)
        assert res.feasible, res.evaluation.violations
        got[duplex] = (_times(res, 0), _times(res, 1))
    for t0, t1 in got.values():
        # stage 0 offloads 1..3; stage 1's F0 ends at 2 and its offload queues behind: 3..5
        assert t0[Action(OFF, 0)] == (1.0, 3.0)
        assert t1[Action(OFF, 0)] == (3.0, 5.0)
    # stage 0's reload is ready at 3 (its offload's end), stage 1's at 5. Duplex: each on the
    # reload lane as it is ready (3..5 beside stage 1's offload, then 5..7). One lane: at 3 stage
    # 1's offload (ready at 2) goes first, then stage 0's reload 5..7, stage 1's 7..9
    t0, t1 = got[True]
    assert t0[Action(REL, 0)] == (3.0, 5.0) and t1[Action(REL, 0)] == (5.0, 7.0)
    t0, t1 = got[False]
    assert t0[Action(REL, 0)] == (5.0, 7.0) and t1[Action(REL, 0)] == (7.0, 9.0)


def test_lanes_of_a_problem() -> None:
    pb = _problem(True, 4, [[1, 2]])
    assert stage_lanes(pb) == [(0, 1), (2, 3), (2, 3), (6, 7)]
    assert lane_of(pb, 2, OFF) == 2 and lane_of(pb, 2, REL) == 3
    half = pb.with_changes(offload={**pb.offload.model_dump(), "duplex": False})
    assert stage_lanes(half) == [(0, 0), (2, 2), (2, 2), (6, 6)]
    assert lane_seconds(pb, 0, 0) == pytest.approx(2.0)
    assert lane_seconds(half, 0, 0) == pytest.approx(4.0)
    assert half.hash != pb.hash
    assert Problem.model_validate_json(pb.model_dump_json()).offload.duplex


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pb=problems(offload=True), seed=st.integers(0, 10**6))
def test_each_lane_runs_one_transfer_at_a_time_in_list_order(pb: Problem, seed: int) -> None:
    """On every lane transfers never overlap, each stage's in its list order; with duplex an
    offload and a reload of one channel may overlap, on one lane never."""
    res = simulate(pb, random_valid_actions(pb, seed))
    if res.timeline is None:
        return
    tl = res.timeline
    by_lane: dict[int, list[tuple[float, float]]] = {}
    for s in range(pb.num_stages):
        last: dict[int, float] = {}
        for a, st_, en in zip(tl.actions[s], tl.start[s], tl.end[s], strict=True):
            if a.op not in (OFF, REL):
                continue
            lane = lane_of(pb, s, a.op)
            assert float(st_) >= last.get(lane, -1.0) - 1e-9  # list order per stage and lane
            last[lane] = float(st_)
            by_lane.setdefault(lane, []).append((float(st_), float(en)))
    for spans in by_lane.values():
        spans.sort()
        for (_a, e), (b, _f) in itertools.pairwise(spans):
            assert b >= e - 1e-9


def test_a_reload_waits_for_the_offload_that_frees_its_room() -> None:
    """One stage, room for two activations. F2 would fill it at 3 with offload 0's copy just
    ended: it starts at 3 (the offload's settle point). Reload 0, issued at 4, would hold a
    third: it waits for offload 1 (4..6), on its own lane, not behind it."""
    pb = _problem(True).with_changes(num_microbatches=3)
    rows = [
        [
            *(Action(F, 0), Action(OFF, 0), Action(F, 1), Action(F, 2), Action(OFF, 1)),
            *(Action(REL, 0), Action(BW, 2), Action(BW, 0), Action(REL, 1), Action(BW, 1)),
        ]
    ]
    res = simulate(pb, rows)
    assert res.feasible, res.evaluation.violations
    t = _times(res)
    # F0 0..1, OFF0 1..3, F1 1..2 (2 bytes at 2), F2 3..4 (settles OFF0); OFF1 4..6
    assert t[Action(OFF, 0)] == (1.0, 3.0) and t[Action(F, 2)] == (3.0, 4.0)
    assert t[Action(OFF, 1)] == (4.0, 6.0)
    assert t[Action(REL, 0)] == (6.0, 8.0)  # ready at 4 (F2's end), room at 6 (it settles OFF1)
    assert res.timeline.reload_waits == [[(5, 4)]]  # REL0 (position 5) waits for OFF1 (4)
    assert res.timeline.memory_waits == [[(3, 1)]]  # F2 waits for OFF0
    # one lane: F2 waits the same way (ending at 3 it would allocate while offload 0's copy
    # is still held: its settle point, BW2, comes after), and the reload queues behind
    # offload 1 anyway, no reload wait to name
    half = simulate(_problem(False).with_changes(num_microbatches=3), rows)
    assert half.feasible
    assert _times(half)[Action(REL, 0)] == (6.0, 8.0)
    assert half.timeline.memory_waits == [[(3, 1)]] and half.timeline.reload_waits == [[]]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pb=problems(offload=True, limit=True), seed=st.integers(0, 10**6))
def test_a_transfer_starts_only_when_something_it_waits_for_ends(pb: Problem, seed: int) -> None:
    """What CP-SAT's exact model allows (``cpsat.tight_options``): a transfer starts at 0 or
    when a compute op of its stage, its own offload or a transfer of its lane ends; with duplex
    lanes a reload also when an offload of its stage ends (its memory wait)."""
    res = simulate(pb, random_valid_actions(pb, seed))
    if res.timeline is None:
        return
    tl = res.timeline
    compute_ends: dict[int, list[float]] = {}
    lane_ends: dict[int, list[float]] = {}
    offload_ends: dict[int, list[float]] = {}
    for s in range(pb.num_stages):
        for a, _st, en in zip(tl.actions[s], tl.start[s], tl.end[s], strict=True):
            if a.op in (OFF, REL):
                lane_ends.setdefault(lane_of(pb, s, a.op), []).append(float(en))
                if a.op == OFF:
                    offload_ends.setdefault(s, []).append(float(en))
            else:
                compute_ends.setdefault(s, []).append(float(en))
    duplex = pb.offload is not None and pb.offload.duplex
    for s in range(pb.num_stages):
        for a, st_ in zip(tl.actions[s], tl.start[s], strict=True):
            if a.op not in (OFF, REL):
                continue
            events = [0.0, *compute_ends.get(s, []), *lane_ends[lane_of(pb, s, a.op)]]
            events += offload_ends.get(s, []) if a.op == REL else []
            assert any(abs(float(st_) - e) <= 1e-9 for e in events), (s, a, float(st_), duplex)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pb=problems(offload=True, limit=True), seed=st.integers(0, 10**6))
def test_a_schedule_that_fits_without_waiting_keeps_its_timing(pb: Problem, seed: int) -> None:
    """The memory waits (a forward's, and with duplex lanes a reload's) only ever change the
    timing of a schedule that breaks the limit without them."""
    from optpipe_lightning.schedule.simulator import _Simulator

    rows = random_valid_actions(pb, seed)
    plain = _Simulator(pb, rows, memory_wait=False).run()
    if not plain.feasible:
        return
    res = simulate(pb, rows)
    assert res.feasible and res.timeline is not None and plain.timeline is not None
    for s in range(pb.num_stages):
        assert (res.timeline.start[s] == plain.timeline.start[s]).all()
    assert not any(res.timeline.memory_waits) and not any(res.timeline.reload_waits)
