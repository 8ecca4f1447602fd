"""``optpipe db`` commands (``cli/db_commands.py``, mounted as ``optpipe db``)."""

from __future__ import annotations

import json
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
from db_builders import fused_rows, hardware, make_fbw, make_problem, make_profile, model_fp
from typer.testing import CliRunner

from optpipe_lightning.cli.db_commands import app
from optpipe_lightning.profiles_db import SolverEventRecorder, open_database
from optpipe_lightning.profiles_db import repository as repo
from optpipe_lightning.schedule.baselines import make_schedule

runner = CliRunner()


def _filled(url: str) -> dict[str, object]:
    db = open_database(url)
    p = make_problem()
    now = datetime.now(UTC)
    fbw, fused = make_fbw(p), make_schedule(p, "gpipe-fused", fused_rows(4, 8))
    with db.session() as s:
        a = repo.store_schedule(s, fbw)
        b = repo.store_schedule(s, fused, source="solver")
        for days in (3, 2, 1):
            repo.store_profile(
                s, make_profile(measured_at=(now - timedelta(days=days)).isoformat())
            )
        srid = repo.start_solver_run(s, p.hash, "cp-sat", {"time_limit": 1})
        trid = repo.start_training_run(s, hardware=hardware(), model=model_fp(), config={})
        repo.record_step(
            s, trid, step=0, measured_seconds=1.0, predicted_seconds=0.9, schedule_id=b,
            peak_memory=[1.0],
        )  # fmt: skip
    with SolverEventRecorder(db, srid) as rec:
        for i in range(5):
            rec(SimpleNamespace(wall_time=0.1 * i, makespan=20.0 - i, bound=10.0))
    db.close()
    return {"problem": p, "a": a, "b": b, "fbw": fbw, "fused": fused, "srid": srid, "trid": trid}


def _run(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    if result.exit_code not in (0, 2):
        raise AssertionError(f"exit {result.exit_code}: {result.output}") from result.exception
    return result.exit_code, result.stdout, result.stderr


def _one_line_error(args: list[str], *needles: str) -> str:
    code, out, err = _run(*args)
    assert code == 2, (out, err)
    assert err.startswith("optpipe: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err + out
    for n in needles:
        assert n in err, err
    return err


def test_list_and_show(sqlite_url: str) -> None:
    f = _filled(sqlite_url)
    p = f["problem"]
    code, out, _ = _run("list", "--db", sqlite_url)
    assert code == 0
    for needle in ("problems (1)", "schedules (2)", "profiles (3)", "solver-runs (1)",
                   "training-runs (1)", p.hash, "gpipe-fused", "cp-sat"):  # fmt: skip
        assert needle in out, needle
    code, out, _ = _run("list", "schedules", "--json", "--db", sqlite_url)
    rows = json.loads(out)["schedules"]
    assert [r["id"] for r in rows] == [f["a"], f["b"]]  # best first
    assert rows[0]["makespan"] == f["fbw"].evaluation.makespan
    assert rows[1]["source"] == "solver"

    code, out, _ = _run("show", "schedule", str(f["b"]), "--db", sqlite_url)
    assert code == 0 and json.loads(out) == f["fused"].model_dump(mode="json")
    code, out, _ = _run("show", "problem", p.hash, "--db", sqlite_url)
    assert json.loads(out)["num_stages"] == 4
    code, out, _ = _run("show", "solver-run", str(f["srid"]), "--db", sqlite_url)
    run = json.loads(out)
    assert [e["makespan"] for e in run["events"]] == [20.0, 19.0, 18.0, 17.0, 16.0]
    assert run["makespan"] == 16.0 and run["num_events"] == 5
    code, out, _ = _run("show", "training-run", str(f["trid"]), "--db", sqlite_url)
    assert json.loads(out)["steps"][0]["schedule_id"] == f["b"]


def test_errors_are_one_line_with_exit_2(sqlite_url: str, tmp_path: Path) -> None:
    _filled(sqlite_url)
    _one_line_error(["show", "schedule", "999", "--db", sqlite_url], "no schedule with id 999")
    _one_line_error(["show", "schedule", "abc", "--db", sqlite_url], "integers")
    _one_line_error(["show", "problem", "beef", "--db", sqlite_url], "no problem with hash")
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as c:
        c.execute("CREATE TABLE t (x)")
    _one_line_error(["list", "--db", f"sqlite:///{other}"], "not an optpipe database")
    _one_line_error(["list", "--db", f"sqlite:///{tmp_path}/missing/x.db"], "does not exist")
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "optpipe.db-export/1", "profiles": [{"nope": 1}]}')
    _one_line_error(["import", str(bad), "--db", sqlite_url], "not an optpipe export")
    bad.write_text("not json")
    _one_line_error(["import", str(bad), "--db", sqlite_url], "not an optpipe export")
    _one_line_error(["import", str(tmp_path / "none.json"), "--db", sqlite_url], "cannot read")


def test_export_import_round_trip(sqlite_url: str, tmp_path: Path) -> None:
    f = _filled(sqlite_url)
    out = tmp_path / "export.json"
    code, _, err = _run("export", str(out), "--db", sqlite_url)
    assert code == 0 and "2 schedules, 3 profiles" in err
    target = f"sqlite:///{tmp_path}/other.db"
    code, _, err = _run("import", str(out), "--db", target)
    assert code == 0 and "1 new problem, 2 new schedules, 3 new profiles" in err
    code, _, err = _run("import", str(out), "--db", target)  # idempotent
    assert "0 new problems, 0 new schedules, 0 new profiles" in err
    db = open_database(target)
    with db.session() as s:
        best = repo.best_schedule(s, f["problem"].hash)  # type: ignore[attr-defined]
        assert best is not None and best[1] == f["fbw"]
        got = repo.find_profile(s, hardware(), model_fp())
        assert got is not None and got.measured_at is not None
        newest = max(r.measured_at for r in repo.list_profiles(s))
        assert datetime.fromisoformat(got.measured_at) == newest
        sources = {r.generator: r.source for r in repo.list_schedules(s)}
    db.close()
    assert sources == {"fbw": "baseline", "gpipe-fused": "solver"}
    code, text_out, _ = _run("export", "-", "--no-schedules", "--db", target)
    doc = json.loads(text_out)
    assert (len(doc["profiles"]), doc["schedules"], doc["problems"]) == (3, [], [])


def test_prune(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _filled(sqlite_url)
    monkeypatch.setenv("OPTPIPE_DB_URL", sqlite_url)  # the default --db
    code, out, _ = _run("prune", "--dry-run")
    assert code == 0 and "would delete 2 profiles, 0 schedules" in out
    code, out, _ = _run("prune", "--keep-schedules", "1")
    # the fused schedule is referenced by a training step: kept although not the best
    assert "deleted 2 profiles, 0 schedules, 0 solver runs, 0 training runs" in out
    code, out, _ = _run("list", "profiles", "--json")
    assert len(json.loads(out)["profiles"]) == 1


def test_check(sqlite_url: str, tmp_path: Path) -> None:
    _filled(sqlite_url)
    code, out, _ = _run("check", "--db", sqlite_url)
    assert code == 0 and out.startswith("ok: ")
    path = Path(sqlite_url.removeprefix("sqlite:///"))
    with sqlite3.connect(path) as c:
        page = c.execute("PRAGMA page_size").fetchone()[0]
        root = c.execute("SELECT rootpage FROM sqlite_master WHERE name = 'profiles'").fetchone()[0]
    with open(path, "r+b") as f:  # damage a table the open does not read
        f.seek((root - 1) * page + 8)
        f.write(b"\xff" * (page - 8))
    _one_line_error(["check", "--db", sqlite_url], "problem, first:", "restore a backup")
