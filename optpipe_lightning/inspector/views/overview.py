"""Overview: what the database holds (hardware, models, profiles, problems, schedules, runs),
and one search over all of it."""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from optpipe_lightning.inspector import data, ui
from optpipe_lightning.inspector.search import matching

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
        "This database is empty. Fill it with `optpipe solve PROBLEM.json --db URL` or a "
        "training run with the optpipe strategy, or see a demo with `optpipe inspect --demo`."
    )

cols = st.columns(5)
cols[0].metric("problems", len(problems))
cols[1].metric("schedules", len(schedules))
cols[2].metric("profiles", len(profiles))
cols[3].metric("solver runs", len(solver))
cols[4].metric("training runs", len(training))

query = st.text_input(
    "search",
    placeholder="problems, schedules, runs and profiles by name, generator, status or hash",
)


def table(title: str, df: pd.DataFrame, **kwargs: object) -> None:
    st.subheader(title)
    shown = matching(df, query)
    if df.empty:
        st.caption("none stored")
    elif shown.empty:
        st.caption(f"nothing matches {query!r}")
    else:
        ui.dataframe(shown, **kwargs)


def text(df: pd.DataFrame, fmt: object, *cols: str) -> pd.DataFrame:
    """Times and bytes as text in the unit that fits each (a column may hold 0.4 s and 28 s)."""
    return df.assign(**{c: df[c].map(fmt) for c in cols})


def wide(title: str) -> Any:
    return st.column_config.TextColumn(title, width="large")


if not profiles.empty:
    full = [ui.load(data.profile, url, int(i)) for i in profiles["id"][:MAX_PROFILES]]
    left, right = st.columns(2)
    with left:
        table("Hardware", data.hardware_frame(full))
    with right:
        table("Models", data.models_frame(full))
table(
    "Profiles",
    profiles.drop(columns=["label"]).assign(open="profiles?profile=" + profiles["id"].astype(str)),
    column_config={"open": st.column_config.LinkColumn("open", display_text="open")},
)
table(
    "Problems",
    text(problems, ui.fmt_bytes, "memory_limit")
    .pipe(text, ui.fmt_s, "best_makespan")
    .assign(compare="compare?problem=" + problems["hash"].astype(str))[
        [
            "label",
            "stages",
            "microbatches",
            "chunks",
            "placement",
            "memory_limit",
            "offload",
            "schedules",
            "best_makespan",
            "compare",
            "hash",
        ]
    ],
    column_config={
        "label": wide("problem"),
        "compare": st.column_config.LinkColumn("compare", display_text="compare"),
        "memory_limit": st.column_config.TextColumn("memory limit"),
        "best_makespan": st.column_config.TextColumn("best makespan"),
    },
)
table(
    "Schedules",
    text(schedules, ui.fmt_s, "makespan").assign(
        timeline="timeline?schedule=" + schedules["id"].astype(str)
    )[
        [
            "id",
            "produced_by",
            "problem",
            "makespan",
            "bubble_rate",
            "feasible",
            "num_offloaded",
            "source",
            "timeline",
            "problem_hash",
        ]
    ],
    column_config={
        "produced_by": wide("schedule"),
        "problem": wide("problem"),
        "timeline": st.column_config.LinkColumn("timeline", display_text="open"),
        "bubble_rate": st.column_config.NumberColumn("bubble rate", format="percent"),
    },
)
table(
    "Solver runs",
    text(solver, ui.fmt_s, "makespan", "lower_bound", "time_limit").assign(
        progress="solver?run=" + solver["id"].astype(str)
    )[
        [
            "id",
            "status",
            "backend",
            "problem",
            "makespan",
            "lower_bound",
            "time_limit",
            "started_at",
            "progress",
            "problem_hash",
        ]
    ],
    column_config={
        "progress": st.column_config.LinkColumn("progress", display_text="open"),
        "problem": wide("problem"),
    },
)
table(
    "Training runs",
    training.drop(columns=["label"]).assign(open="training?run=" + training["id"].astype(str)),
    column_config={"open": st.column_config.LinkColumn("steps", display_text="open")},
)
