"""The strategy's link to the profiles database, guarded: training never stops for the database.

Only global rank 0 talks to the database; every call is wrapped so a failure logs one warning and
switches the link off, unless the user asked for ``require_database=True`` (then opening fails
loudly before training starts). A run records its profile, every schedule it switches to (and
the switch), every optimizer step's measured and predicted seconds against the schedule that
ran it, and how it ended (``finished``, ``failed`` or ``interrupted``).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from ..schedule import Problem, Schedule
from ..schedule.profile import HardwareFingerprint, ModelFingerprint, Profile

log = logging.getLogger(__name__)


class RunLog:
    """Profiles, schedules, steps and switches of one training run in the database."""

    def __init__(self, url: str | None, enabled: bool, required: bool = False) -> None:
        self.db: Any = None
        self.run_id: int | None = None
        self.schedule_id: int | None = None  # the running schedule's id
        if not enabled:
            return
        try:
            from ..profiles_db import open_database

            self.db = open_database(url)
        except Exception as e:
            if required:
                raise RuntimeError(f"optpipe: cannot open the database {url!r}: {e}") from e
            log.warning("optpipe: carrying on without the database (%s)", e)
            self.db = None

    @property
    def active(self) -> bool:
        return self.db is not None

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        if self.db is None:
            return None
        try:
            from ..profiles_db import repository as repo

            with self.db.session() as s:
                return fn(repo, s, *args, **kwargs)
        except Exception as e:
            log.warning(
                "optpipe: database %s failed (%s); carrying on without the database", what, e
            )
            self.close()
            return None

    def find_profile(
        self, hardware: HardwareFingerprint, model: ModelFingerprint
    ) -> Profile | None:
        return self._call("lookup", lambda repo, s: repo.find_profile(s, hardware, model))

    def store_profile(self, profile: Profile) -> int | None:
        return self._call("store", lambda repo, s: repo.store_profile(s, profile))

    def store_schedule(self, schedule: Schedule, problem: Problem, source: str) -> int | None:
        sid = self._call(
            "store",
            lambda repo, s: repo.store_schedule(s, schedule, problem=problem, source=source),
        )
        return sid

    def start_run(
        self, hardware: HardwareFingerprint, model: ModelFingerprint, config: dict[str, Any]
    ) -> None:
        self.run_id = self._call(
            "start",
            lambda repo, s: repo.start_training_run(
                s, hardware=hardware, model=model, config=config
            ),
        )

    def record_step(
        self, step: int, seconds: float, predicted: float | None, peak_memory: list[float]
    ) -> None:
        """One optimizer step, against the schedule that ran it."""
        if self.run_id is None:
            return
        run_id, schedule_id = self.run_id, self.schedule_id
        self._call(
            "record",
            lambda repo, s: repo.record_step(
                s,
                run_id,
                step=step,
                measured_seconds=seconds,
                predicted_seconds=predicted,
                schedule_id=schedule_id,
                peak_memory=peak_memory,
            ),
        )

    def record_switch(self, step: int, schedule: Schedule, problem: Problem, reason: str) -> None:
        """``schedule`` runs from ``step`` on: store it and the switch to it."""
        from_id = self.schedule_id
        self.schedule_id = self.store_schedule(schedule, problem, source=reason)
        to_id = self.schedule_id
        if self.run_id is None or to_id is None:
            return
        run_id = self.run_id
        self._call(
            "record",
            lambda repo, s: repo.record_switch(
                s, run_id, step=step, from_schedule_id=from_id, to_schedule_id=to_id, reason=reason
            ),
        )

    def finish(self, status: str) -> None:
        if self.run_id is not None:
            run_id = self.run_id
            self._call("finish", lambda repo, s: repo.finish_training_run(s, run_id, status=status))
            self.run_id = None

    def close(self) -> None:
        db, self.db = self.db, None
        if db is not None:
            with contextlib.suppress(Exception):  # closing must not raise
                db.close()
