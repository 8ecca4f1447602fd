"""A demo database for the inspector, made by the product itself (``optpipe inspect --demo``).

Everything a schedule page draws comes from the real code: problems from measured-looking
profiles through ``Profile.to_problem`` (what the strategy does after profiling), every baseline
from ``schedule.baselines``, solver runs from ``solver.solve`` recorded with the same
``SolverEventRecorder`` as ``optpipe solve --db``. Only the measurements are invented: the
profiles' op times and the training run (a recording of what the strategy writes: steps timed
near the schedules' predictions, a loss curve, a re-calibration and two schedule switches),
since measuring needs GPUs.

This module sits beside ``cli.py`` (it uses the solver, which the inspector never imports) and is
used by ``optpipe inspect --demo``, the inspector's tests and ``benchmarks/bench_inspector.py``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..schedule import Problem, Schedule
from ..schedule.problem import OffloadSpec
from ..schedule.profile import (
    HardwareFingerprint,
    ModelFingerprint,
    OpStats,
    Profile,
    StageProfile,
)

GB = 1e9
# one layer stack of a GPT-like model, per stage and microbatch, with FlashAttention-sized
# activations (no attention-score matrix kept) and PCIe 4 copies: a copy each way costs about
# the stage's F+B+W, the regime where offload pays only where it hides behind compute
T_F, T_B, T_W = 0.018, 0.019, 0.009
ACTIVATION = 1.2 * GB
WEIGHT_GRAD = 0.24 * GB
OFFLOADABLE = 1.0 * GB
COPY_BANDWIDTH = (25 * GB, 27 * GB)  # device -> host, host -> device
P2P_SECONDS = 0.0006
TRAINING_LIMIT = 2.5  # activations: the limit of the problem the training run uses
STATIC_BYTES = 9.5 * GB  # parameters, gradients and optimizer state of one stage (for peaks)
DEVICE = HardwareFingerprint(
    device_kind="NVIDIA H100 80GB HBM3",
    device_count=4,
    device_memory=80 * 2**30,
    interconnect="nvlink",
    torch_version="2.13.0",
    hostname="demo-node",
)


def demo_profile(
    num_stages: int = 4,
    num_microbatches: int = 8,
    num_chunks: int = 1,
    *,
    name: str = "gpt-1.5b",
    measured_at: str = "2026-11-20T10:00:00+00:00",
) -> Profile:
    """Measured-looking op times (with spread) of a GPT-like stack split over ``num_stages``."""
    stages = []
    for s in range(num_stages):
        for c in range(num_chunks):
            k = (1.0 + 0.04 * (s % 3)) / num_chunks

            def stats(mean: float, k: float = k, s: int = s) -> OpStats:
                m = mean * k
                spread = 0.03 + 0.01 * (s % 2)
                return OpStats(
                    mean=m, std=spread * m, min=(1 - 2 * spread) * m, max=(1 + 3 * spread) * m,
                    samples=24,
                )  # fmt: skip

            stages.append(
                StageProfile(
                    stage=s,
                    chunk=c,
                    f=stats(T_F),
                    b=stats(T_B),
                    w=stats(T_W),
                    activation_bytes=ACTIVATION / num_chunks,
                    weight_grad_bytes=WEIGHT_GRAD / num_chunks,
                    offloadable_bytes=OFFLOADABLE / num_chunks,
                )
            )
    layers = 8 * num_stages
    return Profile(
        hardware=DEVICE.model_copy(update={"device_count": num_stages}),
        model=ModelFingerprint(
            name=name,
            layer_structure=["TransformerBlock"] * layers,
            dtype="bfloat16",
            microbatch_size=4,
            sequence_length=2048,
            num_stages=num_stages,
            num_chunks=num_chunks,
            partition=[layers // (num_stages * num_chunks)] * (num_stages * num_chunks),
        ),
        num_microbatches=num_microbatches,
        stages=stages,
        p2p_seconds=P2P_SECONDS,
        d2h_bandwidth=COPY_BANDWIDTH[0],
        h2d_bandwidth=COPY_BANDWIDTH[1],
        measured_at=measured_at,
    )


def demo_problem(profile: Profile, limit_microbatches: float, *, name: str | None) -> Problem:
    """The profile's problem with a memory limit of ``limit_microbatches`` activations."""
    limit = limit_microbatches * ACTIVATION
    return profile.to_problem(memory_limit=limit).with_changes(name=name)


def unit_problem() -> Problem:
    """Unit costs (a time unit of one second), limit of two activations, offload: the textbook
    case, stored without a name so the inspector labels it by its shape."""
    return Problem(
        num_stages=4,
        num_microbatches=8,
        t_f=1.0,
        t_b=1.0,
        t_w=1.0,
        t_comm=0.0,
        m_f=1.0,
        m_b=-0.5,
        m_w=-0.5,
        memory_limit=2.0,
        offload=OffloadSpec(bytes=1.0, d2h_bandwidth=1.0, h2d_bandwidth=1.0),
    )


@dataclass
class DemoDatabase:
    """What ``build_demo_database`` stored, by key."""

    url: str
    problems: dict[str, str] = field(default_factory=dict)  # key -> problem hash
    schedules: dict[tuple[str, str], int] = field(default_factory=dict)  # (key, name) -> id
    solver_runs: dict[tuple[str, str], int] = field(default_factory=dict)  # (key, backend) -> id
    profiles: list[int] = field(default_factory=list)
    training_run: int | None = None


def build_demo_database(
    url: str,
    *,
    time_limit: float = 5.0,
    workers: int | None = None,
    large: bool = False,
    large_time_limit: float = 20.0,
) -> DemoDatabase:
    """Fill the database at ``url`` (created when missing) with the demo; returns what it stored.

    Problems: ``gpt-4x8`` (4 stages x 8 microbatches, limit 2.5 activations, offload) solved by
    the heuristic backend and by CP-SAT; ``gpt-4x8x2`` (two interleaved chunks per stage) solved
    once; ``unit-4x8`` (unit costs, no name) solved once; with ``large``, ``gpt-16x64x2`` solved
    by the heuristics for ``large_time_limit`` seconds. Every applicable baseline of each
    problem is stored too, and a training run on ``gpt-4x8``.
    """
    from ..profiles_db import open_database

    out = DemoDatabase(url)
    prof1 = demo_profile(4, 8, 1)
    prof2 = demo_profile(4, 8, 2, measured_at="2026-11-20T11:30:00+00:00")
    problems: list[tuple[str, Problem, list[str], float]] = [
        (
            "gpt-4x8",
            demo_problem(
                prof1, TRAINING_LIMIT, name="gpt-1.5b on 4x H100, 8 microbatches, tight memory"
            ),
            ["heuristic", "cpsat"],
            time_limit,
        ),
        (
            "gpt-4x8x2",
            demo_problem(prof2, 3.0, name="gpt-1.5b on 4x H100, 2 chunks per stage"),
            ["auto"],
            time_limit,
        ),
        ("unit-4x8", unit_problem(), ["auto"], time_limit),
    ]
    if large:
        big = demo_profile(16, 64, 2, name="gpt-6b", measured_at="2026-11-21T09:00:00+00:00")
        problems.append(
            (
                "gpt-16x64x2",
                demo_problem(big, 6.0, name="gpt-6b on 16 GPUs, 2 chunks per stage"),
                ["heuristic"],
                large_time_limit,
            )
        )
    with open_database(url) as db:
        with db.session() as s:
            from ..profiles_db import repository as repo

            out.profiles = [repo.store_profile(s, prof1), repo.store_profile(s, prof2)]
        for key, pb, backends, limit in problems:
            out.problems[key] = pb.hash
            _store_baselines(db, key, pb, out)
            for backend in backends:
                _record_solve(db, key, pb, backend, limit, workers, out)
        out.training_run = _record_training(db, prof1, "gpt-4x8", out)
    return out


def _store_baselines(db: Any, key: str, problem: Problem, out: DemoDatabase) -> None:
    from ..profiles_db import repository as repo
    from ..schedule.baselines import generate_all

    with db.session() as s:
        for name, sched in generate_all(problem).items():
            if isinstance(sched, Schedule):
                out.schedules[(key, name)] = repo.store_schedule(
                    s, sched, problem=problem, source="baseline"
                )


def _record_solve(
    db: Any,
    key: str,
    problem: Problem,
    backend: str,
    time_limit: float,
    workers: int | None,
    out: DemoDatabase,
) -> None:
    """One solve recorded as ``optpipe solve --db`` records it: run, incumbents, schedule."""
    from ..profiles_db import repository as repo
    from ..solver import solve

    with db.session() as s:
        repo.store_problem(s, problem)
        run = repo.start_solver_run(
            s, problem.hash, backend, {"time_limit": time_limit, "seed": 0, "gap": 0.0}
        )
    with repo.SolverEventRecorder(db, run) as recorder:
        result = solve(
            problem, backend=backend, time_limit=time_limit, seed=0, workers=workers,
            on_incumbent=recorder,
        )  # fmt: skip
    with db.session() as s:
        sid = repo.store_schedule(s, result.schedule, problem=problem, source="solver")
        repo.finish_solver_run(
            s,
            run,
            status=result.status,
            makespan=result.makespan,
            lower_bound=result.lower_bound,
            schedule_id=sid,
        )
    out.solver_runs[(key, backend)] = run
    out.schedules[(key, f"optpipe/{backend}")] = sid


def _record_training(db: Any, profile: Profile, key: str, out: DemoDatabase) -> int:
    """A 40-step run as the strategy records it: 4 profiling steps, a baseline, a re-calibration
    (the ops ran 6% slower than profiled), a switch to the fastest schedule (the solver's),
    validation every 10 steps."""
    from ..profiles_db import repository as repo

    with db.session() as s:
        stored = [r for r in repo.list_schedules(s, out.problems[key]) if r.feasible and r.makespan]
        # the run ends on the fastest schedule stored (the solver's, unless a timed solve on a
        # busy machine fell behind a baseline) and starts on the fastest baseline slower than it
        best = min(stored, key=lambda r: (r.makespan or math.inf, r.source != "solver"))
        fastest = best.makespan or 0.0
        slower = [r for r in stored if r.source == "baseline" and (r.makespan or 0) > fastest]
        first = min(slower, key=lambda r: r.makespan or math.inf)
        peaks = {r.id: repo.get_schedule(s, r.id).evaluation for r in (first, best)}
        cfg = {
            "num_stages": profile.model.num_stages,
            "num_microbatches": profile.num_microbatches,
            "schedule": "optimal",
            "online_resolve": True,
            "calibrate": True,
        }
        run = repo.start_training_run(s, hardware=profile.hardware, model=profile.model, config=cfg)
        limit = STATIC_BYTES + TRAINING_LIMIT * ACTIVATION
        repo.record_memory_limit(s, run, [limit] * profile.model.num_stages)
        samples = profile.num_microbatches * profile.model.microbatch_size
        slow = 1.06  # the ops turn out 6% slower than the profile said
        current: int | None = None
        predicted: float | None = None
        for step in range(40):
            if step == 4:
                current, predicted = first.id, first.makespan
                repo.record_switch(
                    s, run, step=step, from_schedule_id=None, to_schedule_id=first.id,
                    reason=f"profiled: best baseline {first.generator}",
                    predicted_before=None, predicted_after=predicted,
                )  # fmt: skip
            elif step == 12 and predicted is not None:
                repo.record_calibration(
                    s, run, step=step, schedule_id=current, predicted_before=predicted,
                    predicted_after=predicted * slow, measured_seconds=predicted * slow * 1.01,
                    reason="calibrated from 8 steps: ops 6% slower than profiled",
                )  # fmt: skip
                predicted *= slow
            elif step == 20 and predicted is not None and best.makespan is not None:
                after = best.makespan * slow
                who = "solver incumbent" if best.source == "solver" else "faster schedule"
                repo.record_switch(
                    s, run, step=step, from_schedule_id=current, to_schedule_id=best.id,
                    reason=f"{who}: predicted {after:.4f} s vs {predicted:.4f} s",
                    predicted_before=predicted, predicted_after=after,
                )  # fmt: skip
                current, predicted = best.id, after
            base = (predicted or first.makespan or 1.0) * (1.0 if step >= 12 else slow)
            measured = base * (1.01 + 0.012 * math.sin(1.7 * step))
            ev = peaks.get(current) if current is not None else peaks[first.id]
            act = ev.peak_memory if ev is not None else [0.0] * profile.model.num_stages
            repo.record_step(
                s,
                run,
                step=step,
                measured_seconds=measured,
                predicted_seconds=predicted,
                schedule_id=current,
                # 2% above the simulator's peak, within the run's limit (what the simulator
                # predicts does not depend on which schedule a timed solve ended on)
                peak_memory=[
                    STATIC_BYTES + min(a * 1.02, TRAINING_LIMIT * ACTIVATION) for a in act
                ],
            )
            loss = 2.1 + 8.0 * math.exp(-step / 9) + 0.04 * math.sin(2.3 * step)
            metrics = {"train_loss": loss, "samples": float(samples)}
            if step % 10 == 9:
                metrics["val_loss"] = loss + 0.08
            repo.record_metrics(s, run, step=step, metrics=metrics)
        repo.finish_training_run(s, run, status="finished")
    return run


def default_demo_path() -> Path:
    """``$XDG_CACHE_HOME/optpipe/demo.db`` (``~/.cache/optpipe/demo.db`` when unset)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "optpipe" / "demo.db"


def _older_schema(path: Path) -> bool:
    from ..profiles_db import DatabaseError, OlderSchemaError, open_database

    try:
        open_database(f"sqlite:///{path}", read_only=True, create=False).close()
    except OlderSchemaError:
        return True
    except DatabaseError:
        return False  # another fault: the inspector names it
    return False


def ensure_demo_database(url: str | None, *, log: Callable[[str], None] = print) -> str:
    """The URL of a demo database: ``url`` filled with the demo, or the cached demo file (built
    the first time, reused after: delete it to rebuild)."""
    if url is not None:
        log(f"building the demo database {url}: baselines and about 15 s of solving...")
        build_demo_database(url, time_limit=3.0)
        return url
    path = default_demo_path()
    if path.exists() and not _older_schema(path):
        log(f"demo database {path} (delete it to build it again)")
        return f"sqlite:///{path}"
    if path.exists():  # made by an older version: the demo is rebuilt, never migrated
        log(f"demo database {path} is of an older schema: building it again")
    path.parent.mkdir(parents=True, exist_ok=True)
    log(f"building the demo database {path}: baselines and about 15 s of solving...")
    part = path.with_name(f".{path.name}.{os.getpid()}")  # an interrupted build leaves no demo
    try:
        build_demo_database(f"sqlite:///{part}", time_limit=3.0)
        os.replace(part, path)
    finally:
        for leftover in part.parent.glob(f"{part.name}*"):
            leftover.unlink(missing_ok=True)
    return f"sqlite:///{path}"
