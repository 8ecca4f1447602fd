"""The inspector's server process: Streamlit's own command line, with the app's imports warmed.

``python -m optpipe_lightning.inspector.serve APP [streamlit options] [-- app args]`` is
``streamlit run APP ...`` plus a background thread that, once the server answers, imports what
the first page needs (pandas, Altair and its schema, SQLAlchemy, the simulator) and makes
Streamlit's once-per-process first calls, while the first browser downloads and starts
Streamlit's frontend; the first script run then finds them done (seconds on a loaded machine).
The thread only prepares; a page that needs a module first simply waits on Python's import lock.
"""

from __future__ import annotations

import sys
import threading
import time


def _port(argv: list[str]) -> int | None:
    for i, a in enumerate(argv):
        if a == "--":
            break
        if a == "--server.port" and i + 1 < len(argv):
            return int(argv[i + 1])
        if a.startswith("--server.port="):
            return int(a.split("=", 1)[1])
    return None


def _wait_until_serving(port: int | None, timeout: float = 30.0) -> None:
    """Return once the server answers on ``port`` (at once when unknown), so that warming up
    never delays the server's own start: it overlaps the browser loading the frontend."""
    if port is None:
        return
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=1):
                return
        except OSError:
            time.sleep(0.05)


def warm_up(port: int | None = None) -> None:
    """Import and initialise what every page uses (errors are left to the page to report)."""
    _wait_until_serving(port)
    try:
        import altair as alt
        import pandas as pd

        from optpipe_lightning.inspector import charts, data, frames, labels, ui  # noqa: F401
        from optpipe_lightning.profiles_db import repository  # noqa: F401
        from optpipe_lightning.schedule import simulate  # noqa: F401

        # Altair loads and compiles its Vega-Lite JSON schema on the first validation
        alt.Chart(pd.DataFrame({"x": [0.0]})).mark_bar().encode(x="x:Q").to_dict()
        _warm_streamlit_first_calls()
    except Exception:  # pragma: no cover - the page reports its own import errors
        return


def _warm_streamlit_first_calls() -> None:
    """What Streamlit does once per process on a page's first calls, done here instead of in
    the first script run (~0.2 s of it): ``set_page_config`` with an emoji icon loads its emoji
    table, and the first element checks once whether it runs in a REPL, walking the script
    thread's deep stack with ``inspect.stack()`` (reading every frame's source file). From this
    thread's short stack that check is cheap, and it is not repeated."""
    from streamlit import delta_generator, string_util

    string_util.is_emoji("📊")
    check = getattr(delta_generator, "_maybe_print_use_warning", None)
    if callable(check):  # a private helper: skipped if a Streamlit version drops it
        check()


def main() -> None:
    threading.Thread(
        target=warm_up, args=(_port(sys.argv[1:]),), name="optpipe-inspector-warm-up", daemon=True
    ).start()
    from streamlit.web import cli

    sys.argv = ["streamlit", "run", *sys.argv[1:]]
    cli.main()


if __name__ == "__main__":
    main()
