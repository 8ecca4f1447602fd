"""Training: measured step time against predicted, schedule switches, peak memory per rank."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from optpipe_lightning.inspector import charts, data, frames, ui

url = ui.db_url()
st.title("Training")
runs = ui.load(data.training_runs, url)
if runs.empty:
    ui.empty('No training runs in this database yet. Train with `Trainer(strategy="optpipe")`.')

ids = [int(x) for x in runs["id"]]
labels = {
    int(r.id): f"run #{r.id} · {r.model} on {r.device} · {r.status} · "
    f"started {pd.Timestamp(r.started_at):%Y-%m-%d %H:%M}"
    for r in runs.itertuples()
}
raw = st.query_params.get("run")
wanted = int(raw) if raw is not None and raw.isdigit() else None
run_id = st.selectbox(
    "training run",
    ids,
    index=ids.index(wanted) if wanted in ids else 0,
    format_func=lambda i: labels[i],
    key="training_run",
)
st.query_params["run"] = str(run_id)
run = ui.load(data.training, url, run_id)
steps, switches, memory = run["steps"], run["switches"], run["memory"]
if steps.empty:
    ui.empty("This run has recorded no steps yet.")

measured = steps[steps["series"] == "measured"]["seconds"]
predicted = steps[steps["series"] == "predicted"]["seconds"]
cols = st.columns(4)
cols[0].metric("steps", int(steps["step"].nunique()))
cols[1].metric("median step", f"{measured.median():.4f} s" if len(measured) else "–")
cols[2].metric("median predicted", f"{predicted.median():.4f} s" if len(predicted) else "–")
cols[3].metric("schedule switches", len(switches))

ui.chart(charts.training_chart(steps, switches), key="training_chart")
if len(memory):
    st.subheader("Peak memory per rank")
    unit = frames.byte_unit(float(memory["bytes"].max()))
    ui.chart(
        charts.rank_memory_chart(memory.assign(value=memory["bytes"] / unit.scale), unit=unit.name),
        key="rank_memory_chart",
    )
if len(switches):
    st.subheader("Schedule switches")
    ui.dataframe(switches)
