"""Timeline: per-device Gantt of one schedule (compute lane and copy lane per stage)."""

from __future__ import annotations

import streamlit as st

from optpipe_lightning.inspector import charts, data, ui

url = ui.db_url()
st.title("Timeline")
sid = ui.pick_schedule(url)
view = ui.load(data.simulated, url, sid)
s = view["summary"]

cols = st.columns(5)
cols[0].metric("makespan", ui.fmt_ms(s["makespan_ms"]))
cols[1].metric("bubble rate", ui.fmt_pct(s["bubble_rate"]))
cols[2].metric("stage-span bubble rate", ui.fmt_pct(s["stage_span_bubble_rate"]))
cols[3].metric("offloaded activations", s["num_offloaded"])
cols[4].metric("fits the memory limit", "yes" if s["feasible"] else "no")
for message in view["violations"][:5]:
    st.warning(message)

timeline = view["timeline"]
if timeline.empty:
    ui.empty(
        "This schedule cannot be timed (see the violations above), so there is nothing to draw."
    )
st.caption(
    f"{len(timeline):,} ops. Each stage has a compute lane (F, B, W) and under it a copy lane "
    "(OFFLOAD, RELOAD); gaps are idle time. Scroll to zoom, drag to pan, double-click to reset; "
    "hover a bar for its stage, microbatch, chunk, start and duration."
)
ui.chart(charts.timeline_chart(ui.windowed(timeline, key="window")), key="timeline_chart")

with st.expander("idle time per stage"):
    ui.dataframe(
        view["idle"],
        column_config={
            "busy_ms": st.column_config.NumberColumn("busy (ms)", format="%.3f"),
            "idle_ms": st.column_config.NumberColumn("idle (ms)", format="%.3f"),
            "idle_fraction": st.column_config.NumberColumn("idle", format="percent"),
        },
    )
