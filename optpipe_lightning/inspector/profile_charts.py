"""Altair charts of a measured profile: op times per stage (with their spread), the bytes each
op leaves allocated, activation bytes per stage.

Pure functions of the frames in ``frames`` (same conventions as ``charts``).
"""

from __future__ import annotations

import altair as alt
import pandas as pd

from .charts import KIND_DOMAIN, KIND_RANGE, AnyChart


def profile_chart(profile: pd.DataFrame, *, unit: str = "ms", title: str | None = None) -> AnyChart:
    """Measured op time per stage and kind: a bar to the mean, a whisker from min to max, a
    black tick at mean + std. One panel per chunk. ``profile`` is ``frames.profile_frame(...)``.
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
        alt.Tooltip("mean:Q", title=f"mean ({unit})", format=".3f"),
        alt.Tooltip("std:Q", title=f"std ({unit})", format=".3f"),
        alt.Tooltip("min:Q", title=f"min ({unit})", format=".3f"),
        alt.Tooltip("max:Q", title=f"max ({unit})", format=".3f"),
        "samples:Q",
    ]
    bar = (
        alt.Chart()
        .mark_bar(opacity=0.9)
        .encode(
            x=x, xOffset=off, y=alt.Y("mean:Q", title=f"op time ({unit})"), color=col, tooltip=tip
        )
    )
    whisker = (
        alt.Chart()
        .mark_rule(color="black", strokeWidth=1.2)
        .encode(x=x, xOffset=off, y="min:Q", y2="max:Q", tooltip=tip)
    )
    chunks = max(int(profile["chunk"].nunique()) if len(profile) else 1, 1)
    chart = (
        alt.layer(bar, whisker, data=profile)
        .properties(width=max(240, 860 // chunks - 30), height=240)
        .facet(
            column=alt.Column(
                "chunk:O", header=alt.Header(labelExpr="'chunk ' + datum.value"), title=None
            )
        )
    )
    if title:
        chart = chart.properties(title=title)
    return chart


def op_memory_chart(op_memory: pd.DataFrame, *, unit: str = "GB") -> AnyChart:
    """Bytes each op leaves allocated per stage (``frames.op_memory_frame``, its byte columns in
    ``unit``): the profiler's measurement beside the rule, where the profile has one."""
    long = op_memory.melt(
        id_vars=["stage", "chunk", "op"],
        value_vars=["measured", "rule"],
        var_name="source",
        value_name="value",
    ).dropna(subset=["value"])
    return (
        alt.Chart(long)
        .mark_bar()
        .encode(
            x=alt.X("op:N", title=None, sort=["F", "B", "W", "BW"]),
            xOffset=alt.XOffset("source:N", sort=["measured", "rule"]),
            y=alt.Y("value:Q", title=f"bytes left allocated ({unit})"),
            color=alt.Color(
                "source:N",
                title=None,
                scale=alt.Scale(domain=["measured", "rule"], range=["#4C78A8", "#A0A0A0"]),
                legend=alt.Legend(orient="top"),
            ),
            column=alt.Column("stage:O", header=alt.Header(labelExpr="'stage ' + datum.value")),
            row=alt.Row("chunk:O", header=alt.Header(labelExpr="'chunk ' + datum.value")),
            tooltip=[
                "stage:O",
                "chunk:O",
                "op:N",
                "source:N",
                alt.Tooltip("value:Q", title=unit, format=".3f"),
            ],
        )
        .properties(width=110, height=150)
    )


def activation_chart(activations: pd.DataFrame, *, unit: str = "GB") -> AnyChart:
    """Activation bytes per stage: total, the part only W frees, the part an offload moves."""
    return (
        alt.Chart(activations)
        .mark_bar()
        .encode(
            x=alt.X("stage:O", title="stage", axis=alt.Axis(labelAngle=0)),
            xOffset=alt.XOffset("what:N"),
            y=alt.Y("value:Q", title=f"bytes ({unit})"),
            color=alt.Color(
                "what:N",
                title=None,
                scale=alt.Scale(
                    domain=["activation", "weight-grad part", "offloadable"],
                    range=["#4C78A8", "#A0A0A0", KIND_RANGE[4]],
                ),
                legend=alt.Legend(orient="top"),
            ),
            column=alt.Column(
                "chunk:O", header=alt.Header(labelExpr="'chunk ' + datum.value"), title=None
            ),
            tooltip=[
                "stage:O",
                "chunk:O",
                "what:N",
                alt.Tooltip("value:Q", title=unit, format=".3f"),
            ],
        )
        .properties(
            width=max(240, 860 // max(int(activations["chunk"].nunique()), 1) - 30), height=180
        )
    )
