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
    "The Chrome trace shows one process per stage with a compute track and, when the schedule "
    "offloads, a device → host track (OFFLOAD) and a host → device track (RELOAD), the "
    "activation memory as a counter, and arrows for every dependency between stages. Open it "
    "in [Perfetto](https://ui.perfetto.dev) or `chrome://tracing`. The command line writes the "
    "same file: `optpipe trace SCHEDULE.json --out trace.json`."
)
cols = st.columns(3)
cols[0].metric("makespan", ui.fmt_s(summary["makespan"]))
cols[1].metric("trace size", ui.fmt_bytes(len(trace)))
cols[2].metric("schedule size", ui.fmt_bytes(len(schedule_json)))
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
