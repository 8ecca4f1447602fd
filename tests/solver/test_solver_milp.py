"""The MILP backends: Gurobi for real under the pip licence's size limit, HiGHS cross-check."""

from __future__ import annotations

import importlib.util

import pytest
from bench_problems import brute_problem

from optpipe_lightning.schedule import Problem, simulate
from optpipe_lightning.solver import gurobi_license_status, solve


def _pb(p: int, m: int, limit: float | None, offload: bool) -> Problem:
    return brute_problem(p, m, limit=limit, offload=offload)


SMALL = [
    pytest.param(2, 2, 2.0, True, id="2x2-offload"),
    pytest.param(2, 3, 3.0, True, id="2x3-offload"),
    pytest.param(3, 3, None, False, id="3x3-unlimited"),
    pytest.param(3, 3, 2.0, False, id="3x3-mem1"),
]


def test_licence_probe_says_one_of_four_things() -> None:
    status = gurobi_license_status()
    assert status in ("missing", "restricted", "full") or status.startswith("unusable(")
    assert gurobi_license_status() is status  # cached per process


@pytest.mark.parametrize("p,m,limit,offload", SMALL)
def test_gurobi_agrees_with_cpsat_on_the_optimum(
    p: int, m: int, limit: float | None, offload: bool
) -> None:
    if gurobi_license_status() not in ("restricted", "full"):
        pytest.skip(f"no usable Gurobi licence ({gurobi_license_status()})")
    pb = _pb(p, m, limit, offload)
    cp = solve(pb, backend="cpsat", time_limit=30, workers=1, use_baselines=False)
    gu = solve(pb, backend="gurobi", time_limit=30, workers=1, use_baselines=False)
    assert gu.backend == "gurobi", gu.message
    assert gu.message is None
    assert cp.status == gu.status == "optimal"
    assert gu.makespan == pytest.approx(cp.makespan)
    ev = simulate(pb, gu.schedule).evaluation
    assert ev.feasible and ev.makespan == pytest.approx(gu.makespan)


def test_gurobi_over_the_pip_size_limit_says_why_cpsat_ran() -> None:
    if gurobi_license_status() != "restricted":
        pytest.skip(f"needs the size-limited pip licence, have {gurobi_license_status()}")
    pb = _pb(4, 8, 2.0, True)
    res = solve(pb, backend="gurobi", time_limit=2, workers=1, use_baselines=False)
    assert res.backend == "cpsat"
    assert res.message is not None
    assert "size-limited pip licence" in res.message
    assert "2000 variables and 2000 constraints" in res.message
    assert "CP-SAT ran instead" in res.message
    assert res.schedule.evaluation is not None and res.schedule.evaluation.feasible


def test_highs_cross_checks_the_formulation() -> None:
    if importlib.util.find_spec("highspy") is None:
        pytest.skip("highspy is not installed")
    pb = _pb(2, 2, 2.0, True)
    hi = solve(pb, backend="highs", time_limit=60, workers=1, use_baselines=False)
    assert hi.backend == "highs"
    assert hi.status == "optimal"
    cp = solve(pb, backend="cpsat", time_limit=30, workers=1, use_baselines=False)
    assert cp.status == "optimal"
    assert hi.makespan == pytest.approx(cp.makespan)


def test_gurobi_on_a_large_model_is_refused_without_building_it() -> None:
    if gurobi_license_status() != "restricted":
        pytest.skip(f"needs the size-limited pip licence, have {gurobi_license_status()}")
    pb = _pb(8, 32, 2.0, True)
    res = solve(pb, backend="gurobi", time_limit=1, workers=1, use_baselines=False)
    assert res.backend == "cpsat"
    assert res.message is not None and "needs at least 1536 variables" in res.message


def test_the_highs_child_caps_its_memory() -> None:
    """An allocation past ``HIGHS_MEMORY_BYTES`` fails in the child (issue 32: 9.75 GB seen)."""
    import subprocess
    import sys

    code = (
        "from optpipe_lightning.solver.highs_worker import cap_memory\n"
        "from optpipe_lightning.solver.milp_solvers import HIGHS_MEMORY_BYTES as cap\n"
        "if not cap_memory(cap): raise SystemExit(3)\n"
        "try:\n"
        "    bytearray(cap + 2**30)\n"
        "except MemoryError:\n"
        "    raise SystemExit(0)\n"
        "raise SystemExit(1)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], check=False, timeout=120)
    if done.returncode == 3:
        pytest.skip("no address-space limit on this platform")
    assert done.returncode == 0
