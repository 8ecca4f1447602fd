"""Chart functions: Vega-Lite specs and the rows each chart draws (no browser)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import altair as alt
import pandas as pd
import pytest

from optpipe_lightning.cli.demo import demo_profile
from optpipe_lightning.inspector import charts, frames, profile_charts, training_charts
from optpipe_lightning.inspector import training_frames as tf
from optpipe_lightning.schedule import simulate
from optpipe_lightning.schedule.baselines import generate
from optpipe_lightning.schedule.units import Unit


@pytest.fixture(autouse=True)
def _no_row_limit() -> Iterator[None]:
    with alt.data_transformers.disable_max_rows():
        yield


def spec_and_rows(chart: alt.TopLevelMixin) -> tuple[dict, list[dict]]:
    spec = chart.to_dict()
    datasets = spec.get("datasets", {})
    assert len(datasets) == 1, "one inline dataset per chart"
    return spec, next(iter(datasets.values()))


def test_timeline_chart_spec_and_data(offload_case: tuple) -> None:
    _, sc, sim = offload_case
    tl = frames.timeline_frame(sim)
    spec = charts.timeline_chart(tl, unit="ms").to_dict()
    (bars, *others) = spec["layer"]
    rows = spec["datasets"][bars["data"]["name"]]  # every op (the ops that waited: again)
    assert bars["mark"]["type"] == "bar"
    enc = bars["encoding"]
    assert (enc["x"]["field"], enc["x2"]["field"], enc["y"]["field"]) == ("start", "end", "device")
    assert enc["x"]["title"] == "time (ms)"
    assert enc["yOffset"]["field"] == "lane"
    assert enc["yOffset"]["scale"]["domain"] == ["compute", "device → host", "host → device"]
    present = ["F", "B", "W", "OFFLOAD", "RELOAD"]  # the legend lists only these (no BW)
    assert enc["color"]["scale"]["domain"] == present
    assert enc["color"]["scale"]["range"] == [
        charts.KIND_RANGE[charts.KIND_DOMAIN.index(k)] for k in present
    ]
    tips = {t["field"]: t["title"] for t in enc["tooltip"]}
    assert tips["start"] == "start (ms)" and tips["end"] == "end (ms)" and "waits_for" not in tips
    (zoom,) = spec["params"]  # Altair lifts layer params to the top, naming their view
    assert zoom["bind"] == "scales" and zoom["select"]["encodings"] == ["x"]
    assert zoom["views"] == [bars["name"]]
    (text,) = [x for x in others if x["mark"]["type"] == "text"]
    assert text["encoding"]["text"]["field"] == "micro"
    assert len(rows) == sum(len(r) for r in sc.actions)


def test_only_the_ops_that_waited_show_the_wait() -> None:
    tl = pd.DataFrame(
        {
            "device": 0,
            "lane": "compute",
            "kind": ["F", "F"],
            "micro": [0, 1],
            "chunk": 0,
            "start": [0.0, 2.0],
            "end": [1.0, 3.0],
            "duration": 1.0,
            "waits_for": ["", "offload of mb 0"],
        }
    )
    spec = charts.timeline_chart(tl, labels=False).to_dict()
    plain, waited = spec["layer"]
    # every bar from one dataset without a transform; the op that waited again, on top
    assert "transform" not in plain and "transform" not in waited
    assert len(spec["datasets"][plain["data"]["name"]]) == 2
    # only the columns the chart draws (no duration: the tooltip says start and end)
    expected = {k: v for k, v in tl.iloc[1].to_dict().items() if k != "duration"}
    assert spec["datasets"][waited["data"]["name"]] == [
        {**expected, "device": 0, "micro": 1, "chunk": 0}
    ]
    assert "waits_for" not in {t["field"] for t in plain["encoding"]["tooltip"]}
    assert "waits_for" in {t["field"] for t in waited["encoding"]["tooltip"]}
    # compute-only: one lane, a legend of F alone
    assert plain["encoding"]["yOffset"]["scale"]["domain"] == ["compute"]
    assert plain["encoding"]["color"]["scale"]["domain"] == ["F"]


def test_timeline_chart_drops_labels_when_crowded() -> None:
    big = pd.DataFrame(
        {
            "device": 0,
            "lane": "compute",
            "kind": "F",
            "micro": range(charts.LABEL_MAX_BARS + 1),
            "chunk": 0,
            "start": 0.0,
            "end": 1.0,
            "duration": 1.0,
            "waits_for": "",
        }
    )
    assert len(charts.timeline_chart(big).to_dict()["layer"]) == 1
    assert len(charts.timeline_chart(big.head(10)).to_dict()["layer"]) == 2


def test_busy_chart(offload_case: tuple) -> None:
    _, _, sim = offload_case
    tl = frames.timeline_frame(sim)
    busy = frames.busy_frame(tl, float(tl["end"].max()), bins=50)
    spec, rows = spec_and_rows(charts.busy_chart(busy, unit="ms"))
    assert spec["mark"]["type"] == "rect"
    assert spec["encoding"]["color"]["scale"]["domain"] == [0, 1]
    assert spec["encoding"]["y"]["sort"][0].startswith("stage 0 · ")
    assert len(rows) == 4 * 50


def test_memory_chart_draws_the_limit_under_the_curves(offload_case: tuple) -> None:
    pb, _, sim = offload_case
    mem = frames.memory_frame(pb, sim)
    spec, rows = spec_and_rows(charts.memory_chart(mem, unit="GB", time_unit="ms"))
    assert spec["facet"]["field"] == "device" and spec["columns"] == 4
    limit, line, peak, over = spec["spec"]["layer"]  # the limit first: curves stay on top
    assert limit["mark"]["type"] == "rule" and limit["mark"]["strokeDash"]
    assert line["mark"]["type"] == "line" and line["mark"]["interpolate"] == "step-after"
    assert line["encoding"]["y"]["title"] == "activations (GB)"
    assert line["encoding"]["color"]["scale"]["domain"] == ["on device", "offloaded"]
    assert peak["transform"] == [{"filter": "datum.is_peak"}]
    assert "datum.value > datum.limit" in over["transform"][0]["filter"]
    assert len(rows) == len(mem)
    assert sum(r["is_peak"] for r in rows) == pb.num_stages


def test_solver_chart_spans_the_whole_solve() -> None:
    df = frames.solver_frame([(0.5, 0.60, 0.30), (1.5, 0.50, 0.45)], end=30.0)
    marks = frames.baseline_marks({"1f1b": 0.55, "zb-auto": 23.0}, 0.28, 0.62)
    spec = charts.solver_chart(
        df, marks, unit="s", x_end=30.0, y_domain=(0.28, 0.62), time_limit=30.0
    ).to_dict()
    layers = spec["layer"]
    lines = layers[0]
    assert lines["mark"]["interpolate"] == "step-after"
    assert lines["encoding"]["x"]["scale"]["domain"] == [0, pytest.approx(30.9)]
    assert lines["encoding"]["y"]["scale"]["domain"] == [0.28, 0.62]
    datasets = spec["datasets"]
    prog = datasets[lines["data"]["name"]]
    assert max(r["wall_time"] for r in prog) == 30.0  # the lines reach the end of the solve
    vlines = [datasets[x["data"]["name"]] for x in layers if x["mark"]["type"] == "rule"]
    assert [{"at": 30.0, "what": "end · time limit 30 s"}] in vlines
    refs = [d for d in vlines if d and "label" in d[0]]
    assert refs == [[{"makespan": 0.55, "label": "1f1b", "inside": True}]]
    assert spec["title"]["text"] == "baselines above the axis: zb-auto"
    running = charts.solver_chart(
        df, None, unit="s", x_end=12.0, y_domain=(0.2, 0.7), time_limit=60.0, finished=False
    ).to_dict()
    texts = [
        running["datasets"][x["data"]["name"]]
        for x in running["layer"]
        if x["mark"]["type"] == "text"
    ]
    assert [{"at": 12.0, "what": "now"}, {"at": 60.0, "what": "time limit 60 s"}] in texts


def test_compare_chart_rows_and_selection(offload_case: tuple) -> None:
    pb, _, sim = offload_case
    other = simulate(pb, generate("gpipe", pb))
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
    assert counts == {"offload": len(frames.timeline_frame(sim)), "plain": 6 * 4 * 2 * 2}


def test_schedule_summary(offload_case: tuple) -> None:
    pb, _, sim = offload_case
    row = frames.schedule_summary("x", pb, sim)
    assert row["makespan"] == pytest.approx(sim.makespan)
    assert row["peak_vs_limit"] == pytest.approx(
        max(sim.evaluation.peak_memory) / pb.memory_limits()[0]
    )
    assert row["num_offloaded"] == sim.evaluation.num_offloaded > 0
    summary = pd.DataFrame([row]).assign(makespan_display=row["makespan"] * 1e3)
    spec = charts.compare_metrics_chart(summary, unit="ms").to_dict()
    assert spec["encoding"]["x"]["field"] == "makespan_display"
    assert spec["encoding"]["x"]["title"] == "makespan (ms)"


def test_profile_chart_never_a_bare_tick() -> None:
    """Issue 27: a stage whose spread was tiny drew as a bare tick; a bar to the mean and a
    min-max whisker draw whatever the spread."""
    prof = demo_profile(3, 8, 2)
    df = frames.profile_frame(prof.stages, Unit("ms", 1e-3))
    assert len(df) == 3 * 2 * 3
    f00 = df[(df.stage == 0) & (df.chunk == 0) & (df.kind == "F")].iloc[0]
    assert f00["mean"] == pytest.approx(9.0)
    assert (f00["min"], f00["max"]) == pytest.approx((0.94 * 9.0, 1.09 * 9.0))
    spec, rows = spec_and_rows(profile_charts.profile_chart(df, unit="ms"))
    assert spec["facet"]["column"]["field"] == "chunk"
    bar, whisker = spec["spec"]["layer"]
    assert bar["mark"]["type"] == "bar" and bar["encoding"]["y"]["field"] == "mean"
    assert (whisker["encoding"]["y"]["field"], whisker["encoding"]["y2"]["field"]) == (
        "min",
        "max",
    )
    assert len(rows) == 18
    acts = frames.activation_frame(prof.stages)
    assert acts[(acts.what == "offloadable")]["bytes"].max() == pytest.approx(0.5e9)
    a_spec = profile_charts.activation_chart(
        acts.assign(value=acts["bytes"] / 1e9), unit="GB"
    ).to_dict()
    assert a_spec["encoding"]["xOffset"]["field"] == "what"
    assert a_spec["encoding"]["y"]["title"] == "bytes (GB)"


def test_training_charts() -> None:
    steps = [
        {"step": i, "measured_seconds": 0.5 + 0.01 * i, "predicted_seconds": 0.5,
         "peak_memory": [1e10, 1.1e10]}
        for i in range(6)
    ]  # fmt: skip
    events = tf.events_frame(
        [{"step": 3, "from_schedule_id": 1, "to_schedule_id": 2, "reason": "r",
          "predicted_before": 0.5, "predicted_after": 0.45}],
        [{"step": 2, "schedule_id": 1, "reason": "c", "predicted_before": 0.5,
          "predicted_after": 0.52}],
        {},
    )  # fmt: skip
    unit = tf.step_unit(steps)
    spec = training_charts.step_time_chart(
        tf.step_frame(steps, unit), events, unit=unit.name
    ).to_dict()
    lines, rules, text = spec["layer"]
    assert lines["encoding"]["color"]["scale"]["domain"] == ["measured", "predicted"]
    assert lines["encoding"]["y"]["title"] == "step time (ms)"
    assert rules["encoding"]["strokeDash"]["scale"]["domain"] == ["switch", "calibration"]
    assert [r["short"] for r in spec["datasets"][text["data"]["name"]]] == [
        "calibrated (+4.0%)",
        "→ #2 (-10.0%)",
    ]
    assert len(training_charts.step_time_chart(tf.step_frame(steps, unit)).to_dict()["layer"]) == 1
    loss = pd.DataFrame({"step": [0, 1, 1], "series": ["train", "train", "validation"],
                         "value": [3.0, 2.5, 2.7]})  # fmt: skip
    assert training_charts.loss_chart(loss).to_dict()["layer"][0]["encoding"]["color"]["scale"][
        "domain"
    ] == ["train", "validation"]
    thr = pd.DataFrame({"step": [0, 1], "value": [40.0, 41.0]})
    assert training_charts.throughput_chart(thr, what="tokens").to_dict()["encoding"]["y"][
        "title"
    ] == ("tokens / s")
    mu = tf.memory_unit(steps, {"memory_limit": [1.2e10, 1.2e10]})
    mem = tf.rank_memory_frame(steps, mu)
    lim = tf.limit_frame({"memory_limit": [1.2e10, 1.2e10]}, 2, mu)
    spec = training_charts.rank_memory_chart(mem, lim, unit=mu.name).to_dict()
    limit, lines = spec["layer"]
    assert limit["mark"]["type"] == "rule" and lines["encoding"]["color"]["field"] == "rank"
    assert spec["datasets"][limit["data"]["name"]][0]["limit"] == pytest.approx(12.0)


def test_specs_are_valid_json(offload_case: tuple) -> None:
    pb, _, sim = offload_case
    tl = frames.timeline_frame(sim)
    for chart in (
        charts.timeline_chart(tl),
        charts.busy_chart(frames.busy_frame(tl, float(tl["end"].max()))),
        charts.memory_chart(frames.memory_frame(pb, sim)),
    ):
        json.loads(chart.to_json())  # Altair validates against the Vega-Lite schema


def test_large_charts_draw_on_a_canvas() -> None:
    """Streamlit's frontend picks the canvas by itself only for layers without a transform;
    a Gantt whose layers filter (ops that waited for memory) must ask for it."""
    n = charts.NO_ARIA_ROWS + 1
    tl = pd.DataFrame(
        {
            "device": 0,
            "lane": "compute",
            "kind": "F",
            "micro": range(n),
            "chunk": 0,
            "start": [float(i) for i in range(n)],
            "end": [i + 1.0 for i in range(n)],
            "duration": 1.0,
            "waits_for": ["offload of mb 0"] + [""] * (n - 1),
        }
    )
    spec = charts.timeline_chart(tl).to_dict()
    assert spec["usermeta"] == {"embedOptions": {"renderer": "canvas"}}
    assert spec["config"]["mark"]["aria"] is False
    small = charts.timeline_chart(tl.head(100)).to_dict()
    assert "usermeta" not in small and "aria" not in small.get("config", {}).get("mark", {})
