"""Altair charts of schedules, memory and solver runs (profiles: ``profile_charts``; training
runs: ``training_charts``).

Every function is pure: tidy data frames in (see ``frames``), an ``alt.Chart`` (or layered /
faceted chart) out, so each is tested through its Vega-Lite spec and data without a browser.
One colour per op kind on every chart (``KIND_DOMAIN`` / ``KIND_RANGE``); a legend lists only
the kinds the data has. Axis titles carry the unit the data is in.

Size: a 16 x 64 x 2 schedule with copies is ~6-10k bars. Streamlit sends the rows as Arrow and
its frontend draws more than 2,000 rows on a canvas, which stays interactive (zoom, tooltips) up
to ~20-30k bars in headless Chromium; microbatch labels are drawn only below ``LABEL_MAX_BARS``.
"""

from __future__ import annotations

from collections.abc import Sequence
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
LANE_ORDER = ["compute", "device → host", "host → device"]
MEMORY_SERIES = ["on device", "offloaded"]
MEMORY_COLORS = ["#4C78A8", "#72B7B2"]
SOLVER_SERIES = ["incumbent", "lower bound"]
SOLVER_COLORS = ["#E45756", "#4C78A8"]
LIMIT_COLOR = "#D62728"
EVENT_COLOR = "#555555"

CANVAS_ROWS = (
    2000  # above this a chart is drawn on a canvas (SVG slows down past a few 1,000 marks)
)
NO_ARIA_ROWS = 5000  # above this marks get no ARIA labels (building them costs more than drawing)
LABEL_MAX_BARS = 1500  # microbatch labels above this would overlap and slow the canvas
Y_LABELS = 120  # pixels for row labels: the busy strips and the Gantt line up their time axes
ROW_STEP = 24  # pixels per device row without copy lanes
LANE_STEP = 15  # pixels per lane when a device row has copy lanes


def _fast(chart: Any, rows: int) -> Any:
    """Canvas rendering (and no per-mark ARIA) for charts of many rows, as Streamlit's frontend
    chooses by itself only for layers without a transform (ours filter their data)."""
    if rows > CANVAS_ROWS:
        chart = chart.properties(usermeta={"embedOptions": {"renderer": "canvas"}})
    if rows > NO_ARIA_ROWS:
        chart = chart.configure_mark(aria=False)
    return chart


def kind_color(present: Sequence[str] | None = None, *, title: str = "op") -> alt.Color:
    """The op-kind colour encoding shared by every timeline-like chart: fixed colours, a legend
    of the kinds in ``present`` only (all kinds when None)."""
    kinds = [k for k in KIND_DOMAIN if present is None or k in set(present)]
    return alt.Color(
        "kind:N",
        title=title,
        scale=alt.Scale(domain=kinds, range=[KIND_RANGE[KIND_DOMAIN.index(k)] for k in kinds]),
        legend=alt.Legend(orient="top"),
    )


def _lanes(timeline: pd.DataFrame) -> list[str]:
    present = set(timeline["lane"]) if len(timeline) else {"compute"}
    return [lane for lane in LANE_ORDER if lane in present]


def _tooltip(unit: str, waits: bool) -> list[alt.Tooltip]:
    tips = [
        alt.Tooltip("kind:N", title="op"),
        alt.Tooltip("device:O", title="stage"),
        alt.Tooltip("micro:O", title="microbatch"),
        alt.Tooltip("chunk:O", title="chunk"),
        alt.Tooltip("start:Q", title=f"start ({unit})", format=".3f"),
        alt.Tooltip("end:Q", title=f"end ({unit})", format=".3f"),
    ]
    if waits:
        tips.append(alt.Tooltip("waits_for:N", title="waited for memory (copy)"))
    return tips


def _bars(
    color: Any, *, unit: str, lanes: list[str], outline: bool, waits: bool = False
) -> alt.Chart:
    """Gantt bars; a thin white outline separates neighbours when bars are few enough to see
    it (stroking doubles the canvas work on large schedules)."""
    mark = (
        alt.Chart().mark_bar(stroke="white", strokeWidth=0.4) if outline else alt.Chart().mark_bar()
    )
    return mark.encode(
        x=alt.X("start:Q", title=f"time ({unit})", scale=alt.Scale(nice=False)),
        x2="end:Q",
        y=alt.Y(
            "device:O",
            title=None,
            axis=alt.Axis(labelExpr="'stage ' + datum.value", minExtent=Y_LABELS),
        ),
        yOffset=alt.YOffset("lane:N", scale=alt.Scale(domain=lanes)),
        color=color,
        tooltip=_tooltip(unit, waits),
    )


GANTT_COLUMNS = ["device", "lane", "kind", "micro", "chunk", "start", "end", "waits_for"]


def _compact(timeline: pd.DataFrame) -> pd.DataFrame:
    """Only the columns the Gantt draws, integers in their smallest type and the labels as
    categories: the browser decodes every cell of the Arrow data before Vega draws (a fifth of
    the first view's script time on an 8,000-op schedule)."""
    out = timeline[[c for c in GANTT_COLUMNS if c in timeline.columns]].copy()
    for col in ("device", "micro", "chunk"):
        if col in out.columns and len(out):
            out[col] = pd.to_numeric(out[col], downcast="integer")
    for col in ("lane", "kind"):
        if col in out.columns:
            out[col] = out[col].astype("category")
    return out


def timeline_chart(
    timeline: pd.DataFrame,
    *,
    unit: str = "ms",
    title: str | None = None,
    labels: bool | None = None,
    width: int | str = "container",
) -> AnyChart:
    """Per-device Gantt: a compute lane per stage and, when the schedule copies, a
    device → host lane (OFFLOAD) and a host → device lane (RELOAD) under it; colour by op kind.

    Zoom and pan on the time axis (mouse wheel / drag, double-click resets). The few F that
    waited for an offload to free memory say so in their tooltip. Microbatch numbers are
    written on compute bars when there are at most ``LABEL_MAX_BARS`` bars (or ``labels``).
    """
    zoom = alt.selection_interval(bind="scales", encodings=["x"], name="zoom")
    few = len(timeline) <= LABEL_MAX_BARS
    lanes = _lanes(timeline)
    color = kind_color(sorted(set(timeline["kind"])) if len(timeline) else None)
    # every bar from one dataset without transforms (the cheapest for Vega to draw); the few
    # ops that waited for memory again on top, from their own small dataset, with the wait in
    # their tooltip
    if "waits_for" in timeline.columns:
        waited_rows = timeline[timeline["waits_for"] != ""]
        timeline = timeline.drop(columns=["waits_for"])
    else:
        waited_rows = timeline.iloc[:0]
    timeline = _compact(timeline)
    waited_rows = _compact(waited_rows)
    layers: list[alt.Chart] = [
        _bars(color, unit=unit, lanes=lanes, outline=few).properties(data=timeline).add_params(zoom)
    ]
    if len(waited_rows):
        waited = _bars(color, unit=unit, lanes=lanes, outline=few, waits=True)
        layers.append(waited.properties(data=waited_rows))
    if labels is None:
        labels = few
    if labels:
        text = (
            alt.Chart()
            .transform_filter("datum.lane == 'compute'")
            .transform_calculate(mid="(datum.start + datum.end) / 2")
            .mark_text(fontSize=9, color="white", baseline="middle")
            .encode(
                x="mid:Q",
                y="device:O",
                yOffset=alt.YOffset("lane:N", scale=alt.Scale(domain=lanes)),
                text="micro:N",
            )
            .properties(data=timeline)
        )
        layers.append(text)
    row = LANE_STEP if len(lanes) > 1 else ROW_STEP  # the step is per lane
    chart = alt.layer(*layers).properties(width=width, height=alt.Step(row))
    if title:
        chart = chart.properties(title=title)
    return _fast(chart, len(timeline))


def busy_chart(busy: pd.DataFrame, *, unit: str = "ms", width: int | str = "container") -> AnyChart:
    """How busy each stage computes over the iteration: one strip per stage, time slices
    shaded from idle (white) to busy (dark), the stage's idle share in its label.

    ``busy`` is ``frames.busy_frame(...)``; it has a fixed size (stages x slices) whatever the
    number of ops, so it draws at once where the detailed Gantt has thousands of bars.
    """
    order = list(dict.fromkeys(busy.sort_values("device")["stage"])) if len(busy) else []
    chart = (
        alt.Chart(busy)
        .mark_rect()
        .encode(
            x=alt.X("t0:Q", title=f"time ({unit})", scale=alt.Scale(nice=False)),
            x2="t1:Q",
            y=alt.Y("stage:N", title=None, sort=order, axis=alt.Axis(minExtent=Y_LABELS)),
            color=alt.Color(
                "busy:Q",
                title="busy",
                scale=alt.Scale(domain=[0, 1], range=["#F2F2F2", "#1F3B5A"]),
                legend=None,  # the caption says it: the detail below keeps the same width
            ),
            tooltip=[
                alt.Tooltip("stage:N"),
                alt.Tooltip("t0:Q", title=f"from ({unit})", format=".3f"),
                alt.Tooltip("t1:Q", title=f"to ({unit})", format=".3f"),
                alt.Tooltip("busy:Q", title="busy", format=".0%"),
            ],
        )
        .properties(width=width, height=alt.Step(13))
    )
    return _fast(chart, CANVAS_ROWS + 1)  # a canvas whatever its size: a strip of cells


def memory_chart(
    memory: pd.DataFrame,
    *,
    unit: str = "GB",
    time_unit: str = "ms",
    columns: int = 4,
    title: str | None = None,
) -> AnyChart:
    """Per-device activation memory over time (step curve) against its limit.

    One small panel per device: the limit as a dashed red rule drawn first (a curve that runs
    on the limit stays visible on top of it), on-device bytes and, when the schedule offloads,
    the bytes sitting on the host; the peak as a black triangle, any instant above the limit
    as red points.
    """
    series = [s for s in MEMORY_SERIES if len(memory) and s in set(memory["series"])]
    series_color = alt.Color(
        "series:N",
        title=None,
        scale=alt.Scale(
            domain=series or MEMORY_SERIES[:1],
            range=[MEMORY_COLORS[MEMORY_SERIES.index(s)] for s in series or MEMORY_SERIES[:1]],
        ),
        legend=alt.Legend(orient="top"),
    )
    x = alt.X("time:Q", title=f"time ({time_unit})", scale=alt.Scale(nice=False))
    y = alt.Y("value:Q", title=f"activations ({unit})")
    limit = (
        alt.Chart()
        .transform_filter("isValid(datum.limit)")
        .transform_aggregate(limit="max(limit)")
        .mark_rule(color=LIMIT_COLOR, strokeDash=[6, 3], opacity=0.8)
        .encode(y=alt.Y("limit:Q"), tooltip=[alt.Tooltip("limit:Q", title=f"limit ({unit})")])
    )
    lines = (
        alt.Chart()
        .mark_line(interpolate="step-after", strokeWidth=1.6)
        .encode(
            x=x,
            y=y,
            color=series_color,
            tooltip=[
                alt.Tooltip("series:N"),
                alt.Tooltip("time:Q", title=f"time ({time_unit})", format=".3f"),
                alt.Tooltip("value:Q", title=unit, format=".3f"),
            ],
        )
    )
    peak = (
        alt.Chart()
        .transform_filter("datum.is_peak")
        .mark_point(shape="triangle-down", filled=True, size=70, color="black", yOffset=-6)
        .encode(
            x=x,
            y=y,
            tooltip=[
                alt.Tooltip("time:Q", title=f"peak at ({time_unit})", format=".3f"),
                alt.Tooltip("value:Q", title=f"peak ({unit})", format=".3f"),
            ],
        )
    )
    over = (
        alt.Chart()
        .transform_filter(
            "datum.series == 'on device' && isValid(datum.limit) && datum.value > datum.limit"
        )
        .mark_point(shape="triangle-up", filled=True, size=40, color=LIMIT_COLOR)
        .encode(x=x, y=y)
    )
    layered = alt.layer(limit, lines, peak, over, data=memory).properties(width=205, height=120)
    chart = layered.facet(
        facet=alt.Facet(
            "device:O", title=None, header=alt.Header(labelExpr="'stage ' + datum.value")
        ),
        columns=columns,
    )
    if title:
        chart = chart.properties(title=title)
    return _fast(chart, len(memory))


def peak_memory_chart(
    peaks: pd.DataFrame, *, unit: str = "GB", title: str | None = None
) -> AnyChart:
    """Peak activation memory per stage (bars) against each stage's limit (red ticks).

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
                alt.Tooltip("peak:Q", title=f"peak ({unit})", format=".3f"),
                alt.Tooltip("limit:Q", title=f"limit ({unit})", format=".3f"),
            ],
        )
    )
    ticks = (
        alt.Chart()
        .transform_filter("isValid(datum.limit)")
        .mark_tick(color=LIMIT_COLOR, thickness=2, size=30)
        .encode(x="stage:O", y="limit:Q")
    )
    chart = alt.layer(bars, ticks, data=peaks).properties(width="container", height=180)
    if title:
        chart = chart.properties(title=title)
    return chart


def solver_chart(
    progress: pd.DataFrame,
    marks: pd.DataFrame | None = None,
    *,
    unit: str = "ms",
    x_end: float,
    y_domain: tuple[float, float],
    time_limit: float | None = None,
    finished: bool = True,
    title: str | None = None,
) -> AnyChart:
    """Incumbent makespan and lower bound over the whole solve (x from 0 to ``x_end``: the
    run's end, or now while it runs), the time limit and the end as vertical rules.

    The y-axis spans ``y_domain`` (incumbent and bound only); ``marks`` are baseline reference
    lines from ``frames.baseline_marks`` (those outside the axis as one label on its edge).
    ``progress`` is ``frames.solver_frame(...)`` with makespans in ``unit``.
    """
    color = alt.Color(
        "series:N",
        title=None,
        scale=alt.Scale(domain=SOLVER_SERIES, range=SOLVER_COLORS),
        legend=alt.Legend(orient="top"),
    )
    y_scale = alt.Scale(domain=list(y_domain), zero=False, nice=False, clamp=True)
    y = alt.Y("makespan:Q", title=f"makespan ({unit})", scale=y_scale)
    x_max = max(x_end, time_limit or 0.0) * 1.03 or 1.0
    x = alt.X("wall_time:Q", title="solver wall time (s)", scale=alt.Scale(domain=[0, x_max]))
    lines = alt.Chart(progress).mark_line(interpolate="step-after").encode(x=x, y=y, color=color)
    points = (
        alt.Chart(progress)
        .transform_filter("datum.event")
        .mark_point(filled=True, size=30)
        .encode(
            x=x,
            y=y,
            color=color,
            tooltip=[
                alt.Tooltip("series:N"),
                alt.Tooltip("wall_time:Q", title="wall time (s)", format=".2f"),
                alt.Tooltip("makespan:Q", title=unit, format=".3f"),
            ],
        )
    )
    layers: list[alt.Chart] = [lines, points]
    end_name = "end" if finished else "now"
    vlines = [{"at": x_end, "what": end_name}]
    if time_limit and abs(time_limit - x_end) < 0.1 * x_max:  # one label where both would meet
        vlines = [{"at": x_end, "what": f"{end_name} · time limit {time_limit:g} s"}]
    elif time_limit:
        vlines.append({"at": float(time_limit), "what": f"time limit {time_limit:g} s"})
    vl = pd.DataFrame(vlines)
    layers.append(
        alt.Chart(vl)
        .mark_rule(strokeDash=[2, 3], color=EVENT_COLOR)
        .encode(x="at:Q", tooltip=[alt.Tooltip("what:N"), alt.Tooltip("at:Q", format=".2f")])
    )
    layers.append(
        alt.Chart(vl)
        .mark_text(align="right", baseline="top", dx=-3, dy=3, fontSize=10, color=EVENT_COLOR)
        .encode(x="at:Q", y=alt.value(0), text="what:N")
    )
    edge = ""
    if marks is not None and len(marks):
        inside = marks[marks["inside"]]
        layers.append(
            alt.Chart(inside)
            .mark_rule(strokeDash=[4, 4], color="gray")
            .encode(y=alt.Y("makespan:Q", scale=y_scale), tooltip=["label:N"])
        )
        layers.append(
            alt.Chart(inside)
            .mark_text(align="left", dx=4, dy=-6, fontSize=10, color="gray")
            .encode(y=alt.Y("makespan:Q", scale=y_scale), x=alt.value(0), text="label:N")
        )
        edge = "   ".join(marks[~marks["inside"]]["label"])
    chart = alt.layer(*layers).properties(width="container", height=320)
    if edge:  # in the title: a label at the axis's edge would sit on the curves
        chart = chart.properties(
            title=alt.TitleParams(
                text=title or f"baselines {edge}",
                subtitle=f"baselines {edge}" if title else [],
                anchor="start",
                fontSize=11 if not title else 13,
                fontWeight="normal" if not title else "bold",
                color="gray" if not title else "black",
                subtitleColor="gray",
            )
        )
    elif title:
        chart = chart.properties(title=title)
    return chart


COMPARE_WIDTH = 800  # px of time axis: with the stage axis it fits a 980 px wide column


def compare_chart(
    stacked: pd.DataFrame,
    order: Sequence[str] | None = None,
    *,
    unit: str = "ms",
    width: int = COMPARE_WIDTH,
) -> AnyChart:
    """Several schedules' timelines, one row each, on one shared time axis.

    Each row's name sits above it (not beside it), so the chart is ``width`` plus the stage
    axis wide whatever the names: it fits the page's column. Click a bar to highlight that
    microbatch in every row (double-click clears).
    """
    pick = alt.selection_point(fields=["micro"], on="click", clear="dblclick", name="pick")
    present = sorted(set(stacked["kind"])) if len(stacked) else None
    color = alt.condition(pick, kind_color(present), alt.value("#D0D0D0"))
    bars = (
        _bars(color, unit=unit, lanes=_lanes(stacked), outline=len(stacked) <= LABEL_MAX_BARS)
        .add_params(pick)
        .properties(width=width, height=alt.Step(ROW_STEP // 2 + 4))
    )
    names = list(order) if order is not None else list(dict.fromkeys(stacked["schedule"]))
    chart = bars.facet(
        data=stacked,
        row=alt.Row(
            "schedule:N",
            sort=names,
            title=None,
            header=alt.Header(
                labelAngle=0, labelOrient="top", labelAnchor="start", labelAlign="left"
            ),
        ),
    ).resolve_scale(x="shared", y="independent")
    return _fast(chart, len(stacked))


def compare_metrics_chart(summary: pd.DataFrame, *, unit: str = "ms") -> AnyChart:
    """Makespan per schedule (bars in ``summary["makespan_display"]``), feasible ones coloured,
    bubble rate in the tooltip."""
    fits = [x for x in (True, False) if len(summary) and x in set(summary["feasible"])] or [True]
    colors = {True: "#4C78A8", False: LIMIT_COLOR}
    return (
        alt.Chart(summary)
        .mark_bar()
        .encode(
            y=alt.Y("schedule:N", sort=None, title=None),
            x=alt.X("makespan_display:Q", title=f"makespan ({unit})"),
            color=alt.Color(
                "feasible:N",
                scale=alt.Scale(domain=fits, range=[colors[x] for x in fits]),
                legend=alt.Legend(orient="top", title="fits the memory limit"),
            ),
            tooltip=[
                "schedule:N",
                alt.Tooltip("makespan_display:Q", title=f"makespan ({unit})", format=".3f"),
                alt.Tooltip("bubble_rate:Q", format=".1%"),
                alt.Tooltip("stage_span_bubble_rate:Q", format=".1%"),
                "num_offloaded:Q",
            ],
        )
        .properties(width="container")
    )
