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

Every call goes through one path (``RunLog._call``) to a database process of its own
(``profiles_db.writer``): a fault of the database (unwritable, deleted or replaced, locked past
the busy timeout, full, a truncated ``-shm`` file, which kills the process that maps it with
SIGBUS) never reaches training. The first failure logs one warning naming a fallback file
(``fallback_path``); records that could not be written go there as JSON lines, buffered ones
after ``MAX_FAILURES`` failures in a row (or a dead database process) switch the link off, or at
the end. ``require_database=True`` makes a database that cannot be opened fail loudly before
training starts instead.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from ...schedule import Problem, Schedule
from ...schedule.profile import HardwareFingerprint, ModelFingerprint, Profile

log = logging.getLogger(__name__)

MAX_FAILURES = 3  # failed database calls in a row before the link is switched off
FLUSH_SECONDS = 10.0  # buffered step records are written at most this long after their step
# a locked database stalls a step at most this long per call (then the records are kept for
# the next try, or go to the fallback file)
BUSY_SECONDS = 5.0


_prefetched: dict[str | None, tuple[threading.Thread, list[Any]]] = {}


def prefetch_database(url: str | None) -> None:
    """Start the database process and open the database (SQLAlchemy's import and the
    migrations take about a second) in a thread of its own: called while this process waits
    for the other ranks to start, it is ready when the first step needs it. ``RunLog`` takes
    it over."""
    if url in _prefetched:
        return
    box: list[Any] = []

    def open_it() -> None:
        try:
            box.append(_writer(url))
        except Exception as e:  # reported by RunLog, like a failure to open there
            box.append(e)

    thread = threading.Thread(target=open_it, name="optpipe-open-database", daemon=True)
    _prefetched[url] = (thread, box)
    thread.start()


def _writer(url: str | None) -> Any:
    from ...profiles_db.writer import DatabaseWriter

    return DatabaseWriter(url, busy_timeout=BUSY_SECONDS)


def _open(url: str | None) -> Any:
    """The database process for ``url``: the prefetched one if there is one (raises what
    starting it raised)."""
    pre = _prefetched.pop(url, None)
    if pre is None:
        return _writer(url)
    pre[0].join()
    result = pre[1][0] if pre[1] else RuntimeError("opening the database did not finish")
    if isinstance(result, Exception):
        raise result
    return result


def fallback_path() -> Path:
    """Where a run's records go when the database fails: a new file in ``$OPTPIPE_RECORDS_DIR``,
    else the working directory, else the temporary directory."""
    name = f"optpipe-records-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}.jsonl"
    for folder in (os.environ.get("OPTPIPE_RECORDS_DIR"), os.getcwd(), tempfile.gettempdir()):
        if folder and os.access(folder, os.W_OK):
            return Path(folder) / name
    return Path(tempfile.gettempdir()) / name


def _plain(value: Any) -> Any:
    """``value`` as JSON: models as their JSON documents, tensors as numbers."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, str | bool | int):
        return value
    number = _number(value)
    return None if number is None or not math.isfinite(number) else number


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
    """Profiles, schedules, steps and switches of one training run in the database.

    Every call goes through ``_call`` to the database process (``profiles_db.writer``). The
    first one that fails logs one warning naming the fallback file; from then on what is not
    written to the database (buffered records kept for a later try are written when the link
    is switched off, at the end at the latest) goes to that file as JSON lines
    (``{"kind": "step", ...}``), so no record of the run is lost.
    """

    def __init__(
        self,
        url: str | None,
        enabled: bool,
        required: bool = False,
        flush_seconds: float = FLUSH_SECONDS,
    ) -> None:
        self.db: Any = None  # the database process (``DatabaseWriter``)
        self.run_id: int | None = None
        self.schedule_id: int | None = None  # the running schedule's id
        self.flush_seconds = flush_seconds
        self.failures = 0  # failed calls in a row
        self.last_ok = False  # whether the last ``_call`` reached the database
        self.fallback: Path | None = None  # where records go once the database failed
        self.unwritten = 0  # records written to the fallback file
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
            self._failed(f"cannot open the database {url or '(default)'}: {e}")
            self.close()

    @property
    def active(self) -> bool:
        """Whether records are kept: in the database, or in the fallback file."""
        return self.db is not None or self.fallback is not None

    @property
    def recording(self) -> bool:
        return self.run_id is not None or self.fallback is not None

    def _failed(self, why: str) -> None:
        """The one warning of the run (later failures are debug lines)."""
        if self.fallback is not None:
            log.debug("optpipe: database: %s", why)
            return
        self.fallback = fallback_path()
        log.warning(
            "optpipe: database failed (%s); training goes on, the records not written there "
            "go to %s",
            " ".join(why.split()),
            self.fallback,
        )

    def _journal(self, kind: str, **fields: Any) -> None:
        """One record that did not reach the database, appended to the fallback file."""
        if self.fallback is None:
            return
        line = json.dumps({"kind": kind, "run_id": self.run_id, **_plain(fields)})
        try:
            with open(self.fallback, "a", encoding="utf-8") as f:
                f.write(line + "\n")
            self.unwritten += 1
        except OSError as e:
            log.debug("optpipe: fallback file %s: %s", self.fallback, e)

    def _call(self, what: str, *ops: tuple[str, tuple[Any, ...], dict[str, Any]]) -> Any:
        """The one path to the database: ``ops`` (repository calls) in one transaction; None
        when it failed (then the caller journals what it meant to write)."""
        self.last_ok = False
        if self.db is None:
            return None
        try:
            out = self.db.call(*ops)
        except Exception as e:
            self.failures += 1
            self._failed(f"{what}: {e}")
            dead = getattr(self.db, "dead", None) is not None
            if dead or self.failures >= MAX_FAILURES:
                self.close()
            return None
        self.failures = 0
        self.last_ok = True
        return out

    def find_profile(
        self, hardware: HardwareFingerprint, model: ModelFingerprint
    ) -> Profile | None:
        return self._call("lookup", ("find_profile", (hardware, model), {}))

    def store_profile(self, profile: Profile) -> int | None:
        pid = self._call("store", ("store_profile", (profile,), {}))
        if not self.last_ok:
            self._journal("profile", profile=profile)
        return pid

    def store_schedule(self, schedule: Schedule, problem: Problem, source: str) -> int | None:
        """Store ``schedule`` as it runs on ``problem`` (``as_run``) with the problem."""
        ran = as_run(schedule, problem)
        op = ("store_schedule", (ran,), {"problem": problem, "source": source})
        return self._call("store", op)

    def start_run(
        self, hardware: HardwareFingerprint, model: ModelFingerprint, config: dict[str, Any]
    ) -> None:
        kwargs = {"hardware": hardware, "model": model, "config": config}
        self.run_id = self._call("start", ("start_training_run", (), kwargs))
        if not self.last_ok:
            self._journal("run", **kwargs)

    def record_step(
        self, step: int, seconds: float, predicted: float | None, peak_memory: list[float] | None
    ) -> None:
        """One optimizer step, against the schedule that ran it (buffered; see ``flush``).
        ``peak_memory=None``: every device's peak comes later (``fill_peaks``)."""
        if not self.recording:
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
        if not self.recording or not metrics:
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
        if not self.recording:
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
        if self.recording:
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
        fails; to the fallback file once the database is off); steps still waiting for their
        peaks stay, unless ``final``."""
        self._last_flush = time.monotonic()
        if not self.recording:
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
        ops: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        if run_id is not None:
            ops += [("record_step", (run_id,), row) for row in rows]
            ops += [("record_metrics", (run_id,), {"step": k, "metrics": m}) for k, m in metrics]
            ops += [("record_calibration", (run_id,), cal) for cal in calibrations]
            if limit is not None:
                ops.append(("record_memory_limit", (run_id, limit), {}))
        written = False
        if ops:
            self._call("record", *ops)
            written = self.last_ok
        if not written and self.db is not None and not final:
            return  # kept for the next try
        if not written:  # the database is off (or this is the end): the fallback file
            for row in rows:
                self._journal("step", **row)
            for step, m in metrics:
                self._journal("metrics", step=step, metrics=m)
            for cal in calibrations:
                self._journal("calibration", **cal)
            if limit is not None:
                self._journal("memory_limit", limits=limit)
        del self._steps[: len(rows)]
        del self._metrics[: len(metrics)]
        del self._calibrations[: len(calibrations)]
        if self._memory_limit is limit:
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
        fields = {
            "step": step,
            "from_schedule_id": from_id,
            "to_schedule_id": to_id,
            "reason": reason,
            "predicted_before": predicted_before,
            "predicted_after": predicted_after,
        }
        done = False
        if self.run_id is not None and to_id is not None:
            self._call("record", ("record_switch", (self.run_id,), fields))
            done = self.last_ok
        if not done and self.fallback is not None:
            self._journal(
                "switch",
                **fields,
                schedule=as_run(schedule, problem).model_copy(
                    update={"problem": None, "evaluation": None}
                ),
            )

    def finish(self, status: str) -> None:
        self.flush(final=True)
        if self.run_id is not None:
            run_id = self.run_id
            self._call("finish", ("finish_training_run", (run_id,), {"status": status}))
            if not self.last_ok:
                self._journal("finish", status=status)
            self.run_id = None
        elif self.fallback is not None:
            self._journal("finish", status=status)
        if self.fallback is not None and self.unwritten:
            log.info(
                "optpipe: %d records of this run are in %s (the database failed)",
                self.unwritten,
                self.fallback,
            )

    def close(self) -> None:
        db, self.db = self.db, None
        if db is not None:
            with contextlib.suppress(Exception):  # closing must not raise
                db.close()
