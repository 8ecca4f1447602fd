"""Export and import as one JSON document (``optpipe.db-export/1``): moving profiles and
schedules between machines.

The document holds problems, schedules (each with the ``source`` it was stored with) and
profiles, all in their own validated JSON formats. Importing is idempotent: what is already
stored (same problem hash, same schedule, same profile) is skipped, so importing a file twice
or into the database it came from changes nothing. Runs (solver and training) are local history
and are not exported.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from optpipe_lightning.schedule import Problem, Schedule
from optpipe_lightning.schedule.profile import Profile

from . import repository as repo
from .errors import DatabaseError
from .models import ProblemRecord, ProfileRecord, ScheduleRecord

EXPORT_FORMAT = "optpipe.db-export/1"
# what reading a damaged row raises: its JSON fails validation (DatabaseError) or does not parse
# at all (a JSON column: ValueError), or a stored value is of the wrong type
_UNREADABLE = (DatabaseError, ValueError, TypeError, KeyError)


class ExportedSchedule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str = Field(default="import", max_length=32)
    schedule: Schedule


class ExportDocument(BaseModel):
    """What ``optpipe db export`` writes and ``optpipe db import`` reads."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["optpipe.db-export/1"] = "optpipe.db-export/1"
    exported_at: str = Field(default_factory=lambda: datetime.now(UTC).isoformat())
    problems: list[Problem] = Field(default_factory=list)
    schedules: list[ExportedSchedule] = Field(default_factory=list)
    profiles: list[Profile] = Field(default_factory=list)


class ImportCounts(BaseModel):
    problems: int = 0
    schedules: int = 0
    profiles: int = 0


def export_document(
    s: Session,
    *,
    profiles: bool = True,
    schedules: bool = True,
    problem_hash: str | None = None,
    skipped: list[str] | None = None,
) -> ExportDocument:
    """Everything selected, in storage order (problems first, so an import can follow it).

    A row that does not read (damaged, or written by another tool) is left out and named in
    ``skipped`` (``"schedule 12: ..."``); everything that reads is exported. Without
    ``skipped`` the first such row raises its ``DatabaseError``."""

    def unreadable(what: str, e: Exception) -> None:
        if skipped is None:
            raise e
        skipped.append(f"{what}: {e}")

    problems: list[Problem] = []
    out_schedules: list[ExportedSchedule] = []
    if schedules:
        q = select(ProblemRecord.hash).order_by(ProblemRecord.created_at, ProblemRecord.hash)
        if problem_hash is not None:
            q = q.where(ProblemRecord.hash == problem_hash)
        for h in s.scalars(q).all():
            try:
                p = repo.get_problem(s, h)
            except _UNREADABLE as e:
                unreadable(f"problem {h}", e)
                continue
            if p is not None:
                problems.append(p)
        sq = select(ScheduleRecord.id, ScheduleRecord.source).order_by(ScheduleRecord.id)
        if problem_hash is not None:
            sq = sq.where(ScheduleRecord.problem_hash == problem_hash)
        for sid, source in s.execute(sq).all():
            try:
                sched = repo.get_schedule(s, sid).model_copy(update={"problem": None})
                out_schedules.append(ExportedSchedule(source=source, schedule=sched))
            except _UNREADABLE as e:
                unreadable(f"schedule {sid}", e)
    out_profiles: list[Profile] = []
    if profiles:
        for pid in s.scalars(select(ProfileRecord.id).order_by(ProfileRecord.id)).all():
            try:
                out_profiles.append(repo.get_profile(s, pid))
            except _UNREADABLE as e:
                unreadable(f"profile {pid}", e)
    return ExportDocument(problems=problems, schedules=out_schedules, profiles=out_profiles)


def _counts(s: Session) -> ImportCounts:
    return ImportCounts(
        problems=s.scalar(select(func.count()).select_from(ProblemRecord)) or 0,
        schedules=s.scalar(select(func.count()).select_from(ScheduleRecord)) or 0,
        profiles=s.scalar(select(func.count()).select_from(ProfileRecord)) or 0,
    )


def import_document(s: Session, doc: ExportDocument) -> ImportCounts:
    """Store everything in ``doc``; returns how many rows were new.

    Nothing is trusted: schedules are simulated again (``store_schedule`` refuses one whose
    evaluation says otherwise), profiles checked against their model (``store_profile``); the
    first refusal is a ``ValueError`` naming the entry, and the caller's transaction stores
    nothing.
    """
    before = _counts(s)
    known = {p.hash: p for p in doc.problems}  # hashes recomputed, never read from the file
    for p in doc.problems:
        repo.store_problem(s, p)
    for i, entry in enumerate(doc.schedules):
        sched = entry.schedule
        problem = sched.problem or known.get(sched.problem_hash)
        try:
            repo.store_schedule(s, sched, problem=problem, source=entry.source)
        except ValueError as e:
            raise ValueError(f"schedules.{i}: {e}") from None
    for i, prof in enumerate(doc.profiles):
        try:
            repo.store_profile(s, prof)
        except ValueError as e:
            raise ValueError(f"profiles.{i}: {e}") from None
    after = _counts(s)
    return ImportCounts(
        problems=after.problems - before.problems,
        schedules=after.schedules - before.schedules,
        profiles=after.profiles - before.profiles,
    )
