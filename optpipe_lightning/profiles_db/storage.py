"""What every store and read of the repository shares: digests, stored JSON, unique inserts.

Problems, schedules and profiles are stored as their validated JSON (never pickle) and
validated again when read (``parse_stored``); free-form parameters are stored only when they
are plain JSON (``json_safe``); a row that has a natural key is inserted once
(``insert_unique``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from .errors import DatabaseError

M = TypeVar("M", bound=BaseModel)
R = TypeVar("R")


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def content_digest(problem_hash: str, schedule_json: dict[str, Any]) -> str:
    """The digest of what a stored schedule runs: its problem and its actions (not its
    generator, parameters or timings), so the same schedule found twice is stored once. A
    ``memory_budget`` (it changes the memory waits) counts only where present, so the digest of
    a schedule without one is what it always was."""
    what: dict[str, Any] = {"problem_hash": problem_hash, "actions": schedule_json["actions"]}
    if schedule_json.get("memory_budget") is not None:
        what["memory_budget"] = schedule_json["memory_budget"]
    return sha256_hex(json.dumps(what, sort_keys=True, separators=(",", ":")))


def parse_stored(model: type[M], data: str, what: str) -> M:
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


def json_safe(value: dict[str, Any], what: str) -> dict[str, Any]:
    try:
        out: dict[str, Any] = json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as e:
        raise ValueError(
            f"{what} must be JSON-serialisable (plain numbers and text): {e}"
        ) from None
    return out


def insert_unique(s: Session, record: R, find: Callable[[], R | None]) -> R:
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
