"""Profiles database benchmark: solver events, training steps, loading a 16x64x2 schedule, and
what recording incumbents costs a solver loop.

    python benchmarks/bench_db.py                      # a fresh SQLite file in a temp folder
    python benchmarks/bench_db.py --db postgresql://user@127.0.0.1:5432/bench
    python benchmarks/bench_db.py --json               # machine-readable

Numbers:
- events: 10,000 incumbents through ``SolverEventRecorder`` (default flush_every=0.5 s,
  batch=256): time in the solver's thread per call, and until all are on disk (``close()``).
- steps: 1,000 ``record_step`` calls, one transaction each (as a training loop records them).
- schedule: store and load (``get_schedule``, validated, problem attached) of a 16-stage,
  64-microbatch, 2-chunk schedule (6,144 actions) built by a simple generator (all F, then all B,
  then all W per stage).
- overhead: a GIL-bound Python "solver" loop (the worst case: CP-SAT and HiGHS search in C++
  without the GIL and only call back into Python) reporting 100, 1,000 and 10,000 incumbents/s;
  the time inside the recorder's call plus the writer thread's CPU time, as a share of the
  loop (see ``bench_overhead``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from _shared import fbw_rows

from optpipe_lightning.profiles_db import SolverEventRecorder, open_database
from optpipe_lightning.profiles_db import repository as repo
from optpipe_lightning.schedule import Problem
from optpipe_lightning.schedule.baselines import make_schedule
from optpipe_lightning.schedule.profile import HardwareFingerprint, ModelFingerprint


def _timed(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def bench_events(db: Any, problem_hash: str, n: int) -> dict[str, float]:
    with db.session() as s:
        rid = repo.start_solver_run(s, problem_hash, "bench", {})
    incumbents = [SimpleNamespace(wall_time=i * 1e-3, makespan=1e6 - i, bound=i) for i in range(n)]
    rec = SolverEventRecorder(db, rid)
    t0 = time.perf_counter()
    for inc in incumbents:
        rec(inc)
    t_calls = time.perf_counter() - t0
    rec.close()
    t_all = time.perf_counter() - t0
    with db.session() as s:
        stored = len(repo.solver_events(s, rid))
    assert stored == n and rec.dropped == 0, (stored, rec.dropped)
    # the writer's own cost: one batch of all events in one transaction
    with db.session() as s:
        rid2 = repo.start_solver_run(s, problem_hash, "bench-bulk", {})
    rec2 = SolverEventRecorder(db, rid2, flush_every=3600, batch=n + 1)
    for inc in incumbents:
        rec2(inc)
    t1 = time.perf_counter()
    rec2.flush()
    t_bulk = time.perf_counter() - t1
    rec2.close()
    cpu_bulk = rec2.writer_seconds
    return {
        "events": n,
        "call_us": t_calls / n * 1e6,
        "until_stored_s": t_all,
        "bulk_write_s": t_bulk,
        "bulk_write_us_per_event": t_bulk / n * 1e6,
        "bulk_write_cpu_us_per_event": cpu_bulk / n * 1e6,
    }


def bench_steps(db: Any, n: int) -> dict[str, float]:
    hw = HardwareFingerprint(device_kind="cpu", device_count=4, device_memory=0)
    mf = ModelFingerprint(layer_structure=["Linear"] * 8, microbatch_size=1, num_stages=4)
    with db.session() as s:
        rid = repo.start_training_run(s, hardware=hw, model=mf, config={})
    t = time.perf_counter()
    for i in range(n):
        with db.session() as s:
            repo.record_step(
                s,
                rid,
                step=i,
                measured_seconds=0.1,
                predicted_seconds=0.09,
                schedule_id=None,
                peak_memory=[1e9, 2e9, 3e9, 4e9],
            )
    total = time.perf_counter() - t
    t = time.perf_counter()
    with db.session() as s:
        rows = repo.training_steps(s, rid)
    read = time.perf_counter() - t
    assert len(rows) == n
    return {"steps": n, "total_s": total, "ms_per_step": total / n * 1e3, "read_all_s": read}


def bench_schedule(db: Any) -> dict[str, float]:
    problem = Problem(num_stages=16, num_microbatches=64, num_chunks=2, t_f=1.0, t_b=1.0, t_w=0.5)
    t = time.perf_counter()
    sched = make_schedule(problem, "bench-fbw", fbw_rows(16, 64, 2))
    build = time.perf_counter() - t
    t = time.perf_counter()
    with db.session() as s:
        sid = repo.store_schedule(s, sched)
    store = time.perf_counter() - t

    def load() -> Any:
        with db.session() as s:
            return repo.get_schedule(s, sid)

    t_load, got = _timed(load, 15)
    assert got == sched

    def best() -> Any:
        with db.session() as s:
            return repo.best_schedule(s, problem.hash)

    t_best, _ = _timed(best, 15)
    return {
        "actions": sum(len(r) for r in sched.actions),
        "json_kb": len(sched.model_copy(update={"problem": None}).model_dump_json()) / 1024,
        "build_and_simulate_s": build,
        "store_s": store,
        "load_ms": t_load * 1e3,
        "best_schedule_ms": t_best * 1e3,
    }


def _solver_loop(n: int, work: int, callback: Callable[[Any], None]) -> tuple[float, float]:
    """(wall seconds of the loop, wall seconds spent inside the callback)."""
    t = time.perf_counter()
    in_callback = 0.0
    acc = 0
    for i in range(n):
        for k in range(work):  # the solver's own work between two incumbents (GIL-bound)
            acc += k * k % 7
        incumbent = SimpleNamespace(wall_time=time.perf_counter() - t, makespan=1e6 - i, bound=i)
        c = time.perf_counter()
        callback(incumbent)
        in_callback += time.perf_counter() - c
    return time.perf_counter() - t, in_callback


def bench_overhead(
    db: Any, problem_hash: str, rate: float, seconds: float, rounds: int
) -> dict[str, float]:
    """What the recorder takes from a GIL-bound solver loop reporting ``rate`` incumbents/s.

    Two parts, each measured where it happens (an A/B of whole loops drowns in machine noise):
    the time the solver spends inside the recorder's call, and the writer thread's CPU time
    (``SolverEventRecorder.writer_seconds``), which a GIL-bound solver loses in full (a solver
    searching in C++ without the GIL, as CP-SAT and HiGHS do, loses only the first part).
    The flush in ``close()`` after the solve is counted too. Medians over ``rounds``.
    """
    work_per_s = _solver_loop(1, 2_000_000, lambda inc: None)[0]
    work = max(1, int(2_000_000 / (work_per_s * rate)))
    n = max(1, int(rate * seconds))
    shares, calls, writes, loops = [], [], [], []
    for _ in range(rounds):
        with db.session() as s:
            rid = repo.start_solver_run(s, problem_hash, "bench-overhead", {})
        rec = SolverEventRecorder(db, rid)
        loop, in_call = _solver_loop(n, work, rec)
        rec.close()
        shares.append((in_call + rec.writer_seconds) / loop * 100)
        calls.append(in_call / n * 1e6)
        writes.append(rec.writer_seconds / n * 1e6)
        loops.append(loop)
    return {
        "incumbents": n,
        "rate_per_s": n / statistics.median(loops),
        "call_us": statistics.median(calls),
        "writer_us": statistics.median(writes),
        "slowdown_pct": statistics.median(shares),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--db", help="database URL (default: a new SQLite file in a temp folder)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--events", type=int, default=10_000)
    ap.add_argument("--steps", type=int, default=1_000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--seconds", type=float, default=1.0, help="length of one solver loop")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = args.db or f"sqlite:///{Path(tmp) / 'bench.db'}"
        db = open_database(url)
        problem = Problem(num_stages=2, num_microbatches=2, t_f=1.0, t_b=1.0, t_w=1.0)
        with db.session() as s:
            h = repo.store_problem(s, problem)
        out = {
            "backend": db.backend,
            "events": bench_events(db, h, args.events),
            "steps": bench_steps(db, args.steps),
            "schedule": bench_schedule(db),
            "overhead": [
                bench_overhead(db, h, rate, args.seconds, args.rounds)
                for rate in (100.0, 1_000.0, 10_000.0)
            ],
        }
        db.close()
    if args.json:
        print(json.dumps(out, indent=2))
        return
    e, st, sc = out["events"], out["steps"], out["schedule"]
    print(f"backend: {out['backend']}")
    print(
        f"solver events: {e['events']:,} through the recorder: {e['call_us']:.2f} us per call in "
        f"the solver thread, all stored after {e['until_stored_s']:.2f} s; one batched write of "
        f"all: {e['bulk_write_s'] * 1e3:.1f} ms ({e['bulk_write_us_per_event']:.2f} us/event, "
        f"{e['bulk_write_cpu_us_per_event']:.2f} us/event of this process's CPU)"
    )
    print(
        f"training steps: {st['steps']:,} record_step, one transaction each: {st['total_s']:.2f} s "
        f"({st['ms_per_step']:.2f} ms/step); reading them back {st['read_all_s'] * 1e3:.1f} ms"
    )
    print(
        f"16x64x2 schedule: {sc['actions']:,} actions, {sc['json_kb']:.0f} KiB JSON; store "
        f"{sc['store_s'] * 1e3:.1f} ms, load {sc['load_ms']:.1f} ms, best_schedule "
        f"{sc['best_schedule_ms']:.1f} ms (built+simulated in {sc['build_and_simulate_s']:.2f} s)"
    )
    per_event = e["call_us"] + e["bulk_write_cpu_us_per_event"]
    print(
        f"cost model: {e['call_us']:.2f} us in the solver's call + "
        f"{e['bulk_write_cpu_us_per_event']:.2f} us of writer CPU per event = {per_event:.2f} us; "
        f"1% of a fully GIL-bound solver at {0.01 / (per_event * 1e-6):,.0f} incumbents/s"
    )
    for o in out["overhead"]:
        print(
            f"solver loop at {o['rate_per_s']:,.0f} incumbents/s: {o['call_us']:.2f} us in the "
            f"call + {o['writer_us']:.2f} us of writer CPU per event = {o['slowdown_pct']:.3f}% "
            "of a GIL-bound solver's time"
        )


if __name__ == "__main__":
    main()
