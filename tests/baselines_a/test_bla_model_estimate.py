"""Analytic problem estimates: the Zero Bubble Table 1 formulas, FlashAttention and recompute,
units, limits, offload."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from optpipe_lightning.schedule import Problem
from optpipe_lightning.schedule.baselines import generate
from optpipe_lightning.schedule.model_estimate import (
    DEVICES,
    ModelSpec,
    estimate_problem,
    layer_costs,
    layers_per_group,
)

BASE = dict(
    layers=24,
    hidden=2304,
    heads=24,
    seq_len=1024,
    microbatch_size=6,
    device="a100",
    num_stages=8,
    num_microbatches=24,
    attention="eager",  # the ZB paper's Table 1 (its 1.5B measurement stored the scores)
)


def spec(**kw: object) -> ModelSpec:
    return ModelSpec.model_validate({**BASE, **kw})


def test_backward_flops_sum_to_twice_forward_and_memory_sums_to_zero() -> None:
    pb = estimate_problem(spec())
    np.testing.assert_allclose(pb.cost("t_b") + pb.cost("t_w"), 2 * pb.cost("t_f"), rtol=1e-12)
    assert np.all(pb.cost("t_w") < pb.cost("t_f")) and np.all(pb.cost("t_f") < pb.cost("t_b"))
    total = pb.cost("m_f") + pb.cost("m_b") + pb.cost("m_w")
    np.testing.assert_allclose(total, 0.0, atol=1e-3)


def test_bytes_are_34h_plus_5as_per_layer_and_32h_for_w() -> None:
    h, a, s, b = 2304, 24, 1024, 6
    pb = estimate_problem(spec())
    np.testing.assert_allclose(pb.cost("m_f"), 3 * s * b * (34 * h + 5 * a * s))  # 3 layers/stage
    np.testing.assert_allclose(pb.cost("m_w"), -3 * 32 * s * b * h)
    assert pb.cost("m_f")[0, 0] == pytest.approx(3_708_813_312)  # the 1.5B example's m_f
    fp32 = estimate_problem(spec(dtype="fp32"))
    np.testing.assert_allclose(fp32.cost("m_f"), 2 * pb.cost("m_f"))


def test_times_are_flops_over_effective_peak() -> None:
    h, s, b = 2304, 1024, 6
    lc = layer_costs(spec())
    assert lc.flops_f == pytest.approx(s * b * h * (24 * h + 4 * s))
    assert lc.flops_b == pytest.approx(s * b * h * (24 * h + 8 * s))
    assert lc.flops_w == pytest.approx(24 * s * b * h * h)
    pb = estimate_problem(spec(efficiency=0.5))
    assert pb.cost("t_f")[0, 0] == pytest.approx(3 * lc.flops_f / (312e12 * 0.5))
    # the ZB paper measured F = 18.522 ms for this 1.5B stage on A100; the default
    # efficiency (0.45) lands within 5 %
    assert estimate_problem(spec()).cost("t_f")[0, 0] == pytest.approx(18.522e-3, rel=0.05)
    bf = estimate_problem(spec(device="h100", dtype="bf16"))
    f32 = estimate_problem(spec(device="h100", dtype="fp32"))
    assert f32.cost("t_f")[0, 0] / bf.cost("t_f")[0, 0] == pytest.approx(989 / 67)


def test_p2p_time_is_hidden_state_over_link() -> None:
    pb = estimate_problem(spec(device="h100"))
    assert pb.cost("t_comm")[0, 0] == pytest.approx(
        1024 * 6 * 2304 * 2 / DEVICES["h100"].link_bandwidth
    )
    slow = estimate_problem(spec(link_bandwidth=1e9))
    assert slow.cost("t_comm")[0, 0] == pytest.approx(1024 * 6 * 2304 * 2 / 1e9)


def test_uneven_layers_and_vocab_head_on_the_last_group() -> None:
    assert layers_per_group(10, 4) == [3, 3, 2, 2]
    pb = estimate_problem(spec(layers=10, num_stages=4, vocab=50000))
    mf = pb.cost("m_f")[:, 0]
    per_layer = 1024 * 6 * (34 * 2304 + 5 * 24 * 1024)
    assert mf[0] == pytest.approx(3 * per_layer) and mf[2] == pytest.approx(2 * per_layer)
    head = 1024 * 6 * 2304 * 2 + 4 * 1024 * 6 * 50000
    assert mf[3] == pytest.approx(2 * per_layer + head)
    np.testing.assert_allclose(pb.cost("t_b") + pb.cost("t_w"), 2 * pb.cost("t_f"), rtol=1e-12)
    assert pb.cost("t_f")[3, 0] > pb.cost("t_f")[2, 0]


def test_chunks_follow_the_placement() -> None:
    pb = estimate_problem(
        spec(layers=12, num_stages=3, num_chunks=2, placement="vshape", vocab=1000)
    )
    t = pb.cost("t_f")
    # vshape: the LM head (last group 5) is chunk 1 of stage 0
    assert t[0, 1] > t[1, 1] and t[0, 1] > t[0, 0]
    inter = estimate_problem(spec(layers=12, num_stages=3, num_chunks=2, vocab=1000))
    assert inter.cost("t_f")[2, 1] > inter.cost("t_f")[0, 1]


def test_memory_limit_units_and_offload() -> None:
    pb = estimate_problem(
        spec(memory_limit_microbatches=16, offload=True, stages_per_copy_channel=2)
    )
    assert pb.memory_limits()[0] == pytest.approx(16 * pb.activation_unit())
    assert pb.offload is not None
    assert pb.offload.channel_groups == [[0, 1], [2, 3], [4, 5], [6, 7]]
    np.testing.assert_allclose(pb.cost("offload_bytes"), pb.cost("m_f"))
    assert pb.offload.d2h_bandwidth == DEVICES["a100"].copy_bandwidth
    assert estimate_problem(spec(memory_limit=1e10)).memory_limits() == [1e10] * 8
    assert estimate_problem(spec()).offload is None
    ev = generate("zb-auto", pb).evaluation
    assert ev is not None and ev.feasible


@pytest.mark.parametrize(
    "bad,match",
    [
        (dict(layers=4), "fewer than num_stages"),
        (dict(memory_limit=1.0, memory_limit_microbatches=2), "not both"),
        (dict(dtype="int8"), "dtype"),
        (dict(device="tpu"), "device"),
        (dict(hiden=1), "hiden"),
        (dict(heads=0), "heads"),
    ],
)
def test_bad_specs_name_the_field(bad: dict[str, object], match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        spec(**bad)


# ---- FlashAttention and recompute ----------------------------------------------------------------

H, A, S, B = 2304, 24, 1024, 6
SBH = S * B * H


def per_layer(pb_name: str, **kw: object) -> float:
    """One layer's value of a cost (3 layers per stage in BASE)."""
    return float(estimate_problem(spec(**kw)).cost(pb_name)[0, 0]) / 3


def test_flash_keeps_no_attention_scores_and_recomputes_them_in_b() -> None:
    eager = layer_costs(spec())
    flash = layer_costs(spec(attention="flash"))
    assert eager.bytes_b - flash.bytes_b == pytest.approx(5 * A * S * S * B)  # 5as^2 b
    assert flash.bytes_b == pytest.approx(34 * SBH) and flash.bytes_w == eager.bytes_w
    assert flash.flops_b - eager.flops_b == pytest.approx(2 * SBH * S)  # QK^T again
    assert (flash.flops_f, flash.flops_w) == (eager.flops_f, eager.flops_w)
    assert ModelSpec.model_validate({**BASE, "attention": "flash"}) == spec(attention="flash")
    default = {k: v for k, v in BASE.items() if k != "attention"}
    assert ModelSpec.model_validate(default).attention == "flash"  # today's training


def test_selective_recompute_drops_the_attention_core_and_reruns_it() -> None:
    eager = layer_costs(spec())
    sel = layer_costs(spec(recompute="selective"))
    assert sel.bytes_b == pytest.approx(34 * SBH)  # Korthikanti et al.: 5as/h term gone
    assert sel.flops_b - eager.flops_b == pytest.approx(4 * SBH * S)  # QK^T and scores x V
    # with flash there is nothing left to drop: selective changes nothing
    assert layer_costs(spec(attention="flash", recompute="selective")) == layer_costs(
        spec(attention="flash")
    )


@pytest.mark.parametrize("attention", ["eager", "flash"])
def test_full_recompute_keeps_the_layer_input_and_reruns_the_forward(attention: str) -> None:
    plain = layer_costs(spec(attention=attention))
    full = layer_costs(spec(attention=attention, recompute="full"))
    assert full.bytes_b == pytest.approx(2 * SBH)  # bf16 layer input
    assert full.flops_b == pytest.approx(plain.flops_b + plain.flops_f)
    pb = estimate_problem(spec(attention=attention, recompute="full", offload=True))
    # m_b > 0: W's inputs are held from B to W; the three still sum to zero
    np.testing.assert_allclose(pb.cost("m_f"), 3 * 2 * SBH)
    np.testing.assert_allclose(pb.cost("m_b"), 3 * (32 - 2) * SBH)
    np.testing.assert_allclose(pb.cost("m_w"), -3 * 32 * SBH)
    np.testing.assert_allclose(pb.cost("offload_bytes"), pb.cost("m_f"))
    ev = generate("1f1b", pb).evaluation
    assert ev is not None and ev.feasible


def test_copy_bandwidth_pairs_and_layers_per_stage() -> None:
    pb = estimate_problem(
        spec(offload=True, copy_bandwidth=25e9, stages_per_copy_channel=2, layers=32)
    )
    assert pb.offload is not None and pb.offload.d2h_bandwidth == 25e9
    assert pb.offload.h2d_bandwidth == 25e9
    assert pb.offload.channel_groups == [[0, 1], [2, 3], [4, 5], [6, 7]]
    from optpipe_lightning.schedule.model_estimate import even_layers_per_stage

    assert even_layers_per_stage(spec(layers=32)) == 4
    assert even_layers_per_stage(spec(layers=32, num_chunks=2)) == 4
    assert even_layers_per_stage(spec(layers=36, num_chunks=4)) is None  # 36 / 32 groups
    assert even_layers_per_stage(spec(layers=10)) == [2, 2, 1, 1, 1, 1, 1, 1]
    assert even_layers_per_stage(spec(layers=32, vocab=1000)) is None
    if "layers_per_stage" in type(pb).model_fields:  # once the format has it
        assert getattr(pb, "layers_per_stage") == 4  # noqa: B009


def test_problem_command_takes_attention_recompute_and_copy_bandwidth(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from optpipe_lightning.cli import app

    runner = CliRunner()
    args = ["problem", "--layers", "16", "--hidden", "1024", "--heads", "8", "--seq-len", "4096"]
    out = tmp_path / "p.json"
    res = runner.invoke(
        app,
        [
            *args,
            "--recompute",
            "full",
            "--offload",
            "--copy-bandwidth",
            "25GB",
            "--stages-per-copy-channel",
            "2",
            "--out",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    pb = Problem.model_validate_json(out.read_text())
    assert pb.offload is not None and pb.offload.d2h_bandwidth == 25e9
    assert float(pb.cost("m_f")[0, 0]) == pytest.approx(2 * 2 * 4096 * 1024)  # 2 layers' inputs
    assert "full recompute" in (pb.name or "")
    for bad, needle in (
        (["--recompute", "some"], "recompute"),
        (["--attention", "sparse"], "attention"),
        (["--copy-bandwidth", "fast"], "--copy-bandwidth"),
    ):
        res = runner.invoke(app, [*args, *bad])
        assert res.exit_code == 2 and needle in res.stderr
        assert len(res.stderr.strip().splitlines()) == 1
