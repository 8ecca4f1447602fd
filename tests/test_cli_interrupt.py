"""Ctrl-C, SIGTERM and kill -9 on ``optpipe solve``/``compare``: what was found is kept.

The signals are sent when the process is known to be ready for them (its SIGTERM handler is
installed, read from ``/proc/PID/status``; or the database shows a stored incumbent), never
after a guessed delay; the solve's time limit is far beyond what the test waits.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from bench_problems import bench_problem

from optpipe_lightning.cli.interrupt import run_stoppable, signals_stop
from optpipe_lightning.schedule import Schedule, evaluate

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")

ROOT = Path(__file__).resolve().parents[1]
WAIT = 240.0  # the most any wait here takes on a loaded machine (normally a few seconds)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}


def _cli(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "optpipe_lightning.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        cwd=ROOT,
    )


def _problem(tmp_path: Path) -> Path:
    path = tmp_path / "p.json"  # 8 x 32 x 2 with offload: no proof within the time limit
    path.write_text(bench_problem(8, 32, 2).model_dump_json())
    return path


def _until(what: str, ready: object, proc: subprocess.Popen[str]) -> None:
    end = time.monotonic() + WAIT
    while not ready():  # type: ignore[operator]
        assert proc.poll() is None, f"ended before {what}: {proc.communicate()}"
        assert time.monotonic() < end, f"no {what} within {WAIT} s"
        time.sleep(0.05)


def _catches_sigterm(pid: int) -> bool:
    """Whether the process installed its own SIGTERM handler (our signal handling is on)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    mask = int(next(x for x in status.splitlines() if x.startswith("SigCgt:")).split()[1], 16)
    return bool(mask & (1 << (signal.SIGTERM - 1)))


def _stored_incumbent(db: Path) -> bool:
    if not db.exists():
        return False
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as c:
            row = c.execute("SELECT schedule_id FROM solver_runs WHERE id = 1").fetchone()
    except sqlite3.Error:
        return False
    return row is not None and row[0] is not None


def _run_row(db: Path) -> tuple[str, float | None, int | None]:
    with sqlite3.connect(db) as c:
        status, makespan, sid = c.execute(
            "SELECT status, makespan, schedule_id FROM solver_runs WHERE id = 1"
        ).fetchone()
    return status, makespan, sid


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_solve_keeps_the_best_schedule(tmp_path: Path, sig: signal.Signals) -> None:
    problem = _problem(tmp_path)
    out, db = tmp_path / "best.json", tmp_path / "runs.sqlite"
    proc = _cli(
        "solve", str(problem), "--time-limit", "600", "--out", str(out), "--db", f"sqlite:///{db}"
    )
    try:
        _until("stored incumbent", lambda: _stored_incumbent(db), proc)
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=WAIT)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    assert stdout.startswith("interrupted ("), stdout
    assert "Traceback" not in stderr
    sched = Schedule.from_json(out.read_text())
    assert sched.problem is not None
    ev = evaluate(sched.problem, sched)  # the simulator agrees with the file
    assert ev.feasible and sched.evaluation is not None
    assert ev.makespan == pytest.approx(sched.evaluation.makespan, rel=1e-12)
    status, makespan, sid = _run_row(db)
    assert status == "interrupted"
    assert makespan == pytest.approx(ev.makespan, rel=1e-12)  # never overwritten with NULL
    assert sid is not None


def test_kill_9_leaves_the_best_incumbent_in_the_database(tmp_path: Path) -> None:
    problem = _problem(tmp_path)
    db = tmp_path / "runs.sqlite"
    proc = _cli("solve", str(problem), "--time-limit", "600", "--db", f"sqlite:///{db}")
    try:
        _until("stored incumbent", lambda: _stored_incumbent(db), proc)
        proc.kill()
        proc.communicate(timeout=WAIT)
    finally:
        if proc.poll() is None:
            proc.kill()
    url = f"sqlite:///{db}"
    show = subprocess.run(
        [sys.executable, "-m", "optpipe_lightning.cli", "db", "show", "solver-run", "1",
         "--db", url],
        capture_output=True, text=True, env=_env(), cwd=ROOT, check=True,
    )  # fmt: skip
    doc = json.loads(show.stdout)
    assert doc["status"] == "interrupted"
    assert f"optpipe db show schedule {doc['schedule_id']}" in doc["best_schedule"]
    got = subprocess.run(
        [sys.executable, "-m", "optpipe_lightning.cli", "db", "show", "schedule",
         str(doc["schedule_id"]), "--db", url],
        capture_output=True, text=True, env=_env(), cwd=ROOT, check=True,
    )  # fmt: skip
    sched = Schedule.from_json(got.stdout)
    assert sched.problem is not None
    ev = evaluate(sched.problem, sched)
    assert ev.feasible
    assert ev.makespan == pytest.approx(doc["makespan"], rel=1e-12)


def test_interrupted_compare_prints_its_rows_and_exits_130(tmp_path: Path) -> None:
    problem = _problem(tmp_path)
    proc = _cli("compare", str(problem), "--time-limit", "600", "--json")
    try:
        _until("signal handler", lambda: _catches_sigterm(proc.pid), proc)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=WAIT)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    doc = json.loads(stdout)
    assert doc["interrupted"] == "SIGTERM"
    assert all(r["feasible"] is not None for r in doc["schedules"])


def test_a_signal_sets_the_stop_event_and_the_search_returns() -> None:
    stop = threading.Event()

    def search() -> str:  # a search that honours its stop event
        assert stop.wait(WAIT)
        return "stopped"

    with signals_stop(stop) as caught:
        threading.Timer(0.01, os.kill, (os.getpid(), signal.SIGINT)).start()
        outcome = run_stoppable(search, caught)
    assert caught.name == "SIGINT"
    assert outcome.done and outcome.value == "stopped"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored


def test_a_search_that_ignores_the_stop_is_given_up_after_the_grace() -> None:
    stop, release = threading.Event(), threading.Event()

    def stubborn() -> str:
        release.wait(WAIT)
        return "late"

    with signals_stop(stop) as caught:
        threading.Timer(0.01, os.kill, (os.getpid(), signal.SIGTERM)).start()
        outcome = run_stoppable(stubborn, caught, grace=0.0)
    release.set()
    assert caught.name == "SIGTERM" and stop.is_set()
    assert not outcome.done  # abandoned: the caller uses the best incumbent instead
