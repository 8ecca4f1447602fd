"""Page helpers shared by the views: the database URL, error messages, pickers, chart output.

A page never shows a traceback for the database's state: ``load`` turns a missing file, an empty
database or one being written into one clear message and stops the page.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import pandas as pd
import streamlit as st

from optpipe_lightning.inspector import data
from optpipe_lightning.inspector.charts import AnyChart

T = TypeVar("T")
ENV_VAR = "OPTPIPE_DB_URL"


def parse_db_arg(argv: Sequence[str]) -> str | None:
    """The URL in the app's own arguments (after ``--``): ``--db URL`` or ``--db=URL``."""
    args = list(argv)
    for i, a in enumerate(args):
        if a == "--db" and i + 1 < len(args):
            return args[i + 1]
        if a.startswith("--db="):
            return a.split("=", 1)[1]
    return None


def db_url() -> str:
    """The database to read: command-line argument, then ``OPTPIPE_DB_URL``, then the default."""
    return parse_db_arg(sys.argv[1:]) or os.environ.get(ENV_VAR) or data.default_url()


def load(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, or an explanation on the page and a stop when the database is unusable."""
    try:
        return fn(*args)
    except data.DataUnavailable as e:
        if e.transient:
            st.warning(f"{e} Showing nothing for now; reload in a moment.", icon="⏳")
        else:
            st.error(str(e), icon="🚫")
        st.stop()
        raise  # unreachable: st.stop raises


def sidebar() -> None:
    """The database in use, in the sidebar."""
    url = db_url()
    st.sidebar.caption(f"database (read-only): `{data.display_url(url)}`")


def empty(message: str) -> None:
    """An empty-state message and a stop (nothing to draw is not an error)."""
    st.info(message, icon="ℹ️")
    st.stop()


def chart(c: AnyChart, *, key: str | None = None) -> None:
    """Draw an Altair chart with its own colours (Streamlit's theme would recolour op kinds)."""
    st.altair_chart(c, theme=None, key=key)


def _query_int(name: str) -> int | None:
    raw = st.query_params.get(name)
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


def pick_schedule(url: str, *, label: str = "schedule", key: str = "schedule") -> int:
    """A schedule picker (mirrored in the ``?schedule=ID`` query parameter); its id."""
    table = load(data.schedules, url)
    if table.empty:
        empty(
            "No schedules in this database yet. Store some with "
            "`optpipe solve PROBLEM.json --db URL` or `optpipe compare PROBLEM.json --db URL`."
        )
    ids = [int(x) for x in table["id"]]
    labels = {int(r.id): data.schedule_label(r) for r in table.itertuples()}
    wanted = _query_int(key)
    index = ids.index(wanted) if wanted in ids else 0
    chosen = st.selectbox(label, ids, index=index, format_func=lambda i: labels[i], key=key)
    st.query_params[key] = str(chosen)
    return int(chosen)


def pick_problem(url: str, *, key: str = "problem") -> str:
    """A problem picker (mirrored in ``?problem=HASH``); its hash."""
    table = load(data.problems, url)
    if table.empty:
        empty("No problems in this database yet. `optpipe solve PROBLEM.json --db URL` stores one.")
    hashes = list(table["hash"])
    labels = {r.hash: data.problem_label(r) for r in table.itertuples()}
    wanted = st.query_params.get(key)
    index = hashes.index(wanted) if wanted in hashes else 0
    chosen = st.selectbox("problem", hashes, index=index, format_func=lambda h: labels[h], key=key)
    st.query_params[key] = chosen
    return str(chosen)


def dataframe(df: pd.DataFrame, **kwargs: Any) -> None:
    st.dataframe(df, hide_index=True, **kwargs)


def fmt_ms(x: float | None) -> str:
    return "–" if x is None or pd.isna(x) else f"{x:.3f} ms"


def fmt_pct(x: float | None) -> str:
    return "–" if x is None or pd.isna(x) else f"{x:.1%}"


MAX_BARS = 30_000  # above this a timeline is drawn one time window at a time


def windowed(timeline: pd.DataFrame, *, key: str) -> pd.DataFrame:
    """The whole timeline, or for very large ones the part in a window the user picks."""
    from optpipe_lightning.inspector.frames import time_window

    if len(timeline) <= MAX_BARS:
        return timeline
    end = float(timeline["end_ms"].max())
    share = MAX_BARS / len(timeline)
    lo, hi = st.slider(
        "time window (ms)",
        0.0,
        end,
        (0.0, end * share),
        key=key,
        help=f"{len(timeline):,} bars: drawn a window at a time to stay responsive",
    )
    return time_window(timeline, lo, hi)
