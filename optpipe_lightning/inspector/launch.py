"""Start the inspector: ``optpipe inspect`` replaces its process with ``streamlit run app.py``.

The process is replaced (``os.execv``), not wrapped: a wrapper killed by SIGTERM would orphan
Streamlit, which then ignores SIGTERM once its output pipe is gone. The server (``serve.py``:
Streamlit's command line with the first page's imports warmed in the background) listens on
127.0.0.1 only, sends no usage statistics and watches no files. It never writes the database: one
of an older schema revision is refused with the command that migrates it (``optpipe db upgrade``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

APP = Path(__file__).resolve().parent / "app.py"


def streamlit_command(
    db_url: str | None, port: int | None, *, open_browser: bool = False
) -> list[str]:
    """The argument vector that runs the inspector (``sys.executable`` first)."""
    cmd = [
        sys.executable,
        "-m",
        "optpipe_lightning.inspector.serve",
        str(APP),
        "--server.address",
        "127.0.0.1",
        "--browser.gatherUsageStats",
        "false",
        "--server.headless",
        "false" if open_browser else "true",
        "--server.fileWatcherType",
        "none",
        "--client.toolbarMode",
        "viewer",
        "--server.showEmailPrompt",
        "false",
    ]
    if port is not None:
        cmd += ["--server.port", str(port)]
    if db_url:
        cmd += ["--", "--db", db_url]
    return cmd


def check_database(db_url: str | None) -> str | None:
    """None when the database opens read-only, else the one-line reason it does not.

    Read-only means read-only: a database of an older schema revision is never migrated here;
    the reason names ``optpipe db upgrade``, the one way to migrate.
    """
    from optpipe_lightning.profiles_db import DatabaseError, open_database

    try:
        open_database(db_url, read_only=True, create=False).close()
    except DatabaseError as e:
        return str(e)
    return None


def run_inspector(db_url: str | None, port: int | None, *, open_browser: bool = False) -> int:
    """Replace this process with the inspector's Streamlit server; 2 (with a line on stderr)
    when it cannot start: Streamlit not installed, a bad port, or a database it cannot read."""
    try:
        import altair  # noqa: F401
        import streamlit  # noqa: F401
    except ImportError as e:
        print(
            f"optpipe: error: {e.name} is not installed: "
            "pip install 'optpipe-lightning[inspector]'",
            file=sys.stderr,
        )
        return 2
    if port is not None and not 1 <= port <= 65535:
        print(f"optpipe: error: port {port} is out of range: use 1..65535", file=sys.stderr)
        return 2
    problem = check_database(db_url)
    if problem is not None:
        print(f"optpipe: error: {problem}", file=sys.stderr)
        return 2
    # a port of our own choosing (not Streamlit's 8501): the server's warm-up waits on it
    cmd = streamlit_command(db_url, port or free_port(), open_browser=open_browser)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(cmd[0], cmd)
    return 0  # not reached: execv replaced the process


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def spawn_inspector(db_url: str, port: int, *, timeout: float = 30.0) -> subprocess.Popen[bytes]:
    """Start the inspector as a child process and wait until it answers (tests, benchmarks).

    The caller stops it with ``proc.terminate()``; output goes to a temporary file so a full
    pipe never blocks the server.
    """
    import tempfile
    import time
    import urllib.request

    log = tempfile.TemporaryFile()  # noqa: SIM115 (the server writes to it after we return)
    proc = subprocess.Popen(
        streamlit_command(db_url, port),
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + timeout
    url = f"http://127.0.0.1:{port}/_stcore/health"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            tail = log.read().decode(errors="replace")[-2000:]
            raise RuntimeError(f"the inspector exited with {proc.returncode}: {tail}")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.read().strip() == b"ok":
                    return proc
        except OSError:
            time.sleep(0.1)
    proc.terminate()
    raise RuntimeError(f"the inspector did not answer on port {port} within {timeout:g} s")
