"""The data the charts draw, in display units: timelines with a lane per copy direction, busy
strips, memory curves, solver progress with baselines that never stretch the axis, labels,
search, and the Training page's frames."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from optpipe_lightning.inspector import frames, labels
from optpipe_lightning.inspector import training_frames as tf
from optpipe_lightning.inspector.search import matching
from optpipe_lightning.schedule import Action, Problem, simulate
from optpipe_lightning.schedule.units import Unit


def test_timeline_frame_matches_the_simulator(offload_case: tuple) -> None:
    pb, sc, sim = offload_case
    tl = frames.timeline_frame(sim)
    assert frames.schedule_time_unit(sim).name == "ms"
    assert len(tl) == sum(len(r) for r in sc.actions)
    # one lane per direction: OFFLOAD always device -> host, RELOAD always host -> device
    assert set(tl[tl.kind == "OFFLOAD"]["lane"]) == {"device → host"}
    assert set(tl[tl.kind == "RELOAD"]["lane"]) == {"host → device"}
    assert set(tl[tl.kind.isin(["F", "B", "W"])]["lane"]) == {"compute"}
    assert tl["end"].max() == pytest.approx(sim.makespan * 1e3)
    first_f = tl[(tl.kind == "F") & (tl.device == 0) & (tl.micro == 0) & (tl.chunk == 0)].iloc[0]
    assert first_f.start == 0.0
    assert first_f.duration == pytest.approx(pb.cost("t_f")[0, 0] * 1e3)
    idle = frames.idle_frame(tl, sim.makespan * 1e3)
    work = pb.cost("t_f").sum(1) + pb.cost("t_b").sum(1) + pb.cost("t_w").sum(1)
    np.testing.assert_allclose(idle["busy"], work * pb.num_microbatches * 1e3)
    np.testing.assert_allclose(idle["busy"] + idle["idle"], sim.makespan * 1e3)


def test_seconds_when_the_makespan_is_long() -> None:
    """A unit-cost problem (28 time units) reads in seconds, not 28,000 ms."""
    pb = Problem(num_stages=2, num_microbatches=3, t_f=1.0, t_b=1.0, t_w=1.0)
    from optpipe_lightning.schedule.baselines import generate

    sim = simulate(pb, generate("1f1b", pb))
    tl = frames.timeline_frame(sim)
    assert frames.schedule_time_unit(sim).name == "s"
    assert tl["end"].max() == pytest.approx(sim.makespan)


def _brute_busy(tl: pd.DataFrame, device: int, t0: float, t1: float) -> float:
    ops = tl[(tl.device == device) & (tl.lane == "compute")]
    overlap = (np.minimum(ops["end"], t1) - np.maximum(ops["start"], t0)).clip(lower=0).sum()
    return float(overlap) / (t1 - t0)


@pytest.mark.parametrize("bins", [1, 7, 160])
def test_busy_frame_is_exact(offload_case: tuple, bins: int) -> None:
    _, _, sim = offload_case
    tl = frames.timeline_frame(sim)
    makespan = float(tl["end"].max())
    busy = frames.busy_frame(tl, makespan, bins=bins)
    assert len(busy) == 4 * bins
    for r in busy.sample(min(len(busy), 60), random_state=0).itertuples():
        assert r.busy == pytest.approx(_brute_busy(tl, r.device, r.t0, r.t1), abs=1e-9)
    idle = frames.idle_frame(tl, makespan)
    for d in range(4):
        label = busy[busy.device == d]["stage"].iloc[0]
        assert label == f"stage {d} · {idle.iloc[d]['idle_fraction']:.0%} idle"


def test_memory_frame_in_gb(offload_case: tuple) -> None:
    pb, _, sim = offload_case
    unit = frames.memory_unit(pb, sim)
    assert unit == Unit("GB", 1e9)
    mem = frames.memory_frame(pb, sim, unit)
    for s, curve in enumerate(sim.memory):
        mine = mem[(mem.device == s) & (mem.series == "on device")]
        assert mine["value"].max() * 1e9 == pytest.approx(curve.peak)
        (peak_time,) = mine[mine.is_peak]["time"]
        assert peak_time == pytest.approx(curve.peak_time() * 1e3)
        assert mine["time"].max() == pytest.approx(sim.makespan * 1e3)
    assert mem["limit"].to_numpy() == pytest.approx(pb.memory_limits()[0] / 1e9)
    assert "offloaded" in set(mem["series"])
    # a schedule that never offloads has no "offloaded" series (so no legend entry for it)
    from optpipe_lightning.schedule.baselines import generate

    plain = simulate(pb, generate("gpipe", pb))
    assert set(frames.memory_frame(pb, plain)["series"]) == {"on device"}


def test_solver_frame_reaches_the_end() -> None:
    events = [(0.5, 0.60, 0.30), (1.5, 0.50, None), (3.0, None, 0.45)]
    df = frames.solver_frame(events, end=30.0)
    inc = df[df.series == "incumbent"].sort_values("wall_time")
    assert inc["wall_time"].tolist() == [0.5, 1.5, 30.0]
    assert inc["makespan"].tolist() == [0.60, 0.50, 0.50]
    assert inc["event"].tolist() == [True, True, False]
    bound = df[df.series == "lower bound"].sort_values("wall_time")
    assert bound["wall_time"].tolist() == [0.5, 3.0, 30.0]
    assert frames.solver_best(df) == (0.50, 0.45)
    assert frames.solver_gap(df) == pytest.approx((0.50 - 0.45) / 0.50)
    assert frames.solver_gap(frames.solver_frame([])) is None
    assert len(frames.solver_frame(events)) == 4  # no end: the events only


def test_baseline_marks_never_stretch_the_axis() -> None:
    marks = frames.baseline_marks(
        {"zb-h1": 4.80, "zb-h2": 4.81, "1f1b": 5.5, "zb-auto": 23.0, "gpipe": 1.0}, 4.0, 6.0
    )
    inside = marks[marks.inside]
    assert inside["label"].tolist() == ["zb-h1, zb-h2", "1f1b"]  # close values share a label
    assert inside["makespan"].between(4.0, 6.0).all()
    edge = marks[~marks.inside].set_index("label")["makespan"].to_dict()
    assert edge == {"above the axis: zb-auto": 6.0, "below the axis: gpipe": 4.0}
    assert frames.baseline_marks({}, 0, 1).empty


def test_time_window_clips_bars() -> None:
    tl = pd.DataFrame(
        {
            "device": 0,
            "lane": "compute",
            "kind": "F",
            "micro": [0, 1, 2],
            "chunk": 0,
            "start": [0.0, 10.0, 20.0],
            "end": [10.0, 20.0, 30.0],
            "duration": 10.0,
            "waits_for": "",
        }
    )
    w = frames.time_window(tl, 5.0, 15.0)
    assert w["micro"].tolist() == [0, 1]
    assert w["start"].tolist() == [5.0, 10.0] and w["end"].tolist() == [10.0, 15.0]
    assert w["duration"].tolist() == [10.0, 10.0]  # the tooltip keeps the op's own duration


def test_timeline_names_the_copy_a_forward_waited_for() -> None:
    pb = Problem(
        num_stages=1,
        num_microbatches=2,
        t_f=1.0,
        t_b=1.0,
        t_w=1.0,
        m_f=1.0,
        m_b=-0.5,
        m_w=-0.5,
        memory_limit=1.0,
        offload={"bytes": 1.0, "d2h_bandwidth": 1 / 3, "h2d_bandwidth": 1 / 3},
    )
    rows = [
        [
            Action("F", 0),
            Action("OFFLOAD", 0),
            Action("F", 1),
            Action("BW", 1),
            Action("RELOAD", 0),
            Action("BW", 0),
        ]
    ]
    tl = frames.timeline_frame(simulate(pb, rows))
    f1 = tl[(tl["kind"] == "F") & (tl["micro"] == 1)].iloc[0]
    assert f1["waits_for"] == "offload of mb 0"
    assert f1["start"] == pytest.approx(4.0)  # seconds: starts when the copy (1 s .. 4 s) ends
    assert (tl[tl["micro"] == 0]["waits_for"] == "").all()


def test_problem_and_schedule_labels() -> None:
    row = {
        "name": "",
        "stages": 16,
        "microbatches": 64,
        "chunks": 2,
        "placement": "vshape",
        "memory_limit": 12.5e9,
        "offload": True,
    }
    assert labels.problem_label(row) == "16x64x2 vshape · limit 12.50 GB · offload"
    assert labels.problem_label({**row, "name": "gpt-6b"}) == "gpt-6b"
    one = {**row, "chunks": 1, "memory_limit": None, "offload": False}
    assert labels.problem_label(one) == "16x64 · no limit"
    heur = {"backend": "heuristic", "source": "heuristic:offload-repair:zb-h1"}
    cp = {"backend": "cpsat", "source": "cpsat"}
    assert labels.producer("optpipe", "solver", heur) == (
        "optpipe · heuristic · via heuristic offload-repair:zb-h1"
    )
    assert labels.producer("optpipe", "solver", cp) == "optpipe · cpsat"
    assert labels.producer("optpipe", "solver", {"backend": "cpsat", "source": "baseline:zbv"}) == (
        "optpipe · cpsat · via baseline zbv"
    )
    assert labels.producer("zbv", "baseline", {"variant": "block"}) == "zbv (block)"
    sched = {"id": 7, "produced_by": "optpipe · cpsat", "makespan": 28.0, "feasible": False}
    assert labels.schedule_label(sched) == "#7 optpipe · cpsat · 28.000 s · infeasible"
    v2 = {**sched, "feasible": True, "chunks": 2, "placement": "vshape"}
    assert labels.schedule_label(v2) == "#7 optpipe · cpsat · 2 chunks vshape · 28.000 s"


def test_search_survives_missing_values() -> None:
    """Issue 27: a column of floats with NaN made the search raise a TypeError."""
    df = pd.DataFrame(
        {
            "id": [1, 2, 3],
            "status": ["finished", "running", None],
            "makespan": [0.5, float("nan"), None],
            "when": pd.to_datetime(["2026-11-26", None, "2026-11-27"]),
        }
    )
    assert matching(df, "RUN")["id"].tolist() == [2]
    assert matching(df, "0.5")["id"].tolist() == [1]
    assert matching(df, "nan").empty and matching(df, "none").empty
    assert len(matching(df, "")) == 3
    assert matching(df.iloc[:0], "x").empty


STEPS = [
    {"step": 0, "measured_seconds": 0.74, "predicted_seconds": None, "peak_memory": [11e9, 10e9]},
    {"step": 1, "measured_seconds": 0.70, "predicted_seconds": 0.69, "peak_memory": [12e9, 10e9]},
    {"step": 2, "measured_seconds": 0.64, "predicted_seconds": 0.63, "peak_memory": []},
]
METRICS = [
    {"step": 0, "name": "train_loss", "value": 5.0},
    {"step": 0, "name": "samples", "value": 32.0},
    {"step": 1, "name": "train_loss", "value": None},
    {"step": 1, "name": "val_loss", "value": 4.5},
    {"step": 1, "name": "samples", "value": 32.0},
    {"step": 2, "name": "lr", "value": 1e-4},
]


def test_training_step_loss_and_throughput_frames() -> None:
    unit = tf.step_unit(STEPS)
    assert unit.name == "ms"
    st = tf.step_frame(STEPS, unit)
    assert st[st.series == "predicted"]["step"].tolist() == [1, 2]
    assert st[st.series == "measured"]["value"].tolist() == pytest.approx([740, 700, 640])
    loss = tf.loss_frame(METRICS)
    assert loss.to_dict("records") == [
        {"step": 0, "series": "train", "value": 5.0},
        {"step": 1, "series": "validation", "value": 4.5},
    ]
    thr, what = tf.throughput_frame(METRICS, STEPS)
    assert what == "samples"
    assert thr["value"].tolist() == pytest.approx([32 / 0.74, 32 / 0.70])
    tokens = [*METRICS, {"step": 2, "name": "tokens", "value": 65536.0}]
    thr, what = tf.throughput_frame(tokens, STEPS)
    assert what == "tokens" and thr["value"].tolist() == pytest.approx([65536 / 0.64])
    assert set(tf.metric_frame(METRICS)["name"]) == {"train_loss", "val_loss", "samples", "lr"}


def test_training_memory_against_the_limit() -> None:
    detail = {"memory_limit": [12.5e9, 12.5e9], "device_memory": 80 * 2**30}
    unit = tf.memory_unit(STEPS, detail)
    peaks = tf.rank_memory_frame(STEPS, unit)
    assert peaks[peaks["rank"] == 0]["value"].tolist() == [11.0, 12.0]
    limits = tf.limit_frame(detail, 2, unit)
    assert limits.to_dict("records") == [
        {"rank": 0, "limit": 12.5, "what": "memory limit"},
        {"rank": 1, "limit": 12.5, "what": "memory limit"},
    ]
    device = tf.limit_frame({"memory_limit": None, "device_memory": 80e9}, 2, unit)
    assert device["limit"].tolist() == [80.0, 80.0] and set(device["what"]) == {"device"}


def test_training_events_carry_reason_and_gain() -> None:
    switches = [
        {"step": 4, "from_schedule_id": None, "to_schedule_id": 6, "reason": "profiled",
         "predicted_before": None, "predicted_after": 0.6946},
        {"step": 20, "from_schedule_id": 6, "to_schedule_id": 7, "reason": "solver incumbent",
         "predicted_before": 0.7363, "predicted_after": 0.6823},
    ]  # fmt: skip
    cals = [
        {"step": 12, "schedule_id": 6, "reason": "ops 6% slower", "predicted_before": 0.6946,
         "predicted_after": 0.7363},
    ]  # fmt: skip
    ev = tf.events_frame(switches, cals, {6: "adaoffload", 7: "optpipe · cpsat"})
    assert ev["step"].tolist() == [4, 12, 20]
    assert ev["kind"].tolist() == ["switch", "calibration", "switch"]
    assert ev.iloc[2]["what"] == "adaoffload (#6) → optpipe · cpsat (#7)"
    assert ev.iloc[2]["gain"] == "736.300 ms → 682.300 ms (-7.3%)"
    assert ev.iloc[2]["short"] == "→ #7 (-7.3%)"
    assert ev.iloc[0]["what"] == "optpipe-profiling → adaoffload (#6)"  # as the training log
    assert ev.iloc[0]["gain"] == "694.600 ms per step"
    assert ev.iloc[1]["short"] == "calibrated (+6.0%)" and ev.iloc[1]["reason"] == "ops 6% slower"


def test_event_labels_that_would_overlap_go_on_rows_below() -> None:
    # 100 steps over 700 px: 7 px a step; "calibrated (+6.0%)" is ~116 px, ~17 steps
    ys = tf.label_rows([0, 5, 10, 40, 42, 100], ["calibrated (+6.0%)"] * 6, width_px=700)
    assert ys == [0, 12, 24, 0, 12, 0]
    assert tf.label_rows([], []) == []
    far = tf.label_rows([0, 50, 100], ["→ #7"] * 3, width_px=700)
    assert far == [0, 0, 0]  # apart: all on the top row
