"""``optpipe db export`` around damaged rows and ``optpipe db delete`` (issue 33.5)."""

from __future__ import annotations

import json
import sqlite3
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

from db_builders import fused_rows, hardware, make_fbw, make_problem, make_profile, model_fp
from typer.testing import CliRunner

from optpipe_lightning.cli.db_commands import app
from optpipe_lightning.profiles_db import SolverEventRecorder, open_database
from optpipe_lightning.profiles_db import repository as repo
from optpipe_lightning.schedule.baselines import generate, make_schedule

runner = CliRunner()


def _filled(url: str) -> dict[str, int | str]:
    db = open_database(url)
    p = make_problem()
    with db.session() as s:
        a = repo.store_schedule(s, make_fbw(p))
        b = repo.store_schedule(s, make_schedule(p, "gpipe-fused", fused_rows(4, 8)))
        c = repo.store_schedule(s, generate("1f1b", p))
        repo.store_profile(s, make_profile(measured_at=datetime.now(UTC).isoformat()))
        srid = repo.start_solver_run(s, p.hash, "cp-sat", {})
        repo.finish_solver_run(
            s, srid, status="feasible", makespan=1.0, lower_bound=1.0, schedule_id=b
        )
        trid = repo.start_training_run(s, hardware=hardware(), model=model_fp(), config={})
        repo.record_step(
            s, trid, step=0, measured_seconds=1.0, predicted_seconds=0.9, schedule_id=b,
            peak_memory=[1.0],
        )  # fmt: skip
    with SolverEventRecorder(db, srid) as rec:
        for i in range(3):
            rec(SimpleNamespace(wall_time=0.1 * i, makespan=20.0 - i, bound=10.0))
    db.close()
    return {"problem": p.hash, "a": a, "b": b, "c": c, "srid": srid, "trid": trid}


def _damage(url: str, schedule_id: int, data: str = '{"format": "nonsense"') -> None:
    with sqlite3.connect(url.removeprefix("sqlite:///")) as c:
        c.execute("UPDATE schedules SET data = ? WHERE id = ?", (data, schedule_id))


def _count(url: str, table: str) -> int:
    with sqlite3.connect(url.removeprefix("sqlite:///")) as c:
        return int(c.execute(f"SELECT count(*) FROM {table}").fetchone()[0])


def test_export_writes_every_row_that_reads_and_names_the_damaged_one(
    sqlite_url: str, tmp_path: Path
) -> None:
    f = _filled(sqlite_url)
    _damage(sqlite_url, int(f["b"]))
    out = tmp_path / "export.json"
    res = runner.invoke(app, ["export", str(out), "--db", sqlite_url])
    assert res.exit_code == 0, res.output
    assert f"optpipe: warning: skipped schedule {f['b']}: " in res.stderr
    assert "2 schedules, 1 profile " in res.stderr and "skipped 1 row " in res.stderr
    doc = json.loads(out.read_text())
    assert [e["schedule"]["generator"] for e in doc["schedules"]] == ["fbw", "1f1b"]
    target = f"sqlite:///{tmp_path}/other.db"  # what was written imports
    res = runner.invoke(app, ["import", str(out), "--db", target])
    assert res.exit_code == 0 and "2 new schedules" in res.stderr, res.output


def test_delete_a_damaged_schedule_clears_the_references(sqlite_url: str) -> None:
    f = _filled(sqlite_url)
    _damage(sqlite_url, int(f["b"]))
    res = runner.invoke(app, ["delete", "schedule", str(f["b"]), "--yes", "--db", sqlite_url])
    assert res.exit_code == 0, res.output
    assert res.stdout.strip() == "deleted 1 schedules"
    assert _count(sqlite_url, "schedules") == 2
    with sqlite3.connect(sqlite_url.removeprefix("sqlite:///")) as c:
        assert c.execute("SELECT schedule_id FROM solver_runs").fetchone() == (None,)
        assert c.execute("SELECT schedule_id FROM training_steps").fetchone() == (None,)
    res = runner.invoke(app, ["check", "--db", sqlite_url])
    assert res.exit_code == 0, res.output


def test_delete_asks_first_and_keeps_everything_on_no(sqlite_url: str) -> None:
    f = _filled(sqlite_url)
    res = runner.invoke(app, ["delete", "problem", str(f["problem"]), "--db", sqlite_url],
                        input="n\n")  # fmt: skip
    assert res.exit_code == 1
    assert "3 schedules, 1 solver runs, 3 solver events" in res.stdout
    assert _count(sqlite_url, "problems") == 1 and _count(sqlite_url, "schedules") == 3
    res = runner.invoke(app, ["delete", "problem", str(f["problem"]), "--db", sqlite_url],
                        input="")  # fmt: skip
    assert res.exit_code == 2 and "pass --yes" in res.stderr
    res = runner.invoke(app, ["delete", "problem", str(f["problem"]), "--db", sqlite_url],
                        input="y\n")  # fmt: skip
    assert res.exit_code == 0, res.output
    for table in ("problems", "schedules", "solver_runs", "solver_events"):
        assert _count(sqlite_url, table) == 0, table
    assert _count(sqlite_url, "training_runs") == 1  # another run's history stays
    assert _count(sqlite_url, "training_steps") == 1


def test_delete_runs_with_their_rows_and_unknown_ids(sqlite_url: str) -> None:
    f = _filled(sqlite_url)
    res = runner.invoke(app, ["delete", "solver-run", str(f["srid"]), "-y", "--db", sqlite_url])
    assert res.exit_code == 0 and "1 solver runs, 3 solver events" in res.stdout, res.output
    assert _count(sqlite_url, "solver_events") == 0
    res = runner.invoke(app, ["delete", "training-run", str(f["trid"]), "-y", "--db", sqlite_url])
    assert res.exit_code == 0 and "1 training runs, 1 training steps" in res.stdout, res.output
    assert _count(sqlite_url, "training_steps") == 0
    res = runner.invoke(app, ["delete", "profile", "1", "-y", "--db", sqlite_url])
    assert res.exit_code == 0 and _count(sqlite_url, "profiles") == 0
    assert _count(sqlite_url, "schedules") == 3
    for args in (["schedule", "99"], ["problem", "beef"], ["training-run", "x"]):
        res = runner.invoke(app, ["delete", *args, "-y", "--db", sqlite_url])
        assert res.exit_code == 2, res.output
        assert res.stderr.startswith("optpipe: error: ") and res.stderr.count("\n") == 1
