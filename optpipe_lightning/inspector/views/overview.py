"""Overview: what the database holds (hardware, models, profiles, problems, schedules, runs)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from optpipe_lightning.inspector import data, ui

MAX_PROFILES = 50  # fingerprints are read from the newest profiles

url = ui.db_url()
st.title("optpipe inspector")
st.caption(
    "Pipeline schedules, memory, solver progress and training runs stored in the optpipe "
    "database. Pick a page on the left; tables link to the timeline of each schedule."
)

problems = ui.load(data.problems, url)
schedules = ui.load(data.schedules, url)
profiles = ui.load(data.profiles, url)
training = ui.load(data.training_runs, url)
solver = ui.load(data.solver_runs, url)

if problems.empty and schedules.empty and profiles.empty and training.empty:
    ui.empty(
        "This database is empty. Fill it with `optpipe compare PROBLEM.json --db URL`, "
        "`optpipe solve PROBLEM.json --db URL`, or a training run with the optpipe strategy."
    )

cols = st.columns(5)
cols[0].metric("problems", len(problems))
cols[1].metric("schedules", len(schedules))
cols[2].metric("profiles", len(profiles))
cols[3].metric("solver runs", len(solver))
cols[4].metric("training runs", len(training))

query = st.text_input(
    "search", placeholder="filter every table: a name, generator, hash, device..."
)


def matching(df: pd.DataFrame) -> pd.DataFrame:
    if not query or df.empty:
        return df
    text = df.astype(str).agg(" ".join, axis=1).str.lower()
    return df[text.str.contains(query.lower(), regex=False)]


if not profiles.empty:
    st.subheader("Hardware and models")
    full = [ui.load(data.profile, url, int(i)) for i in profiles["id"][:MAX_PROFILES]]
    left, right = st.columns(2)
    with left:
        ui.dataframe(matching(data.hardware_frame(full)))
    with right:
        ui.dataframe(matching(data.models_frame(full)))
    st.subheader("Profiles")
    ui.dataframe(
        matching(profiles).assign(open=lambda d: "profiles?profile=" + d["id"].astype(str)),
        column_config={"open": st.column_config.LinkColumn("open", display_text="open")},
    )

st.subheader("Problems")
if problems.empty:
    st.caption("none stored")
else:
    shown = matching(problems).assign(compare=lambda d: "compare?problem=" + d["hash"].astype(str))
    ui.dataframe(
        shown,
        column_config={
            "compare": st.column_config.LinkColumn("compare", display_text="compare"),
            "memory_limit": st.column_config.NumberColumn("memory limit (bytes)", format="%.3e"),
            "best_makespan_ms": st.column_config.NumberColumn("best makespan (ms)", format="%.3f"),
        },
    )

st.subheader("Schedules")
if schedules.empty:
    st.caption("none stored")
else:
    shown = matching(schedules).assign(
        timeline=lambda d: "timeline?schedule=" + d["id"].astype(str)
    )
    ui.dataframe(
        shown,
        column_config={
            "timeline": st.column_config.LinkColumn("timeline", display_text="open"),
            "makespan_ms": st.column_config.NumberColumn("makespan (ms)", format="%.3f"),
            "bubble_rate": st.column_config.NumberColumn("bubble rate", format="percent"),
        },
    )

st.subheader("Solver runs")
if solver.empty:
    st.caption("none stored")
else:
    ui.dataframe(
        matching(solver).assign(progress=lambda d: "solver?run=" + d["id"].astype(str)),
        column_config={"progress": st.column_config.LinkColumn("progress", display_text="open")},
    )

st.subheader("Training runs")
if training.empty:
    st.caption("none stored")
else:
    ui.dataframe(
        matching(training).assign(steps=lambda d: "training?run=" + d["id"].astype(str)),
        column_config={"steps": st.column_config.LinkColumn("steps", display_text="open")},
    )
