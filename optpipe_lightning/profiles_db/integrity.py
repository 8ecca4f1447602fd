"""``optpipe db check``: the schema and every row of every table, checked again.

- the schema: the revision is this version's head, and the tables, columns, types and indexes
  are exactly what the models declare (Alembic's comparison: a dropped table, a missing column
  or index is named);
- the file: SQLite's ``integrity_check`` (every page) and ``foreign_key_check``;
- every row: stored JSON validates; a problem's hash, a schedule's and a profile's digest and a
  fingerprint's key are recomputed and must match; every schedule is simulated again and its
  stored evaluation and key columns must be the simulator's; every profile must serve the model
  it claims; runs must finish after they start, event and step times be finite.

Each finding is one line naming the table, the row and what is wrong.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from pydantic import BaseModel, ValidationError
from sqlalchemy import Connection, select
from sqlalchemy.orm import Session

from optpipe_lightning.schedule import Problem, Schedule, evaluate
from optpipe_lightning.schedule.profile import HardwareFingerprint, ModelFingerprint, Profile

from .models import (
    VERSION_TABLE,
    Base,
    HardwareRecord,
    ModelRecord,
    ProblemRecord,
    ProfileRecord,
    ScheduleRecord,
    SolverEventRecord,
    SolverRunRecord,
    TrainingRunRecord,
    TrainingStepRecord,
)
from .validation import evaluation_mismatch, profile_defect

M = TypeVar("M", bound=BaseModel)

MAX_FINDINGS = 100


def schema_findings(conn: Connection, head: str) -> list[str]:
    """Where the database's schema differs from the models of revision ``head``."""
    ctx = MigrationContext.configure(
        conn, opts={"version_table": VERSION_TABLE, "compare_type": True}
    )
    found: list[str] = []
    revision = ctx.get_current_revision()
    if revision != head:
        found.append(f"schema revision is {revision}, expected {head}")
    for diff in compare_metadata(ctx, Base.metadata):
        found.append(f"schema differs from revision {head}: {_describe_diff(diff)}")
    return found


def _describe_diff(diff: Any) -> str:
    if isinstance(diff, list):  # column modifications come grouped
        diff = diff[0]
    kind = diff[0]
    what = diff[1] if len(diff) > 1 else None
    if kind in ("remove_table", "add_table"):
        name = getattr(what, "name", what)
        verb = "is missing" if kind == "add_table" else "is not one of optpipe's"
        return f"table {name} {verb}"
    if kind in ("add_column", "remove_column"):
        table, col = diff[2], diff[3]
        verb = "is missing" if kind == "add_column" else "is not one of optpipe's"
        return f"column {table}.{col.name} {verb}"
    if kind in ("add_index", "remove_index"):
        verb = "is missing" if kind == "add_index" else "is not one of optpipe's"
        return f"index {getattr(what, 'name', what)} {verb}"
    if kind.startswith("modify_"):
        return f"column {diff[2]}.{diff[3]}: {kind.removeprefix('modify_')} differs"
    return str(kind)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _parsed(model: type[M], data: str, where: str, found: list[str]) -> M | None:
    try:
        return model.model_validate_json(data)
    except ValidationError as e:
        first = e.errors(include_url=False)[0]
        loc = ".".join(str(x) for x in first["loc"]) or "(top)"
        found.append(f"{where}: stored JSON fails validation at {loc}: {first['msg']}")
        return None


def _rows(s: Session, model: type[Any]) -> Iterator[Any]:
    yield from s.scalars(select(model).execution_options(yield_per=200))


def _problems(s: Session, found: list[str]) -> dict[str, Problem]:
    out: dict[str, Problem] = {}
    for rec in _rows(s, ProblemRecord):
        where = f"problems row {rec.hash}"
        p = _parsed(Problem, rec.data, where, found)
        if p is None:
            continue
        if p.hash != rec.hash:
            found.append(f"{where}: its JSON hashes to {p.hash}")
            continue
        columns = (rec.num_stages, rec.num_microbatches, rec.num_chunks, rec.offload)
        if columns != (p.num_stages, p.num_microbatches, p.num_chunks, p.offload is not None):
            found.append(f"{where}: its key columns differ from its JSON")
        out[rec.hash] = p
    return out


def _schedules(s: Session, problems: dict[str, Problem], found: list[str]) -> None:
    for rec in _rows(s, ScheduleRecord):
        where = f"schedules row {rec.id}"
        if _sha(rec.data) != rec.digest:
            found.append(f"{where}: its digest does not match its JSON")
        sched = _parsed(Schedule, rec.data, where, found)
        problem = problems.get(rec.problem_hash)
        if sched is None or problem is None:
            if sched is not None:
                found.append(f"{where}: its problem {rec.problem_hash} is missing or damaged")
            continue
        if sched.problem_hash != rec.problem_hash:
            found.append(f"{where}: its JSON names problem {sched.problem_hash}")
            continue
        actual = evaluate(problem, sched)
        wrong = None if sched.evaluation is None else evaluation_mismatch(sched.evaluation, actual)
        if sched.evaluation is None:
            wrong = "it is stored without its evaluation"
        if wrong is None and (
            rec.feasible != actual.feasible
            or not _same(rec.makespan, actual.makespan)
            or rec.num_offloaded != actual.num_offloaded
        ):
            wrong = "its key columns (feasible, makespan, offloads) differ from the simulator's"
        if wrong is not None:
            found.append(f"{where} ({rec.generator}): {wrong}")


def _same(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def _fingerprints(s: Session, found: list[str]) -> None:
    for table, model, record in (
        ("hardware_fingerprints", HardwareFingerprint, HardwareRecord),
        ("model_fingerprints", ModelFingerprint, ModelRecord),
    ):
        for rec in _rows(s, record):
            fp: Any = _parsed(model, rec.data, f"{table} row {rec.id}", found)
            if fp is not None and fp.key != rec.key:
                found.append(f"{table} row {rec.id}: its JSON's key is {fp.key}, not {rec.key}")


def _profiles(s: Session, found: list[str]) -> None:
    keys = {
        "hw": {i: k for i, k in s.execute(select(HardwareRecord.id, HardwareRecord.key))},
        "model": {i: k for i, k in s.execute(select(ModelRecord.id, ModelRecord.key))},
    }
    for rec in _rows(s, ProfileRecord):
        where = f"profiles row {rec.id}"
        if _sha(rec.data) != rec.digest:
            found.append(f"{where}: its digest does not match its JSON")
        prof = _parsed(Profile, rec.data, where, found)
        if prof is None:
            continue
        defect = profile_defect(prof)
        if defect is not None:
            found.append(f"{where}: cannot serve its model: {defect}")
        elif (keys["hw"].get(rec.hardware_id), keys["model"].get(rec.model_id)) != (
            prof.hardware.key,
            prof.model.key,
        ):
            found.append(f"{where}: its JSON names another hardware or model than its row")


def _runs(s: Session, found: list[str]) -> None:
    for table, model in (("solver_runs", SolverRunRecord), ("training_runs", TrainingRunRecord)):
        for rec in _rows(s, model):
            if rec.finished_at is not None and rec.finished_at < rec.started_at:
                found.append(f"{table} row {rec.id}: finished before it started")
    checks: tuple[tuple[str, Any, Callable[[Any], bool]], ...] = (
        (
            "solver_events",
            SolverEventRecord,
            lambda r: math.isfinite(r.wall_time) and r.wall_time >= 0,
        ),
        (
            "training_steps",
            TrainingStepRecord,
            lambda r: math.isfinite(r.measured_seconds) and r.measured_seconds >= 0,
        ),
    )
    for table, model, ok in checks:
        for rec in _rows(s, model):
            if not ok(rec):
                found.append(f"{table} row {rec.id}: a time that is negative or not finite")


def row_findings(s: Session) -> list[str]:
    """Every row of every table checked again (the module doc says how)."""
    found: list[str] = []
    problems = _problems(s, found)
    _schedules(s, problems, found)
    _fingerprints(s, found)
    _profiles(s, found)
    _runs(s, found)
    return found[:MAX_FINDINGS] + (
        [f"... and {len(found) - MAX_FINDINGS} more"] if len(found) > MAX_FINDINGS else []
    )
