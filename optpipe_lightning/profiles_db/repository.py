"""Repository functions: what the solver, the strategy, the inspector and the CLI store and read.

Every function takes a ``Session`` (from ``Database.session()``, which commits on success), so a
caller groups calls into one short transaction. Problems, schedules and profiles are stored as
their validated JSON (never pickle) and validated again when read.

Lookup rules for reusing a profile (``find_profile``):

1. An exact fingerprint match reuses: the stored profile's ``HardwareFingerprint.key`` and
   ``ModelFingerprint.key`` equal the asked ones. The keys cover every field except the
   informative ``hostname`` (hardware) and ``name`` (model), so an identical machine of a team
   reuses a colleague's profile, and renaming a model does not lose its profile.
2. A different torch version, device kind, device count, device memory, interconnect or driver
   is a different hardware key, and a different layer structure, parameter shape, dtype,
   microbatch size, sequence length or partition a different model key: no reuse.
3. Of several profiles for one key, the newest ``measured_at`` wins (a profile without
   ``measured_at`` counts as measured when stored), so storing a newer profile refreshes it;
   the older ones stay until ``prune``.
4. With ``max_age_seconds``, a newest profile older than that is stale: ``None`` is returned
   (measure again and store the new profile, which then refreshes the key).
5. A stored profile that cannot serve the model it claims (``validation.profile_defect``: a
   (stage, chunk) it does not measure, values out of range) or whose row is damaged is skipped
   with a logged warning, and the next newest is considered.

Schedules: ``store_schedule`` stores the problem too (from ``problem=`` or the schedule's own
embedded problem), evaluates the schedule with the one simulator when it carries no evaluation,
and returns the existing id when the same schedule is stored again. ``best_schedule`` is the
feasible schedule with the smallest makespan (ties: the first stored); with
``feasible_only=False`` an infeasible one is returned only when no feasible one exists.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from sqlalchemy import Select, case, delete, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from optpipe_lightning.schedule import Problem, Schedule, evaluate
from optpipe_lightning.schedule.profile import HardwareFingerprint, ModelFingerprint, Profile

from .errors import DatabaseError, NotFoundError
from .models import (
    HardwareRecord,
    ModelRecord,
    ProblemRecord,
    ProfileRecord,
    ScheduleRecord,
    ScheduleSwitchRecord,
    SolverEventRecord,
    SolverRunRecord,
    TrainingCalibrationRecord,
    TrainingMetricRecord,
    TrainingRunRecord,
    TrainingStepRecord,
    utcnow,
)
from .owners import current_owner, display_status, mark_interrupted
from .recorder import SolverEventRecorder
from .rows import (
    ProblemRow,
    ProfileRow,
    PruneReport,
    ScheduleRow,
    SolverEventRow,
    SolverRunRow,
    StepRow,
    SwitchRow,
    TrainingRunRow,
)
from .training_log import (
    record_calibration,
    record_memory_limit,
    record_metrics,
    training_calibrations,
    training_metrics,
    training_run_detail,
)
from .validation import evaluation_mismatch, profile_defect

__all__ = [
    "SolverEventRecorder",
    "best_schedule",
    "find_profile",
    "finish_solver_run",
    "finish_training_run",
    "get_problem",
    "get_profile",
    "get_schedule",
    "get_solver_run",
    "list_problems",
    "list_profiles",
    "list_schedules",
    "list_solver_runs",
    "list_training_runs",
    "prune",
    "record_calibration",
    "record_memory_limit",
    "record_metrics",
    "record_step",
    "record_switch",
    "schedule_switches",
    "solver_events",
    "start_solver_run",
    "start_training_run",
    "store_problem",
    "store_profile",
    "store_schedule",
    "training_calibrations",
    "training_metrics",
    "training_run_detail",
    "training_steps",
]

log = logging.getLogger("optpipe_lightning.profiles_db")

M = TypeVar("M", bound=BaseModel)
R = TypeVar("R")


# ---- helpers ---------------------------------------------------------------------------------


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _parse(model: type[M], data: str, what: str) -> M:
    """Validate stored JSON on the way out; a bad row is a ``DatabaseError``, not a crash."""
    try:
        return model.model_validate_json(data)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"]) or "(top)"
        raise DatabaseError(
            f"stored {what} fails validation at {loc}: {err['msg']} "
            "(written by another tool or damaged; delete the row or restore a backup)"
        ) from None


def _json_safe(value: dict[str, Any], what: str) -> dict[str, Any]:
    try:
        out: dict[str, Any] = json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as e:
        raise ValueError(
            f"{what} must be JSON-serialisable (plain numbers and text): {e}"
        ) from None
    return out


def _insert_unique(s: Session, record: R, find: Callable[[], R | None]) -> R:
    """Insert ``record`` unless ``find()`` finds its twin; safe against a concurrent insert.

    SQLite sessions hold the write lock from their first statement (``BEGIN IMMEDIATE``), so
    check-then-insert cannot race there; elsewhere a savepoint catches the loser's conflict.
    """
    found = find()
    if found is not None:
        return found
    if s.get_bind().dialect.name == "sqlite":
        s.add(record)
        s.flush()
        return record
    try:
        with s.begin_nested():
            s.add(record)
        return record
    except IntegrityError:
        found = find()
        if found is None:
            raise
        return found


def _to_utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _measured_at(profile: Profile) -> datetime:
    if profile.measured_at is None:
        return utcnow()
    try:
        return _to_utc(datetime.fromisoformat(profile.measured_at))
    except ValueError:
        raise ValueError(
            f"profile.measured_at {profile.measured_at!r} is not an ISO-8601 time "
            "(e.g. 2025-01-31T12:00:00+00:00)"
        ) from None


# ---- problems --------------------------------------------------------------------------------


def store_problem(s: Session, problem: Problem) -> str:
    """Store a problem under its hash (idempotent: a stored hash is left as it is)."""
    h = problem.hash
    limits = [x for x in problem.memory_limits() if x is not None]
    record = ProblemRecord(
        hash=h,
        name=None if problem.name is None else problem.name[:200],  # the full name is in data
        num_stages=problem.num_stages,
        num_microbatches=problem.num_microbatches,
        num_chunks=problem.num_chunks,
        placement=problem.placement,
        memory_limit=min(limits) if limits else None,
        offload=problem.offload is not None,
        data=problem.model_dump_json(),
    )
    _insert_unique(s, record, lambda: s.get(ProblemRecord, h))
    return h


def get_problem(s: Session, problem_hash: str) -> Problem | None:
    rec = s.get(ProblemRecord, problem_hash)
    if rec is None:
        return None
    return _parse(Problem, rec.data, f"problem {problem_hash}")


def list_problems(s: Session) -> list[ProblemRow]:
    stats = (
        select(
            ScheduleRecord.problem_hash.label("h"),
            func.count(ScheduleRecord.id).label("n"),
            func.min(case((ScheduleRecord.feasible, ScheduleRecord.makespan))).label("best"),
        )
        .group_by(ScheduleRecord.problem_hash)
        .subquery()
    )
    q = (
        select(ProblemRecord, stats.c.n, stats.c.best)
        .outerjoin(stats, stats.c.h == ProblemRecord.hash)
        .order_by(ProblemRecord.created_at.desc(), ProblemRecord.hash)
    )
    return [
        ProblemRow(
            hash=p.hash,
            name=p.name,
            num_stages=p.num_stages,
            num_microbatches=p.num_microbatches,
            num_chunks=p.num_chunks,
            placement=p.placement,
            memory_limit=p.memory_limit,
            offload=p.offload,
            created_at=p.created_at,
            num_schedules=n or 0,
            best_makespan=best,
        )
        for p, n, best in s.execute(q).all()
    ]


# ---- schedules -------------------------------------------------------------------------------


def store_schedule(
    s: Session, schedule: Schedule, *, problem: Problem | None = None, source: str = "baseline"
) -> int:
    """Store a schedule (and its problem); returns its id, the existing one if stored before.

    The problem comes from ``problem=``, else the schedule's embedded problem, else the
    database. The simulator evaluates every schedule; what is stored is its evaluation, and a
    schedule whose own evaluation says otherwise is refused (``ValueError``).
    """
    prob = problem if problem is not None else schedule.problem
    if prob is not None:
        if prob.hash != schedule.problem_hash:
            raise ValueError(
                f"the schedule is for problem {schedule.problem_hash}, not {prob.hash}: "
                "pass the problem it was made for"
            )
        store_problem(s, prob)
    else:
        prob = get_problem(s, schedule.problem_hash)
        if prob is None:
            raise ValueError(
                f"problem {schedule.problem_hash} is not in the database: pass problem= "
                "or store the problem first"
            )
    actions = sum(len(row) for row in schedule.actions)
    most = 5 * prob.num_stages * prob.num_microbatches * prob.num_chunks  # F B W OFFLOAD RELOAD
    if actions > most:
        raise ValueError(
            f"schedule {schedule.generator!r} has {actions} actions; one for problem "
            f"{prob.hash} has at most {most}"
        )
    evaluation = evaluate(prob, schedule)  # a claimed evaluation is never trusted
    if schedule.evaluation is not None:
        wrong = evaluation_mismatch(schedule.evaluation, evaluation)
        if wrong is not None:
            raise ValueError(
                f"schedule {schedule.generator!r} for problem {schedule.problem_hash}: {wrong}; "
                "store it without its evaluation, or as the simulator evaluates it"
            )
    body = schedule.model_copy(update={"problem": None, "evaluation": evaluation})
    data = body.model_dump_json()
    digest = _sha(data)
    record = ScheduleRecord(
        problem_hash=schedule.problem_hash,
        generator=schedule.generator,
        source=source,
        digest=digest,
        makespan=evaluation.makespan,
        feasible=evaluation.feasible,
        bubble_rate=evaluation.bubble_rate,
        num_offloaded=schedule.num_offloaded(),
        params=_json_safe(body.model_dump(mode="json")["params"], "schedule.params"),
        data=data,
    )
    rec = _insert_unique(
        s,
        record,
        lambda: s.scalars(select(ScheduleRecord).where(ScheduleRecord.digest == digest)).first(),
    )
    return rec.id


def get_schedule(s: Session, schedule_id: int) -> Schedule:
    """The stored schedule with its problem embedded (``NotFoundError`` if there is none)."""
    rec = s.get(ScheduleRecord, schedule_id)
    if rec is None:
        raise NotFoundError(f"no schedule with id {schedule_id} in the database")
    schedule = _parse(Schedule, rec.data, f"schedule {schedule_id}")
    problem = get_problem(s, rec.problem_hash)
    return schedule.model_copy(update={"problem": problem}) if problem is not None else schedule


def best_schedule(
    s: Session, problem_hash: str, *, feasible_only: bool = True
) -> tuple[int, Schedule] | None:
    q = select(ScheduleRecord.id).where(ScheduleRecord.problem_hash == problem_hash)
    if feasible_only:
        q = q.where(ScheduleRecord.feasible.is_(True), ScheduleRecord.makespan.is_not(None))
    q = q.order_by(
        ScheduleRecord.feasible.desc(),
        ScheduleRecord.makespan.is_(None),
        ScheduleRecord.makespan,
        ScheduleRecord.id,
    ).limit(1)
    sid = s.scalars(q).first()
    if sid is None:
        return None
    return sid, get_schedule(s, sid)


def _schedule_rows(s: Session, q: Select[Any]) -> list[ScheduleRow]:
    return [
        ScheduleRow(
            id=r.id,
            problem_hash=r.problem_hash,
            generator=r.generator,
            source=r.source,
            makespan=r.makespan,
            feasible=r.feasible,
            bubble_rate=r.bubble_rate,
            num_offloaded=r.num_offloaded,
            created_at=r.created_at,
        )
        for r in s.scalars(q)
    ]


def list_schedules(s: Session, problem_hash: str | None = None) -> list[ScheduleRow]:
    """Schedules (of one problem, or all), best first: feasible, then by makespan."""
    q = select(ScheduleRecord)
    if problem_hash is not None:
        q = q.where(ScheduleRecord.problem_hash == problem_hash)
    q = q.order_by(
        ScheduleRecord.problem_hash,
        ScheduleRecord.feasible.desc(),
        ScheduleRecord.makespan.is_(None),
        ScheduleRecord.makespan,
        ScheduleRecord.id,
    )
    return _schedule_rows(s, q)


# ---- fingerprints and profiles ---------------------------------------------------------------


def _upsert_hardware(s: Session, hw: HardwareFingerprint) -> HardwareRecord:
    key = hw.key
    rec = _insert_unique(
        s,
        HardwareRecord(
            key=key,
            device_kind=hw.device_kind,
            device_count=hw.device_count,
            device_memory=hw.device_memory,
            interconnect=hw.interconnect,
            driver=hw.driver,
            torch_version=hw.torch_version,
            data=hw.model_dump_json(),
        ),
        lambda: s.scalars(select(HardwareRecord).where(HardwareRecord.key == key)).first(),
    )
    data = hw.model_dump_json()
    if rec.data != data:  # informative fields (hostname): keep the latest seen
        rec.data = data
    return rec


def _upsert_model(s: Session, model: ModelFingerprint) -> ModelRecord:
    key = model.key
    rec = _insert_unique(
        s,
        ModelRecord(
            key=key,
            name=model.name,
            dtype=model.dtype,
            num_layers=len(model.layer_structure),
            microbatch_size=model.microbatch_size,
            sequence_length=model.sequence_length,
            num_stages=model.num_stages,
            num_chunks=model.num_chunks,
            data=model.model_dump_json(),
        ),
        lambda: s.scalars(select(ModelRecord).where(ModelRecord.key == key)).first(),
    )
    if rec.name != model.name:  # informative: keep the latest name
        rec.name = model.name
        rec.data = model.model_dump_json()
    return rec


def store_profile(s: Session, profile: Profile) -> int:
    """Store a measured profile (upserting its fingerprints); the same profile again: same id.

    A profile that cannot serve the model it claims (``validation.profile_defect``) is refused
    with ``ValueError``.
    """
    defect = profile_defect(profile)
    if defect is not None:
        raise ValueError(f"profile of model {profile.model.name!r}: {defect}")
    measured = _measured_at(profile)
    data = profile.model_dump_json()
    digest = _sha(data)
    existing = s.scalars(select(ProfileRecord.id).where(ProfileRecord.digest == digest)).first()
    if existing is not None:
        return existing
    hw = _upsert_hardware(s, profile.hardware)
    model = _upsert_model(s, profile.model)
    rec = _insert_unique(
        s,
        ProfileRecord(
            hardware_id=hw.id,
            model_id=model.id,
            digest=digest,
            num_microbatches=profile.num_microbatches,
            measured_at=measured,
            data=data,
        ),
        lambda: s.scalars(select(ProfileRecord).where(ProfileRecord.digest == digest)).first(),
    )
    return rec.id


def find_profile(
    s: Session,
    hardware: HardwareFingerprint,
    model: ModelFingerprint,
    *,
    max_age_seconds: float | None = None,
) -> Profile | None:
    """The profile to reuse for (hardware, model), by the rules in this module's docstring."""
    q = (
        select(ProfileRecord)
        .join(HardwareRecord, HardwareRecord.id == ProfileRecord.hardware_id)
        .join(ModelRecord, ModelRecord.id == ProfileRecord.model_id)
        .where(HardwareRecord.key == hardware.key, ModelRecord.key == model.key)
        .order_by(ProfileRecord.measured_at.desc(), ProfileRecord.id.desc())
    )
    for rec in s.scalars(q):
        if max_age_seconds is not None:
            age = (utcnow() - rec.measured_at).total_seconds()
            if age > max_age_seconds:
                return None
        try:
            profile = _parse(Profile, rec.data, f"profile {rec.id}")
        except DatabaseError as e:
            log.warning("optpipe: skipping %s", e)
            continue
        defect = profile_defect(profile)
        if defect is None and (profile.model.key, profile.hardware.key) != (
            model.key,
            hardware.key,
        ):
            defect = "its JSON names another model or hardware than its row"
        if defect is None:
            return profile
        log.warning("optpipe: skipping stored profile %d: %s (measure again)", rec.id, defect)
    return None


def get_profile(s: Session, profile_id: int) -> Profile:
    rec = s.get(ProfileRecord, profile_id)
    if rec is None:
        raise NotFoundError(f"no profile with id {profile_id} in the database")
    return _parse(Profile, rec.data, f"profile {profile_id}")


def list_profiles(s: Session) -> list[ProfileRow]:
    q = (
        select(ProfileRecord, HardwareRecord, ModelRecord)
        .join(HardwareRecord, HardwareRecord.id == ProfileRecord.hardware_id)
        .join(ModelRecord, ModelRecord.id == ProfileRecord.model_id)
        .order_by(ProfileRecord.measured_at.desc(), ProfileRecord.id.desc())
    )
    return [
        ProfileRow(
            id=p.id,
            hardware_key=h.key,
            model_key=m.key,
            device_kind=h.device_kind,
            device_count=h.device_count,
            torch_version=h.torch_version,
            model_name=m.name,
            num_stages=m.num_stages,
            num_chunks=m.num_chunks,
            microbatch_size=m.microbatch_size,
            num_microbatches=p.num_microbatches,
            measured_at=p.measured_at,
            stored_at=p.stored_at,
        )
        for p, h, m in s.execute(q).all()
    ]


# ---- solver runs -----------------------------------------------------------------------------


def start_solver_run(s: Session, problem_hash: str, backend: str, params: dict[str, Any]) -> int:
    """A new solver run (status ``running``, owned by this process) for a stored problem.

    Runs of this host whose process is gone are marked ``interrupted`` first (``owners``)."""
    if s.get(ProblemRecord, problem_hash) is None:
        raise NotFoundError(
            f"problem {problem_hash} is not in the database: store_problem before a solver run"
        )
    mark_interrupted(s)
    rec = SolverRunRecord(
        problem_hash=problem_hash,
        backend=backend,
        params=_json_safe(params, "solver params"),
        status="running",
        owner=current_owner(),
    )
    s.add(rec)
    s.flush()
    return rec.id


def finish_solver_run(
    s: Session,
    run_id: int,
    *,
    status: str,
    makespan: float | None,
    lower_bound: float | None,
    schedule_id: int | None,
) -> None:
    rec = s.get(SolverRunRecord, run_id)
    if rec is None:
        raise NotFoundError(f"no solver run with id {run_id} in the database")
    rec.status = status
    rec.makespan = makespan
    rec.lower_bound = lower_bound
    rec.schedule_id = schedule_id
    rec.finished_at = utcnow()


def _solver_run_rows(s: Session, where: Any = None) -> list[SolverRunRow]:
    counts = (
        select(SolverEventRecord.run_id.label("rid"), func.count().label("n"))
        .group_by(SolverEventRecord.run_id)
        .subquery()
    )
    q = select(SolverRunRecord, counts.c.n).outerjoin(counts, counts.c.rid == SolverRunRecord.id)
    if where is not None:
        q = q.where(where)
    q = q.order_by(SolverRunRecord.started_at.desc(), SolverRunRecord.id.desc())
    return [
        SolverRunRow(
            id=r.id,
            problem_hash=r.problem_hash,
            backend=r.backend,
            status=display_status(r.status, r.owner),
            started_at=r.started_at,
            finished_at=r.finished_at,
            makespan=r.makespan,
            lower_bound=r.lower_bound,
            schedule_id=r.schedule_id,
            num_events=n or 0,
        )
        for r, n in s.execute(q).all()
    ]


def list_solver_runs(s: Session, problem_hash: str | None = None) -> list[SolverRunRow]:
    """Solver runs, newest first."""
    where = None if problem_hash is None else SolverRunRecord.problem_hash == problem_hash
    return _solver_run_rows(s, where)


def get_solver_run(s: Session, run_id: int) -> SolverRunRow:
    rows = _solver_run_rows(s, SolverRunRecord.id == run_id)
    if not rows:
        raise NotFoundError(f"no solver run with id {run_id} in the database")
    return rows[0]


def solver_events(s: Session, run_id: int) -> list[SolverEventRow]:
    """The run's incumbent events in time order."""
    q = (
        select(SolverEventRecord.wall_time, SolverEventRecord.makespan, SolverEventRecord.bound)
        .where(SolverEventRecord.run_id == run_id)
        .order_by(SolverEventRecord.wall_time, SolverEventRecord.id)
    )
    return [SolverEventRow(w, m, b) for w, m, b in s.execute(q).all()]


# ---- training runs ---------------------------------------------------------------------------


def start_training_run(
    s: Session,
    *,
    hardware: HardwareFingerprint,
    model: ModelFingerprint,
    config: dict[str, Any],
) -> int:
    """A new training run (status ``running``, owned by this process) on (hardware, model).

    Runs of this host whose process is gone are marked ``interrupted`` first (``owners``)."""
    hw = _upsert_hardware(s, hardware)
    mod = _upsert_model(s, model)
    mark_interrupted(s)
    rec = TrainingRunRecord(
        hardware_id=hw.id,
        model_id=mod.id,
        config=_json_safe(config, "training config"),
        status="running",
        owner=current_owner(),
    )
    s.add(rec)
    s.flush()
    return rec.id


def record_step(
    s: Session,
    run_id: int,
    *,
    step: int,
    measured_seconds: float,
    predicted_seconds: float | None,
    schedule_id: int | None,
    peak_memory: list[float],
) -> None:
    s.add(
        TrainingStepRecord(
            run_id=run_id,
            step=step,
            measured_seconds=float(measured_seconds),
            predicted_seconds=None if predicted_seconds is None else float(predicted_seconds),
            schedule_id=schedule_id,
            peak_memory=[float(x) for x in peak_memory],
        )
    )
    s.flush()


def record_switch(
    s: Session,
    run_id: int,
    *,
    step: int,
    from_schedule_id: int | None,
    to_schedule_id: int,
    reason: str,
    predicted_before: float | None = None,
    predicted_after: float | None = None,
) -> None:
    """A schedule switch; ``predicted_before`` / ``predicted_after`` are the predicted step
    times (seconds) of the schedule left and of the one adopted, on the costs of that moment."""
    s.add(
        ScheduleSwitchRecord(
            run_id=run_id,
            step=step,
            from_schedule_id=from_schedule_id,
            to_schedule_id=to_schedule_id,
            reason=reason,
            predicted_before=predicted_before,
            predicted_after=predicted_after,
        )
    )
    s.flush()


def finish_training_run(s: Session, run_id: int, *, status: str) -> None:
    rec = s.get(TrainingRunRecord, run_id)
    if rec is None:
        raise NotFoundError(f"no training run with id {run_id} in the database")
    rec.status = status
    rec.finished_at = utcnow()


def list_training_runs(s: Session) -> list[TrainingRunRow]:
    """Training runs, newest first."""
    counts = (
        select(TrainingStepRecord.run_id.label("rid"), func.count().label("n"))
        .group_by(TrainingStepRecord.run_id)
        .subquery()
    )
    q = (
        select(TrainingRunRecord, HardwareRecord, ModelRecord, counts.c.n)
        .join(HardwareRecord, HardwareRecord.id == TrainingRunRecord.hardware_id)
        .join(ModelRecord, ModelRecord.id == TrainingRunRecord.model_id)
        .outerjoin(counts, counts.c.rid == TrainingRunRecord.id)
        .order_by(TrainingRunRecord.started_at.desc(), TrainingRunRecord.id.desc())
    )
    return [
        TrainingRunRow(
            id=r.id,
            hardware_key=h.key,
            model_key=m.key,
            device_kind=h.device_kind,
            model_name=m.name,
            status=display_status(r.status, r.owner),
            started_at=r.started_at,
            finished_at=r.finished_at,
            num_steps=n or 0,
            config=dict(r.config),
        )
        for r, h, m, n in s.execute(q).all()
    ]


def training_steps(s: Session, run_id: int) -> list[StepRow]:
    q = (
        select(TrainingStepRecord)
        .where(TrainingStepRecord.run_id == run_id)
        .order_by(TrainingStepRecord.step, TrainingStepRecord.id)
    )
    return [
        StepRow(
            step=r.step,
            measured_seconds=r.measured_seconds,
            predicted_seconds=r.predicted_seconds,
            schedule_id=r.schedule_id,
            peak_memory=tuple(r.peak_memory),
            recorded_at=r.recorded_at,
        )
        for r in s.scalars(q)
    ]


def schedule_switches(s: Session, run_id: int) -> list[SwitchRow]:
    q = (
        select(ScheduleSwitchRecord)
        .where(ScheduleSwitchRecord.run_id == run_id)
        .order_by(ScheduleSwitchRecord.step, ScheduleSwitchRecord.id)
    )
    return [
        SwitchRow(
            step=r.step,
            from_schedule_id=r.from_schedule_id,
            to_schedule_id=r.to_schedule_id,
            reason=r.reason,
            recorded_at=r.recorded_at,
            predicted_before=r.predicted_before,
            predicted_after=r.predicted_after,
        )
        for r in s.scalars(q)
    ]


# ---- prune -----------------------------------------------------------------------------------


def prune(
    s: Session,
    *,
    keep_profiles: int = 1,
    keep_schedules: int | None = None,
    older_than_seconds: float | None = None,
    dry_run: bool = False,
) -> PruneReport:
    """Delete what no lookup returns any more; counts what was (or, dry, would be) deleted.

    - profiles: all but the newest ``keep_profiles`` per (hardware, model) key;
    - schedules (when ``keep_schedules`` is given): all but the best ``keep_schedules`` per
      problem, except schedules a solver run, a training step or a switch refers to;
    - runs (when ``older_than_seconds`` is given): finished solver and training runs started
      longer ago than that, with their events, steps, switches, metrics and calibrations.
    """
    if keep_profiles < 1:
        raise ValueError("keep_profiles must be >= 1 (the newest profile is what lookups reuse)")
    if keep_schedules is not None and keep_schedules < 1:
        raise ValueError("keep_schedules must be >= 1 (the best schedule is what lookups reuse)")

    drop_profiles: list[int] = []
    seen: dict[tuple[int, int], int] = {}
    for pid, hid, mid in s.execute(
        select(ProfileRecord.id, ProfileRecord.hardware_id, ProfileRecord.model_id).order_by(
            ProfileRecord.measured_at.desc(), ProfileRecord.id.desc()
        )
    ).all():
        n = seen.get((hid, mid), 0)
        seen[(hid, mid)] = n + 1
        if n >= keep_profiles:
            drop_profiles.append(pid)

    drop_runs: list[int] = []
    drop_training: list[int] = []
    if older_than_seconds is not None:
        cutoff = datetime.fromtimestamp(utcnow().timestamp() - older_than_seconds, UTC)
        drop_runs = list(
            s.scalars(
                select(SolverRunRecord.id).where(
                    SolverRunRecord.started_at < cutoff, SolverRunRecord.finished_at.is_not(None)
                )
            )
        )
        drop_training = list(
            s.scalars(
                select(TrainingRunRecord.id).where(
                    TrainingRunRecord.started_at < cutoff,
                    TrainingRunRecord.finished_at.is_not(None),
                )
            )
        )

    drop_schedules: list[int] = []
    if keep_schedules is not None:
        used: set[int] = set()
        for col, owner, gone in (
            (SolverRunRecord.schedule_id, SolverRunRecord.id, drop_runs),
            (TrainingStepRecord.schedule_id, TrainingStepRecord.run_id, drop_training),
            (ScheduleSwitchRecord.from_schedule_id, ScheduleSwitchRecord.run_id, drop_training),
            (ScheduleSwitchRecord.to_schedule_id, ScheduleSwitchRecord.run_id, drop_training),
            (
                TrainingCalibrationRecord.schedule_id,
                TrainingCalibrationRecord.run_id,
                drop_training,
            ),
        ):
            q = select(col).where(col.is_not(None))
            if gone:
                q = q.where(owner.not_in(gone))
            used.update(x for x in s.scalars(q.distinct()) if x is not None)
        count: dict[str, int] = {}
        for sid, h in s.execute(
            select(ScheduleRecord.id, ScheduleRecord.problem_hash).order_by(
                ScheduleRecord.problem_hash,
                ScheduleRecord.feasible.desc(),
                ScheduleRecord.makespan.is_(None),
                ScheduleRecord.makespan,
                ScheduleRecord.id,
            )
        ).all():
            n = count.get(h, 0)
            count[h] = n + 1
            if n >= keep_schedules and sid not in used:
                drop_schedules.append(sid)

    if not dry_run:
        _delete_in(s, SolverEventRecord, SolverEventRecord.run_id, drop_runs)
        _delete_in(s, SolverRunRecord, SolverRunRecord.id, drop_runs)
        _delete_in(s, TrainingStepRecord, TrainingStepRecord.run_id, drop_training)
        _delete_in(s, ScheduleSwitchRecord, ScheduleSwitchRecord.run_id, drop_training)
        _delete_in(s, TrainingMetricRecord, TrainingMetricRecord.run_id, drop_training)
        _delete_in(s, TrainingCalibrationRecord, TrainingCalibrationRecord.run_id, drop_training)
        _delete_in(s, TrainingRunRecord, TrainingRunRecord.id, drop_training)
        _delete_in(s, ProfileRecord, ProfileRecord.id, drop_profiles)
        _delete_in(s, ScheduleRecord, ScheduleRecord.id, drop_schedules)
        s.expire_all()
    return PruneReport(
        profiles=len(drop_profiles),
        schedules=len(drop_schedules),
        solver_runs=len(drop_runs),
        training_runs=len(drop_training),
        dry_run=dry_run,
    )


def _delete_in(s: Session, model: type[Any], col: Any, ids: list[int], chunk: int = 500) -> None:
    for i in range(0, len(ids), chunk):
        s.execute(
            delete(model)
            .where(col.in_(ids[i : i + chunk]))
            .execution_options(synchronize_session=False)
        )
