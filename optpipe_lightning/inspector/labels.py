"""Names people read: problems by name or shape, schedules by what produced them, runs by
what they ran. Pure functions of plain rows (mappings or objects with attributes).

A hash is never the name of anything here; pages show it a click away.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

import pandas as pd

from ..schedule.units import format_bytes, format_seconds


def _v(row: Any, name: str, default: Any = None) -> Any:
    val = row.get(name, default) if isinstance(row, Mapping) else getattr(row, name, default)
    if val is None:
        return default
    try:
        if pd.isna(val):
            return default
    except (TypeError, ValueError):
        pass
    return val


def problem_shape(row: Any) -> str:
    """``4x8``, ``4x8x2 vshape``, then the smallest memory limit and whether it may offload."""
    p, m, v = _v(row, "stages", 0), _v(row, "microbatches", 0), _v(row, "chunks", 1)
    shape = f"{p}x{m}" + (f"x{v} {_v(row, 'placement', '')}".rstrip() if v and v > 1 else "")
    limit = _v(row, "memory_limit")
    parts = [shape, f"limit {format_bytes(limit)}" if limit is not None else "no limit"]
    if _v(row, "offload", False):
        parts.append("offload")
    return " · ".join(parts)


def problem_label(row: Any) -> str:
    """The problem's name when it has one, else its shape (stages x microbatches x chunks,
    limit, offload)."""
    name = _v(row, "name", "")
    return str(name) if name else problem_shape(row)


def producer(generator: str, source: str, params: Mapping[str, Any]) -> str:
    """What made a schedule: a baseline's name (with its variant), or the solver's backend and
    the rule or baseline its best schedule came from (``optpipe · cpsat · via heuristic
    offload-repair``)."""
    if generator == "optpipe" or source == "solver":
        backend = params.get("backend")
        found = str(params.get("source") or "")
        parts = [generator]
        if backend:
            parts.append(str(backend))
        if found and found != backend:
            kind, _, what = found.partition(":")
            parts.append(f"via {kind} {what}".strip() if what else f"via {kind}")
        return " · ".join(parts)
    extra = params.get("variant") or params.get("rule")
    return f"{generator} ({extra})" if extra else generator


def schedule_label(row: Any) -> str:
    """``#8 optpipe · cpsat · 2 chunks vshape · 643.659 ms`` (the chunking when a stage holds
    more than one, ``infeasible`` when it exceeds the limit)."""
    made = _v(row, "produced_by") or _v(row, "generator", "?")
    v = int(_v(row, "chunks", 1) or 1)
    chunks = f" · {v} chunks {_v(row, 'placement', '')}".rstrip() if v > 1 else ""
    fits = "" if _v(row, "feasible", True) else " · infeasible"
    return f"#{_v(row, 'id')} {made}{chunks} · {format_seconds(_v(row, 'makespan'))}{fits}"


def solver_run_label(row: Any) -> str:
    """``run #3 · running · cpsat · gpt-1.5b on 4x H100 ...``."""
    return (
        f"run #{_v(row, 'id')} · {_v(row, 'status', '?')} · {_v(row, 'backend', '?')} · "
        f"{_v(row, 'problem') or 'problem ' + str(_v(row, 'problem_hash', ''))[:8]}"
    )


def _when(x: Any) -> str:
    if isinstance(x, datetime | pd.Timestamp):
        return f"{pd.Timestamp(x):%Y-%m-%d %H:%M}"
    return str(x) if x else "?"


def profile_label(row: Any) -> str:
    """``#1 gpt-1.5b on 4x NVIDIA H100 80GB HBM3 · 4x1 · m=8 · measured 2026-11-20 10:00``."""
    return (
        f"#{_v(row, 'id')} {_v(row, 'model') or 'model'} on {_v(row, 'devices')}x "
        f"{_v(row, 'device')} · {_v(row, 'stages')}x{_v(row, 'chunks')} · "
        f"m={_v(row, 'microbatches')} · measured {_when(_v(row, 'measured_at'))}"
    )


def training_run_label(row: Any) -> str:
    """``run #1 · gpt-1.5b on NVIDIA H100 · finished · 40 steps · started 2026-11-26 09:21``."""
    return (
        f"run #{_v(row, 'id')} · {_v(row, 'model') or 'model'} on {_v(row, 'device') or '?'} · "
        f"{_v(row, 'status', '?')} · {_v(row, 'steps', 0)} steps · "
        f"started {_when(_v(row, 'started_at'))}"
    )
