"""Shared test instances: the solver benchmark's (``benchmarks/bench_solver.py``) and the small
ones exhaustive search settles (``tests/solver/test_solver_bruteforce.py``)."""

from __future__ import annotations

from bench_solver import make_problem

from optpipe_lightning.schedule import Problem


def bench_problem(
    p: int, m: int, v: int = 1, mem: float | None = 0.25, copy: float = 0.5
) -> Problem:
    """The solver benchmark's instance: F = B = W = 1 per stage (split evenly over ``v`` chunks,
    V-shape), one activation per stage (B frees half, W the rest), a limit of ``mem`` x p
    activations (None: unlimited) and one copy taking ``copy`` times a chunk's F + B + W."""
    return make_problem(p, m, v, mem, copy)


def one_lane(problem: Problem) -> Problem:
    """``problem`` with its copies on one lane for both directions (``offload.duplex: false``),
    for the tests whose numbers were worked out for it."""
    assert problem.offload is not None
    return problem.with_changes(offload={**problem.offload.model_dump(), "duplex": False})


def brute_problem(
    p: int,
    m: int,
    *,
    t_w: float = 1.0,
    limit: float | None = None,
    offload: bool = False,
    bandwidth: float = 4.0,
    t_bw: float | None = None,
    duplex: bool = True,
    shared: bool = False,
) -> Problem:
    """F = 1, B = 2, W = ``t_w``, p2p 0.5; activation 2 (B frees half, W the rest); copies of the
    whole activation at ``bandwidth`` (4: half an F) when ``offload``, on duplex lanes or one lane
    for both directions, every stage on one channel when ``shared``; a fused backward of
    ``t_bw`` (None: B + W)."""
    return Problem(
        num_stages=p,
        num_microbatches=m,
        t_f=1.0,
        t_b=2.0,
        t_w=t_w,
        t_bw=t_bw,
        t_comm=0.5,
        m_f=2.0,
        m_b=-1.0,
        m_w=-1.0,
        memory_limit=limit,
        offload={
            "bytes": 2.0,
            "d2h_bandwidth": bandwidth,
            "h2d_bandwidth": bandwidth,
            "duplex": duplex,
            "channel_groups": [list(range(p))] if shared else [],
        }
        if offload
        else None,
    )


def fused_problem(t_bw: float, limit: float | None = None) -> Problem:
    """4 stages x 8 microbatches, F = B = W = 1, a fused backward of ``t_bw`` (cheaper than
    B + W = 2 below 2), activation 1 (B frees half, W the rest), no offload."""
    return Problem(
        name="fused cheaper",
        num_stages=4,
        num_microbatches=8,
        t_f=1.0,
        t_b=1.0,
        t_w=1.0,
        t_bw=t_bw,
        m_f=1.0,
        m_b=-0.5,
        m_w=-0.5,
        memory_limit=limit,
    )
