"""Tidy data frames the charts draw: one row per bar, point or step, in milliseconds and GiB-like units.

Pure functions of a ``Problem`` and the simulator's ``SimResult`` (or of rows read from the
database), so each chart's data can be checked without Streamlit or a browser.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ..schedule import Problem, Schedule, SimResult, simulate

MS = 1e3  # seconds -> milliseconds

TIMELINE_COLUMNS = [
    "device",
    "lane",
    "kind",
    "micro",
    "chunk",
    "start_ms",
    "end_ms",
    "duration_ms",
    "label",
    "waits_for",
]


@dataclass(frozen=True)
class ByteUnit:
    """A unit for byte axes: divide bytes by ``scale`` to get ``name``."""

    name: str
    scale: float


def byte_unit(max_bytes: float) -> ByteUnit:
    """The largest binary unit in which ``max_bytes`` is at least 1 (bytes below 1 KiB)."""
    for name, power in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if max_bytes >= 2**power:
            return ByteUnit(name, float(2**power))
    return ByteUnit("bytes", 1.0)


def simulate_schedule(problem: Problem, schedule: Schedule) -> SimResult:
    """The simulator's result for a stored schedule (raises ``ScheduleMismatchError`` when the
    schedule was made for another problem)."""
    return simulate(problem, schedule)


def timeline_frame(sim: SimResult) -> pd.DataFrame:
    """One row per action: device, lane (compute / copy), kind, microbatch, chunk, start, end."""
    tl = sim.timeline
    if tl is None:
        return pd.DataFrame({c: [] for c in TIMELINE_COLUMNS})
    parts: list[pd.DataFrame] = []
    for s, row in enumerate(tl.actions):
        if not row:
            continue
        start = np.asarray(tl.start[s], dtype=float) * MS
        end = np.asarray(tl.end[s], dtype=float) * MS
        kinds = [a.op for a in row]
        waits = [""] * len(row)
        for f_pos, o_pos in tl.memory_waits[s] if tl.memory_waits else ():
            o = row[o_pos]
            waits[f_pos] = f"offload of mb {o.mb}" + (f" chunk {o.chunk}" if o.chunk else "")
        parts.append(
            pd.DataFrame(
                {
                    "device": s,
                    "lane": ["compute" if k in ("F", "B", "W", "BW") else "copy" for k in kinds],
                    "kind": kinds,
                    "micro": [a.mb for a in row],
                    "chunk": [a.chunk for a in row],
                    "start_ms": start,
                    "end_ms": end,
                    "duration_ms": end - start,
                    "label": [str(a.mb) for a in row],
                    "waits_for": waits,  # the memory wait: the copy this F waited for
                }
            )
        )
    if not parts:
        return pd.DataFrame({c: [] for c in TIMELINE_COLUMNS})
    return pd.concat(parts, ignore_index=True)


def idle_frame(timeline: pd.DataFrame, makespan_ms: float) -> pd.DataFrame:
    """Per device: busy compute time, idle time within the makespan, and the idle fraction."""
    comp = timeline[timeline["lane"] == "compute"]
    busy = comp.groupby("device")["duration_ms"].sum()
    devices = sorted(timeline["device"].unique().tolist())
    rows = []
    for d in devices:
        b = float(busy.get(d, 0.0))
        idle = max(makespan_ms - b, 0.0)
        rows.append(
            {
                "device": int(d),
                "busy_ms": b,
                "idle_ms": idle,
                "idle_fraction": idle / makespan_ms if makespan_ms > 0 else 0.0,
            }
        )
    return pd.DataFrame(rows, columns=["device", "busy_ms", "idle_ms", "idle_fraction"])


def memory_frame(problem: Problem, sim: SimResult, unit: ByteUnit | None = None) -> pd.DataFrame:
    """Step points of each device's activation memory and offloaded bytes, in ``unit``.

    Columns: device, time_ms, series ("on device" / "offloaded"), value, limit (None when
    unlimited), is_peak (the first instant the on-device curve reaches its peak).
    """
    unit = unit or memory_unit(problem, sim)
    limits = problem.memory_limits()
    makespan = (sim.makespan or 0.0) * MS
    frames: list[pd.DataFrame] = []
    for s, curve in enumerate(sim.memory):
        times = np.asarray(curve.times, dtype=float) * MS
        on_dev = np.asarray(curve.bytes, dtype=float) / unit.scale
        host = np.asarray(curve.offloaded, dtype=float) / unit.scale
        if times.size and times[-1] < makespan:
            # extend the last step to the makespan so every curve spans the whole iteration
            times = np.append(times, makespan)
            on_dev = np.append(on_dev, on_dev[-1])
            host = np.append(host, host[-1])
        peak_i = int(np.argmax(on_dev)) if on_dev.size else -1
        lim = limits[s]
        lim_v = None if lim is None else lim / unit.scale
        for series, vals in (("on device", on_dev), ("offloaded", host)):
            frames.append(
                pd.DataFrame(
                    {
                        "device": s,
                        "time_ms": times,
                        "series": series,
                        "value": vals,
                        "limit": lim_v,
                        "is_peak": [
                            series == "on device" and i == peak_i for i in range(len(vals))
                        ],
                    }
                )
            )
    if not frames:
        return pd.DataFrame(columns=["device", "time_ms", "series", "value", "limit", "is_peak"])
    return pd.concat(frames, ignore_index=True)


def memory_unit(problem: Problem, sim: SimResult) -> ByteUnit:
    """One byte unit for a schedule's memory chart (from its peaks and limits)."""
    peaks = [c.peak for c in sim.memory] + [
        float(c.offloaded.max()) for c in sim.memory if c.offloaded.size
    ]
    limits = [x for x in problem.memory_limits() if x is not None]
    return byte_unit(max([*peaks, *limits, 0.0]))


def schedule_summary(name: str, problem: Problem, sim: SimResult) -> dict[str, Any]:
    """One row of the comparison table (values from the simulator only)."""
    ev = sim.evaluation
    limits = [x for x in problem.memory_limits() if x is not None]
    peak = max(ev.peak_memory) if ev.peak_memory else 0.0
    return {
        "schedule": name,
        "makespan_ms": None if ev.makespan is None else ev.makespan * MS,
        "bubble_rate": ev.bubble_rate,
        "stage_span_bubble_rate": ev.stage_span_bubble_rate,
        "peak_memory": peak,
        "peak_vs_limit": peak / min(limits) if limits else None,
        "num_offloaded": ev.num_offloaded,
        "feasible": ev.feasible,
    }


def compare_frame(timelines: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """Several timelines stacked with a ``schedule`` column (in the mapping's order)."""
    parts = [df.assign(schedule=name) for name, df in timelines.items() if len(df)]
    if not parts:
        return pd.DataFrame(columns=[*TIMELINE_COLUMNS, "schedule"])
    return pd.concat(parts, ignore_index=True)


def solver_frame(events: Iterable[Mapping[str, Any] | Sequence[Any]]) -> pd.DataFrame:
    """Solver progress in long form: wall_time, series (incumbent / lower bound), makespan_ms.

    ``events`` are rows with ``wall_time``, ``makespan`` and ``bound`` (seconds; either may be
    None), as the database's solver events give them.
    """
    rows = []
    for ev in events:
        wall, mk, bd = _triple(ev)
        if mk is not None:
            rows.append({"wall_time": wall, "series": "incumbent", "makespan_ms": mk * MS})
        if bd is not None:
            rows.append({"wall_time": wall, "series": "lower bound", "makespan_ms": bd * MS})
    return pd.DataFrame(rows, columns=["wall_time", "series", "makespan_ms"])


def _triple(ev: Mapping[str, Any] | Sequence[Any]) -> tuple[float, float | None, float | None]:
    if isinstance(ev, Mapping):
        wall, mk, bd = ev.get("wall_time"), ev.get("makespan"), ev.get("bound")
    elif hasattr(ev, "wall_time"):
        wall, mk, bd = ev.wall_time, getattr(ev, "makespan", None), getattr(ev, "bound", None)
    else:
        wall, mk, bd = ev[0], ev[1], ev[2]
    return (
        float(wall or 0.0),
        None if mk is None else float(mk),
        None if bd is None else float(bd),
    )


def solver_gap(frame: pd.DataFrame) -> float | None:
    """Relative gap of the latest incumbent to the best bound: (inc - bound) / inc."""
    inc = frame[frame["series"] == "incumbent"]["makespan_ms"]
    bd = frame[frame["series"] == "lower bound"]["makespan_ms"]
    if inc.empty or bd.empty:
        return None
    best, bound = float(inc.min()), float(bd.max())
    return max(best - bound, 0.0) / best if best > 0 else None


def profile_frame(stages: Iterable[Any]) -> pd.DataFrame:
    """Measured op times per (stage, chunk, kind): mean, std, min, max, samples, in ms.

    ``stages`` are ``StageProfile`` objects (``.f``, ``.b``, ``.w`` with ``OpStats``).
    """
    rows = []
    for sp in stages:
        for kind, st in (("F", sp.f), ("B", sp.b), ("W", sp.w)):
            mean = float(st.mean) * MS
            std = float(st.std) * MS
            lo = float(st.min) * MS if st.min is not None else mean - std
            hi = float(st.max) * MS if st.max is not None else mean + std
            rows.append(
                {
                    "stage": int(sp.stage),
                    "chunk": int(sp.chunk),
                    "kind": kind,
                    "mean_ms": mean,
                    "std_ms": std,
                    "lo_std_ms": max(mean - std, 0.0),
                    "hi_std_ms": mean + std,
                    "min_ms": lo,
                    "max_ms": hi,
                    "samples": int(st.samples),
                }
            )
    return pd.DataFrame(
        rows,
        columns=[
            "stage",
            "chunk",
            "kind",
            "mean_ms",
            "std_ms",
            "lo_std_ms",
            "hi_std_ms",
            "min_ms",
            "max_ms",
            "samples",
        ],
    )


def activation_frame(stages: Iterable[Any]) -> pd.DataFrame:
    """Activation bytes per (stage, chunk): what F leaves, what W alone frees, what may move."""
    rows = []
    for sp in stages:
        off = sp.offloadable_bytes if sp.offloadable_bytes is not None else sp.activation_bytes
        for what, val in (
            ("activation", sp.activation_bytes),
            ("weight-grad part", sp.weight_grad_bytes),
            ("offloadable", off),
        ):
            rows.append(
                {"stage": int(sp.stage), "chunk": int(sp.chunk), "what": what, "bytes": float(val)}
            )
    return pd.DataFrame(rows, columns=["stage", "chunk", "what", "bytes"])


def training_frame(steps: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """Step times in long form: step, series (measured / predicted), seconds."""
    rows = []
    for st in steps:
        step = int(st["step"])
        if st.get("step_time") is not None:
            rows.append({"step": step, "series": "measured", "seconds": float(st["step_time"])})
        if st.get("predicted") is not None:
            rows.append({"step": step, "series": "predicted", "seconds": float(st["predicted"])})
    return pd.DataFrame(rows, columns=["step", "series", "seconds"])


def time_window(timeline: pd.DataFrame, lo_ms: float, hi_ms: float) -> pd.DataFrame:
    """The bars that overlap ``[lo_ms, hi_ms]`` (clipped to it), for schedules too large to draw
    whole."""
    keep = (timeline["end_ms"] > lo_ms) & (timeline["start_ms"] < hi_ms)
    out = timeline[keep].copy()
    out["start_ms"] = out["start_ms"].clip(lower=lo_ms)
    out["end_ms"] = out["end_ms"].clip(upper=hi_ms)
    return out
