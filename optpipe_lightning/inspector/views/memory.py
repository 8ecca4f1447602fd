"""Memory: per-device activation memory over time against the limit, offloaded bytes, peaks."""

from __future__ import annotations

import streamlit as st

from optpipe_lightning.inspector import charts, data, ui

url = ui.db_url()
st.title("Memory")
sid = ui.pick_schedule(url)
view = ui.load(data.simulated, url, sid)
unit = view["unit"]
peaks = view["peaks"]
memory = view["memory"]
if memory.empty:
    ui.empty("This schedule cannot be timed, so it has no memory curve.")

peak_bytes = view["peak_bytes"]
worst = max(range(len(peak_bytes)), key=lambda i: peak_bytes[i])
limits = [x for x in view["limit_bytes"] if x is not None]
cols = st.columns(4)
cols[0].metric("highest peak", ui.fmt_bytes(peak_bytes[worst]), help=f"on stage {worst}")
cols[1].metric("memory limit", ui.fmt_bytes(min(limits)) if limits else "none")
cols[2].metric("offloaded activations", view["summary"]["num_offloaded"])
cols[3].metric("fits the memory limit", "yes" if view["summary"]["feasible"] else "no")

st.caption(
    "Activation memory on each device (step curve), activations sitting on the host after an "
    "offload, the limit (dashed red), the peak (black triangle) and any instant above the limit "
    "(red)."
)
ui.chart(charts.memory_chart(memory, unit=unit, time_unit=view["time_unit"]), key="memory_chart")
st.subheader("Peak per stage")
ui.chart(charts.peak_memory_chart(peaks, unit=unit), key="peak_chart")
