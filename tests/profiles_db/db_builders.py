"""Builders shared by the profiles database tests (a module with a unique name: test files
import from here, never from ``conftest``, which other test folders have too)."""

from __future__ import annotations

from optpipe_lightning.schedule import Action, Problem, Schedule
from optpipe_lightning.schedule.baselines import make_schedule
from optpipe_lightning.schedule.profile import (
    HardwareFingerprint,
    ModelFingerprint,
    OpStats,
    Profile,
    StageProfile,
)

# ---- builders --------------------------------------------------------------------------------


def fbw_rows(p: int, m: int, v: int = 1) -> list[list[Action]]:
    """All F (chunk order), then all B, then all W (reverse chunk order) on every stage."""
    rows = []
    for _ in range(p):
        row = [Action("F", i, c) for c in range(v) for i in range(m)]
        row += [Action("B", i, c) for c in reversed(range(v)) for i in range(m)]
        row += [Action("W", i, c) for c in reversed(range(v)) for i in range(m)]
        rows.append(row)
    return rows


def fused_rows(p: int, m: int) -> list[list[Action]]:
    """GPipe with fused backward (one chunk)."""
    return [[Action("F", i) for i in range(m)] + [Action("BW", i) for i in range(m)]] * p


def make_problem(p: int = 4, m: int = 8, v: int = 1, t_f: float = 1.0, **kw: object) -> Problem:
    return Problem(num_stages=p, num_microbatches=m, num_chunks=v, t_f=t_f, t_b=1.0, t_w=0.5, **kw)  # type: ignore[arg-type]


def make_fbw(problem: Problem, generator: str = "fbw") -> Schedule:
    rows = fbw_rows(problem.num_stages, problem.num_microbatches, problem.num_chunks)
    return make_schedule(problem, generator, rows)


def hardware(**kw: object) -> HardwareFingerprint:
    base: dict[str, object] = {
        "device_kind": "NVIDIA H100 80GB HBM3",
        "device_count": 4,
        "device_memory": 80 * 2**30,
        "interconnect": "nvlink",
        "driver": "550.54",
        "torch_version": "2.13.0",
        "hostname": "node-a",
    }
    base.update(kw)
    return HardwareFingerprint.model_validate(base)


def model_fp(**kw: object) -> ModelFingerprint:
    base: dict[str, object] = {
        "name": "gpt-small",
        "layer_structure": ["Embedding"] + ["Block"] * 8 + ["Head"],
        "parameter_shapes": [[50304, 768], [768, 768]],
        "dtype": "bfloat16",
        "microbatch_size": 2,
        "sequence_length": 1024,
        "num_stages": 4,
        "num_chunks": 1,
        "partition": [3, 2, 2, 3],
    }
    base.update(kw)
    return ModelFingerprint.model_validate(base)


def make_profile(
    hw: HardwareFingerprint | None = None,
    mf: ModelFingerprint | None = None,
    *,
    t_f: float = 0.01,
    measured_at: str | None = None,
) -> Profile:
    hw = hw or hardware()
    mf = mf or model_fp()
    stages = [
        StageProfile(
            stage=s,
            chunk=c,
            f=OpStats(mean=t_f, std=t_f / 20, samples=10),
            b=OpStats(mean=2 * t_f, std=t_f / 10, samples=10),
            w=OpStats(mean=t_f, samples=10),
            activation_bytes=1e9,
            weight_grad_bytes=2e8,
        )
        for s in range(mf.num_stages)
        for c in range(mf.num_chunks)
    ]
    return Profile(
        hardware=hw,
        model=mf,
        num_microbatches=8,
        stages=stages,
        p2p_seconds=1e-4,
        d2h_bandwidth=2e10,
        h2d_bandwidth=2e10,
        measured_at=measured_at,
    )
