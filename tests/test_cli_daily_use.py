"""Issue 38: the command line starts without the database or the schedule model, says what
runs while the baselines run (on a terminal only), has ``--version`` and ``python -m``, and
``compare``/``baseline --db`` store every row they print."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap
from importlib.metadata import version
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from optpipe_lightning.cli import app
from optpipe_lightning.cli import output as cli_output

runner = CliRunner()
TINY = Path(__file__).resolve().parents[1] / "examples" / "problems" / "tiny-4x8.json"
HEAVY = ("sqlalchemy", "alembic", "numpy", "optpipe_lightning.schedule", "optpipe_lightning.solver")


def _imported_by(args: list[str]) -> list[str]:
    """The heavy modules a fresh interpreter imported to run ``optpipe ARGS``."""
    script = textwrap.dedent(
        f"""
        import sys
        from optpipe_lightning.cli import app
        try:
            app({args!r}, prog_name="optpipe")
        except SystemExit:
            pass
        heavy = {HEAVY!r}
        print("HEAVY", sorted(m for m in sys.modules if m.split(".")[0] in heavy
                              or any(m == h or m.startswith(h + ".") for h in heavy)))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("HEAVY"))
    return list(eval(line.removeprefix("HEAVY ")))  # a list literal printed by the child


@pytest.mark.parametrize(
    "args", [["--help"], ["compare", "--help"], ["db", "--help"], ["db", "list", "--help"]]
)
def test_help_imports_no_database_and_no_schedule_model(args: list[str]) -> None:
    assert _imported_by(args) == []


def test_version_and_python_dash_m() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "optpipe_lightning", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"optpipe-lightning {version('optpipe-lightning')}"
    helped = subprocess.run(
        [sys.executable, "-m", "optpipe_lightning", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert helped.returncode == 0 and "compare" in helped.stdout


def _terminal(monkeypatch: pytest.MonkeyPatch) -> io.StringIO:
    buf = io.StringIO()
    monkeypatch.setattr(cli_output, "err", Console(file=buf, force_terminal=True, width=100))
    return buf


def test_compare_shows_what_runs_on_a_terminal_only(monkeypatch: pytest.MonkeyPatch) -> None:
    buf = _terminal(monkeypatch)
    shown = runner.invoke(app, ["compare", str(TINY), "--no-solve", "--time-limit", "30"])
    assert shown.exit_code == 0, shown.output
    assert "compare: baseline gpipe (1/" in buf.getvalue()
    buf = _terminal(monkeypatch)
    as_json = runner.invoke(app, ["compare", str(TINY), "--no-solve", "--json"])
    assert as_json.exit_code == 0 and buf.getvalue() == ""  # --json: nothing beside the JSON
    assert json.loads(as_json.stdout)["schedules"]
    monkeypatch.setattr(cli_output, "err", Console(file=io.StringIO(), force_terminal=False))
    piped = runner.invoke(app, ["compare", str(TINY), "--no-solve"])
    assert piped.exit_code == 0 and "compare: baseline" not in piped.output


def test_compare_db_stores_every_printed_row_once(tmp_path: Path) -> None:
    from optpipe_lightning.profiles_db import open_database
    from optpipe_lightning.profiles_db import repository as repo

    url = f"sqlite:///{tmp_path / 'c.db'}"
    args = ["compare", str(TINY), "--json", "--no-solve", "--time-limit", "30", "--db", url]
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    printed = [r["name"] for r in json.loads(first.stdout)["schedules"]]
    again = runner.invoke(app, args)
    assert again.exit_code == 0 and again.stdout == first.stdout  # the JSON is unchanged
    with open_database(url, read_only=True) as db, db.session() as s:
        runs = repo.list_solver_runs(s)
        assert len(runs) == 2 and {r.status for r in runs} == {"baselines"}  # one per command
        rows = repo.run_rows(s, runs[0].problem_hash)
        assert sorted(rows) == sorted(printed)
        stored = repo.list_schedules(s)
        assert {r.id for r in stored} == set(rows.values())  # the second run stored nothing new
        assert len(stored) <= len(printed)


def test_baseline_db_stores_its_schedule(tmp_path: Path) -> None:
    from optpipe_lightning.profiles_db import open_database
    from optpipe_lightning.profiles_db import repository as repo

    url = f"sqlite:///{tmp_path / 'b.db'}"
    out = tmp_path / "g.json"
    done = runner.invoke(app, ["baseline", "gpipe", str(TINY), "--out", str(out), "--db", url])
    assert done.exit_code == 0, done.output
    with open_database(url, read_only=True) as db, db.session() as s:
        (run,) = repo.list_solver_runs(s)
        (sched,) = repo.list_schedules(s)
        assert (run.status, run.schedule_id, sched.generator) == ("baselines", sched.id, "gpipe")
