"""All database access of the inspector, cached: one read-only engine per URL, short-lived query
caches (the database may be written while the app is open), plain frames and models out.

Every function takes the database URL first (the cache key) and raises ``DataUnavailable`` with
one line for the user when the database cannot be read (missing file, not a database, locked by
a writer, schema too new). Nothing here imports ``optpipe_lightning.strategy`` (no torch).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import pandas as pd
import streamlit as st

from optpipe_lightning.inspector import frames
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


# ---- problems and schedules -------------------------------------------------------------------


def _problem_of(obj: Any) -> Problem:
    if isinstance(obj, Problem):
        return obj
    for attr in ("problem", "data"):
        val = _get(obj, attr)
        if isinstance(val, Problem):
            return val
        if isinstance(val, str | bytes):
            return Problem.model_validate_json(val)
    raise TypeError(f"not a problem: {type(obj).__name__}")


def _schedule_of(obj: Any) -> Schedule:
    if isinstance(obj, Schedule):
        return obj
    for attr in ("schedule", "data"):
        val = _get(obj, attr)
        if isinstance(val, Schedule):
            return val
        if isinstance(val, str | bytes):
            return Schedule.model_validate_json(val)
    raise TypeError(f"not a schedule: {type(obj).__name__}")


@st.cache_data(ttl=LIST_TTL, show_spinner=False)
def problems(url: str) -> pd.DataFrame:
    """Stored problems: hash, name, p, m, v, placement, smallest memory limit, offload."""

    def q(s: Any) -> pd.DataFrame:
        rows = []
        for r in _repo().list_problems(s):
            best = _get(r, "best_makespan")
            rows.append(
                {
                    "hash": _get(r, "hash"),
                    "name": _get(r, "name") or "",
                    "stages": _get(r, "num_stages"),
                    "microbatches": _get(r, "num_microbatches"),
                    "chunks": _get(r, "num_chunks"),
                    "placement": _get(r, "placement") if (_get(r, "num_chunks") or 1) > 1 else "",
                    "memory_limit": _get(r, "memory_limit"),
                    "offload": bool(_get(r, "offload")),
                    "schedules": _get(r, "num_schedules"),
                    "best_makespan_ms": _ms(best),
                }
            )
        return pd.DataFrame(
            rows,
            columns=[
                "hash",
                "name",
                "stages",
                "microbatches",
                "chunks",
                "placement",
                "memory_limit",
                "offload",
                "schedules",
                "best_makespan_ms",
            ],
        )

    return _query(url, q)


SCHEDULE_COLUMNS = [
    "id",
    "problem_hash",
    "generator",
    "source",
    "makespan_ms",
    "bubble_rate",
    "feasible",
    "num_offloaded",
    "created_at",
]


@st.cache_data(ttl=LIST_TTL, show_spinner=False)
def schedules(url: str, problem_hash: str | None = None) -> pd.DataFrame:
    """Stored schedules (newest first within a problem), without their action lists."""

    def q(s: Any) -> pd.DataFrame:
        rows = []
        for rec in _repo().list_schedules(s, problem_hash=problem_hash):
            mk = _get(rec, "makespan")
            rows.append(
                {
                    "id": int(_get(rec, "id")),
                    "problem_hash": _get(rec, "problem_hash"),
                    "generator": _get(rec, "generator"),
                    "source": _get(rec, "source", ""),
                    "makespan_ms": None if mk is None else float(mk) * frames.MS,
                    "bubble_rate": _get(rec, "bubble_rate"),
                    "feasible": bool(_get(rec, "feasible")),
                    "num_offloaded": int(_get(rec, "num_offloaded", 0) or 0),
                    "created_at": _get(rec, "created_at"),
                }
            )
        return pd.DataFrame(rows, columns=SCHEDULE_COLUMNS)

    return _query(url, q)


def schedule_label(row: Any) -> str:
    mk = row.makespan_ms
    mk_s = "–" if mk is None or pd.isna(mk) else f"{mk:.2f} ms"
    fits = "" if row.feasible else ", infeasible"
    return f"#{row.id} {row.generator} · {mk_s}{fits} · problem {str(row.problem_hash)[:8]}"


def problem_label(row: Any) -> str:
    name = f"{row.name} · " if row.name else ""
    return f"{name}p={row.stages} m={row.microbatches} v={row.chunks} · {str(row.hash)[:8]}"


@st.cache_data(ttl=STATIC_TTL, show_spinner=False)
def problem(url: str, problem_hash: str) -> Problem:
    def q(s: Any) -> Problem:
        pb = _repo().get_problem(s, problem_hash)
        if pb is None:
            raise DataUnavailable(f"no problem {problem_hash} in the database")
        return _problem_of(pb)

    return _query(url, q)


@st.cache_data(ttl=STATIC_TTL, show_spinner=False)
def schedule(url: str, schedule_id: int) -> tuple[Problem, Schedule]:
    """A stored schedule and its problem (the problem embedded in the schedule)."""

    def q(s: Any) -> tuple[Problem, Schedule]:
        sc = _schedule_of(_repo().get_schedule(s, schedule_id))
        if sc.problem is None:
            raise DataUnavailable(
                f"schedule {schedule_id} refers to problem {sc.problem_hash}, which is not stored"
            )
        return sc.problem, sc

    return _query(url, q)


@st.cache_data(ttl=STATIC_TTL, show_spinner=False, max_entries=32)
def simulated(url: str, schedule_id: int) -> dict[str, Any]:
    """The simulator's view of a stored schedule: timeline, idle, memory frames and summary."""
    pb, sc = schedule(url, schedule_id)
    sim = frames.simulate_schedule(pb, sc)
    tl = frames.timeline_frame(sim)
    makespan_ms = (sim.makespan or 0.0) * frames.MS
    unit = frames.memory_unit(pb, sim)
    limits = pb.memory_limits()
    peaks = pd.DataFrame(
        {
            "stage": list(range(pb.num_stages)),
            "peak": [c.peak / unit.scale for c in sim.memory] or [0.0] * pb.num_stages,
            "limit": [None if x is None else x / unit.scale for x in limits],
        }
    )
    return {
        "timeline": tl,
        "idle": frames.idle_frame(tl, makespan_ms) if len(tl) else pd.DataFrame(),
        "memory": frames.memory_frame(pb, sim, unit),
        "peaks": peaks,
        "unit": unit.name,
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


@st.cache_data(ttl=STATIC_TTL, show_spinner="generating the baseline schedules...")
def baseline_makespans(url: str, problem_hash: str) -> dict[str, float]:
    """Makespan (ms) of every feasible baseline on the problem: stored ones, else generated now."""
    out: dict[str, float] = {}
    table = schedules(url, problem_hash)
    stored = set(table[table["source"] == "baseline"]["generator"])
    for r in table.itertuples():
        if r.source == "baseline" and r.feasible and r.makespan_ms is not None:
            prev = out.get(r.generator)
            out[r.generator] = r.makespan_ms if prev is None else min(prev, r.makespan_ms)
    try:
        from optpipe_lightning.schedule.baselines import BASELINE_NAMES, generate
    except ImportError:
        return out
    missing = [n for n in BASELINE_NAMES if n not in stored]
    if not missing:
        return out
    pb = problem(url, problem_hash)
    for name in missing:
        try:
            sc = generate(name, pb)
        except Exception:  # not applicable here, or a generator still being written
            continue
        ev = sc.evaluation
        if ev is not None and ev.feasible and ev.makespan is not None:
            out[name] = ev.makespan * frames.MS
    return out


# ---- solver runs --------------------------------------------------------------------------------


SOLVER_RUN_COLUMNS = [
    "id",
    "problem_hash",
    "backend",
    "status",
    "started_at",
    "finished_at",
    "makespan_ms",
    "lower_bound_ms",
    "schedule_id",
    "events",
]


def _ms(x: Any) -> float | None:
    return None if x is None else float(x) * frames.MS


@st.cache_data(ttl=1, show_spinner=False)
def solver_runs(url: str, problem_hash: str | None = None) -> pd.DataFrame:
    def q(s: Any) -> pd.DataFrame:
        rows = [
            {
                "id": int(_get(r, "id")),
                "problem_hash": _get(r, "problem_hash"),
                "backend": _get(r, "backend", ""),
                "status": _get(r, "status", ""),
                "started_at": _get(r, "started_at"),
                "finished_at": _get(r, "finished_at"),
                "makespan_ms": _ms(_get(r, "makespan")),
                "lower_bound_ms": _ms(_get(r, "lower_bound")),
                "schedule_id": _get(r, "schedule_id"),
                "events": _get(r, "num_events"),
            }
            for r in _repo().list_solver_runs(s, problem_hash=problem_hash)
        ]
        return pd.DataFrame(rows, columns=SOLVER_RUN_COLUMNS)

    return _query(url, q)


def solver_events(url: str, run_id: int) -> pd.DataFrame:
    """Progress of a solver run in long form (uncached: the run may be writing right now)."""
    return _query(url, lambda s: frames.solver_frame(list(_repo().solver_events(s, run_id))))


# ---- profiles -------------------------------------------------------------------------------------


def _profile_of(obj: Any) -> Profile:
    if isinstance(obj, Profile):
        return obj
    for attr in ("profile", "data"):
        val = _get(obj, attr)
        if isinstance(val, Profile):
            return val
        if isinstance(val, str | bytes):
            return Profile.model_validate_json(val)
    raise TypeError(f"not a profile: {type(obj).__name__}")


PROFILE_COLUMNS = [
    "id",
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
        rows = [
            {
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
            for r in _repo().list_profiles(s)
        ]
        return pd.DataFrame(rows, columns=PROFILE_COLUMNS)

    return _query(url, q)


@st.cache_data(ttl=STATIC_TTL, show_spinner=False, max_entries=64)
def profile(url: str, profile_id: int) -> Profile:
    return _query(url, lambda s: _profile_of(_repo().get_profile(s, profile_id)))


def hardware_frame(profs: list[Profile]) -> pd.DataFrame:
    """One row per distinct hardware fingerprint."""
    rows = {}
    for pr in profs:
        hw = pr.hardware
        rows[hw.key] = {
            "device": hw.device_kind,
            "devices": hw.device_count,
            "memory_GiB": round(hw.device_memory / 2**30, 1),
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
    def q(s: Any) -> pd.DataFrame:
        rows = [
            {
                "id": int(_get(r, "id")),
                "model": _get(r, "model_name") or "",
                "device": _get(r, "device_kind") or "",
                "status": _get(r, "status", ""),
                "steps": _get(r, "num_steps"),
                "started_at": _get(r, "started_at"),
                "finished_at": _get(r, "finished_at"),
                "config": json.dumps(_get(r, "config", {}) or {}, default=str),
            }
            for r in _repo().list_training_runs(s)
        ]
        return pd.DataFrame(rows, columns=TRAINING_RUN_COLUMNS)

    return _query(url, q)


@st.cache_data(ttl=LIST_TTL, show_spinner=False)
def training(url: str, run_id: int) -> dict[str, pd.DataFrame]:
    """Steps (long form measured / predicted), switches and per-rank peak memory of a run."""

    def q(s: Any) -> dict[str, pd.DataFrame]:
        repo = _repo()
        steps = list(repo.training_steps(s, run_id))
        switches = list(repo.schedule_switches(s, run_id))
        step_rows = [
            {
                "step": int(_get(st_, "step")),
                "step_time": _get(st_, "measured_seconds", _get(st_, "step_time")),
                "predicted": _get(st_, "predicted_seconds", _get(st_, "predicted")),
            }
            for st_ in steps
        ]
        mem_rows = [
            {"step": int(_get(st_, "step")), "rank": r, "bytes": float(b)}
            for st_ in steps
            for r, b in enumerate(_get(st_, "peak_memory") or [])
        ]
        sw_rows = [
            {
                "step": int(_get(w, "step")),
                "schedule": f"→ #{_get(w, 'to_schedule_id')}",
                "reason": _get(w, "reason", ""),
            }
            for w in switches
        ]
        return {
            "steps": frames.training_frame(step_rows),
            "switches": pd.DataFrame(sw_rows, columns=["step", "schedule", "reason"]),
            "memory": pd.DataFrame(mem_rows, columns=["step", "rank", "bytes"]),
        }

    return _query(url, q)
