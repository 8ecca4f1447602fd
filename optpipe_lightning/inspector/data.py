"""All database access of the inspector, cached: one read-only engine per URL, short-lived query
caches (the database may be written while the app is open), plain frames and models out.

Every function takes the database URL first (the cache key) and raises ``DataUnavailable`` with
one line for the user when the database cannot be read (missing file, not a database, locked by
a writer, schema too new). Times are seconds and bytes are bytes here; pages convert them to
display units. Nothing here imports ``optpipe_lightning.strategy`` (no torch).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, TypeVar

import pandas as pd
import streamlit as st

from optpipe_lightning.inspector import frames, labels
from optpipe_lightning.schedule import Problem, Schedule
from optpipe_lightning.schedule.profile import Profile

T = TypeVar("T")

LIST_TTL = 3  # seconds: lists refresh quickly while a solver or training run writes
STATIC_TTL = 600  # stored schedules, problems and profiles never change once written


class DataUnavailable(Exception):
    """The database cannot be read now; ``transient`` when retrying later may help."""

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


def default_url() -> str:
    from optpipe_lightning.profiles_db import default_database_url

    return str(default_database_url())


def display_url(url: str) -> str:
    """The URL without a password."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url


@st.cache_resource(show_spinner=False, max_entries=4)
def _database(url: str) -> Any:
    from optpipe_lightning.profiles_db import open_database

    return open_database(url, read_only=True, create=False)


@contextmanager
def _session(url: str) -> Iterator[Any]:
    """A read-only session, translating every database failure into ``DataUnavailable``."""
    from optpipe_lightning.profiles_db import DatabaseError

    try:
        db = _database(url)
    except DatabaseError as e:
        _database.clear()
        raise DataUnavailable(str(e)) from None
    except Exception as e:  # a driver or URL error the database layer did not translate
        _database.clear()
        raise DataUnavailable(f"cannot open database {display_url(url)}: {_one_line(e)}") from None
    try:
        with db.session() as s:
            yield s
    except DataUnavailable:
        raise
    except DatabaseError as e:
        raise DataUnavailable(str(e), transient=_is_transient(str(e))) from None
    except Exception as e:
        msg = _one_line(e)
        if _is_sqlalchemy_error(e):
            raise DataUnavailable(
                f"database {display_url(url)} could not be read: {msg}",
                transient=_is_transient(msg),
            ) from None
        raise


def _is_sqlalchemy_error(e: BaseException) -> bool:
    from sqlalchemy import exc

    return isinstance(e, exc.SQLAlchemyError)


def _is_transient(msg: str) -> bool:
    low = msg.lower()
    return "locked" in low or "busy" in low


def _one_line(e: BaseException) -> str:
    orig = getattr(e, "orig", None) or e
    for line in str(orig).splitlines():
        if line.strip():
            return line.strip()
    return type(orig).__name__


def _query(url: str, fn: Callable[[Any], T]) -> T:
    with _session(url) as s:
        return fn(s)


def _repo() -> Any:
    from optpipe_lightning.profiles_db import repository

    return repository


def _get(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)


def _params(s: Any, model_name: str, ids: list[int]) -> dict[int, dict[str, Any]]:
    """The ``params`` JSON of schedules or solver runs by id (the list rows leave it out)."""
    from sqlalchemy import select

    from optpipe_lightning.profiles_db import models

    model = getattr(models, model_name)
    out: dict[int, dict[str, Any]] = {}
    for i in range(0, len(ids), 500):
        q = select(model.id, model.params).where(model.id.in_(ids[i : i + 500]))
        out.update({int(k): dict(v or {}) for k, v in s.execute(q).all()})
    return out


def now() -> datetime:
    return datetime.now(UTC)


# ---- problems and schedules -------------------------------------------------------------------

PROBLEM_COLUMNS = [
    "hash",
    "label",
    "name",
    "stages",
    "microbatches",
    "chunks",
    "placement",
    "memory_limit",
    "offload",
    "schedules",
    "best_makespan",
    "given_hash",
]


@st.cache_data(ttl=LIST_TTL, show_spinner=False)
def problems(url: str) -> pd.DataFrame:
    """Stored problems: hash, label (name or shape), shape, smallest memory limit, offload, how
    many schedules and the best feasible makespan (seconds)."""

    def q(s: Any) -> pd.DataFrame:
        rows = []
        for r in _repo().list_problems(s):
            row = {
                "hash": _get(r, "hash"),
                "name": _get(r, "name") or "",
                "stages": _get(r, "num_stages"),
                "microbatches": _get(r, "num_microbatches"),
                "chunks": _get(r, "num_chunks"),
                "placement": _get(r, "placement") if (_get(r, "num_chunks") or 1) > 1 else "",
                "memory_limit": _get(r, "memory_limit"),
                "offload": bool(_get(r, "offload")),
                "schedules": _get(r, "num_schedules"),
                "best_makespan": _get(r, "best_makespan"),
            }
            row["label"] = labels.problem_label(row)
            row["given_hash"] = _get(r, "given_hash")
            rows.append(row)
        return pd.DataFrame(rows, columns=PROBLEM_COLUMNS)

    return _query(url, q)


SCHEDULE_COLUMNS = [
    "id",
    "label",
    "produced_by",
    "problem",
    "problem_hash",
    "chunks",
    "placement",
    "generator",
    "source",
    "makespan",
    "bubble_rate",
    "feasible",
    "num_offloaded",
    "created_at",
]


@st.cache_data(ttl=LIST_TTL, show_spinner=False)
def schedules(
    url: str, problem_hash: str | None = None, with_rechunkings: bool = False
) -> pd.DataFrame:
    """Stored schedules (newest first within a problem), without their action lists: what
    produced each one (``produced_by``), its problem's label, makespan (seconds).
    ``with_rechunkings``: also those of the re-chunkings the solver and baselines ran for the
    problem (each labelled by its chunking)."""
    table = problems(url)
    problem_labels = dict(zip(table["hash"], table["label"], strict=True))
    chunking = {r.hash: (int(r.chunks or 1), str(r.placement or "")) for r in table.itertuples()}

    def q(s: Any) -> pd.DataFrame:
        recs = list(_repo().list_schedules(s, problem_hash, with_rechunkings=with_rechunkings))
        params = _params(s, "ScheduleRecord", [int(_get(r, "id")) for r in recs])
        rows = []
        for rec in recs:
            sid = int(_get(rec, "id"))
            gen = str(_get(rec, "generator"))
            source = str(_get(rec, "source", "") or "")
            row = {
                "id": sid,
                "produced_by": labels.producer(gen, source, params.get(sid, {})),
                "problem": problem_labels.get(_get(rec, "problem_hash"), ""),
                "problem_hash": _get(rec, "problem_hash"),
                "chunks": chunking.get(_get(rec, "problem_hash"), (1, ""))[0],
                "placement": chunking.get(_get(rec, "problem_hash"), (1, ""))[1],
                "generator": gen,
                "source": source,
                "makespan": _get(rec, "makespan"),
                "bubble_rate": _get(rec, "bubble_rate"),
                "feasible": bool(_get(rec, "feasible")),
                "num_offloaded": int(_get(rec, "num_offloaded", 0) or 0),
                "created_at": _get(rec, "created_at"),
            }
            row["label"] = labels.schedule_label(row)
            rows.append(row)
        return pd.DataFrame(rows, columns=SCHEDULE_COLUMNS)

    return _query(url, q)


@st.cache_data(ttl=STATIC_TTL, show_spinner=False)
def problem(url: str, problem_hash: str) -> Problem:
    def q(s: Any) -> Problem:
        pb = _repo().get_problem(s, problem_hash)
        if pb is None:
            raise DataUnavailable(f"no problem {problem_hash} in the database")
        return pb

    return _query(url, q)


@st.cache_data(ttl=STATIC_TTL, show_spinner=False)
def schedule(url: str, schedule_id: int) -> tuple[Problem, Schedule]:
    """A stored schedule and its problem (the problem embedded in the schedule)."""

    def q(s: Any) -> tuple[Problem, Schedule]:
        sc: Schedule = _repo().get_schedule(s, schedule_id)
        if sc.problem is None:
            raise DataUnavailable(
                f"schedule {schedule_id} refers to problem {sc.problem_hash}, which is not stored"
            )
        return sc.problem, sc

    return _query(url, q)


@st.cache_data(ttl=STATIC_TTL, show_spinner=False, max_entries=32)
def simulated(url: str, schedule_id: int) -> dict[str, Any]:
    """The simulator's view of a stored schedule, in display units: timeline, per-stage busy
    strips and idle time, memory curves, peaks, summary (seconds and bytes)."""
    pb, sc = schedule(url, schedule_id)
    sim = frames.simulate_schedule(pb, sc)
    tu = frames.schedule_time_unit(sim)
    tl = frames.timeline_frame(sim, tu)
    makespan = (sim.makespan or 0.0) / tu.scale
    mu = frames.memory_unit(pb, sim)
    limits = pb.memory_limits()
    peaks = pd.DataFrame(
        {
            "stage": list(range(pb.num_stages)),
            "peak": [c.peak / mu.scale for c in sim.memory] or [0.0] * pb.num_stages,
            "limit": [None if x is None else x / mu.scale for x in limits],
        }
    )
    return {
        "timeline": tl,
        "busy": frames.busy_frame(tl, makespan),
        "idle": frames.idle_frame(tl, makespan) if len(tl) else pd.DataFrame(),
        "memory": frames.memory_frame(pb, sim, mu, tu),
        "peaks": peaks,
        "peak_bytes": [c.peak for c in sim.memory],
        "limit_bytes": limits,
        "time_unit": tu.name,
        "time_scale": tu.scale,
        "unit": mu.name,
        "summary": frames.schedule_summary(sc.generator, pb, sim),
        "violations": [v.message for v in sim.evaluation.violations],
    }


@st.cache_data(ttl=STATIC_TTL, show_spinner=False)
def trace_json(url: str, schedule_id: int) -> str:
    from optpipe_lightning.inspector.chrome_trace import chrome_trace

    pb, sc = schedule(url, schedule_id)
    return json.dumps(chrome_trace(pb, sc))


@st.cache_data(ttl=STATIC_TTL, show_spinner=False)
def schedule_json(url: str, schedule_id: int) -> str:
    _pb, sc = schedule(url, schedule_id)
    return sc.to_json(indent=1)


@st.cache_data(ttl=LIST_TTL, show_spinner=False)
def baseline_makespans(url: str, problem_hash: str) -> dict[str, float]:
    """Makespan (seconds) of every feasible baseline stored for the problem (on any of its
    chunkings): the schedules stored as baselines, and the rows ``optpipe compare --db``
    printed. Read only: the inspector never generates a schedule."""

    def q(s: Any) -> dict[str, float]:
        repo = _repo()
        recs = list(repo.list_schedules(s, problem_hash, with_rechunkings=True))
        by_id = {int(_get(r, "id")): r for r in recs}
        found: dict[str, float] = {}

        def add(name: str, rec: Any) -> None:
            mk = _get(rec, "makespan")
            if not _get(rec, "feasible") or mk is None:
                return
            found[name] = min(float(mk), found.get(name, float("inf")))

        for rec in recs:
            if _get(rec, "source") == "baseline":
                add(str(_get(rec, "generator")), rec)
        for name, sid in repo.run_rows(s, problem_hash).items():
            if name != "optpipe" and sid in by_id:
                add(name, by_id[sid])
        return found

    return _query(url, q)


# ---- solver runs --------------------------------------------------------------------------------

SOLVER_RUN_COLUMNS = [
    "id",
    "label",
    "problem",
    "problem_hash",
    "backend",
    "status",
    "started_at",
    "finished_at",
    "time_limit",
    "makespan",
    "lower_bound",
    "schedule_id",
    "events",
]


@st.cache_data(ttl=1, show_spinner=False)
def solver_runs(url: str, problem_hash: str | None = None) -> pd.DataFrame:
    """Solver runs, running ones first (newest first), then the others newest first."""
    problem_labels = dict(zip(problems(url)["hash"], problems(url)["label"], strict=True))

    def q(s: Any) -> pd.DataFrame:
        recs = list(_repo().list_solver_runs(s, problem_hash=problem_hash))
        params = _params(s, "SolverRunRecord", [int(_get(r, "id")) for r in recs])
        rows = []
        for r in recs:
            rid = int(_get(r, "id"))
            limit = params.get(rid, {}).get("time_limit")
            row = {
                "id": rid,
                "problem": problem_labels.get(_get(r, "problem_hash"), ""),
                "problem_hash": _get(r, "problem_hash"),
                "backend": _get(r, "backend", ""),
                "status": _get(r, "status", ""),
                "started_at": _get(r, "started_at"),
                "finished_at": _get(r, "finished_at"),
                "time_limit": float(limit) if isinstance(limit, int | float) else None,
                "makespan": _get(r, "makespan"),
                "lower_bound": _get(r, "lower_bound"),
                "schedule_id": _get(r, "schedule_id"),
                "events": _get(r, "num_events"),
            }
            row["label"] = labels.solver_run_label(row)
            rows.append(row)
        df = pd.DataFrame(rows, columns=SOLVER_RUN_COLUMNS)
        if df.empty:
            return df
        running = (df["status"] == "running").astype(int)
        order = sorted(range(len(df)), key=lambda i: (-running.iloc[i], i))
        return df.iloc[order].reset_index(drop=True)

    return _query(url, q)


def solver_events(url: str, run_id: int) -> list[tuple[float, float | None, float | None]]:
    """(wall_time, makespan, bound) of a run in time order (uncached: it may be writing now)."""
    return _query(
        url,
        lambda s: [
            (float(e.wall_time), e.makespan, e.bound) for e in _repo().solver_events(s, run_id)
        ],
    )


# ---- profiles -------------------------------------------------------------------------------------

PROFILE_COLUMNS = [
    "id",
    "label",
    "model",
    "device",
    "devices",
    "stages",
    "chunks",
    "microbatch_size",
    "microbatches",
    "torch",
    "measured_at",
]


@st.cache_data(ttl=LIST_TTL, show_spinner=False)
def profiles(url: str) -> pd.DataFrame:
    """Stored profiles, newest first: id, model, device kind and count, shape, when measured."""

    def q(s: Any) -> pd.DataFrame:
        rows = []
        for r in _repo().list_profiles(s):
            row = {
                "id": int(_get(r, "id")),
                "model": _get(r, "model_name") or "",
                "device": _get(r, "device_kind"),
                "devices": _get(r, "device_count"),
                "stages": _get(r, "num_stages"),
                "chunks": _get(r, "num_chunks"),
                "microbatch_size": _get(r, "microbatch_size"),
                "microbatches": _get(r, "num_microbatches"),
                "torch": _get(r, "torch_version"),
                "measured_at": _get(r, "measured_at"),
            }
            row["label"] = labels.profile_label(row)
            rows.append(row)
        return pd.DataFrame(rows, columns=PROFILE_COLUMNS)

    return _query(url, q)


@st.cache_data(ttl=STATIC_TTL, show_spinner=False, max_entries=64)
def profile(url: str, profile_id: int) -> Profile:
    return _query(url, lambda s: _repo().get_profile(s, profile_id))


def hardware_frame(profs: list[Profile]) -> pd.DataFrame:
    """One row per distinct hardware fingerprint (device memory in GB)."""
    rows = {}
    for pr in profs:
        hw = pr.hardware
        rows[hw.key] = {
            "device": hw.device_kind,
            "devices": hw.device_count,
            "memory (GB)": round(hw.device_memory / 1e9, 1),
            "interconnect": hw.interconnect,
            "torch": hw.torch_version,
            "host": hw.hostname or "",
        }
    return pd.DataFrame(list(rows.values()))


def models_frame(profs: list[Profile]) -> pd.DataFrame:
    """One row per distinct model fingerprint."""
    rows = {}
    for pr in profs:
        m = pr.model
        rows[m.key] = {
            "model": m.name,
            "layers": len(m.layer_structure),
            "dtype": m.dtype,
            "microbatch_size": m.microbatch_size,
            "sequence_length": m.sequence_length,
            "stages": m.num_stages,
            "chunks": m.num_chunks,
        }
    return pd.DataFrame(list(rows.values()))


# ---- training runs --------------------------------------------------------------------------------

TRAINING_RUN_COLUMNS = [
    "id",
    "label",
    "model",
    "device",
    "status",
    "steps",
    "started_at",
    "finished_at",
    "config",
]


@st.cache_data(ttl=LIST_TTL, show_spinner=False)
def training_runs(url: str) -> pd.DataFrame:
    """Training runs, newest first, with the status as stored."""

    def q(s: Any) -> pd.DataFrame:
        rows = []
        for r in _repo().list_training_runs(s):
            row = {
                "id": int(_get(r, "id")),
                "model": _get(r, "model_name") or "",
                "device": _get(r, "device_kind") or "",
                "status": _get(r, "status", ""),
                "steps": _get(r, "num_steps"),
                "started_at": _get(r, "started_at"),
                "finished_at": _get(r, "finished_at"),
                "config": json.dumps(_get(r, "config", {}) or {}, default=str),
            }
            row["label"] = labels.training_run_label(row)
            rows.append(row)
        return pd.DataFrame(rows, columns=TRAINING_RUN_COLUMNS)

    return _query(url, q)


@st.cache_data(ttl=LIST_TTL, show_spinner=False)
def training(url: str, run_id: int) -> dict[str, Any]:
    """Everything the Training page shows of a run, as rows (``training_frames`` shapes them):
    steps, switches, calibrations, metrics, and the run's detail (limits, device memory)."""
    schedule_labels = dict(zip(schedules(url)["id"], schedules(url)["produced_by"], strict=True))

    def q(s: Any) -> dict[str, Any]:
        repo = _repo()
        detail = repo.training_run_detail(s, run_id)
        return {
            "steps": [r.to_dict() for r in repo.training_steps(s, run_id)],
            "switches": [r.to_dict() for r in repo.schedule_switches(s, run_id)],
            "calibrations": [r.to_dict() for r in repo.training_calibrations(s, run_id)],
            "metrics": [r.to_dict() for r in repo.training_metrics(s, run_id)],
            "detail": detail.to_dict(),
            "schedules": {int(k): str(v) for k, v in schedule_labels.items()},
        }

    return _query(url, q)
