"""Page helpers shared by the views: the database URL, error messages, pickers, chart output.

A page never shows a traceback for the database's state: ``load`` turns a missing file, an empty
database or one being written into one clear message and stops the page. Pickers mirror their
choice in a query parameter (links open the same view) and say so when a link names something
the database does not hold.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar

import pandas as pd
import streamlit as st

from optpipe_lightning.inspector import data
from optpipe_lightning.inspector.charts import AnyChart
from optpipe_lightning.schedule.units import format_bytes, format_seconds

T = TypeVar("T")
ENV_VAR = "OPTPIPE_DB_URL"
REMEMBERED = "chosen:"  # session keys of what the pickers chose, by widget key


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


def pick(
    what: str,
    options: Sequence[Hashable],
    labels: Sequence[str],
    *,
    key: str,
    param: str | None = None,
    default: int = 0,
    parse: Callable[[str], Hashable] = int,
) -> Any:
    """A selectbox (widget ``key``) over ``options`` mirrored in the ``?param=`` query
    parameter (``key`` when not given), and remembered for the session: another page's picker
    of the same parameter starts from it (a page switch drops the query), and writes it into
    that page's URL.

    A link that names an option the database does not hold gets a notice and the default.
    """
    param = param or key
    names = dict(zip(options, labels, strict=True))
    raw = st.query_params.get(param)
    from_link = raw is not None
    if raw is None:  # a page switch drops the query: the choice made on another page
        raw = st.session_state.get(REMEMBERED + key)
    wanted: Hashable | None = None
    if raw is not None:
        try:
            wanted = parse(raw)
        except ValueError:
            wanted = None
        if wanted not in names and from_link:
            st.warning(
                f"No {what} {raw!r} in this database (from the link): showing "
                f"{names[options[default]]} instead.",
                icon="🔎",
            )
    index = list(options).index(wanted) if wanted in names else default
    chosen = st.selectbox(what, options, index=index, format_func=lambda i: names[i], key=key)
    st.query_params[param] = str(chosen)
    st.session_state[REMEMBERED + key] = str(chosen)  # for the next page (and in its URL)
    return chosen


def pick_schedule(url: str, *, key: str = "schedule") -> int:
    """A schedule picker (mirrored in ``?schedule=ID``); its id."""
    table = load(data.schedules, url)
    if table.empty:
        empty(
            "No schedules in this database yet. Store some with "
            "`optpipe solve PROBLEM.json --db URL`, or see a demo with `optpipe inspect --demo`."
        )
    labels = [f"{r.label} · {r.problem}" for r in table.itertuples()]
    return int(pick("schedule", [int(x) for x in table["id"]], labels, key=key))


def pick_problem(url: str, *, key: str = "problem") -> str:
    """A problem picker (mirrored in ``?problem=HASH``); its hash, shown a click away."""
    table = load(data.problems, url)
    if table.empty:
        empty("No problems in this database yet. `optpipe solve PROBLEM.json --db URL` stores one.")
    chosen = str(pick("problem", list(table["hash"]), list(table["label"]), key=key, parse=str))
    problem_details(url, chosen)
    return chosen


def problem_details(url: str, problem_hash: str) -> None:
    """The problem's hash, shape and JSON behind a popover."""
    with st.popover("problem details"):
        table = load(data.problems, url)
        row = table[table["hash"] == problem_hash]
        if len(row):
            from optpipe_lightning.inspector.labels import problem_shape

            st.markdown(f"**{problem_shape(row.iloc[0])}**")
        st.code(problem_hash, language=None)
        pb = load(data.problem, url, problem_hash)
        st.json(pb.model_dump(mode="json", exclude_none=True), expanded=False)


def dataframe(df: pd.DataFrame, **kwargs: Any) -> None:
    st.dataframe(df, hide_index=True, **kwargs)


def fmt_s(x: float | None) -> str:
    return format_seconds(None if x is None or pd.isna(x) else float(x), none="–")


def fmt_bytes(x: float | None) -> str:
    return format_bytes(None if x is None or pd.isna(x) else float(x), none="–")


def idle_table(idle: pd.DataFrame, *, unit: str) -> str:
    """``frames.idle_frame`` as a Markdown table: stage, busy and idle time, idle share."""
    lines = [f"| stage | busy ({unit}) | idle ({unit}) | idle |", "|---:|---:|---:|---:|"]
    lines += [
        f"| {int(r.device)} | {r.busy:,.3f} | {r.idle:,.3f} | {r.idle_fraction:.1%} |"
        for r in idle.itertuples()
    ]
    return "\n".join(lines)


def fmt_pct(x: float | None) -> str:
    return "–" if x is None or pd.isna(x) else f"{x:.1%}"


MAX_BARS = 30_000  # above this a timeline is drawn one time window at a time


def windowed(timeline: pd.DataFrame, *, key: str, unit: str) -> pd.DataFrame:
    """The whole timeline, or for very large ones the part in a window the user picks."""
    from optpipe_lightning.inspector.frames import time_window

    if len(timeline) <= MAX_BARS:
        return timeline
    end = float(timeline["end"].max())
    share = MAX_BARS / len(timeline)
    lo, hi = st.slider(
        f"time window ({unit})",
        0.0,
        end,
        (0.0, end * share),
        key=key,
        help=f"{len(timeline):,} bars: drawn a window at a time to stay responsive",
    )
    return time_window(timeline, lo, hi)
