"""Profiling: the cursor's measurements of a few steps, gathered over the pipeline, as a Profile.

During profiling steps the engine runs ``planner.profiling_schedule`` with ``measure=True``: the
cursor times every F, B (input gradient) and W (weight gradient) per chunk (CUDA events on GPU,
``perf_counter`` on CPU) and counts the bytes autograd saves in each forward (saved-tensor hooks,
parameters excluded, storages counted once). Afterwards ``measure_p2p`` times a ping-pong of one
stage output between neighbouring ranks and ``measure_copy_bandwidth`` the host copies. The
first profiling step is a warm-up: the strategy drops its op times (``RankCursor.drop_times``)
and keeps only its byte counts. Each op's cost is the interquartile mean of its samples
(``calibration.robust_mean``): a sample inflated by a preempted process or a page fault does not
move it.

Memory: on GPU the cursor also watches the CUDA allocator around every action of the timed
profiling steps (``op_memory``): each (stage, chunk)'s ``StageProfile.memory`` holds the median
bytes its F, B, W and BW left allocated and the largest transient of its ops, and the problem's
``m_f``, ``m_b``, ``m_w`` follow it. On CPU there is no allocator counter: the profile keeps the
rule that torch's split backward implies (F allocates the saved bytes, B frees nothing, W frees
them all).
"""

from __future__ import annotations

import socket
import statistics
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.distributed as dist
from torch import nn

from ...schedule.profile import (
    HardwareFingerprint,
    ModelFingerprint,
    OpStats,
    Profile,
    StageProfile,
)
from ..runtime.op_memory import summarize
from ..runtime.process_groups import PipelineComm, gather
from ..runtime.stage import RankCursor
from .calibration import fit_overhead, robust_mean

if TYPE_CHECKING:
    from ..runtime.engine import PipelineEngine

_MIN_SECONDS = 1e-7


def _stats(xs: Sequence[float]) -> OpStats:
    """``mean`` is the interquartile mean (robust to spikes); std, min, max over all samples."""
    xs = [max(float(x), _MIN_SECONDS) for x in xs] or [_MIN_SECONDS]
    return OpStats(
        mean=max(robust_mean(xs), _MIN_SECONDS),
        std=statistics.pstdev(xs) if len(xs) > 1 else 0.0,
        min=min(xs),
        max=max(xs),
        samples=len(xs),
    )


def local_measurements(
    cursor: RankCursor, pp_rank: int, num_chunks: int, skip: int = 0
) -> list[dict[str, Any]]:
    """This rank's per-chunk samples (dropping the first ``skip`` samples of each list)."""
    out = []
    for c in range(num_chunks):
        out.append(
            {
                "stage": pp_rank,
                "chunk": c,
                "f": cursor.times.get(("F", c), [])[skip:],
                "b": cursor.times.get(("B", c), [])[skip:],
                "w": cursor.times.get(("W", c), [])[skip:],
                "bw": cursor.times.get(("BW", c), [])[skip:],
                # bytes are counted in the warm-up step only (the hooks would slow the timed ones)
                "bytes": cursor.saved_bytes.get(c, []),
                # GPU: (left allocated, transient) per action of the timed steps, by op kind
                "memory": cursor.memory.chunk_samples(c) if cursor.memory is not None else {},
            }
        )
    return out


def runtime_overhead(
    profile: Profile, schedule_actions: Any, step_seconds: Sequence[float]
) -> float:
    """Seconds of runtime overhead per compute action, from the timed profiling steps.

    The op times measure the compute inside each action; the step also pays for posting p2p
    ops, waiting on them beyond ``t_comm``, loss bookkeeping and Python between actions. The
    overhead is the seconds which, added to every compute action, make the simulator's makespan
    of the profiling schedule on the measured costs equal the median timed profiling step
    (``calibration.fit_overhead``; 0 when the compute alone takes that long).
    """
    if not step_seconds:
        return 0.0
    problem = profile.to_problem().with_changes(offload=None)
    return fit_overhead(problem, schedule_actions, statistics.median(step_seconds))


def with_overhead(profile: Profile, seconds: float) -> Profile:
    """The profile with ``seconds`` added to every F, B, W and BW mean (and min/max), and to
    its ``runtime_overhead`` (what a run started from the stored profile takes out again)."""
    if seconds <= 0:
        return profile

    def bump(s: OpStats) -> OpStats:
        return s.model_copy(
            update={
                "mean": s.mean + seconds,
                "min": None if s.min is None else s.min + seconds,
                "max": None if s.max is None else s.max + seconds,
            }
        )

    stages = [
        sp.model_copy(
            update={
                "f": bump(sp.f),
                "b": bump(sp.b),
                "w": bump(sp.w),
                "bw": None if sp.bw is None else bump(sp.bw),
            }
        )
        for sp in profile.stages
    ]
    total = profile.runtime_overhead + seconds
    return profile.model_copy(update={"stages": stages, "runtime_overhead": total})


def measure_p2p(
    nbytes: int, pp_rank: int, num_stages: int, group: Any, device: torch.device, rounds: int = 5
) -> float:
    """Seconds one stage output takes between neighbours (half a ping-pong, best of rounds)."""
    if num_stages < 2 or not dist.is_initialized():
        return 0.0
    n = max(1, nbytes // 4)
    buf = torch.zeros(n, dtype=torch.float32, device=device)
    best = float("inf")
    for s in range(num_stages - 1):
        if pp_rank not in (s, s + 1):
            continue
        peer = s + 1 if pp_rank == s else s
        for _ in range(rounds):
            t0 = time.perf_counter()
            if pp_rank == s:
                dist.send(buf, group=group, group_dst=peer)
                dist.recv(buf, group=group, group_src=peer)
            else:
                dist.recv(buf, group=group, group_src=peer)
                dist.send(buf, group=group, group_dst=peer)
            if device.type == "cuda":  # pragma: no cover - GPU only
                torch.cuda.synchronize(device)
            best = min(best, (time.perf_counter() - t0) / 2)
    vals = gather(best if best < float("inf") else 0.0, group)
    return float(max(vals))


def measure_copy_bandwidth(device: torch.device, nbytes: int = 16 << 20) -> tuple[float, float]:
    """(device-to-host, host-to-device) bytes/s of the copies an offload makes."""
    n = max(1, nbytes // 4)
    src = torch.randn(n, device=device)
    if device.type == "cuda":  # pragma: no cover - GPU only
        host = torch.empty(n, pin_memory=True)
        torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        host.copy_(src, non_blocking=True)
        torch.cuda.synchronize(device)
        d2h = nbytes / max(time.perf_counter() - t0, 1e-9)
        t0 = time.perf_counter()
        src.copy_(host, non_blocking=True)
        torch.cuda.synchronize(device)
        h2d = nbytes / max(time.perf_counter() - t0, 1e-9)
        return d2h, h2d
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        src.clone()
        best = min(best, time.perf_counter() - t0)
    bw = nbytes / max(best, 1e-9)
    return bw, bw


def hardware_fingerprint(
    device: torch.device, world_size: int, backend: str
) -> HardwareFingerprint:
    if device.type == "cuda":  # pragma: no cover - GPU only
        props = torch.cuda.get_device_properties(device)
        kind, mem = props.name, int(props.total_memory)
        driver = str(torch.version.cuda or "")
    else:
        kind, mem, driver = "cpu", 0, ""
    return HardwareFingerprint(
        device_kind=kind,
        device_count=world_size,
        device_memory=mem,
        interconnect=f"{backend}",
        driver=driver,
        torch_version=torch.__version__.split("+")[0],
        hostname=socket.gethostname(),
    )


def model_fingerprint(
    name: str,
    layers: Sequence[nn.Module],
    microbatch_size: int,
    num_stages: int,
    num_chunks: int,
    partition: Sequence[int],
    sequence_length: int | None = None,
    placement: Literal["interleaved", "vshape"] | None = None,
) -> ModelFingerprint:
    params = [p for layer in layers for p in layer.parameters()]
    dtype = str(params[0].dtype).replace("torch.", "") if params else "float32"
    return ModelFingerprint(
        name=name,
        layer_structure=[type(x).__name__ for x in layers],
        parameter_shapes=[list(p.shape) for p in params],
        dtype=dtype,
        microbatch_size=max(1, microbatch_size),
        sequence_length=sequence_length,
        num_stages=num_stages,
        num_chunks=num_chunks,
        partition=list(partition),
        placement=placement,
    )


def build_profile(
    gathered: Sequence[Sequence[dict[str, Any]]],
    hardware: HardwareFingerprint,
    model: ModelFingerprint,
    num_microbatches: int,
    placement: str,
    p2p_seconds: float,
    d2h: float | None,
    h2d: float | None,
) -> Profile:
    stages = []
    for rank_rows in gathered:
        for r in rank_rows:
            act = float(statistics.fmean(r["bytes"])) if r["bytes"] else 0.0
            stages.append(
                StageProfile(
                    stage=r["stage"],
                    chunk=r["chunk"],
                    f=_stats(r["f"]),
                    b=_stats(r["b"]),
                    w=_stats(r["w"]),
                    bw=_stats(r["bw"]) if r.get("bw") else None,
                    activation_bytes=act,
                    # the rule (CPU): torch's input-gradient pass keeps the graph (retain_graph)
                    # until W: W frees all; on GPU ``memory`` (measured) replaces it
                    weight_grad_bytes=act,
                    offloadable_bytes=act,
                    memory=summarize(r.get("memory") or {}),
                )
            )
    return Profile(
        hardware=hardware,
        model=model,
        num_microbatches=num_microbatches,
        placement=placement,
        stages=stages,
        p2p_seconds=max(0.0, p2p_seconds),
        d2h_bandwidth=d2h,
        h2d_bandwidth=h2d,
        measured_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )


def profile_pipeline(
    engine: PipelineEngine,
    comm: PipelineComm,
    hardware: HardwareFingerprint,
    model: ModelFingerprint,
    step_seconds: Sequence[float],
) -> tuple[Profile, float]:
    """The profile of the profiling steps that just ran (a collective over the pipeline).

    Every stage's op samples and saved bytes, a p2p ping-pong between neighbours and the host
    copy bandwidths are gathered; global rank 0 fits the per-action runtime overhead to the
    timed steps' wall times ``step_seconds`` (the first is the warm-up, left out) and adds it to
    every op, so the simulator predicts wall time. Returns (the profile, the overhead) on every
    rank (the overhead is rank 0's; 0 elsewhere).
    """
    problem, cursor, device = engine.problem, engine.cursor, engine.device
    rows = local_measurements(cursor, comm.pp_rank, problem.num_chunks)
    gathered = comm.gather(rows)
    out_bytes = max(comm.gather(max(cursor.out_bytes or [4])))
    p2p = measure_p2p(int(out_bytes), comm.pp_rank, comm.num_stages, comm.pp_group, device)
    bws = comm.gather(measure_copy_bandwidth(device))
    profile = build_profile(
        gathered,
        hardware,
        model,
        problem.num_microbatches,
        problem.placement,
        p2p,
        min(b[0] for b in bws),
        min(b[1] for b in bws),
    )
    overhead = 0.0
    if comm.is_global_zero:
        # the runtime's per-action overhead (p2p posting, waits, Python), so the simulator
        # predicts wall time, not compute time; the warm-up step is left out
        overhead = runtime_overhead(profile, engine.schedule.actions, step_seconds[1:])
        profile = with_overhead(profile, overhead)
    profile = Profile.model_validate_json(comm.broadcast(profile.model_dump_json()))
    return profile, overhead
