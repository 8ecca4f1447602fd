"""The Chrome trace: Trace Event Format fields, non-overlapping tracks, flows, memory counters."""

from __future__ import annotations

import itertools
import json
from collections import Counter, defaultdict

import pytest

from optpipe_lightning.inspector import TraceError, chrome_trace
from optpipe_lightning.inspector.demo import demo_problem, greedy_schedule
from optpipe_lightning.schedule import Action, Schedule, simulate


@pytest.fixture(scope="module")
def case() -> tuple:
    pb = demo_problem(4, 6, 2)
    sc = greedy_schedule(pb, offload_every=2)
    return pb, sc, chrome_trace(None, sc)


def test_document_shape_and_json(case: tuple) -> None:
    pb, sc, tr = case
    assert tr["displayTimeUnit"] == "ms"
    text = json.dumps(tr)  # serialisable as is
    assert json.loads(text)["otherData"]["problem_hash"] == pb.hash
    phases = Counter(e["ph"] for e in tr["traceEvents"])
    n_actions = sum(len(r) for r in sc.actions)
    assert phases["X"] == n_actions == 4 * 6 * 2 * 3 + 2 * 4 * 3 * 2  # F,B,W + offload/reload
    assert phases["M"] == 4 * 6  # per stage: process name/sort, two threads' name/sort
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
            assert ev["tid"] == (0 if a.is_compute else 1)
            assert ev["cat"] == a.op
            assert ev["args"] == {"stage": s, "microbatch": a.mb, "chunk": a.chunk, "op": a.op}
    last_end = max(e["ts"] + e["dur"] for e in xs.values())
    assert last_end == pytest.approx(sim.makespan * 1e6)


def test_no_overlap_on_one_track(case: tuple) -> None:
    _, _, tr = case
    tracks: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    for e in tr["traceEvents"]:
        if e["ph"] == "X":
            assert e["dur"] >= 0
            tracks[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
    assert len(tracks) == 8  # 4 stages x (compute, copy)
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
    # vshape p=4, v=2: 6 of the 7 group boundaries cross devices; F and B each; 6 microbatches
    crossing = 6 * 6 * 2
    offloads = sum(1 for e in xs if e["cat"] == "OFFLOAD")
    assert offloads == 2 * 4 * 3 * 1  # microbatches 0, 2, 4 on every (stage, chunk)
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
        assert max(e["args"]["offloaded"] for e in mine) > 0  # this stage offloads
        assert "limit" not in mine[0]["args"]  # the demo problem is unlimited
    limited = pb.with_changes(memory_limit=1e12)
    sc2 = sc.model_copy(update={"problem_hash": limited.hash, "problem": limited})
    tr2 = chrome_trace(None, sc2)
    assert {e["args"]["limit"] for e in tr2["traceEvents"] if e["ph"] == "C"} == {1e12}


def test_errors_are_one_line() -> None:
    pb = demo_problem(2, 2)
    sc = greedy_schedule(pb)
    with pytest.raises(TraceError, match="does not embed its problem"):
        chrome_trace(None, sc.model_copy(update={"problem": None}))
    with pytest.raises(TraceError, match="made for problem"):
        chrome_trace(demo_problem(2, 3), sc)
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
