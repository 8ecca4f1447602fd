"""Profiles: measured op times per stage (with their spread), activation bytes, bandwidths."""

from __future__ import annotations

import streamlit as st

from optpipe_lightning.inspector import data, frames, profile_charts, ui
from optpipe_lightning.schedule.units import byte_unit, format_bandwidth, time_unit

url = ui.db_url()
st.title("Profiles")
profs = ui.load(data.profiles, url)
if profs.empty:
    ui.empty(
        "No profiles in this database yet. A training run with the optpipe strategy measures "
        "and stores one."
    )

pid = int(ui.pick("profile", [int(x) for x in profs["id"]], list(profs["label"]), key="profile"))
prof = ui.load(data.profile, url, pid)

cols = st.columns(4)
cols[0].metric("p2p time", ui.fmt_s(prof.p2p_seconds))
cols[1].metric("device → host", format_bandwidth(prof.d2h_bandwidth, none="not measured"))
cols[2].metric("host → device", format_bandwidth(prof.h2d_bandwidth, none="not measured"))
cols[3].metric("stages × chunks", f"{prof.model.num_stages} × {prof.model.num_chunks}")

st.subheader("Op times")
st.caption("Bar: mean; whisker: fastest to slowest sample. Hover for the spread and sample count.")
tu = time_unit(max((max(sp.f.mean, sp.b.mean, sp.w.mean) for sp in prof.stages), default=0.0))
times = frames.profile_frame(prof.stages, tu)
ui.chart(profile_charts.profile_chart(times, unit=tu.name), key="profile_chart")

st.subheader("Activation bytes")
acts = frames.activation_frame(prof.stages)
bu = byte_unit(float(acts["bytes"].max()) if len(acts) else 0.0)
acts = acts.assign(value=acts["bytes"] / bu.scale)
ui.chart(profile_charts.activation_chart(acts, unit=bu.name), key="activation_chart")

st.subheader("Per-op memory")
opm = frames.op_memory_frame(prof.stages)
if opm["measured"].notna().any():
    st.caption(
        "What each op leaves allocated, as the profiler's allocator watch measured it (median "
        "over the profiling steps) beside the rule from the activation bytes. The problem uses "
        "the measurement (W frees what F and B left); the largest transient is kept as reserve."
    )
    mu = byte_unit(float(opm[["measured", "rule"]].abs().max().max()) if len(opm) else 0.0)
    scaled = opm.assign(**{c: opm[c] / mu.scale for c in ("rule", "measured", "used", "transient")})
    ui.chart(profile_charts.op_memory_chart(scaled, unit=mu.name), key="op_memory_chart")
    with st.expander("per-op memory"):
        ui.dataframe(
            scaled,
            column_config={
                c: st.column_config.NumberColumn(f"{c} ({mu.name})", format="%.3f")
                for c in ("rule", "measured", "used", "transient")
            },
        )
else:
    st.caption(
        "This profile has no per-op memory (the profiler measures it on GPUs only): the problem "
        "uses the rule (F leaves the activation, B frees all but the weight-grad part, W the rest)."
    )
with st.expander("measurements"):
    ui.dataframe(
        times,
        column_config={
            c: st.column_config.NumberColumn(f"{c} ({tu.name})", format="%.3f")
            for c in ("mean", "std", "min", "max")
        },
    )
