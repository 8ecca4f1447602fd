"""Launching the inspector: the Streamlit command line, start-up errors, no torch import."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from optpipe_lightning.cli.demo import DemoDatabase
from optpipe_lightning.inspector import launch
from optpipe_lightning.inspector.ui import parse_db_arg


def test_command_line() -> None:
    cmd = launch.streamlit_command("sqlite:////tmp/x.db", 8600)
    assert cmd[:4] == [sys.executable, "-m", "optpipe_lightning.inspector.serve", str(launch.APP)]
    opts = dict(zip(cmd[4:-3:2], cmd[5:-3:2], strict=True))
    assert opts == {
        "--server.address": "127.0.0.1",
        "--browser.gatherUsageStats": "false",
        "--server.headless": "true",
        "--server.fileWatcherType": "none",
        "--client.toolbarMode": "viewer",
        "--server.showEmailPrompt": "false",
        "--server.port": "8600",
    }
    assert cmd[-3:] == ["--", "--db", "sqlite:////tmp/x.db"]
    plain = launch.streamlit_command(None, None, open_browser=True)
    assert "--server.port" not in plain and "--" not in plain
    assert plain[plain.index("--server.headless") + 1] == "false"
    assert launch.APP.is_file()


def test_app_arguments() -> None:
    assert parse_db_arg(["--db", "sqlite:///a.db"]) == "sqlite:///a.db"
    assert parse_db_arg(["--db=postgresql://u@h/d"]) == "postgresql://u@h/d"
    assert parse_db_arg(["-q", "tests/x.py"]) is None  # pytest's own arguments are not a URL


def test_run_inspector_execs_streamlit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from optpipe_lightning.profiles_db import open_database

    url = f"sqlite:///{tmp_path / 'ok.db'}"
    open_database(url).close()
    seen: list[list[str]] = []

    def fake_execv(path: str, argv: list[str]) -> None:
        seen.append(argv)
        raise SystemExit(0)

    monkeypatch.setattr(launch.os, "execv", fake_execv)
    with pytest.raises(SystemExit):
        launch.run_inspector(url, 8765)
    assert seen == [launch.streamlit_command(url, 8765)]


@pytest.mark.parametrize(
    ("url", "port", "message"),
    [
        ("sqlite:///{tmp}/missing.db", None, "no database at {tmp}/missing.db to read"),
        ("sqlite:///{tmp}/ok.db", 70000, "port 70000 is out of range: use 1..65535"),
        ("not a url", None, "'not a url' is not a database URL"),
    ],
)
def test_start_up_errors_are_one_line(
    url: str, port: int | None, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from optpipe_lightning.profiles_db import open_database

    open_database(f"sqlite:///{tmp_path / 'ok.db'}").close()
    rc = launch.run_inspector(url.format(tmp=tmp_path), port)
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith("optpipe: error: ")
    assert message.format(tmp=tmp_path) in err


def test_browsing_never_imports_torch(demo_db: DemoDatabase) -> None:
    """Every page, run in a fresh interpreter: neither torch, the strategy nor the solver gets
    imported."""
    script = textwrap.dedent(
        f"""
        import os, sys
        from streamlit.testing.v1 import AppTest
        from optpipe_lightning.inspector import launch
        os.environ["OPTPIPE_DB_URL"] = "{demo_db.url}"
        at = AppTest.from_file(str(launch.APP), default_timeout=60).run()
        for page in ("timeline", "memory", "solver", "compare", "profiles", "training", "export"):
            at.switch_page(f"views/{{page}}.py").run()
            assert not at.exception, (page, at.exception)
        bad = sorted(m for m in sys.modules if m == "torch" or m.startswith(("torch.", "lightning",
                     "optpipe_lightning.strategy", "optpipe_lightning.solver",
                     "optpipe_lightning.cli.demo")))
        print("IMPORTED", bad)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "IMPORTED []" in out.stdout


def test_an_older_schema_is_refused_unchanged_with_the_upgrade_command(tmp_path: Path) -> None:
    import hashlib

    from alembic import command

    from optpipe_lightning.profiles_db import open_database
    from optpipe_lightning.profiles_db.database import _alembic_config

    path = tmp_path / "old.db"
    url = f"sqlite:///{path}"
    db = open_database(url)
    with db.engine.begin() as conn:
        command.downgrade(_alembic_config(conn), "0001")
    db.close()
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    problem = launch.check_database(url)
    assert problem is not None
    assert "older schema revision 0001" in problem and f"optpipe db upgrade --db {url}" in problem
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before  # read-only: not one byte
    assert not (tmp_path / "old.db.0001.bak").exists()


def test_inspect_demo_builds_then_launches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from optpipe_lightning.cli import app, demo

    calls: list[tuple[str, ...]] = []
    monkeypatch.setattr(demo, "build_demo_database", lambda url, **kw: calls.append(("build", url)))
    monkeypatch.setattr(
        launch, "run_inspector", lambda url, port: calls.append(("run", url, str(port))) or 0
    )
    url = f"sqlite:///{tmp_path / 'demo.db'}"
    result = CliRunner().invoke(app, ["inspect", "--demo", "--db", url, "--port", "8601"])
    assert result.exit_code == 0, result.output
    assert calls == [("build", url), ("run", url, "8601")]
