"""Timeline: how busy each stage is, above a zoomable Gantt of every op (compute lane, and a
lane per copy direction when the schedule offloads)."""

from __future__ import annotations

import streamlit as st

from optpipe_lightning.inspector import charts, data, ui

url = ui.db_url()
st.title("Timeline")
sid = ui.pick_schedule(url)
view = ui.load(data.simulated, url, sid)
s = view["summary"]
unit = view["time_unit"]

cols = st.columns(5)
cols[0].metric("makespan", ui.fmt_s(s["makespan"]))
cols[1].metric("bubble rate", ui.fmt_pct(s["bubble_rate"]))
cols[2].metric("stage-span bubble", ui.fmt_pct(s["stage_span_bubble_rate"]))
cols[3].metric("offloaded activations", s["num_offloaded"])
cols[4].metric("fits the memory limit", "yes" if s["feasible"] else "no")
for message in view["violations"][:5]:
    st.warning(message)

timeline = view["timeline"]
if timeline.empty:
    ui.empty(
        "This schedule cannot be timed (see the violations above), so there is nothing to draw."
    )
copies = (timeline["lane"] != "compute").any()
st.caption(
    "How busy each stage computes over the iteration (darker: busier; the label says how much "
    "of the iteration the stage idles)."
)
ui.chart(charts.busy_chart(view["busy"], unit=unit), key="busy_chart")
st.caption(
    f"{len(timeline):,} ops. Each stage has a compute lane (F, B, W)"
    + (
        ", and under it a device → host lane (OFFLOAD) and a host → device lane (RELOAD): the "
        "copy engines work both ways at once"
        if copies
        else ""
    )
    + ". Gaps are idle time. Scroll to zoom, drag to pan, double-click to reset; hover a bar "
    "for its stage, microbatch, chunk, start and end."
)
detail = ui.windowed(timeline, key="window", unit=unit)
ui.chart(charts.timeline_chart(detail, unit=unit), key="timeline_chart")

with st.expander("idle time per stage"):
    # a Markdown table: a data grid here would make the first view download and start the
    # grid's ~1.2 MB of scripts beside the charts' (the first drawn Timeline waited on it)
    st.markdown(ui.idle_table(view["idle"], unit=unit))
