"""Altair charts of schedules, memory, solver runs, profiles and training runs.

Every function is pure: tidy data frames in (see ``frames``), an ``alt.Chart`` (or layered /
faceted chart) out, so each is tested through its Vega-Lite spec and data without a browser.
One colour per op kind on every chart (``KIND_DOMAIN`` / ``KIND_RANGE``).

Size: a 16 x 64 x 2 schedule with copies is ~6-10k bars. Streamlit sends the rows as Arrow and
its frontend draws more than 2,000 rows on a canvas, which stays interactive (zoom, tooltips) up
to ~20-30k bars in headless Chromium; microbatch labels are drawn only below ``LABEL_MAX_BARS``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeAlias

import altair as alt
import pandas as pd

AnyChart: TypeAlias = (
    alt.Chart
    | alt.LayerChart
    | alt.FacetChart
    | alt.ConcatChart
    | alt.VConcatChart
    | alt.HConcatChart
)

KIND_DOMAIN = ["F", "B", "W", "BW", "OFFLOAD", "RELOAD"]
KIND_RANGE = ["#4C78A8", "#F58518", "#54A24B", "#9D755D", "#72B7B2", "#B279A2"]
LANE_DOMAIN = ["compute", "copy"]
MEMORY_SERIES = ["on device", "offloaded"]
MEMORY_COLORS = ["#4C78A8", "#72B7B2"]
SOLVER_SERIES = ["incumbent", "lower bound"]
SOLVER_COLORS = ["#E45756", "#4C78A8"]
TRAINING_SERIES = ["measured", "predicted"]
TRAINING_COLORS = ["#E45756", "#4C78A8"]

LABEL_MAX_BARS = 1500  # microbatch labels above this would overlap and slow the canvas
ROW_STEP = 26  # pixels per device row (two lanes)


def kind_color(title: str = "op") -> alt.Color:
    """The one op-kind colour encoding shared by every timeline-like chart."""
    return alt.Color(
        "kind:N",
        title=title,
        scale=alt.Scale(domain=KIND_DOMAIN, range=KIND_RANGE),
        legend=alt.Legend(orient="top"),
    )


_TIMELINE_TOOLTIP = [
    alt.Tooltip("kind:N", title="op"),
    alt.Tooltip("device:O", title="stage"),
    alt.Tooltip("micro:O", title="microbatch"),
    alt.Tooltip("chunk:O", title="chunk"),
    alt.Tooltip("start_ms:Q", title="start (ms)", format=".3f"),
    alt.Tooltip("duration_ms:Q", title="duration (ms)", format=".3f"),
    alt.Tooltip("waits_for:N", title="waited for memory (copy)"),
]


def _bars(color: Any, *, outline: bool) -> alt.Chart:
    """Gantt bars; a thin white outline separates neighbours when bars are few enough to see
    it (stroking doubles the canvas work on large schedules)."""
    mark = (
        alt.Chart().mark_bar(stroke="white", strokeWidth=0.4) if outline else alt.Chart().mark_bar()
    )
    return mark.encode(
        x=alt.X("start_ms:Q", title="time (ms)", scale=alt.Scale(nice=False)),
        x2="end_ms:Q",
        y=alt.Y("device:O", title="stage", axis=alt.Axis(labelExpr="'stage ' + datum.value")),
        yOffset=alt.YOffset("lane:N", scale=alt.Scale(domain=LANE_DOMAIN)),
        color=color,
        tooltip=_TIMELINE_TOOLTIP,
    )


def timeline_chart(
    timeline: pd.DataFrame,
    *,
    title: str | None = None,
    labels: bool | None = None,
    width: int | str = "container",
) -> AnyChart:
    """Per-device Gantt: compute lane and copy lane per stage, colour by op kind.

    Zoom and pan on the time axis (mouse wheel / drag, double-click resets). Microbatch numbers
    are written on compute bars when there are at most ``LABEL_MAX_BARS`` bars (or ``labels``).
    """
    zoom = alt.selection_interval(bind="scales", encodings=["x"], name="zoom")
    few = len(timeline) <= LABEL_MAX_BARS
    bars = _bars(kind_color(), outline=few).add_params(zoom)
    layers: list[alt.Chart] = [bars]
    if labels is None:
        labels = few
    if labels:
        text = (
            alt.Chart()
            .transform_filter("datum.lane == 'compute'")
            .transform_calculate(mid="(datum.start_ms + datum.end_ms) / 2")
            .mark_text(fontSize=9, color="white", baseline="middle")
            .encode(
                x="mid:Q",
                y="device:O",
                yOffset=alt.YOffset("lane:N", scale=alt.Scale(domain=LANE_DOMAIN)),
                text="label:N",
            )
        )
        layers.append(text)
    chart = alt.layer(*layers, data=timeline).properties(width=width, height=alt.Step(ROW_STEP))
    if title:
        chart = chart.properties(title=title)
    return chart


def memory_chart(
    memory: pd.DataFrame, *, unit: str = "bytes", columns: int = 4, title: str | None = None
) -> AnyChart:
    """Per-device activation memory over time (step curve) against its limit.

    One small panel per device: on-device bytes and offloaded (host) bytes, the limit as a
    dashed red rule, the peak as a black triangle, any instant above the limit as red points.
    """
    series_color = alt.Color(
        "series:N",
        title=None,
        scale=alt.Scale(domain=MEMORY_SERIES, range=MEMORY_COLORS),
        legend=alt.Legend(orient="top"),
    )
    x = alt.X("time_ms:Q", title="time (ms)", scale=alt.Scale(nice=False))
    y = alt.Y("value:Q", title=f"activations ({unit})")
    lines = (
        alt.Chart()
        .mark_line(interpolate="step-after")
        .encode(
            x=x,
            y=y,
            color=series_color,
            tooltip=[
                alt.Tooltip("series:N"),
                alt.Tooltip("time_ms:Q", title="time (ms)", format=".3f"),
                alt.Tooltip("value:Q", title=unit, format=".4~g"),
            ],
        )
    )
    limit = (
        alt.Chart()
        .transform_filter("isValid(datum.limit)")
        .transform_aggregate(limit="max(limit)")
        .mark_rule(color="#D62728", strokeDash=[6, 3])
        .encode(y=alt.Y("limit:Q"), tooltip=[alt.Tooltip("limit:Q", title=f"limit ({unit})")])
    )
    peak = (
        alt.Chart()
        .transform_filter("datum.is_peak")
        .mark_point(shape="triangle-down", filled=True, size=70, color="black", yOffset=-6)
        .encode(
            x=x,
            y=y,
            tooltip=[
                alt.Tooltip("time_ms:Q", title="peak at (ms)", format=".3f"),
                alt.Tooltip("value:Q", title=f"peak ({unit})", format=".4~g"),
            ],
        )
    )
    over = (
        alt.Chart()
        .transform_filter(
            "datum.series == 'on device' && isValid(datum.limit) && datum.value > datum.limit"
        )
        .mark_point(shape="triangle-up", filled=True, size=40, color="#D62728")
        .encode(x=x, y=y)
    )
    layered = alt.layer(lines, limit, peak, over, data=memory).properties(width=220, height=120)
    chart = layered.facet(
        facet=alt.Facet(
            "device:O", title=None, header=alt.Header(labelExpr="'stage ' + datum.value")
        ),
        columns=columns,
    )
    if title:
        chart = chart.properties(title=title)
    return chart


def peak_memory_chart(
    peaks: pd.DataFrame, *, unit: str = "bytes", title: str | None = None
) -> AnyChart:
    """Peak activation memory per stage (bars) against each stage's limit (ticks).

    ``peaks`` has columns stage, peak, limit (limit may be missing / None), in ``unit``.
    """
    bars = (
        alt.Chart()
        .mark_bar(color=MEMORY_COLORS[0])
        .encode(
            x=alt.X("stage:O", title="stage", axis=alt.Axis(labelAngle=0)),
            y=alt.Y("peak:Q", title=f"peak ({unit})"),
            tooltip=[
                "stage:O",
                alt.Tooltip("peak:Q", format=".4~g"),
                alt.Tooltip("limit:Q", format=".4~g"),
            ],
        )
    )
    ticks = (
        alt.Chart()
        .transform_filter("isValid(datum.limit)")
        .mark_tick(color="#D62728", thickness=2, size=30)
        .encode(x="stage:O", y="limit:Q")
    )
    chart = alt.layer(bars, ticks, data=peaks).properties(width="container", height=180)
    if title:
        chart = chart.properties(title=title)
    return chart


def solver_chart(
    progress: pd.DataFrame,
    baselines: Mapping[str, float] | None = None,
    *,
    title: str | None = None,
) -> AnyChart:
    """Incumbent makespan and lower bound (ms) over solver wall time, baselines as dashed lines.

    ``progress`` is ``frames.solver_frame(...)``; ``baselines`` maps a baseline's name to its
    makespan in ms.
    """
    color = alt.Color(
        "series:N",
        title=None,
        scale=alt.Scale(domain=SOLVER_SERIES, range=SOLVER_COLORS),
        legend=alt.Legend(orient="top"),
    )
    y = alt.Y("makespan_ms:Q", title="makespan (ms)", scale=alt.Scale(zero=False))
    x = alt.X("wall_time:Q", title="solver wall time (s)")
    lines = (
        alt.Chart(progress)
        .mark_line(interpolate="step-after", point=True)
        .encode(
            x=x,
            y=y,
            color=color,
            tooltip=[
                alt.Tooltip("series:N"),
                alt.Tooltip("wall_time:Q", title="wall time (s)", format=".2f"),
                alt.Tooltip("makespan_ms:Q", title="ms", format=".4f"),
            ],
        )
    )
    layers: list[alt.Chart] = [lines]
    if baselines:
        ref = pd.DataFrame(
            {"baseline": list(baselines), "makespan_ms": [float(v) for v in baselines.values()]}
        )
        rules = (
            alt.Chart(ref)
            .mark_rule(strokeDash=[4, 4], color="gray")
            .encode(
                y="makespan_ms:Q",
                tooltip=[
                    alt.Tooltip("baseline:N"),
                    alt.Tooltip("makespan_ms:Q", title="makespan (ms)", format=".4f"),
                ],
            )
        )
        names = (
            alt.Chart(ref)
            .mark_text(align="left", dx=4, dy=-6, fontSize=10, color="gray")
            .encode(y="makespan_ms:Q", x=alt.value(0), text="baseline:N")
        )
        layers += [rules, names]
    chart = alt.layer(*layers).properties(width="container", height=320)
    if title:
        chart = chart.properties(title=title)
    return chart


def compare_chart(
    stacked: pd.DataFrame, order: Sequence[str] | None = None, *, width: int = 900
) -> AnyChart:
    """Several schedules' timelines, one row each, on one shared time axis.

    Click a bar to highlight that microbatch in every row (double-click clears).
    """
    pick = alt.selection_point(fields=["micro"], on="click", clear="dblclick", name="pick")
    color = alt.condition(pick, kind_color(), alt.value("#D0D0D0"))
    bars = (
        _bars(color, outline=len(stacked) <= LABEL_MAX_BARS)
        .add_params(pick)
        .properties(width=width, height=alt.Step(ROW_STEP // 2 + 4))
    )
    names = list(order) if order is not None else list(dict.fromkeys(stacked["schedule"]))
    return bars.facet(
        data=stacked,
        row=alt.Row(
            "schedule:N", sort=names, title=None, header=alt.Header(labelAngle=0, labelAlign="left")
        ),
    ).resolve_scale(x="shared", y="independent")


def compare_metrics_chart(summary: pd.DataFrame) -> AnyChart:
    """Makespan per schedule (bars), feasible ones coloured, bubble rate in the tooltip."""
    return (
        alt.Chart(summary)
        .mark_bar()
        .encode(
            y=alt.Y("schedule:N", sort=None, title=None),
            x=alt.X("makespan_ms:Q", title="makespan (ms)"),
            color=alt.Color(
                "feasible:N",
                scale=alt.Scale(domain=[True, False], range=["#4C78A8", "#D62728"]),
                legend=alt.Legend(orient="top", title="fits the memory limit"),
            ),
            tooltip=[
                "schedule:N",
                alt.Tooltip("makespan_ms:Q", format=".4f"),
                alt.Tooltip("bubble_rate:Q", format=".1%"),
                alt.Tooltip("stage_span_bubble_rate:Q", format=".1%"),
                "num_offloaded:Q",
            ],
        )
        .properties(width="container")
    )


def profile_chart(profile: pd.DataFrame, *, title: str | None = None) -> AnyChart:
    """Measured op time per stage and kind: min-max whisker, mean +- std box, mean tick.

    One panel per chunk. ``profile`` is ``frames.profile_frame(...)``.
    """
    x = alt.X("stage:O", title="stage", axis=alt.Axis(labelAngle=0))
    off = alt.XOffset("kind:N", scale=alt.Scale(domain=["F", "B", "W"]))
    col = alt.Color(
        "kind:N",
        title="op",
        scale=alt.Scale(domain=KIND_DOMAIN[:3], range=KIND_RANGE[:3]),
        legend=alt.Legend(orient="top"),
    )
    tip = [
        "stage:O",
        "chunk:O",
        "kind:N",
        alt.Tooltip("mean_ms:Q", format=".4f"),
        alt.Tooltip("std_ms:Q", format=".4f"),
        alt.Tooltip("min_ms:Q", format=".4f"),
        alt.Tooltip("max_ms:Q", format=".4f"),
        "samples:Q",
    ]
    whisker = (
        alt.Chart()
        .mark_rule()
        .encode(
            x=x,
            xOffset=off,
            y=alt.Y("min_ms:Q", title="op time (ms)"),
            y2="max_ms:Q",
            color=col,
            tooltip=tip,
        )
    )
    box = (
        alt.Chart()
        .mark_bar(size=8, opacity=0.6)
        .encode(x=x, xOffset=off, y="lo_std_ms:Q", y2="hi_std_ms:Q", color=col, tooltip=tip)
    )
    mean = (
        alt.Chart()
        .mark_tick(color="black", thickness=2, size=10)
        .encode(x=x, xOffset=off, y="mean_ms:Q", tooltip=tip)
    )
    chart = (
        alt.layer(whisker, box, mean, data=profile)
        .properties(width=520, height=240)
        .facet(
            column=alt.Column(
                "chunk:O", header=alt.Header(labelExpr="'chunk ' + datum.value"), title=None
            )
        )
    )
    if title:
        chart = chart.properties(title=title)
    return chart


def activation_chart(activations: pd.DataFrame, *, unit: str = "bytes") -> AnyChart:
    """Activation bytes per stage: total, the part only W frees, the part an offload moves."""
    return (
        alt.Chart(activations)
        .mark_bar()
        .encode(
            x=alt.X("stage:O", title="stage", axis=alt.Axis(labelAngle=0)),
            xOffset=alt.XOffset("what:N"),
            y=alt.Y("value:Q", title=f"bytes ({unit})"),
            color=alt.Color("what:N", title=None, legend=alt.Legend(orient="top")),
            column=alt.Column(
                "chunk:O", header=alt.Header(labelExpr="'chunk ' + datum.value"), title=None
            ),
            tooltip=["stage:O", "chunk:O", "what:N", alt.Tooltip("value:Q", format=".4~g")],
        )
        .properties(width=360, height=180)
    )


def training_chart(
    steps: pd.DataFrame, switches: pd.DataFrame | None = None, *, title: str | None = None
) -> AnyChart:
    """Measured step time against the schedule's predicted makespan, switches as rules.

    ``steps`` is ``frames.training_frame(...)``; ``switches`` has columns step, schedule.
    """
    color = alt.Color(
        "series:N",
        title=None,
        scale=alt.Scale(domain=TRAINING_SERIES, range=TRAINING_COLORS),
        legend=alt.Legend(orient="top"),
    )
    lines = (
        alt.Chart(steps)
        .mark_line(point=alt.OverlayMarkDef(size=20))
        .encode(
            x=alt.X("step:Q", title="optimizer step", axis=alt.Axis(tickMinStep=1, format="d")),
            y=alt.Y("seconds:Q", title="step time (s)", scale=alt.Scale(zero=False)),
            color=color,
            tooltip=["step:Q", "series:N", alt.Tooltip("seconds:Q", format=".4f")],
        )
    )
    layers: list[alt.Chart] = [lines]
    if switches is not None and len(switches):
        rules = (
            alt.Chart(switches)
            .mark_rule(strokeDash=[4, 3], color="#555")
            .encode(x="step:Q", tooltip=["step:Q", "schedule:N"])
        )
        text = (
            alt.Chart(switches)
            .mark_text(align="left", dx=3, dy=6, fontSize=10, color="#555", baseline="top")
            .encode(x="step:Q", y=alt.value(0), text="schedule:N")
        )
        layers += [rules, text]
    chart = alt.layer(*layers).properties(width="container", height=300)
    if title:
        chart = chart.properties(title=title)
    return chart


def rank_memory_chart(peaks: pd.DataFrame, *, unit: str = "bytes") -> AnyChart:
    """Peak memory per rank over steps (columns step, rank, value)."""
    return (
        alt.Chart(peaks)
        .mark_line(point=True)
        .encode(
            x=alt.X("step:Q", title="optimizer step", axis=alt.Axis(tickMinStep=1, format="d")),
            y=alt.Y("value:Q", title=f"peak memory ({unit})"),
            color=alt.Color("rank:N", title="rank"),
            tooltip=["step:Q", "rank:N", alt.Tooltip("value:Q", format=".4~g")],
        )
        .properties(width="container", height=220)
    )
