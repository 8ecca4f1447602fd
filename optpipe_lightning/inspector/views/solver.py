"""Solver: incumbent makespan and lower bound over wall time; refreshes while a solve runs."""

from __future__ import annotations

import streamlit as st

from optpipe_lightning.inspector import charts, data, frames, ui

REFRESH_SECONDS = 2.0

url = ui.db_url()
st.title("Solver")
runs = ui.load(data.solver_runs, url)
if runs.empty:
    ui.empty(
        "No solver runs in this database yet. `optpipe solve PROBLEM.json --db URL` records one."
    )

ids = [int(x) for x in runs["id"]]
labels = {
    int(r.id): f"run #{r.id} · {r.backend} · {r.status} · problem {str(r.problem_hash)[:8]}"
    for r in runs.itertuples()
}
raw = st.query_params.get("run")
wanted = int(raw) if raw is not None and raw.isdigit() else None
run_id = st.selectbox(
    "solver run",
    ids,
    index=ids.index(wanted) if wanted in ids else 0,
    format_func=lambda i: labels[i],
    key="run",
)
st.query_params["run"] = str(run_id)
run = runs[runs["id"] == run_id].iloc[0]
running = run["status"] == "running"
baselines = ui.load(data.baseline_makespans, url, str(run["problem_hash"]))


@st.fragment(run_every=REFRESH_SECONDS if running else None)
def progress() -> None:
    fresh = data.solver_runs(url)
    now = fresh[fresh["id"] == run_id]
    status = str(now.iloc[0]["status"]) if len(now) else str(run["status"])
    events = ui.load(data.solver_events, url, run_id)
    gap = frames.solver_gap(events)
    inc = events[events["series"] == "incumbent"]["makespan_ms"]
    bound = events[events["series"] == "lower bound"]["makespan_ms"]
    cols = st.columns(4)
    cols[0].metric("status", status)
    cols[1].metric("incumbent", ui.fmt_ms(float(inc.min()) if len(inc) else None))
    cols[2].metric("lower bound", ui.fmt_ms(float(bound.max()) if len(bound) else None))
    cols[3].metric("gap", ui.fmt_pct(gap))
    if events.empty:
        st.info("This run has reported no incumbent or bound yet.")
    else:
        ui.chart(charts.solver_chart(events, baselines), key="solver_chart")
    if running and status != "running":
        st.rerun()  # the run ended: redraw the page without the timer


if running:
    st.caption(f"Solving: this chart refreshes every {REFRESH_SECONDS:g} s.")
progress()
if baselines:
    st.caption(
        "Dashed lines: makespan of each baseline schedule on this problem ("
        + ", ".join(f"{k} {v:.3f} ms" for k, v in sorted(baselines.items(), key=lambda kv: kv[1]))
        + ")."
    )
