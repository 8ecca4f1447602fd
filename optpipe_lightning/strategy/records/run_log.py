"""The strategy's link to the profiles database, guarded: training never stops for the database.

Only global rank 0 talks to the database. A run records its profile, every schedule it switches
to (and the switch), every optimizer step's measured and predicted seconds against the schedule
that ran it, and how it ended (``finished``, ``failed`` or ``interrupted``).

Beside the step times it records, for the inspector's Training page (``profiles_db.training_log``):
each optimizer step's metrics (``train_loss``, ``samples``, ``tokens`` where the pipeline's input
is token ids, and ``val_loss`` after a validation run), every calibration with the predicted step
time before and after it, the memory limit per stage that the peaks are held against, and each
switch's predicted step time before and after it. All of it is buffered with the step records.

The log survives every switch: a schedule is stored under the problem it runs on (a solver
incumbent made for the profiled costs runs on the calibrated ones: it is stored as run, with
the running problem's hash; the actions are the same), so a switch to another problem hash,
chunking or partition never fails the store. Step records (and metrics, calibrations, the
memory limit) are buffered and written in one short transaction every ``flush_seconds`` (and
before a switch and at the end), so a step pays a list append, not a database commit. A loss
given as a tensor is read (``float``) only then, so recording it never waits for the device.

A failed write logs one warning and is retried with the next one (a busy SQLite file is
transient); the link is switched off only after ``MAX_FAILURES`` failures in a row, unless the
user asked for ``require_database=True`` (then opening fails loudly before training starts).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any

from ...schedule import Problem, Schedule
from ...schedule.profile import HardwareFingerprint, ModelFingerprint, Profile

log = logging.getLogger(__name__)

MAX_FAILURES = 3  # failed database calls in a row before the link is switched off
FLUSH_SECONDS = 10.0  # buffered step records are written at most this long after their step


_prefetched: dict[str | None, tuple[threading.Thread, list[Any]]] = {}


def prefetch_database(url: str | None) -> None:
    """Open the database in a thread of its own (SQLAlchemy's import and the migrations take
    about a second): called while this process waits for the other ranks to start, it is
    ready when the first step needs it. ``RunLog`` takes it over."""
    if url in _prefetched:
        return
    box: list[Any] = []

    def open_it() -> None:
        try:
            from ...profiles_db import open_database

            box.append(open_database(url))
        except Exception as e:  # reported by RunLog, like a failure to open there
            box.append(e)

    thread = threading.Thread(target=open_it, name="optpipe-open-database", daemon=True)
    _prefetched[url] = (thread, box)
    thread.start()


def _open(url: str | None) -> Any:
    """The database at ``url``: the prefetched one if there is one (raises what opening it
    raised)."""
    pre = _prefetched.pop(url, None)
    if pre is None:
        from ...profiles_db import open_database

        return open_database(url)
    pre[0].join()
    result = pre[1][0] if pre[1] else RuntimeError("opening the database did not finish")
    if isinstance(result, Exception):
        raise result
    return result


def _number(value: Any) -> float | None:
    """A metric's value as a float (a tensor is read here, when the buffer is written)."""
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def as_run(schedule: Schedule, problem: Problem) -> Schedule:
    """``schedule`` stated for ``problem`` (what it runs on): same actions and generator, the
    running problem's hash, no stale evaluation. Unchanged when it already is."""
    if schedule.problem_hash == problem.hash:
        return schedule
    return schedule.model_copy(
        update={"problem_hash": problem.hash, "problem": problem, "evaluation": None}
    )


class BatchMetrics:
    """The training batches of one optimizer step, as the run log's metrics: ``train_loss`` (the
    mean of their losses: floats, or scalar tensors left on the device until the log writes),
    ``samples`` and ``tokens`` (None: the input is not token ids), every replica together."""

    def __init__(self) -> None:
        self._losses: list[Any] = []
        self._samples = 0
        self._tokens: int | None = None

    def add(self, loss: Any, samples: int, tokens: int | None) -> None:
        if loss is not None:
            self._losses.append(loss)
        self._samples += samples
        if tokens is not None:
            self._tokens = (self._tokens or 0) + tokens

    def take(self) -> dict[str, Any]:
        """This optimizer step's metrics; the next step starts from nothing."""
        out: dict[str, Any] = {}
        if self._losses:
            total = self._losses[0]
            for x in self._losses[1:]:
                total = total + x
            n = len(self._losses)
            out["train_loss"] = total / n if n > 1 else total
        if self._samples:
            out["samples"] = float(self._samples)
        if self._tokens is not None:
            out["tokens"] = float(self._tokens)
        self._losses, self._samples, self._tokens = [], 0, None
        return out


class RunLog:
    """Profiles, schedules, steps and switches of one training run in the database."""

    def __init__(
        self,
        url: str | None,
        enabled: bool,
        required: bool = False,
        flush_seconds: float = FLUSH_SECONDS,
    ) -> None:
        self.db: Any = None
        self.run_id: int | None = None
        self.schedule_id: int | None = None  # the running schedule's id
        self.flush_seconds = flush_seconds
        self.failures = 0  # failed calls in a row
        self._steps: list[dict[str, Any]] = []  # buffered step records
        self._metrics: list[tuple[int, dict[str, Any]]] = []  # (step, name -> number or tensor)
        self._calibrations: list[dict[str, Any]] = []  # buffered calibration records
        self._memory_limit: list[float] | None = None  # to be written
        self._last_flush = time.monotonic()
        if not enabled:
            return
        try:
            self.db = _open(url)
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
            from ...profiles_db import repository as repo

            with self.db.session() as s:
                out = fn(repo, s, *args, **kwargs)
        except Exception as e:
            self.failures += 1
            if self.failures >= MAX_FAILURES:
                log.warning(
                    "optpipe: database %s failed (%s); %d failures in a row: carrying on without "
                    "the database",
                    what,
                    e,
                    self.failures,
                )
                self.close()
            else:
                log.warning("optpipe: database %s failed (%s); trying again later", what, e)
            return None
        self.failures = 0
        return out

    def find_profile(
        self, hardware: HardwareFingerprint, model: ModelFingerprint
    ) -> Profile | None:
        return self._call("lookup", lambda repo, s: repo.find_profile(s, hardware, model))

    def store_profile(self, profile: Profile) -> int | None:
        return self._call("store", lambda repo, s: repo.store_profile(s, profile))

    def store_schedule(self, schedule: Schedule, problem: Problem, source: str) -> int | None:
        """Store ``schedule`` as it runs on ``problem`` (``as_run``) with the problem."""
        ran = as_run(schedule, problem)
        sid = self._call(
            "store",
            lambda repo, s: repo.store_schedule(s, ran, problem=problem, source=source),
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
        self, step: int, seconds: float, predicted: float | None, peak_memory: list[float] | None
    ) -> None:
        """One optimizer step, against the schedule that ran it (buffered; see ``flush``).
        ``peak_memory=None``: every device's peak comes later (``fill_peaks``)."""
        if self.run_id is None:
            return
        self._steps.append(
            {
                "step": step,
                "measured_seconds": seconds,
                "predicted_seconds": predicted,
                "schedule_id": self.schedule_id,
                "peak_memory": peak_memory,
            }
        )
        if time.monotonic() - self._last_flush >= self.flush_seconds:
            self.flush()

    def record_metrics(self, step: int, metrics: dict[str, Any]) -> None:
        """Named numbers of one optimizer step (``training_log.record_metrics``; buffered). A
        value may be a scalar tensor: it is read when the buffer is written."""
        if self.run_id is None or not metrics:
            return
        self._metrics.append((step, dict(metrics)))

    def record_calibration(
        self,
        step: int,
        predicted_before: float | None,
        predicted_after: float | None,
        measured: float | None,
        reason: str,
    ) -> None:
        """A re-calibration of the running schedule's costs (buffered)."""
        if self.run_id is None:
            return
        self._calibrations.append(
            {
                "step": step,
                "schedule_id": self.schedule_id,
                "predicted_before": predicted_before,
                "predicted_after": predicted_after,
                "measured_seconds": measured,
                "reason": reason,
            }
        )

    def record_memory_limit(self, limits: list[float]) -> None:
        """Bytes per stage the measured peaks are held against (written with the next flush)."""
        if self.run_id is not None:
            self._memory_limit = [float(x) for x in limits]

    @property
    def pending_steps(self) -> int:
        return len(self._steps)

    def fill_peaks(self, peaks: dict[int, list[float]]) -> None:
        """Every device's peak memory of buffered steps (by step)."""
        for row in self._steps:
            if row["peak_memory"] is None and row["step"] in peaks:
                row["peak_memory"] = peaks[row["step"]]

    def flush(self, final: bool = False) -> None:
        """Write the buffered step records in one transaction (kept for the next try if it
        fails); steps still waiting for their peaks stay, unless ``final``."""
        self._last_flush = time.monotonic()
        if self.run_id is None:
            return
        run_id = self.run_id
        ready = len(self._steps)
        for i, row in enumerate(self._steps):
            if row["peak_memory"] is None:
                if not final:
                    ready = i
                    break
                row["peak_memory"] = []
        rows = self._steps[:ready]
        metrics = [(step, {k: _number(v) for k, v in m.items()}) for step, m in self._metrics]
        calibrations = list(self._calibrations)
        limit = self._memory_limit
        if not (rows or metrics or calibrations or limit is not None):
            return

        def write(repo: Any, s: Any) -> bool:
            for row in rows:
                repo.record_step(s, run_id, **row)
            for step, m in metrics:
                repo.record_metrics(s, run_id, step=step, metrics=m)
            for cal in calibrations:
                repo.record_calibration(s, run_id, **cal)
            if limit is not None:
                repo.record_memory_limit(s, run_id, limit)
            return True

        if self._call("record", write):
            del self._steps[: len(rows)]
            del self._metrics[: len(metrics)]
            del self._calibrations[: len(calibrations)]
            if self._memory_limit is limit:
                self._memory_limit = None
        elif self.db is None:
            self._steps.clear()
            self._metrics.clear()
            self._calibrations.clear()
            self._memory_limit = None

    def record_switch(
        self,
        step: int,
        schedule: Schedule,
        problem: Problem,
        reason: str,
        predicted_before: float | None = None,
        predicted_after: float | None = None,
    ) -> None:
        """``schedule`` runs on ``problem`` from ``step`` on: store both and the switch, with
        the predicted step times (seconds) of the schedule left and of this one."""
        self.flush()  # write what is ready (every buffered step keeps its schedule id)
        from_id = self.schedule_id
        to_id = self.store_schedule(schedule, problem, source=reason)
        self.schedule_id = to_id
        if self.run_id is None or to_id is None:
            return
        run_id = self.run_id
        self._call(
            "record",
            lambda repo, s: repo.record_switch(
                s,
                run_id,
                step=step,
                from_schedule_id=from_id,
                to_schedule_id=to_id,
                reason=reason,
                predicted_before=predicted_before,
                predicted_after=predicted_after,
            ),
        )

    def finish(self, status: str) -> None:
        self.flush(final=True)
        if self.run_id is not None:
            run_id = self.run_id
            self._call("finish", lambda repo, s: repo.finish_training_run(s, run_id, status=status))
            self.run_id = None

    def close(self) -> None:
        db, self.db = self.db, None
        if db is not None:
            with contextlib.suppress(Exception):  # closing must not raise
                db.close()
