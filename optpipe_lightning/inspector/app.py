"""The inspector's Streamlit entry point: page setup and navigation (pages live in ``views/``).

Run it with ``optpipe inspect [--db URL]``, or ``streamlit run app.py -- --db URL``; without a URL
it reads ``OPTPIPE_DB_URL`` or the default database. The database is opened read-only.
(The pages folder is ``views/``: a ``pages/`` folder beside the entry point would switch
Streamlit to its older multipage mode and bypass ``st.navigation``.)
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from optpipe_lightning.inspector import ui

VIEWS = Path(__file__).resolve().parent / "views"

# (file, title, url path). No page icons: an emoji needs a colour font the machine may lack,
# and a material icon makes the browser fetch a favicon from the internet.
PAGES = [
    ("overview.py", "Overview", ""),  # the default page lives at the root URL
    ("timeline.py", "Timeline", "timeline"),
    ("memory.py", "Memory", "memory"),
    ("solver.py", "Solver", "solver"),
    ("compare.py", "Compare", "compare"),
    ("profiles.py", "Profiles", "profiles"),
    ("training.py", "Training", "training"),
    ("export.py", "Export", "export"),
]

st.set_page_config(page_title="optpipe inspector", page_icon="📊", layout="wide")
navigation = st.navigation(
    [
        st.Page(VIEWS / file, title=title, url_path=path or None, default=not path)
        for file, title, path in PAGES
    ]
)
ui.sidebar()
navigation.run()
