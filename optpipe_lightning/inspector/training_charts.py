"""Altair charts of a training run: step time (measured and predicted), loss, throughput and
peak memory per rank, with each schedule switch and re-calibration marked.

Pure functions of the frames in ``training_frames`` (same conventions as ``charts``).
"""

from __future__ import annotations

import altair as alt
import pandas as pd

from .charts import EVENT_COLOR, LIMIT_COLOR, AnyChart

TRAINING_SERIES = ["measured", "predicted"]
TRAINING_COLORS = ["#E45756", "#4C78A8"]
LOSS_SERIES = ["train", "validation"]
LOSS_COLORS = ["#4C78A8", "#F58518"]

_STEP_X = alt.X("step:Q", title="optimizer step", axis=alt.Axis(tickMinStep=1, format="d"))


def _event_layers(events: pd.DataFrame | None) -> list[alt.Chart]:
    """Vertical rules at schedule switches (solid) and re-calibrations (dotted), labelled."""
    if events is None or not len(events):
        return []
    rules = (
        alt.Chart(events)
        .mark_rule(color=EVENT_COLOR)
        .encode(
            x="step:Q",
            strokeDash=alt.StrokeDash(
                "kind:N",
                scale=alt.Scale(domain=["switch", "calibration"], range=[[1, 0], [2, 3]]),
                legend=alt.Legend(orient="top", title=None),
            ),
            tooltip=[
                "step:Q",
                "kind:N",
                alt.Tooltip("what:N", title="schedule"),
                alt.Tooltip("gain:N", title="predicted"),
                "reason:N",
            ],
        )
    )
    text = (
        alt.Chart(events)
        .mark_text(align="left", dx=3, dy=4, fontSize=10, color=EVENT_COLOR, baseline="top")
        .encode(x="step:Q", y=alt.Y("label_y:Q", scale=None), text="short:N")
    )
    return [rules, text]


def step_time_chart(
    steps: pd.DataFrame, events: pd.DataFrame | None = None, *, unit: str = "s"
) -> AnyChart:
    """Measured step time against the running schedule's predicted one, with the schedule
    switches and re-calibrations as labelled rules. ``steps``: step, series, value (``unit``)."""
    color = alt.Color(
        "series:N",
        title=None,
        scale=alt.Scale(domain=TRAINING_SERIES, range=TRAINING_COLORS),
        legend=alt.Legend(orient="top"),
    )
    lines = (
        alt.Chart(steps)
        .mark_line(point=alt.OverlayMarkDef(size=16), interpolate="step-after")
        .encode(
            x=_STEP_X,
            y=alt.Y("value:Q", title=f"step time ({unit})", scale=alt.Scale(zero=False)),
            color=color,
            tooltip=["step:Q", "series:N", alt.Tooltip("value:Q", title=unit, format=".3f")],
        )
    )
    chart = alt.layer(lines, *_event_layers(events)).properties(width="container", height=260)
    return chart.resolve_scale(strokeDash="independent")


def loss_chart(loss: pd.DataFrame, events: pd.DataFrame | None = None) -> AnyChart:
    """Training loss per step and the validation loss where it was measured."""
    color = alt.Color(
        "series:N",
        title=None,
        scale=alt.Scale(domain=LOSS_SERIES, range=LOSS_COLORS),
        legend=alt.Legend(orient="top"),
    )
    lines = (
        alt.Chart(loss)
        .mark_line(point=alt.OverlayMarkDef(size=18))
        .encode(
            x=_STEP_X,
            y=alt.Y("value:Q", title="loss", scale=alt.Scale(zero=False)),
            color=color,
            tooltip=["step:Q", "series:N", alt.Tooltip("value:Q", title="loss", format=".4f")],
        )
    )
    return alt.layer(lines, *_event_layers(events)).properties(width="container", height=220)


def throughput_chart(throughput: pd.DataFrame, *, what: str = "samples") -> AnyChart:
    """Samples (or tokens) per second of each step."""
    return (
        alt.Chart(throughput)
        .mark_line(point=alt.OverlayMarkDef(size=16), color="#54A24B")
        .encode(
            x=_STEP_X,
            y=alt.Y("value:Q", title=f"{what} / s", scale=alt.Scale(zero=False)),
            tooltip=["step:Q", alt.Tooltip("value:Q", title=f"{what} / s", format=",.1f")],
        )
        .properties(width="container", height=180)
    )


def rank_memory_chart(
    peaks: pd.DataFrame, limits: pd.DataFrame | None = None, *, unit: str = "GB"
) -> AnyChart:
    """Peak memory per rank over steps (columns step, rank, value) against each rank's limit
    (``limits``: rank, limit, what; a dashed red rule)."""
    lines = (
        alt.Chart(peaks)
        .mark_line(point=alt.OverlayMarkDef(size=14))
        .encode(
            x=_STEP_X,
            y=alt.Y("value:Q", title=f"peak memory ({unit})", scale=alt.Scale(zero=False)),
            color=alt.Color("rank:N", title="rank", legend=alt.Legend(orient="top")),
            tooltip=["step:Q", "rank:N", alt.Tooltip("value:Q", title=unit, format=".3f")],
        )
    )
    layers: list[alt.Chart] = []
    if limits is not None and len(limits):
        layers.append(
            alt.Chart(limits)
            .mark_rule(color=LIMIT_COLOR, strokeDash=[6, 3], strokeWidth=1.5)
            .encode(
                y="limit:Q",
                tooltip=[
                    "rank:N",
                    alt.Tooltip("what:N", title="limit"),
                    alt.Tooltip("limit:Q", title=unit, format=".3f"),
                ],
            )
        )
    layers.append(lines)
    return alt.layer(*layers).properties(width="container", height=220)
