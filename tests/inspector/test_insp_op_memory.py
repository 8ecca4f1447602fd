"""The profile page's per-op memory: what the profiler measured beside the rule (issue 34)."""

from __future__ import annotations

import math

import pytest

from optpipe_lightning.inspector import frames, profile_charts
from optpipe_lightning.schedule.profile import OpMemory, OpStats, StageProfile


def _stage(stage: int, memory: OpMemory | None) -> StageProfile:
    t = OpStats(mean=1.0)
    return StageProfile(
        stage=stage,
        f=t,
        b=t,
        w=t,
        activation_bytes=100.0,
        weight_grad_bytes=30.0,
        memory=memory,
    )


def test_the_frame_puts_the_measurement_beside_the_rule() -> None:
    measured = OpMemory(f=120.0, b=-50.0, w=-60.0, bw=-110.0, transient=40.0, samples=3)
    df = frames.op_memory_frame([_stage(0, measured), _stage(1, None)])
    row = {(r.stage, r.op): r for r in df.itertuples()}
    # the rule: F leaves the activation, B frees all but the weight-grad part, W the rest
    assert (row[(0, "F")].rule, row[(0, "B")].rule, row[(0, "W")].rule) == (100.0, -70.0, -30.0)
    assert (row[(0, "F")].measured, row[(0, "B")].measured, row[(0, "W")].measured) == (
        120.0,
        -50.0,
        -60.0,
    )
    assert row[(0, "BW")].measured == -110.0 and row[(0, "BW")].rule == -100.0
    # what the problem uses: the measurement, W freeing what F and B left
    assert (row[(0, "F")].used, row[(0, "B")].used, row[(0, "W")].used) == (120.0, -50.0, -70.0)
    assert row[(0, "F")].transient == 40.0
    # a profile without per-op memory (CPU): no measurement, the rule is what is used
    assert math.isnan(row[(1, "F")].measured) and (1, "BW") not in row
    assert row[(1, "B")].used == pytest.approx(-70.0)


def test_the_chart_draws_measured_and_rule_bars() -> None:
    measured = OpMemory(f=120.0, b=-50.0, w=-60.0)
    df = frames.op_memory_frame([_stage(0, measured), _stage(1, None)])
    spec = profile_charts.op_memory_chart(df, unit="B").to_dict()
    values = spec["datasets"][next(iter(spec["datasets"]))]
    sources = {(v["stage"], v["op"], v["source"]) for v in values}
    assert (0, "F", "measured") in sources and (0, "F", "rule") in sources
    assert (1, "F", "rule") in sources and (1, "F", "measured") not in sources  # NaN dropped
