"""Problems and their schedules: store, read, list, and the best schedule of a problem.

``store_schedule`` stores the problem too (from ``problem=`` or the schedule's own embedded
problem), evaluates the schedule with the one simulator when it carries no evaluation, and
returns the existing id when the same schedule is stored again. ``best_schedule`` is the
feasible schedule with the smallest makespan (ties: the first stored); with
``feasible_only=False`` an infeasible one is returned only when no feasible one exists.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Select, case, func, select
from sqlalchemy.orm import Session

from optpipe_lightning.schedule import Problem, Schedule, evaluate

from .errors import NotFoundError
from .models import ProblemRecord, ScheduleRecord
from .rows import ProblemRow, ScheduleRow
from .storage import insert_unique, json_safe, parse_stored, sha256_hex
from .validation import evaluation_mismatch

__all__ = [
    "best_schedule",
    "get_problem",
    "get_schedule",
    "list_problems",
    "list_schedules",
    "store_problem",
    "store_schedule",
]


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
    insert_unique(s, record, lambda: s.get(ProblemRecord, h))
    return h


def get_problem(s: Session, problem_hash: str) -> Problem | None:
    rec = s.get(ProblemRecord, problem_hash)
    if rec is None:
        return None
    return parse_stored(Problem, rec.data, f"problem {problem_hash}")


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
    digest = sha256_hex(data)
    record = ScheduleRecord(
        problem_hash=schedule.problem_hash,
        generator=schedule.generator,
        source=source,
        digest=digest,
        makespan=evaluation.makespan,
        feasible=evaluation.feasible,
        bubble_rate=evaluation.bubble_rate,
        num_offloaded=schedule.num_offloaded(),
        params=json_safe(body.model_dump(mode="json")["params"], "schedule.params"),
        data=data,
    )
    rec = insert_unique(
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
    schedule = parse_stored(Schedule, rec.data, f"schedule {schedule_id}")
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
