"""The shipped example problems are valid and say what they are."""

from __future__ import annotations

from pathlib import Path

import pytest

from optpipe_lightning.schedule import Problem
from optpipe_lightning.schedule.baselines import generate

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "problems"


@pytest.mark.parametrize(
    "fname,p,m,h,a,b,times",
    [
        ("zb-1.5b-p8-m24.json", 8, 24, 2304, 24, 6, (18.522, 18.086, 9.337, 0.601)),
        ("zb-14.6b-p16-m48.json", 16, 48, 5120, 40, 1, (11.347, 11.248, 8.132, 0.377)),
    ],
)
def test_zb_settings(
    fname: str, p: int, m: int, h: int, a: int, b: int, times: tuple[float, ...]
) -> None:
    pb = Problem.model_validate_json((EXAMPLES / fname).read_text())
    assert (pb.num_stages, pb.num_microbatches, pb.num_chunks) == (p, m, 1)
    got = [float(pb.cost(k)[0, 0]) * 1e3 for k in ("t_f", "t_b", "t_w", "t_comm")]
    assert got == pytest.approx(list(times))
    s, layers = 1024, 3
    assert pb.cost("m_f")[0, 0] == pytest.approx(layers * s * b * (34 * h + 5 * a * s))
    assert pb.cost("m_w")[0, 0] == pytest.approx(-layers * 32 * s * b * h)
    assert pb.memory_limits()[0] == pytest.approx(2 * p * pb.activation_unit())
    assert pb.offload is not None and pb.name and "b=" in pb.name


def test_tiny() -> None:
    pb = Problem.model_validate_json((EXAMPLES / "tiny-4x8.json").read_text())
    assert (pb.num_stages, pb.num_microbatches) == (4, 8)
    assert pb.memory_limits() == [2.0] * 4 and pb.offload is not None
    ev = generate("zb-auto", pb).evaluation
    assert ev is not None and ev.feasible and max(ev.peak_memory) <= 2.0
    one = generate("1f1b", pb).evaluation
    assert one is not None and not one.feasible  # 1F1B needs p = 4 microbatches on stage 0
