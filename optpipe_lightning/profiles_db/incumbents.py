"""The best incumbent schedule of a running solver run, kept in the database as it improves.

``IncumbentKeeper(db, run_id)`` is an ``on_incumbent`` callback: a call only remembers the
schedule; a daemon thread stores the newest one (``source="incumbent"``) at most every
``every`` seconds and points the run's ``schedule_id`` and ``makespan`` at it, so that a solve
killed without warning (kill -9, a power cut) leaves its best schedule behind:
``optpipe db show solver-run RUN`` names it and ``optpipe db show schedule ID`` prints it. A store (which simulates the schedule again) takes at
most about a tenth of the time: the next waits ten times as long as the last one took.
``close()`` stores the last one. A database failure never reaches the solver: one warning is
logged and later incumbents are tried again.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from sqlalchemy import text

if TYPE_CHECKING:
    from optpipe_lightning.schedule import Schedule

    from .database import Database

log = logging.getLogger("optpipe_lightning.profiles_db")


class IncumbentKeeper:
    """Stores the newest incumbent schedule of run ``run_id`` every ``every`` seconds."""

    def __init__(self, db: Database, run_id: int, *, every: float = 1.0) -> None:
        if every <= 0:
            raise ValueError("every must be > 0 seconds")
        self.db = db
        self.run_id = run_id
        self.every = every
        self.stored: int | None = None  # id of the schedule stored last
        self.write_seconds = 0.0  # how long the last store took
        self._pending: Schedule | None = None
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self._warned = False
        self._thread = threading.Thread(
            target=self._run, name=f"optpipe-incumbents-{run_id}", daemon=True
        )
        self._thread.start()

    def __call__(self, incumbent: Any) -> None:
        sched = getattr(incumbent, "schedule", None)
        if sched is None or self._closed:
            return
        with self._lock:
            self._pending = sched

    def _write(self) -> None:
        with self._write_lock:
            with self._lock:
                sched, self._pending = self._pending, None
            if sched is None:
                return
            from .schedules import store_schedule

            started = time.perf_counter()
            try:
                with self.db.session() as s:
                    sid = store_schedule(s, sched, source="incumbent")
                    s.execute(
                        text(
                            "UPDATE solver_runs SET schedule_id = :sid, makespan = CASE WHEN "
                            "makespan IS NULL OR makespan > :m THEN :m ELSE makespan END "
                            "WHERE id = :rid"
                        ),
                        {
                            "sid": sid,
                            "m": sched.evaluation.makespan if sched.evaluation else None,
                            "rid": self.run_id,
                        },
                    )
                self.stored = sid
                self.write_seconds = time.perf_counter() - started
            except Exception as e:  # never the solver's problem
                if not self._warned:
                    self._warned = True
                    log.warning(
                        "incumbent schedule of solver run %s not stored: %s: %s",
                        self.run_id,
                        type(e).__name__,
                        e,
                    )

    def _run(self) -> None:
        while not self._closed:
            self._wake.wait(max(self.every, 10 * self.write_seconds))
            if self._closed:
                return
            self._write()

    def close(self, *, store_last: bool = True) -> None:
        """Stop the thread; store the newest incumbent not stored yet (``store_last``)."""
        self._closed = True
        self._wake.set()
        self._thread.join()
        if store_last:
            self._write()
