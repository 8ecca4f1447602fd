"""Compare: several schedules of one problem on one time axis, with their numbers."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from optpipe_lightning.inspector import charts, data, frames, ui

MAX_DEFAULT = 4

url = ui.db_url()
st.title("Compare")
problem_hash = ui.pick_problem(url)
table = ui.load(data.schedules, url, problem_hash)
if table.empty:
    ui.empty("No schedules stored for this problem yet.")

table = table.sort_values("makespan_ms", na_position="last")
ids = [int(x) for x in table["id"]]
labels = {int(r.id): data.schedule_label(r) for r in table.itertuples()}
raw = st.query_params.get("schedules")
wanted = [int(x) for x in raw.split(",") if x.isdigit()] if raw else []
default = [i for i in wanted if i in ids] or ids[:MAX_DEFAULT]
chosen = st.multiselect(
    "schedules", ids, default=default, format_func=lambda i: labels[i], key="compare_ids"
)
st.query_params["schedules"] = ",".join(str(i) for i in chosen)
if not chosen:
    ui.empty("Pick at least one schedule.")

views = {i: ui.load(data.simulated, url, i) for i in chosen}
names = {i: f"#{i} {views[i]['summary']['schedule']}" for i in chosen}
summary = pd.DataFrame([{**views[i]["summary"], "schedule": names[i]} for i in chosen])
units = {views[i]["unit"] for i in chosen}
ui.dataframe(
    summary,
    column_config={
        "makespan_ms": st.column_config.NumberColumn("makespan (ms)", format="%.3f"),
        "bubble_rate": st.column_config.NumberColumn("bubble rate", format="percent"),
        "stage_span_bubble_rate": st.column_config.NumberColumn(
            "stage-span bubble", format="percent"
        ),
        "peak_memory": st.column_config.NumberColumn("peak memory (bytes)", format="%.3e"),
        "peak_vs_limit": st.column_config.NumberColumn("peak / limit", format="percent"),
        "num_offloaded": st.column_config.NumberColumn("offloaded"),
    },
)
ui.chart(charts.compare_metrics_chart(summary), key="compare_metrics")
st.caption(
    "Timelines on one time axis. Click a bar to follow its microbatch through every schedule; "
    "double-click clears."
)
stacked = frames.compare_frame({names[i]: views[i]["timeline"] for i in chosen})
if stacked.empty:
    ui.empty("None of these schedules can be timed.")
stacked = ui.windowed(stacked, key="compare_window")
ui.chart(charts.compare_chart(stacked, [names[i] for i in chosen]), key="compare_chart")
if len(units) > 1:
    st.caption("Peak memory is in bytes; per-schedule charts use their own units.")
