"""Training: loss, throughput, measured against predicted step time with every schedule switch
and re-calibration, and peak memory per rank against the limit."""

from __future__ import annotations

import streamlit as st

from optpipe_lightning.inspector import data, training_charts, ui
from optpipe_lightning.inspector import training_frames as tf

url = ui.db_url()
st.title("Training")
runs = ui.load(data.training_runs, url)
if runs.empty:
    ui.empty('No training runs in this database yet. Train with `Trainer(strategy="optpipe")`.')

run_id = int(
    ui.pick(
        "training run",
        [int(x) for x in runs["id"]],
        list(runs["label"]),
        key="training_run",
        param="run",
    )
)
run = ui.load(data.training, url, run_id)
detail, steps, metrics = run["detail"], run["steps"], run["metrics"]
if not steps:
    st.metric("status", detail["status"])
    ui.empty("This run has recorded no steps yet.")

unit = tf.step_unit(steps)
step_times = tf.step_frame(steps, unit)
events = tf.events_frame(run["switches"], run["calibrations"], run["schedules"])
loss = tf.loss_frame(metrics)
throughput, what = tf.throughput_frame(metrics, steps)
measured = [r["measured_seconds"] for r in steps]
predicted = [r["predicted_seconds"] for r in steps if r["predicted_seconds"] is not None]
train = loss[loss["series"] == "train"]

cols = st.columns(5)
cols[0].metric("status", detail["status"], help="as the run stored it")
cols[1].metric("steps", len({r["step"] for r in steps}))
cols[2].metric("last train loss", f"{train['value'].iloc[-1]:.4f}" if len(train) else "–")
cols[3].metric(
    f"{what} / s (median)", f"{throughput['value'].median():,.1f}" if len(throughput) else "–"
)
cols[4].metric(
    "step time (median)",
    ui.fmt_s(sorted(measured)[len(measured) // 2]),
    help="measured; the predicted median is "
    + (ui.fmt_s(sorted(predicted)[len(predicted) // 2]) if predicted else "unknown"),
)

st.subheader("Loss")
if loss.empty:
    st.caption("This run recorded no loss (`train_loss` / `val_loss` metrics).")
else:
    ui.chart(training_charts.loss_chart(loss, events), key="loss_chart")

st.subheader(f"Throughput ({what} per second)")
if throughput.empty:
    st.caption("This run recorded no sample or token counts, so its throughput is unknown.")
else:
    ui.chart(training_charts.throughput_chart(throughput, what=what), key="throughput_chart")

st.subheader("Step time: measured and predicted")
st.caption(
    "The prediction is the simulator's makespan of the running schedule on the costs known at "
    "that step. Solid rules: schedule switches; dotted: re-calibrations of the costs (both "
    "labelled with the predicted change; hover for the reason)."
)
ui.chart(training_charts.step_time_chart(step_times, events, unit=unit.name), key="step_time_chart")

st.subheader("Peak memory per rank")
mu = tf.memory_unit(steps, detail)
peaks = tf.rank_memory_frame(steps, mu)
if peaks.empty:
    st.caption("No peak memory measured (CPU runs measure none).")
else:
    limits = tf.limit_frame(detail, int(peaks["rank"].max()) + 1, mu)
    if len(limits) and (limits["what"] == "device").all():
        st.caption("Dashed: the device's memory (the run recorded no memory limit).")
    ui.chart(
        training_charts.rank_memory_chart(peaks, limits, unit=mu.name), key="rank_memory_chart"
    )

if len(events):
    n_switch = int((events["kind"] == "switch").sum())
    n_cal = int((events["kind"] == "calibration").sum())
    st.subheader(
        f"{n_switch} schedule switch{'es' if n_switch != 1 else ''} and "
        f"{n_cal} re-calibration{'s' if n_cal != 1 else ''}"
    )
    ui.dataframe(
        events.drop(columns=["short", "label_y"]),
        column_config={"gain": st.column_config.TextColumn("predicted step time")},
    )
