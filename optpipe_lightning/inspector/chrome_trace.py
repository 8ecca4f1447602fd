"""Chrome trace (Trace Event Format) of a schedule's simulated timeline, for Perfetto.

Layout: one process per device ("stage d"), thread 0 its compute ops, thread 1 its
device-to-host copies (OFFLOAD), thread 2 its host-to-device copies (RELOAD): a copy channel has
one lane per direction, which run at the same time on a full-duplex channel; one complete event (``ph: "X"``) per action, a counter (``ph: "C"``) named
"activation memory" per device with the on-device and offloaded bytes at every change, and flow
arrows (``ph: "s"`` / ``"f"``) for every dependency that crosses devices (activations forward,
gradients backward) and from each offload to its reload. Times are microseconds from the first
op. Events on one (pid, tid) never overlap: a device computes one op at a time and each lane of
its copy channel moves one activation at a time.

Open the file in https://ui.perfetto.dev or chrome://tracing.
"""

from __future__ import annotations

from typing import Any

from ..schedule import Problem, Schedule, simulate
from ..schedule.schedule import COMPUTE_KINDS

US = 1e6  # seconds -> microseconds
COMPUTE_TID = 0
OFFLOAD_TID = 1  # device -> host lane
RELOAD_TID = 2  # host -> device lane
TIDS = {"OFFLOAD": OFFLOAD_TID, "RELOAD": RELOAD_TID}
MEMORY_COUNTER = "activation memory"


class TraceError(ValueError):
    """The schedule cannot be drawn (no problem to time it on, or it cannot be timed)."""


def chrome_trace(problem: Problem | None, schedule: Schedule) -> dict[str, Any]:
    """The Trace Event Format document of ``schedule`` timed on ``problem``.

    ``problem`` may be None when the schedule embeds its problem (``schedule.problem``).
    Raises ``TraceError`` (one line) when there is no problem or the schedule deadlocks.
    """
    if problem is None:
        problem = schedule.problem
    if problem is None:
        raise TraceError("the schedule does not embed its problem; pass the problem JSON as well")
    try:
        sim = simulate(problem, schedule)
    except ValueError as e:
        raise TraceError(str(e)) from None
    tl = sim.timeline
    if tl is None:
        why = "; ".join(v.message for v in sim.evaluation.violations[:3])
        raise TraceError(f"the schedule cannot be timed: {why}")

    events: list[dict[str, Any]] = []
    p = problem.num_stages
    for s in range(p):
        events += [
            _meta("process_name", s, None, {"name": f"stage {s}"}),
            _meta("process_sort_index", s, None, {"sort_index": s}),
            _meta("thread_name", s, COMPUTE_TID, {"name": "compute"}),
            _meta("thread_sort_index", s, COMPUTE_TID, {"sort_index": 0}),
        ]
        ops = {a.op for a in tl.actions[s]}  # a copy lane is named only where it is used
        for op, name in (
            ("OFFLOAD", "device → host (offload)"),
            ("RELOAD", "host → device (reload)"),
        ):
            if op in ops:
                events += [
                    _meta("thread_name", s, TIDS[op], {"name": name}),
                    _meta("thread_sort_index", s, TIDS[op], {"sort_index": TIDS[op]}),
                ]

    # (op, stage, mb, chunk) -> (start us, end us, tid)
    slot: dict[tuple[str, int, int, int], tuple[float, float, int]] = {}
    for s in range(p):
        for a, t0, t1 in zip(tl.actions[s], tl.start[s], tl.end[s], strict=True):
            ts, te = float(t0) * US, float(t1) * US
            tid = COMPUTE_TID if a.op in COMPUTE_KINDS else TIDS[a.op]
            slot[(a.op, s, a.mb, a.chunk)] = (ts, te, tid)
            events.append(
                {
                    "name": str(a),
                    "cat": a.op,
                    "ph": "X",
                    "pid": s,
                    "tid": tid,
                    "ts": ts,
                    "dur": max(te - ts, 0.0),
                    "args": {"stage": s, "microbatch": a.mb, "chunk": a.chunk, "op": a.op},
                }
            )

    limits = problem.memory_limits()
    for s, curve in enumerate(sim.memory):
        for t, on_dev, host in zip(curve.times, curve.bytes, curve.offloaded, strict=True):
            args: dict[str, float] = {"on device": float(on_dev), "offloaded": float(host)}
            if limits[s] is not None:
                args["limit"] = float(limits[s])  # type: ignore[arg-type]
            events.append(
                {
                    "name": MEMORY_COUNTER,
                    "ph": "C",
                    "pid": s,
                    "tid": COMPUTE_TID,
                    "ts": max(float(t), 0.0) * US,
                    "args": args,
                }
            )

    events += _flows(problem, slot)
    ev = sim.evaluation
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "generator": schedule.generator,
            "problem_hash": problem.hash,
            "makespan_seconds": ev.makespan,
            "bubble_rate": ev.bubble_rate,
            "feasible": ev.feasible,
            "num_offloaded": ev.num_offloaded,
        },
    }


def _meta(name: str, pid: int, tid: int | None, args: dict[str, Any]) -> dict[str, Any]:
    ev: dict[str, Any] = {"name": name, "ph": "M", "pid": pid, "args": args}
    ev["tid"] = tid if tid is not None else 0
    return ev


def _flows(
    problem: Problem, slot: dict[tuple[str, int, int, int], tuple[float, float, int]]
) -> list[dict[str, Any]]:
    """Flow start/finish pairs: cross-device F->F and B->B (or BW), and offload->reload."""
    p_g = problem.group_table
    G = len(p_g)
    out: list[dict[str, Any]] = []
    next_id = 0

    def backward(s: int, mb: int, c: int) -> tuple[str, int, int, int] | None:
        for op in ("B", "BW"):
            if (op, s, mb, c) in slot:
                return (op, s, mb, c)
        return None

    def add(src: tuple[str, int, int, int], dst: tuple[str, int, int, int], name: str) -> None:
        nonlocal next_id
        s0, s1 = slot[src], slot[dst]
        common = {"name": name, "cat": "dependency", "id": next_id}
        out.append({**common, "ph": "s", "pid": src[1], "tid": s0[2], "ts": (s0[0] + s0[1]) / 2})
        out.append(
            {**common, "ph": "f", "bp": "e", "pid": dst[1], "tid": s1[2], "ts": (s1[0] + s1[1]) / 2}
        )
        next_id += 1

    for mb in range(problem.num_microbatches):
        for g in range(G - 1):
            (s0, c0), (s1, c1) = p_g[g], p_g[g + 1]
            if s0 == s1:
                continue
            f0, f1 = ("F", s0, mb, c0), ("F", s1, mb, c1)
            if f0 in slot and f1 in slot:
                add(f0, f1, "activation")
            b1, b0 = backward(s1, mb, c1), backward(s0, mb, c0)
            if b1 is not None and b0 is not None:
                add(b1, b0, "gradient")
    for op, s, mb, c in list(slot):
        if op == "OFFLOAD" and ("RELOAD", s, mb, c) in slot:
            add((op, s, mb, c), ("RELOAD", s, mb, c), "offloaded activation")
    return out
