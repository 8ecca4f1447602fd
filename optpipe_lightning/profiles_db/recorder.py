"""Recording solver incumbents without slowing the solver: a buffer and a background writer.

``SolverEventRecorder(db, run_id)`` is the solver's ``on_incumbent`` callback. A call only
appends ``(wall_time, makespan, bound)`` to a deque (lock-free, about a microsecond); a daemon
thread writes the buffer in one short transaction every ``flush_every`` seconds, or as soon as
``batch`` events wait, and moves the run's best makespan and bound along so a reader sees the
progress while the solver runs. ``close()`` (or leaving a ``with`` block) writes the rest.

A database failure never reaches the solver: the writer logs one warning, counts the events it
could not store in ``dropped``, and keeps trying with later events. ``flush()`` called directly
raises the ``DatabaseError`` instead.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from types import TracebackType
from typing import TYPE_CHECKING, Any

from sqlalchemy import insert, text

from .errors import DatabaseError
from .models import SolverEventRecord

if TYPE_CHECKING:
    from .database import Database

log = logging.getLogger("optpipe_lightning.profiles_db")

_Event = tuple[Any, Any, Any]  # (wall_time, makespan, bound) as the solver gave them
_SQLITE_INSERT = (
    "INSERT INTO solver_events (run_id, wall_time, makespan, bound) VALUES (?, ?, ?, ?)"
)
_PG_INSERT = "INSERT INTO solver_events (run_id, wall_time, makespan, bound) VALUES %s"


class SolverEventRecorder:
    """Batched, thread-safe recorder of one solver run's incumbents (an ``on_incumbent``)."""

    def __init__(
        self, db: Database, run_id: int, *, flush_every: float = 0.5, batch: int = 256
    ) -> None:
        if flush_every <= 0:
            raise ValueError("flush_every must be > 0 seconds")
        if batch < 1:
            raise ValueError("batch must be >= 1")
        self.db = db
        self.run_id = run_id
        self.flush_every = flush_every
        self.batch = batch
        self.recorded = 0  # events written
        self.dropped = 0  # events lost to database errors
        self.writer_seconds = 0.0  # CPU time of the writing thread(s) spent writing
        self._buf: deque[_Event] = deque()
        self._write_lock = threading.Lock()  # one writer at a time, in order
        self._wake = threading.Event()
        self._closed = False
        self._warned = False
        self._thread = threading.Thread(
            target=self._run, name=f"optpipe-solver-events-{run_id}", daemon=True
        )
        self._thread.start()

    # ---- the solver's side -------------------------------------------------------------------

    def __call__(self, incumbent: Any) -> None:
        """Queue one event; reads ``.wall_time``, ``.makespan`` and ``.bound`` (may be None).

        Lock-free (``deque.append`` is atomic); values become floats in the writer thread.
        """
        if self._closed:  # a late incumbent after close(): counted, never raised
            self.dropped += 1
            return
        buf = self._buf
        buf.append(
            (
                incumbent.wall_time,
                getattr(incumbent, "makespan", None),
                getattr(incumbent, "bound", None),
            )
        )
        if len(buf) >= self.batch:
            self._wake.set()

    # ---- writing -----------------------------------------------------------------------------

    def flush(self) -> None:
        """Write what is buffered now (raises ``DatabaseError`` if the database fails)."""
        self._write(raise_errors=True)

    def _take(self) -> list[_Event]:
        buf = self._buf
        popleft = buf.popleft
        return [popleft() for _ in range(len(buf))]  # under _write_lock: one taker, in order

    def _write(self, *, raise_errors: bool) -> None:
        with self._write_lock:
            events = self._take()
            if not events:
                return
            started = time.thread_time()
            try:
                self._insert(events)
            except DatabaseError as e:
                self.dropped += len(events)
                if raise_errors:
                    raise
                if not self._warned:
                    self._warned = True
                    log.warning("solver events of run %s not recorded: %s", self.run_id, e)
            except Exception as e:  # a bug or a vanished run must not kill the solver
                self.dropped += len(events)
                if raise_errors:
                    raise
                if not self._warned:
                    self._warned = True
                    log.warning(
                        "solver events of run %s not recorded: %s: %s",
                        self.run_id,
                        type(e).__name__,
                        e,
                    )
            else:
                self.recorded += len(events)
            finally:
                self.writer_seconds += time.thread_time() - started

    def _insert(self, events: list[_Event]) -> None:
        rid = self.run_id
        rows = [
            (rid, float(w), None if m is None else float(m), None if b is None else float(b))
            for w, m, b in events
        ]
        makespans = [r[2] for r in rows if r[2] is not None]
        bounds = [r[3] for r in rows if r[3] is not None]
        sets: list[str] = []
        params: dict[str, Any] = {"rid": rid}
        if makespans:  # the run's best makespan and bound follow the events
            sets.append(
                "makespan = CASE WHEN makespan IS NULL OR makespan > :m THEN :m ELSE makespan END"
            )
            params["m"] = min(makespans)
        if bounds:
            sets.append(
                "lower_bound = CASE WHEN lower_bound IS NULL OR lower_bound < :b THEN :b "
                "ELSE lower_bound END"
            )
            params["b"] = max(bounds)
        with self.db.connection() as conn:
            if conn.dialect.name == "sqlite":  # the driver's executemany: ~4x less Python
                conn.exec_driver_sql(_SQLITE_INSERT, rows)
            elif conn.dialect.driver == "psycopg2":  # one multi-row INSERT per 1,000 rows
                from psycopg2.extras import execute_values

                cur = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
                try:
                    execute_values(cur, _PG_INSERT, rows, page_size=1000)
                finally:
                    cur.close()
            else:  # SQLAlchemy batches these (insertmanyvalues) for server databases
                conn.execute(
                    insert(SolverEventRecord),
                    [
                        {"run_id": r, "wall_time": w, "makespan": m, "bound": b}
                        for r, w, m, b in rows
                    ],
                )
            if sets:
                conn.execute(
                    text(f"UPDATE solver_runs SET {', '.join(sets)} WHERE id = :rid"), params
                )

    def _run(self) -> None:
        while True:
            self._wake.wait(self.flush_every)
            self._wake.clear()
            closed = self._closed
            self._write(raise_errors=False)
            if closed:
                return

    # ---- lifetime ----------------------------------------------------------------------------

    def close(self) -> None:
        """Write every buffered event and stop the writer thread (idempotent)."""
        with self._write_lock:
            if self._closed:
                return
            self._closed = True
        self._wake.set()
        self._thread.join()
        self._write(raise_errors=False)

    def __enter__(self) -> SolverEventRecorder:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
