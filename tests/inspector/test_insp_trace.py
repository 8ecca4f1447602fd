"""The Chrome trace: Trace Event Format fields, non-overlapping tracks, flows, memory counters."""

from __future__ import annotations

import itertools
import json
from collections import Counter, defaultdict

import pytest

from optpipe_lightning.inspector import TraceError, chrome_trace
from optpipe_lightning.schedule import Action, Problem, Schedule, simulate
from optpipe_lightning.schedule.baselines import generate
from optpipe_lightning.schedule.problem import OffloadSpec


@pytest.fixture(scope="module")
def case(offload_case: tuple) -> tuple:
    pb, sc, _ = offload_case
    return pb, sc, chrome_trace(None, sc)


def copy_lanes(sc: Schedule) -> int:
    """(stage, direction) pairs that carry copies: each gets a named thread."""
    return sum(len({a.op for a in row} & {"OFFLOAD", "RELOAD"}) for row in sc.actions)


def test_document_shape_and_json(case: tuple) -> None:
    pb, sc, tr = case
    assert tr["displayTimeUnit"] == "ms"
    text = json.dumps(tr)  # serialisable as is
    assert json.loads(text)["otherData"]["problem_hash"] == pb.hash
    phases = Counter(e["ph"] for e in tr["traceEvents"])
    n_actions = sum(len(r) for r in sc.actions)
    assert phases["X"] == n_actions == 4 * 6 * 2 * 3 + 2 * sc.num_offloaded()
    # per stage: process name/sort and compute thread name/sort; a used copy lane name/sort
    assert phases["M"] == 4 * 4 + 2 * copy_lanes(sc)
    assert phases["s"] == phases["f"]


def test_complete_events_match_the_simulator(case: tuple) -> None:
    pb, sc, tr = case
    sim = simulate(pb, sc)
    assert sim.timeline is not None
    xs = {(e["pid"], e["name"]): e for e in tr["traceEvents"] if e["ph"] == "X"}
    for s in range(pb.num_stages):
        for a, t0, t1 in zip(
            sim.timeline.actions[s], sim.timeline.start[s], sim.timeline.end[s], strict=True
        ):
            ev = xs[(s, str(a))]
            assert ev["ts"] == pytest.approx(t0 * 1e6)
            assert ev["dur"] == pytest.approx((t1 - t0) * 1e6)
            assert ev["tid"] == {"OFFLOAD": 1, "RELOAD": 2}.get(a.op, 0)
            assert ev["cat"] == a.op
            assert ev["args"] == {"stage": s, "microbatch": a.mb, "chunk": a.chunk, "op": a.op}
    last_end = max(e["ts"] + e["dur"] for e in xs.values())
    assert last_end == pytest.approx(sim.makespan * 1e6)


def test_no_overlap_on_one_track(case: tuple) -> None:
    _, sc, tr = case
    tracks: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    for e in tr["traceEvents"]:
        if e["ph"] == "X":
            assert e["dur"] >= 0
            tracks[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
    assert len(tracks) == 4 + copy_lanes(sc)  # compute, and one track per copy direction
    for spans in tracks.values():
        spans.sort()
        for (_, end0), (start1, _) in itertools.pairwise(spans):
            assert start1 >= end0 - 1e-6


def test_flows_pair_up_inside_their_slices(case: tuple) -> None:
    _pb, _, tr = case
    xs = [e for e in tr["traceEvents"] if e["ph"] == "X"]
    starts = {e["id"]: e for e in tr["traceEvents"] if e["ph"] == "s"}
    ends = {e["id"]: e for e in tr["traceEvents"] if e["ph"] == "f"}
    assert set(starts) == set(ends)
    # interleaved p=4, v=2: all 7 group boundaries cross devices; F and B each; 6 microbatches
    crossing = 7 * 6 * 2
    offloads = sum(1 for e in xs if e["cat"] == "OFFLOAD")
    assert offloads > 0
    assert len(starts) == crossing + offloads

    def enclosing(ev: dict) -> dict:
        hits = [
            x
            for x in xs
            if x["pid"] == ev["pid"]
            and x["tid"] == ev["tid"]
            and x["ts"] <= ev["ts"] <= x["ts"] + x["dur"]
        ]
        assert len(hits) == 1
        return hits[0]

    for fid, s_ev in starts.items():
        f_ev = ends[fid]
        assert f_ev["bp"] == "e"
        src, dst = enclosing(s_ev), enclosing(f_ev)
        assert src["args"]["microbatch"] == dst["args"]["microbatch"]
        assert dst["ts"] >= src["ts"] + src["dur"] - 1e-6  # arrows point forward in time
        if s_ev["name"] == "activation":
            assert (src["cat"], dst["cat"]) == ("F", "F") and src["pid"] != dst["pid"]
        elif s_ev["name"] == "gradient":
            assert (src["cat"], dst["cat"]) == ("B", "B") and src["pid"] != dst["pid"]
        else:
            assert (src["cat"], dst["cat"]) == ("OFFLOAD", "RELOAD") and src["pid"] == dst["pid"]


def test_memory_counters_follow_the_curves(case: tuple) -> None:
    pb, sc, tr = case
    sim = simulate(pb, sc)
    counters = [e for e in tr["traceEvents"] if e["ph"] == "C"]
    assert {e["name"] for e in counters} == {"activation memory"}
    for s, curve in enumerate(sim.memory):
        mine = [e for e in counters if e["pid"] == s]
        assert len(mine) == len(curve.times)
        assert max(e["args"]["on device"] for e in mine) == pytest.approx(curve.peak)
        if any(a.op == "OFFLOAD" for a in sc.actions[s]):
            assert max(e["args"]["offloaded"] for e in mine) > 0
        assert {e["args"]["limit"] for e in mine} == {pb.memory_limits()[s]}
    unlimited = pb.with_changes(memory_limit=None)
    sc2 = sc.model_copy(update={"problem_hash": unlimited.hash, "problem": unlimited})
    tr2 = chrome_trace(None, sc2)
    assert not any("limit" in e["args"] for e in tr2["traceEvents"] if e["ph"] == "C")


def test_errors_are_one_line() -> None:
    pb = Problem(num_stages=2, num_microbatches=2, t_f=1.0, t_b=1.0, t_w=1.0)
    sc = generate("1f1b", pb)
    with pytest.raises(TraceError, match="does not embed its problem"):
        chrome_trace(None, sc.model_copy(update={"problem": None}))
    with pytest.raises(TraceError, match="made for problem"):
        chrome_trace(pb.with_changes(num_microbatches=3), sc)
    stuck = Schedule(
        problem_hash=pb.hash,
        generator="bad",
        actions=[
            [
                Action("B", 0),
                Action("F", 0),
                Action("W", 0),
                Action("F", 1),
                Action("B", 1),
                Action("W", 1),
            ],
            [
                Action("F", 0),
                Action("B", 0),
                Action("W", 0),
                Action("F", 1),
                Action("B", 1),
                Action("W", 1),
            ],
        ],
        problem=pb,
    )
    with pytest.raises(TraceError, match="cannot be timed: deadlock") as e:
        chrome_trace(None, stuck)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("duplex", [None, True, False])
def test_a_lane_per_copy_direction(duplex: bool | None) -> None:
    """An offload and a reload of one stage sit on their own tracks (OFFLOAD: device -> host,
    RELOAD: host -> device); with a full-duplex channel they run at the same time."""
    spec: dict[str, object] = {"bytes": 1.0, "d2h_bandwidth": 1 / 3, "h2d_bandwidth": 1 / 3}
    if duplex is not None:
        if "duplex" not in OffloadSpec.model_fields:
            pytest.skip("this build's simulator has no offload.duplex yet (issue 22)")
        spec["duplex"] = duplex
    pb = Problem(
        num_stages=1,
        num_microbatches=2,
        t_f=1.0,
        t_b=1.0,
        t_w=1.0,
        m_f=1.0,
        m_b=-0.5,
        m_w=-0.5,
        offload=OffloadSpec(**spec),
    )
    order = ["F0", "OFFLOAD0", "F1", "OFFLOAD1", "RELOAD0", "BW0", "RELOAD1", "BW1"]
    row = [Action(x.rstrip("01"), int(x[-1])) for x in order]
    sc = Schedule(problem_hash=pb.hash, generator="hand", actions=[row], problem=pb)
    xs = {e["name"]: e for e in chrome_trace(None, sc)["traceEvents"] if e["ph"] == "X"}
    assert {xs[str(a)]["tid"] for a in row if a.op == "OFFLOAD"} == {1}
    assert {xs[str(a)]["tid"] for a in row if a.op == "RELOAD"} == {2}
    off1, rel0 = xs[str(Action("OFFLOAD", 1))], xs[str(Action("RELOAD", 0))]
    overlap = min(off1["ts"] + off1["dur"], rel0["ts"] + rel0["dur"]) - max(off1["ts"], rel0["ts"])
    if duplex:
        assert overlap > 0  # both directions copy at once
    elif duplex is False:
        assert overlap <= 1e-6  # one lane for both directions
