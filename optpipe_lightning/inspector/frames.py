"""Tidy data frames the charts draw: one row per bar, point or step, in display units.

Pure functions of a ``Problem`` and the simulator's ``SimResult`` (or of rows read from the
database), so each chart's data can be checked without Streamlit or a browser. Times are in the
``time`` unit a frame is built with (``units.time_unit`` of the makespan: s, ms or µs), bytes in
``units.byte_unit`` of the largest value (GB, MB...), never both mixed on one axis.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from ..schedule import Problem, Schedule, SimResult, simulate
from ..schedule.schedule import COMPUTE_KINDS
from ..schedule.units import Unit, byte_unit, time_unit

TIMELINE_COLUMNS = [
    "device",
    "lane",
    "kind",
    "micro",
    "chunk",
    "start",
    "end",
    "duration",
    "waits_for",
]
# one lane per direction of the copy channel: OFFLOAD is always device -> host, RELOAD always
# host -> device (with a full-duplex channel the two run at the same time)
LANES = {"OFFLOAD": "device → host", "RELOAD": "host → device"}
LANE_ORDER = ["compute", "device → host", "host → device"]


def lane_of(op: str) -> str:
    """The lane an op is drawn in."""
    return "compute" if op in COMPUTE_KINDS else LANES[op]


def simulate_schedule(problem: Problem, schedule: Schedule) -> SimResult:
    """The simulator's result for a stored schedule (raises ``ScheduleMismatchError`` when the
    schedule was made for another problem)."""
    return simulate(problem, schedule)


def schedule_time_unit(sim: SimResult) -> Unit:
    """The time unit of a schedule's charts: the one that fits its makespan."""
    return time_unit(sim.makespan or 0.0)


def timeline_frame(sim: SimResult, unit: Unit | None = None) -> pd.DataFrame:
    """One row per action: device, lane, kind, microbatch, chunk, start, end, duration (in
    ``unit``), and for an F that waited for memory the offload it waited for."""
    tl = sim.timeline
    if tl is None:
        return pd.DataFrame({c: [] for c in TIMELINE_COLUMNS})
    unit = unit or schedule_time_unit(sim)
    parts: list[pd.DataFrame] = []
    for s, row in enumerate(tl.actions):
        if not row:
            continue
        start = np.asarray(tl.start[s], dtype=float) / unit.scale
        end = np.asarray(tl.end[s], dtype=float) / unit.scale
        waits = [""] * len(row)
        for f_pos, o_pos in tl.memory_waits[s] if tl.memory_waits else ():
            o = row[o_pos]
            waits[f_pos] = f"offload of mb {o.mb}" + (f" chunk {o.chunk}" if o.chunk else "")
        parts.append(
            pd.DataFrame(
                {
                    "device": s,
                    "lane": [lane_of(a.op) for a in row],
                    "kind": [a.op for a in row],
                    "micro": [a.mb for a in row],
                    "chunk": [a.chunk for a in row],
                    "start": start,
                    "end": end,
                    "duration": end - start,
                    "waits_for": waits,  # the memory wait: the copy this F waited for
                }
            )
        )
    if not parts:
        return pd.DataFrame({c: [] for c in TIMELINE_COLUMNS})
    return pd.concat(parts, ignore_index=True)


def idle_frame(timeline: pd.DataFrame, makespan: float) -> pd.DataFrame:
    """Per device: busy compute time, idle time within the makespan, and the idle fraction (in
    the timeline's unit)."""
    comp = timeline[timeline["lane"] == "compute"]
    busy = comp.groupby("device")["duration"].sum()
    rows = []
    for d in sorted(timeline["device"].unique().tolist()):
        b = float(busy.get(d, 0.0))
        idle = max(makespan - b, 0.0)
        rows.append(
            {
                "device": int(d),
                "busy": b,
                "idle": idle,
                "idle_fraction": idle / makespan if makespan > 0 else 0.0,
            }
        )
    return pd.DataFrame(rows, columns=["device", "busy", "idle", "idle_fraction"])


def busy_frame(timeline: pd.DataFrame, makespan: float, bins: int = 100) -> pd.DataFrame:
    """How busy each device's compute lane is in ``bins`` equal time slices of the makespan.

    Columns: device, t0, t1 (the slice), busy (fraction of the slice spent computing), stage
    (the row label: "stage d · x% idle"). Exact: a device computes one op at a time, so the busy
    time up to ``t`` is the sum of the finished ops plus the part of the running one.
    """
    cols = ["device", "stage", "t0", "t1", "busy"]
    if timeline.empty or makespan <= 0:
        return pd.DataFrame(columns=cols)
    edges = np.linspace(0.0, makespan, bins + 1)
    comp = timeline[timeline["lane"] == "compute"]
    parts = []
    for d in sorted(timeline["device"].unique().tolist()):
        ops = comp[comp["device"] == d].sort_values("start")
        starts = ops["start"].to_numpy(dtype=float)
        ends = ops["end"].to_numpy(dtype=float)
        done = np.concatenate([[0.0], np.cumsum(ends - starts)])
        k = np.searchsorted(ends, edges, side="right")  # ops finished by each edge
        partial = np.zeros_like(edges)
        on = k < len(starts)  # the next op may have started before the edge
        partial[on] = np.clip(edges[on] - starts[k[on]], 0.0, None)
        upto = done[k] + partial
        busy = np.diff(upto) / np.diff(edges)
        idle = 1.0 - float(done[-1]) / makespan
        parts.append(
            pd.DataFrame(
                {
                    "device": int(d),
                    "stage": f"stage {int(d)} · {idle:.0%} idle",
                    "t0": edges[:-1],
                    "t1": edges[1:],
                    "busy": np.clip(busy, 0.0, 1.0),
                }
            )
        )
    return pd.concat(parts, ignore_index=True)


def memory_unit(problem: Problem, sim: SimResult) -> Unit:
    """One byte unit for a schedule's memory chart (from its peaks and limits)."""
    peaks = [c.peak for c in sim.memory] + [
        float(c.offloaded.max()) for c in sim.memory if c.offloaded.size
    ]
    limits = [x for x in problem.memory_limits() if x is not None]
    return byte_unit(max([*peaks, *limits, 0.0]))


def memory_frame(
    problem: Problem, sim: SimResult, unit: Unit | None = None, time: Unit | None = None
) -> pd.DataFrame:
    """Step points of each device's activation memory and offloaded bytes, in ``unit``.

    Columns: device, time (in ``time``), series ("on device" / "offloaded"), value, limit (None
    when unlimited), is_peak (the first instant the on-device curve reaches its peak).
    """
    unit = unit or memory_unit(problem, sim)
    time = time or schedule_time_unit(sim)
    limits = problem.memory_limits()
    makespan = (sim.makespan or 0.0) / time.scale
    frames: list[pd.DataFrame] = []
    for s, curve in enumerate(sim.memory):
        times = np.asarray(curve.times, dtype=float) / time.scale
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
        series_list = [("on device", on_dev)]
        if host.size and host.max() > 0:
            series_list.append(("offloaded", host))
        for series, vals in series_list:
            frames.append(
                pd.DataFrame(
                    {
                        "device": s,
                        "time": times,
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
        return pd.DataFrame(columns=["device", "time", "series", "value", "limit", "is_peak"])
    return pd.concat(frames, ignore_index=True)


def schedule_summary(name: str, problem: Problem, sim: SimResult) -> dict[str, Any]:
    """One row of the comparison table (values from the simulator only; seconds and bytes)."""
    ev = sim.evaluation
    limits = [x for x in problem.memory_limits() if x is not None]
    peak = max(ev.peak_memory) if ev.peak_memory else 0.0
    return {
        "schedule": name,
        "makespan": ev.makespan,
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


def solver_frame(
    events: Iterable[Mapping[str, Any] | Sequence[Any]], end: float | None = None
) -> pd.DataFrame:
    """Solver progress in long form: wall_time (s), series (incumbent / lower bound), makespan
    (seconds).

    ``events`` are rows with ``wall_time``, ``makespan`` and ``bound`` (seconds; either may be
    None), as the database's solver events give them. With ``end`` (the run's end, or now while
    it runs) each series gets a last point there, so the step lines reach it.
    """
    rows = []
    for ev in events:
        wall, mk, bd = _triple(ev)
        if mk is not None:
            rows.append({"wall_time": wall, "series": "incumbent", "makespan": mk, "event": True})
        if bd is not None:
            rows.append({"wall_time": wall, "series": "lower bound", "makespan": bd, "event": True})
    df = pd.DataFrame(rows, columns=["wall_time", "series", "makespan", "event"])
    if end is not None and not df.empty:
        last = df.sort_values("wall_time").groupby("series", sort=False).tail(1)
        tail = last[last["wall_time"] < end].assign(wall_time=float(end), event=False)
        df = pd.concat([df, tail], ignore_index=True)
    return df


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


def solver_best(frame: pd.DataFrame) -> tuple[float | None, float | None]:
    """(best incumbent, best bound) of a solver frame, in its unit."""
    inc = frame[frame["series"] == "incumbent"]["makespan"]
    bd = frame[frame["series"] == "lower bound"]["makespan"]
    return (float(inc.min()) if len(inc) else None, float(bd.max()) if len(bd) else None)


def solver_gap(frame: pd.DataFrame) -> float | None:
    """Relative gap of the best incumbent to the best bound: (inc - bound) / inc."""
    best, bound = solver_best(frame)
    if best is None or bound is None:
        return None
    return max(best - bound, 0.0) / best if best > 0 else None


def baseline_marks(
    baselines: Mapping[str, float], lo: float, hi: float, *, merge: float = 0.04
) -> pd.DataFrame:
    """Baseline reference lines for a y-axis from ``lo`` to ``hi`` that they must not stretch.

    Baselines inside the range get a line and a label; names whose values lie within ``merge``
    of the range of each other share one label (so labels never overlap); the ones above the
    range are listed in one label ("above the axis: zb-auto"). Columns:
    makespan (where the line/label sits), label, inside (False for the edge label).
    """
    cols = ["makespan", "label", "inside"]
    if not baselines:
        return pd.DataFrame(columns=cols)
    span = max(hi - lo, abs(hi) * 1e-3, 1e-12)
    inside = sorted((v, k) for k, v in baselines.items() if lo <= v <= hi)
    above = sorted((v, k) for k, v in baselines.items() if v > hi)
    below = sorted((v, k) for k, v in baselines.items() if v < lo)
    rows: list[dict[str, Any]] = []
    group: list[tuple[float, str]] = []
    for v, k in inside:
        if group and v - group[0][0] > merge * span:
            rows.append(_merged(group))
            group = []
        group.append((v, k))
    if group:
        rows.append(_merged(group))
    if above:
        rows.append(
            {
                "makespan": hi,
                "label": "above the axis: " + ", ".join(k for _, k in above),
                "inside": False,
            }
        )
    if below:
        rows.append(
            {
                "makespan": lo,
                "label": "below the axis: " + ", ".join(k for _, k in below),
                "inside": False,
            }
        )
    return pd.DataFrame(rows, columns=cols)


def _merged(group: list[tuple[float, str]]) -> dict[str, Any]:
    return {"makespan": group[0][0], "label": ", ".join(k for _, k in group), "inside": True}


def profile_frame(stages: Iterable[Any], unit: Unit) -> pd.DataFrame:
    """Measured op times per (stage, chunk, kind) in ``unit``: mean, std, min, max, samples.

    ``stages`` are ``StageProfile`` objects (``.f``, ``.b``, ``.w`` with ``OpStats``); a missing
    min / max is the mean -/+ one std.
    """
    rows = []
    for sp in stages:
        for kind, st in (("F", sp.f), ("B", sp.b), ("W", sp.w)):
            mean = float(st.mean) / unit.scale
            std = float(st.std) / unit.scale
            lo = float(st.min) / unit.scale if st.min is not None else mean - std
            hi = float(st.max) / unit.scale if st.max is not None else mean + std
            rows.append(
                {
                    "stage": int(sp.stage),
                    "chunk": int(sp.chunk),
                    "kind": kind,
                    "mean": mean,
                    "std": std,
                    "min": max(lo, 0.0),
                    "max": hi,
                    "samples": int(st.samples),
                }
            )
    return pd.DataFrame(
        rows, columns=["stage", "chunk", "kind", "mean", "std", "min", "max", "samples"]
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


def op_memory_frame(stages: Iterable[Any]) -> pd.DataFrame:
    """Per (stage, chunk, op): the bytes the op leaves allocated by the rule (``activation_bytes``
    and ``weight_grad_bytes``: F leaves the activation, B frees all but the weight-grad part, W
    the rest) and as the profiler's allocator watch measured it (``StageProfile.memory``, GPU
    profiles; NaN where the profile has none), plus the measured transient (workspace above both
    ends of the op). ``used`` is what the problem takes (``memory_changes``)."""
    rows = []
    for sp in stages:
        act, wg = float(sp.activation_bytes), float(sp.weight_grad_bytes)
        rule = {"F": act, "B": -(act - wg), "W": -wg}
        mem = sp.memory
        used = dict(zip(("F", "B", "W"), (float(x) for x in sp.memory_changes()), strict=True))
        measured: dict[str, float] = (
            {"F": float(mem.f), "B": float(mem.b), "W": float(mem.w)} if mem is not None else {}
        )
        if mem is not None and mem.bw is not None:
            measured["BW"] = float(mem.bw)
        for op in ("F", "B", "W", "BW"):
            if op == "BW" and "BW" not in measured:
                continue
            rows.append(
                {
                    "stage": int(sp.stage),
                    "chunk": int(sp.chunk),
                    "op": op,
                    "rule": rule["B"] + rule["W"] if op == "BW" else rule[op],
                    "measured": measured.get(op, float("nan")),
                    "used": used["B"] + used["W"] if op == "BW" else used[op],
                    "transient": float(mem.transient) if mem is not None else float("nan"),
                }
            )
    return pd.DataFrame(
        rows, columns=["stage", "chunk", "op", "rule", "measured", "used", "transient"]
    )


def time_window(timeline: pd.DataFrame, lo: float, hi: float) -> pd.DataFrame:
    """The bars that overlap ``[lo, hi]`` (clipped to it), for schedules too large to draw
    whole."""
    keep = (timeline["end"] > lo) & (timeline["start"] < hi)
    out = timeline[keep].copy()
    out["start"] = out["start"].clip(lower=lo)
    out["end"] = out["end"].clip(upper=hi)
    return out
