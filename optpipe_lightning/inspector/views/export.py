"""Export: a Chrome trace (Perfetto) of any stored schedule, and the schedule's JSON."""

from __future__ import annotations

import streamlit as st

from optpipe_lightning.inspector import data, ui
from optpipe_lightning.inspector.chrome_trace import TraceError

url = ui.db_url()
st.title("Export")
sid = ui.pick_schedule(url)
schedule_json = ui.load(data.schedule_json, url, sid)
summary = ui.load(data.simulated, url, sid)["summary"]
try:
    trace = ui.load(data.trace_json, url, sid)
except TraceError as e:
    st.download_button(
        "Download schedule JSON",
        schedule_json,
        file_name=f"schedule-{sid}.json",
        mime="application/json",
        key="download_schedule",
    )
    ui.empty(f"No Chrome trace for this schedule: {e}")

st.write(
    "The Chrome trace shows one process per stage with a compute track and a copy track, "
    "the activation memory as a counter, and arrows for every dependency between stages. Open it "
    "in [Perfetto](https://ui.perfetto.dev) or `chrome://tracing`. The command line writes the "
    "same file: `optpipe trace SCHEDULE.json --out trace.json`."
)
cols = st.columns(3)
cols[0].metric("makespan", ui.fmt_ms(summary["makespan_ms"]))
cols[1].metric("trace size", f"{len(trace) / 1e6:.2f} MB")
cols[2].metric("schedule size", f"{len(schedule_json) / 1e6:.2f} MB")
left, right = st.columns(2)
left.download_button(
    "Download Chrome trace",
    trace,
    file_name=f"schedule-{sid}-trace.json",
    mime="application/json",
    key="download_trace",
)
right.download_button(
    "Download schedule JSON",
    schedule_json,
    file_name=f"schedule-{sid}.json",
    mime="application/json",
    key="download_schedule",
)
