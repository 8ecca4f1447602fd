"""Problems and their schedules: store, read, list, and the best schedule of a problem.

``store_schedule`` stores the problem too (from ``problem=`` or the schedule's own embedded
problem), evaluates the schedule with the one simulator when it carries no evaluation, and
returns the existing id when the same schedule is stored again: the same problem and actions
(``content_digest``), whatever generator, parameters or timings came with them. A schedule
built for a re-chunking of the problem the user gave (``given=``) stores that re-chunking
labelled by its chunking and linked to the given problem (``given_hash``), whose
``list_schedules(..., with_rechunkings=True)`` then lists the schedules of every chunking.
``best_schedule`` is the
feasible schedule with the smallest makespan (ties: the first stored); with
``feasible_only=False`` an infeasible one is returned only when no feasible one exists.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Select, case, func, select
from sqlalchemy.orm import Session

from optpipe_lightning.schedule import Problem, Schedule, evaluate

from .errors import NotFoundError
from .models import ProblemRecord, ScheduleRecord
from .rows import ProblemRow, ScheduleRow
from .storage import content_digest, insert_unique, json_safe, parse_stored, sha256_hex
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


def rechunked_name(problem: Problem, given: Problem) -> str:
    """The label of a re-chunking the solver or a baseline ran: the chunking that ran, then
    the given problem's name (``v=4 vshape re-chunking of 2 chunks per stage``)."""
    chunking = f"v={problem.num_chunks}" + (
        f" {problem.placement}" if problem.num_chunks > 1 else ""
    )
    of = given.name or f"{given.num_stages}x{given.num_microbatches}x{given.num_chunks}"
    return f"{chunking} re-chunking of {of}"


def store_problem(s: Session, problem: Problem, *, given: Problem | None = None) -> str:
    """Store a problem under its hash (idempotent: a stored hash is left as it is).

    ``given``: the problem the user gave when ``problem`` is a re-chunking of it; the row is
    labelled by its chunking and linked to ``given`` (stored too)."""
    h = problem.hash
    given_hash = None
    name = problem.name
    if given is not None and given.hash != h:
        given_hash = store_problem(s, given)
        name = rechunked_name(problem, given)
    limits = [x for x in problem.memory_limits() if x is not None]
    record = ProblemRecord(
        hash=h,
        given_hash=given_hash,
        name=None if name is None else name[:200],  # the full name is in data
        num_stages=problem.num_stages,
        num_microbatches=problem.num_microbatches,
        num_chunks=problem.num_chunks,
        placement=problem.placement,
        memory_limit=min(limits) if limits else None,
        offload=problem.offload is not None,
        data=problem.model_dump_json(),
    )
    stored = insert_unique(s, record, lambda: s.get(ProblemRecord, h))
    if given_hash is not None and stored.given_hash is None:  # stored before as it was given
        stored.given_hash, stored.name = given_hash, record.name
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
    rows = s.execute(q).all()
    # a problem the user gave counts the schedules of its re-chunkings too (every chunking
    # the solver and the baselines ran for it)
    counts = {p.hash: (n or 0, best) for p, n, best in rows}
    for p, n, best in rows:
        if p.given_hash in counts and n:
            total, top = counts[p.given_hash]
            bests = [x for x in (top, best) if x is not None]
            counts[p.given_hash] = (total + n, min(bests) if bests else None)
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
            num_schedules=counts[p.hash][0],
            best_makespan=counts[p.hash][1],
            given_hash=p.given_hash,
        )
        for p, _n, _best in rows
    ]


# ---- schedules -------------------------------------------------------------------------------


def store_schedule(
    s: Session,
    schedule: Schedule,
    *,
    problem: Problem | None = None,
    source: str = "baseline",
    given: Problem | None = None,
) -> int:
    """Store a schedule (and its problem); returns its id, the existing one if stored before.

    The problem comes from ``problem=``, else the schedule's embedded problem, else the
    database. The simulator evaluates every schedule; what is stored is its evaluation, and a
    schedule whose own evaluation says otherwise is refused (``ValueError``). ``given``: the
    problem the user gave, when the schedule's problem may be a re-chunking of it.
    """
    prob = problem if problem is not None else schedule.problem
    if prob is not None:
        if prob.hash != schedule.problem_hash:
            raise ValueError(
                f"the schedule is for problem {schedule.problem_hash}, not {prob.hash}: "
                "pass the problem it was made for"
            )
        store_problem(s, prob, given=given)
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
    content = content_digest(schedule.problem_hash, json.loads(data))
    same = s.scalars(
        select(ScheduleRecord.id).where(ScheduleRecord.content_digest == content).limit(1)
    ).first()
    if same is not None:  # the same schedule, found again (another run, another generator)
        return same
    record = ScheduleRecord(
        content_digest=content,
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


def list_schedules(
    s: Session, problem_hash: str | None = None, *, with_rechunkings: bool = False
) -> list[ScheduleRow]:
    """Schedules (of one problem, or all), best first: feasible, then by makespan.

    ``with_rechunkings``: also the schedules of the re-chunkings of that problem (the
    chunkings the solver and the baselines ran for it)."""
    q = select(ScheduleRecord)
    if problem_hash is not None and with_rechunkings:
        children = select(ProblemRecord.hash).where(ProblemRecord.given_hash == problem_hash)
        q = q.where(
            (ScheduleRecord.problem_hash == problem_hash)
            | ScheduleRecord.problem_hash.in_(children)
        )
    elif problem_hash is not None:
        q = q.where(ScheduleRecord.problem_hash == problem_hash)
    q = q.order_by(
        ScheduleRecord.problem_hash,
        ScheduleRecord.feasible.desc(),
        ScheduleRecord.makespan.is_(None),
        ScheduleRecord.makespan,
        ScheduleRecord.id,
    )
    return _schedule_rows(s, q)
