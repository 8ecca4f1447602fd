"""Profiles: measured op times per stage (with their spread), activation bytes, bandwidths."""

from __future__ import annotations

import streamlit as st

from optpipe_lightning.inspector import charts, data, frames, ui

url = ui.db_url()
st.title("Profiles")
profs = ui.load(data.profiles, url)
if profs.empty:
    ui.empty(
        "No profiles in this database yet. A training run with the optpipe strategy measures "
        "and stores one."
    )

ids = [int(x) for x in profs["id"]]
labels = {
    int(r.id): f"#{r.id} {r.model or 'model'} on {r.devices}x {r.device} · "
    f"m={r.microbatches} · measured {r.measured_at:%Y-%m-%d %H:%M}"
    for r in profs.itertuples()
}
raw = st.query_params.get("profile")
wanted = int(raw) if raw is not None and raw.isdigit() else None
pid = st.selectbox(
    "profile",
    ids,
    index=ids.index(wanted) if wanted in ids else 0,
    format_func=lambda i: labels[i],
    key="profile",
)
st.query_params["profile"] = str(pid)
prof = ui.load(data.profile, url, pid)

cols = st.columns(4)
cols[0].metric("p2p time", f"{prof.p2p_seconds * 1e3:.3f} ms")
cols[1].metric(
    "device → host",
    f"{prof.d2h_bandwidth / 1e9:.1f} GB/s" if prof.d2h_bandwidth else "not measured",
)
cols[2].metric(
    "host → device",
    f"{prof.h2d_bandwidth / 1e9:.1f} GB/s" if prof.h2d_bandwidth else "not measured",
)
cols[3].metric("stages × chunks", f"{prof.model.num_stages} × {prof.model.num_chunks}")

st.subheader("Op times")
st.caption("Whisker: min to max; box: mean ± std; black tick: mean. Hover for sample counts.")
times = frames.profile_frame(prof.stages)
ui.chart(charts.profile_chart(times), key="profile_chart")

st.subheader("Activation bytes")
acts = frames.activation_frame(prof.stages)
unit = frames.byte_unit(float(acts["bytes"].max()) if len(acts) else 0.0)
acts = acts.assign(value=acts["bytes"] / unit.scale)
ui.chart(charts.activation_chart(acts, unit=unit.name), key="activation_chart")
with st.expander("measurements"):
    ui.dataframe(times)
