"""Compare: several schedules of one problem on one time axis, with their numbers."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from optpipe_lightning.inspector import charts, data, frames, ui
from optpipe_lightning.schedule.units import byte_unit, time_unit

MAX_DEFAULT = 4

url = ui.db_url()
st.title("Compare")
problem_hash = ui.pick_problem(url)
# its schedules of every chunking: those of the re-chunkings the solver and baselines ran too
table = ui.load(data.schedules, url, problem_hash, True)
if table.empty:
    ui.empty(
        "No schedules stored for this problem yet: `optpipe compare PROBLEM.json --db "
        f"{data.display_url(url)}` stores every row it prints."
    )

# the feasible schedules first (fastest first): what the default comparison shows
table = table.assign(_infeasible=~table["feasible"]).sort_values(
    ["_infeasible", "makespan"], na_position="last", kind="stable"
)
ids = [int(x) for x in table["id"]]
names = {int(r.id): str(r.label) for r in table.itertuples()}
raw = st.query_params.get("schedules")
wanted = [int(x) for x in raw.split(",") if x.isdigit()] if raw else []
unknown = [i for i in wanted if i not in ids]
if unknown:
    st.warning(
        "Not schedules of this problem (from the link): "
        + ", ".join(f"#{i}" for i in unknown)
        + ".",
        icon="🔎",
    )
fitting = [int(r.id) for r in table.itertuples() if r.feasible]
default = [i for i in wanted if i in ids] or fitting[:MAX_DEFAULT] or ids[:MAX_DEFAULT]
chosen = st.multiselect(
    "schedules", ids, default=default, format_func=lambda i: names[i], key="compare_ids"
)
st.query_params["schedules"] = ",".join(str(i) for i in chosen)
if not chosen:
    ui.empty("Pick at least one schedule.")

views = {i: ui.load(data.simulated, url, i) for i in chosen}
produced = dict(zip(table["id"], table["produced_by"], strict=True))
row_names = {i: f"#{i} {produced[i]}" for i in chosen}
summary = pd.DataFrame([{**views[i]["summary"], "schedule": row_names[i]} for i in chosen])
tu = time_unit(float(summary["makespan"].max(skipna=True) or 0.0))
bu = byte_unit(float(summary["peak_memory"].max(skipna=True) or 0.0))
summary = summary.assign(
    makespan_display=summary["makespan"] / tu.scale, peak_display=summary["peak_memory"] / bu.scale
)
ui.dataframe(
    summary[
        [
            "schedule",
            "makespan_display",
            "bubble_rate",
            "stage_span_bubble_rate",
            "peak_display",
            "peak_vs_limit",
            "num_offloaded",
            "feasible",
        ]
    ],
    column_config={
        "makespan_display": st.column_config.NumberColumn(f"makespan ({tu.name})", format="%.3f"),
        "bubble_rate": st.column_config.NumberColumn("bubble rate", format="percent"),
        "stage_span_bubble_rate": st.column_config.NumberColumn(
            "stage-span bubble", format="percent"
        ),
        "peak_display": st.column_config.NumberColumn(f"peak memory ({bu.name})", format="%.2f"),
        "peak_vs_limit": st.column_config.NumberColumn("peak / limit", format="percent"),
        "num_offloaded": st.column_config.NumberColumn("offloaded"),
        "feasible": st.column_config.CheckboxColumn("fits"),
    },
)
ui.chart(charts.compare_metrics_chart(summary, unit=tu.name), key="compare_metrics")
st.caption(
    "Timelines on one time axis. Click a bar to follow its microbatch through every schedule; "
    "double-click clears."
)


def in_unit(timeline: pd.DataFrame, scale: float) -> pd.DataFrame:
    """A timeline (in its own unit, ``scale`` seconds) in this page's time unit."""
    k = scale / tu.scale
    if k == 1.0 or timeline.empty:
        return timeline
    return timeline.assign(
        start=timeline["start"] * k, end=timeline["end"] * k, duration=timeline["duration"] * k
    )


stacked = frames.compare_frame(
    {row_names[i]: in_unit(views[i]["timeline"], views[i]["time_scale"]) for i in chosen}
)
if stacked.empty:
    ui.empty("None of these schedules can be timed.")
stacked = ui.windowed(stacked, key="compare_window", unit=tu.name)
ui.chart(
    charts.compare_chart(stacked, [row_names[i] for i in chosen], unit=tu.name),
    key="compare_chart",
)
