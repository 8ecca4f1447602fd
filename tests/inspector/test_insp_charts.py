"""Chart functions and their data frames: Vega-Lite specs and the rows each chart draws."""

from __future__ import annotations

import json
from collections.abc import Iterator

import altair as alt
import numpy as np
import pandas as pd
import pytest

from optpipe_lightning.inspector import charts, frames
from optpipe_lightning.inspector.demo import demo_problem, demo_profile, greedy_schedule
from optpipe_lightning.schedule import simulate


@pytest.fixture(autouse=True)
def _no_row_limit() -> Iterator[None]:
    with alt.data_transformers.disable_max_rows():
        yield


@pytest.fixture(scope="module")
def case() -> tuple:
    pb = demo_problem(4, 6, 2, memory_limit=5.0e9)
    sc = greedy_schedule(pb, offload_every=2)
    return pb, sc, simulate(pb, sc)


def spec_and_rows(chart: alt.TopLevelMixin) -> tuple[dict, list[dict]]:
    spec = chart.to_dict()
    datasets = spec.get("datasets", {})
    assert len(datasets) == 1, "one inline dataset per chart"
    return spec, next(iter(datasets.values()))


def test_timeline_frame_matches_the_simulator(case: tuple) -> None:
    pb, sc, sim = case
    tl = frames.timeline_frame(sim)
    assert len(tl) == sum(len(r) for r in sc.actions)
    assert set(tl["lane"]) == {"compute", "copy"}
    assert (tl[tl["lane"] == "copy"]["kind"].isin(["OFFLOAD", "RELOAD"])).all()
    assert tl["end_ms"].max() == pytest.approx(sim.makespan * 1e3)
    first_f = tl[(tl.kind == "F") & (tl.device == 0) & (tl.micro == 0) & (tl.chunk == 0)].iloc[0]
    assert first_f.start_ms == 0.0
    assert first_f.duration_ms == pytest.approx(pb.cost("t_f")[0, 0] * 1e3)
    idle = frames.idle_frame(tl, sim.makespan * 1e3)
    work = pb.cost("t_f").sum(1) + pb.cost("t_b").sum(1) + pb.cost("t_w").sum(1)
    np.testing.assert_allclose(idle["busy_ms"], work * pb.num_microbatches * 1e3)
    np.testing.assert_allclose(idle["busy_ms"] + idle["idle_ms"], sim.makespan * 1e3)


def test_timeline_chart_spec_and_data(case: tuple) -> None:
    _, sc, sim = case
    tl = frames.timeline_frame(sim)
    spec, rows = spec_and_rows(charts.timeline_chart(tl))
    bars, text = spec["layer"]
    assert bars["mark"]["type"] == "bar"
    enc = bars["encoding"]
    assert (enc["x"]["field"], enc["x2"]["field"], enc["y"]["field"]) == (
        "start_ms",
        "end_ms",
        "device",
    )
    assert enc["yOffset"]["field"] == "lane"
    assert enc["yOffset"]["scale"]["domain"] == ["compute", "copy"]
    assert enc["color"]["scale"] == {"domain": charts.KIND_DOMAIN, "range": charts.KIND_RANGE}
    tips = {t["field"] for t in enc["tooltip"]}
    assert {"kind", "device", "micro", "chunk", "start_ms", "duration_ms"} <= tips
    (zoom,) = spec["params"]  # Altair lifts layer params to the top, naming their view
    assert zoom["bind"] == "scales" and zoom["select"]["encodings"] == ["x"]
    assert zoom["views"] == [bars["name"]]
    assert text["mark"]["type"] == "text" and text["encoding"]["text"]["field"] == "label"
    assert len(rows) == sum(len(r) for r in sc.actions)
    offl = [r for r in rows if r["kind"] == "OFFLOAD"]
    assert len(offl) == sc.num_offloaded() and {r["lane"] for r in offl} == {"copy"}


def test_timeline_chart_drops_labels_when_crowded() -> None:
    big = pd.DataFrame(
        {
            "device": 0,
            "lane": "compute",
            "kind": "F",
            "micro": range(charts.LABEL_MAX_BARS + 1),
            "chunk": 0,
            "start_ms": 0.0,
            "end_ms": 1.0,
            "duration_ms": 1.0,
            "label": "0",
        }
    )
    spec = charts.timeline_chart(big).to_dict()
    assert len(spec["layer"]) == 1
    assert len(charts.timeline_chart(big.head(10)).to_dict()["layer"]) == 2


def test_memory_frame_and_chart(case: tuple) -> None:
    pb, _, sim = case
    unit = frames.memory_unit(pb, sim)
    assert unit.name == "GiB"
    mem = frames.memory_frame(pb, sim, unit)
    for s, curve in enumerate(sim.memory):
        mine = mem[(mem.device == s) & (mem.series == "on device")]
        assert mine["value"].max() * unit.scale == pytest.approx(curve.peak)
        peak_rows = mine[mine.is_peak]
        assert len(peak_rows) == 1
        assert peak_rows.iloc[0].time_ms == pytest.approx(curve.peak_time() * 1e3)
        assert mine["time_ms"].max() == pytest.approx(sim.makespan * 1e3)
        host = mem[(mem.device == s) & (mem.series == "offloaded")]
        assert host["value"].max() > 0
    assert set(mem["limit"]) == {5.0e9 / unit.scale}
    spec, rows = spec_and_rows(charts.memory_chart(mem, unit=unit.name))
    assert spec["facet"]["field"] == "device" and spec["columns"] == 4
    line, limit, peak, over = spec["spec"]["layer"]
    assert line["mark"] == {"type": "line", "interpolate": "step-after"}
    assert limit["mark"]["type"] == "rule" and limit["mark"]["strokeDash"]
    assert peak["transform"] == [{"filter": "datum.is_peak"}]
    assert "datum.value > datum.limit" in over["transform"][0]["filter"]
    assert line["encoding"]["y"]["title"] == "activations (GiB)"
    assert len(rows) == len(mem)
    assert sum(r["is_peak"] for r in rows) == pb.num_stages


def test_byte_units() -> None:
    assert frames.byte_unit(3 * 2**30).name == "GiB"
    assert frames.byte_unit(5 * 2**20).name == "MiB"
    assert frames.byte_unit(512).name == "bytes"


def test_solver_frame_gap_and_chart() -> None:
    events = [
        {"wall_time": 0.5, "makespan": 0.60, "bound": 0.30},
        {"wall_time": 1.5, "makespan": 0.50, "bound": None},
        {"wall_time": 3.0, "makespan": None, "bound": 0.45},
    ]
    df = frames.solver_frame(events)
    assert len(df) == 4
    assert df[df.series == "incumbent"]["makespan_ms"].tolist() == pytest.approx([600.0, 500.0])
    assert frames.solver_gap(df) == pytest.approx((500 - 450) / 500)
    assert frames.solver_gap(frames.solver_frame([])) is None
    spec = charts.solver_chart(df, {"1f1b": 550.0, "gpipe": 700.0}).to_dict()
    lines, rules, _names = spec["layer"]
    assert lines["mark"]["interpolate"] == "step-after"
    assert lines["encoding"]["x"]["field"] == "wall_time"
    assert lines["encoding"]["color"]["scale"]["domain"] == ["incumbent", "lower bound"]
    ref = spec["datasets"][rules["data"]["name"]]
    assert {r["baseline"]: r["makespan_ms"] for r in ref} == {"1f1b": 550.0, "gpipe": 700.0}
    assert len(charts.solver_chart(df).to_dict()["layer"]) == 1


def test_compare_chart_rows_and_selection(case: tuple) -> None:
    pb, _, sim = case
    other = simulate(pb, greedy_schedule(pb))
    stacked = frames.compare_frame(
        {"offload": frames.timeline_frame(sim), "plain": frames.timeline_frame(other)}
    )
    spec, rows = spec_and_rows(charts.compare_chart(stacked, ["plain", "offload"]))
    assert spec["facet"]["row"]["field"] == "schedule"
    assert spec["facet"]["row"]["sort"] == ["plain", "offload"]
    assert spec["resolve"]["scale"]["x"] == "shared"
    (pick,) = spec["params"]
    assert pick["select"]["fields"] == ["micro"]
    cond = spec["spec"]["encoding"]["color"]["condition"]
    assert cond["param"] == pick["name"] and cond["field"] == "kind"
    counts = pd.DataFrame(rows).groupby("schedule").size().to_dict()
    assert counts == {"offload": len(frames.timeline_frame(sim)), "plain": 6 * 4 * 2 * 3}


def test_schedule_summary(case: tuple) -> None:
    pb, _, sim = case
    row = frames.schedule_summary("x", pb, sim)
    assert row["makespan_ms"] == pytest.approx(sim.makespan * 1e3)
    assert row["peak_vs_limit"] == pytest.approx(max(sim.evaluation.peak_memory) / 5.0e9)
    assert row["num_offloaded"] == sim.evaluation.num_offloaded > 0
    spec = charts.compare_metrics_chart(pd.DataFrame([row])).to_dict()
    assert spec["encoding"]["x"]["field"] == "makespan_ms"


def test_profile_and_activation_charts() -> None:
    prof = demo_profile(3, 2)
    df = frames.profile_frame(prof.stages)
    assert len(df) == 3 * 2 * 3
    f00 = df[(df.stage == 0) & (df.chunk == 0) & (df.kind == "F")].iloc[0]
    assert f00.mean_ms == pytest.approx(9.0)
    assert (f00.min_ms, f00.max_ms) == pytest.approx((0.93 * 9.0, 1.12 * 9.0))
    assert f00.lo_std_ms == pytest.approx(9.0 * 0.96)
    spec, rows = spec_and_rows(charts.profile_chart(df))
    assert spec["facet"]["column"]["field"] == "chunk"
    whisker, box, mean = spec["spec"]["layer"]
    assert (whisker["encoding"]["y"]["field"], whisker["encoding"]["y2"]["field"]) == (
        "min_ms",
        "max_ms",
    )
    assert (box["encoding"]["y"]["field"], box["encoding"]["y2"]["field"]) == (
        "lo_std_ms",
        "hi_std_ms",
    )
    assert mean["mark"]["type"] == "tick"
    assert len(rows) == 18
    acts = frames.activation_frame(prof.stages)
    assert set(acts["what"]) == {"activation", "weight-grad part", "offloadable"}
    assert acts[(acts.what == "offloadable")]["bytes"].max() == pytest.approx(0.8e9)
    a_spec = charts.activation_chart(acts.assign(value=acts["bytes"] / 2**30), unit="GiB").to_dict()
    assert a_spec["encoding"]["xOffset"]["field"] == "what"


def test_training_chart_marks_switches() -> None:
    steps = frames.training_frame(
        [{"step": i, "step_time": 0.5 + 0.01 * i, "predicted": 0.5} for i in range(5)]
        + [{"step": 5, "step_time": 0.4, "predicted": None}]
    )
    assert len(steps) == 11
    switches = pd.DataFrame({"step": [3], "schedule": ["→ #7"]})
    spec = charts.training_chart(steps, switches).to_dict()
    lines, rules, _text = spec["layer"]
    assert lines["encoding"]["color"]["scale"]["domain"] == ["measured", "predicted"]
    assert spec["datasets"][rules["data"]["name"]] == [{"step": 3, "schedule": "→ #7"}]
    assert len(charts.training_chart(steps).to_dict()["layer"]) == 1
    mem = pd.DataFrame({"step": [0, 0], "rank": [0, 1], "value": [1.0, 2.0]})
    assert charts.rank_memory_chart(mem).to_dict()["encoding"]["color"]["field"] == "rank"


def test_specs_are_valid_json(case: tuple) -> None:
    pb, _, sim = case
    for chart in (
        charts.timeline_chart(frames.timeline_frame(sim)),
        charts.memory_chart(frames.memory_frame(pb, sim)),
    ):
        json.loads(chart.to_json())  # Altair validates against the Vega-Lite schema


def test_time_window_clips_bars() -> None:
    tl = pd.DataFrame(
        {
            "device": 0,
            "lane": "compute",
            "kind": "F",
            "micro": [0, 1, 2],
            "chunk": 0,
            "start_ms": [0.0, 10.0, 20.0],
            "end_ms": [10.0, 20.0, 30.0],
            "duration_ms": 10.0,
            "label": ["0", "1", "2"],
        }
    )
    w = frames.time_window(tl, 5.0, 15.0)
    assert w["micro"].tolist() == [0, 1]
    assert w["start_ms"].tolist() == [5.0, 10.0] and w["end_ms"].tolist() == [10.0, 15.0]
    assert w["duration_ms"].tolist() == [10.0, 10.0]  # the tooltip keeps the op's own duration


def test_timeline_names_the_copy_a_forward_waited_for() -> None:
    from optpipe_lightning.schedule import Action, Problem

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
    assert f1["start_ms"] == pytest.approx(3000.0)  # ends with the copy (1 s .. 4 s)
    assert (tl[tl["micro"] == 0]["waits_for"] == "").all()
    spec = charts.timeline_chart(tl).to_dict()
    assert "waits_for" in json.dumps(spec)
