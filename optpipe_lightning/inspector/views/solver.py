"""Solver: incumbent makespan and lower bound over the whole solve, live while it runs, and a
notice when another solve starts."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from optpipe_lightning.inspector import charts, data, frames, ui
from optpipe_lightning.schedule.units import time_unit

REFRESH_SECONDS = 2.0
WATCH_SECONDS = 3.0

url = ui.db_url()
st.title("Solver")
runs = ui.load(data.solver_runs, url)
if runs.empty:
    ui.empty(
        "No solver runs in this database yet. `optpipe solve PROBLEM.json --db URL` records one."
    )
known = {int(x) for x in runs["id"]}
# running runs come first (newest first): a page opened without a link shows the live one
run_id = int(
    ui.pick(
        "solver run",
        [int(x) for x in runs["id"]],
        list(runs["label"]),
        key="solver_run",
        param="run",
    )
)
ui.problem_details(url, str(runs[runs["id"] == run_id].iloc[0]["problem_hash"]))


def follow(run: int) -> None:
    st.session_state["solver_run"] = run  # before the picker exists (a button callback)
    st.query_params["run"] = str(run)


@st.fragment(run_every=WATCH_SECONDS)
def watch() -> None:
    """Notice of runs started since the page was drawn; redraw the page to list them."""
    fresh = data.solver_runs(url)
    new = fresh[~fresh["id"].isin(known)]
    if len(new):
        for r in new.itertuples():
            st.toast(f"New solver run: {r.label}", icon="⏱️")
        st.rerun()  # the picker lists the new runs; this fragment then tells about them
    others = fresh[(fresh["status"] == "running") & (fresh["id"] != run_id)]
    for r in others.itertuples():
        left, right = st.columns([5, 1])
        left.info(f"Solving now: {r.label}.", icon="⏱️")
        if right.button("follow it", key=f"follow_{r.id}", on_click=follow, args=(int(r.id),)):
            st.rerun()  # the whole page, for the picker


watch()


def elapsed(row: pd.Series) -> float:
    """Seconds from the run's start to its end, or to now while it runs."""
    start = pd.Timestamp(row["started_at"])
    end = pd.Timestamp(row["finished_at"]) if pd.notna(row["finished_at"]) else None
    return max(((end or pd.Timestamp(data.now())) - start).total_seconds(), 0.0)


page_running = bool(runs[runs["id"] == run_id].iloc[0]["status"] == "running")


@st.fragment(run_every=REFRESH_SECONDS if page_running else None)
def progress() -> None:
    fresh = data.solver_runs(url)
    row = fresh[fresh["id"] == run_id].iloc[0]
    running = row["status"] == "running"
    events = ui.load(data.solver_events, url, run_id)
    limit = row["time_limit"] if pd.notna(row["time_limit"]) else None
    end = max(elapsed(row), max((e[0] for e in events), default=0.0))
    frame = frames.solver_frame(events, end=end)
    best, bound = frames.solver_best(frame)
    cols = st.columns(5)
    cols[0].metric("status", str(row["status"]))
    cols[1].metric("incumbent", ui.fmt_s(best))
    cols[2].metric("lower bound", ui.fmt_s(bound))
    cols[3].metric("gap", ui.fmt_pct(frames.solver_gap(frame)))
    cols[4].metric(
        ("solving for" if running else "solved in") + (f" (limit {limit:g} s)" if limit else ""),
        ui.fmt_s(end),
    )
    if running and limit and end > 2 * limit + 60:
        st.warning(
            f"This run started {ui.fmt_s(end)} ago with a {limit:g} s limit and never finished: "
            "its process may have stopped."
        )
    if frame.empty:
        if row["backend"] == "baselines":  # `compare --no-solve --db`, `baseline --db`
            st.info(
                "This run stored baselines only (no solver ran): their schedules are on the "
                "Compare page.",
                icon="ℹ️",
            )
        else:
            st.info("This run has reported no incumbent or bound yet.")
        return
    tu = time_unit(float(frame["makespan"].max()))
    shown = frame.assign(makespan=frame["makespan"] / tu.scale)
    lo, hi = float(shown["makespan"].min()), float(shown["makespan"].max())
    pad = max(hi - lo, 0.02 * abs(hi)) * 0.08
    baselines = {
        k: v / tu.scale
        for k, v in ui.load(data.baseline_makespans, url, str(row["problem_hash"])).items()
    }
    marks = frames.baseline_marks(baselines, lo - pad, hi + pad)
    ui.chart(
        charts.solver_chart(
            shown,
            marks,
            unit=tu.name,
            x_end=end,
            y_domain=(lo - pad, hi + pad),
            time_limit=limit,
            finished=not running,
        ),
        key="solver_chart",
    )
    if running:
        st.caption(f"Solving: this chart follows the run every {REFRESH_SECONDS:g} s.")
    if not baselines:
        st.info(
            "No baseline of this problem is stored, so none is drawn for comparison: "
            f"`optpipe compare PROBLEM.json --no-solve --db {data.display_url(url)}` stores "
            "them (the inspector never computes one).",
            icon="ℹ️",
        )
    else:
        st.caption(
            "Dashed grey lines: the baselines' makespans on this problem ("
            + ", ".join(
                f"{k} {ui.fmt_s(v * tu.scale)}"
                for k, v in sorted(baselines.items(), key=lambda kv: kv[1])
            )
            + "); those off the axis are named above the chart."
        )
    if page_running and not running:
        st.rerun()  # the run ended: redraw the page without the timer


progress()
