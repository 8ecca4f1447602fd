"""Seconds from SIGINT/SIGTERM to the exit of ``optpipe solve`` (issue 33): the search stops,
the best schedule is simulated again, ``--out`` written and (``--db``) stored.

``python benchmarks/bench_interrupt.py``: ``bench_problem(8, 32, 2)`` with ``--time-limit 600``;
the signal is sent once the database holds an incumbent (without ``--db``: after 8 s).
"""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "benchmarks")]

from bench_problems import bench_problem  # noqa: E402


def _has_incumbent(db: Path) -> bool:
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as c:
            row = c.execute("SELECT schedule_id FROM solver_runs WHERE id = 1").fetchone()
    except sqlite3.Error:
        return False
    return row is not None and row[0] is not None


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        problem = Path(tmp, "p.json")
        problem.write_text(bench_problem(8, 32, 2).model_dump_json())
        for with_db in (True, False):
            for sig in (signal.SIGINT, signal.SIGTERM):
                db = Path(tmp, f"{with_db}-{sig.name}.db")
                args = [sys.executable, "-m", "optpipe_lightning.cli", "solve", str(problem),
                        "--time-limit", "600", "--out", str(Path(tmp, "out.json"))]  # fmt: skip
                if with_db:
                    args += ["--db", f"sqlite:///{db}"]
                proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                if with_db:
                    while not _has_incumbent(db):
                        time.sleep(0.05)
                else:
                    time.sleep(8)
                t = time.perf_counter()
                proc.send_signal(sig)
                proc.communicate()
                took = time.perf_counter() - t
                print(f"--db {with_db!s:5} {sig.name}: exit {proc.returncode} after {took:.2f} s")


if __name__ == "__main__":
    main()
