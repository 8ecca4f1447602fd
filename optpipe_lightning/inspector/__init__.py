"""The schedule inspector: a Streamlit app over the optpipe database, and Chrome traces.

``chrome_trace(problem, schedule)`` needs only the schedule core; the app, its charts and
``run_inspector`` need the ``inspector`` extra (streamlit, altair, pandas). Nothing here imports
``optpipe_lightning.strategy`` (browsing a database never imports torch).
"""

from __future__ import annotations

from .chrome_trace import TraceError, chrome_trace
from .launch import run_inspector

__all__ = ["TraceError", "chrome_trace", "run_inspector"]
