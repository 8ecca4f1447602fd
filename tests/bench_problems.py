"""The solver benchmark's instances (``benchmarks/bench_solver.py``), for tests."""

from __future__ import annotations

from optpipe_lightning.schedule import Problem


def bench_problem(
    p: int, m: int, v: int = 1, mem: float | None = 0.25, copy: float = 0.5
) -> Problem:
    """F = B = W = 1 per stage (split evenly over ``v`` chunks, V-shape), one activation per
    stage (B frees half, W the rest), a limit of ``mem`` x p activations (None: unlimited) and
    one copy taking ``copy`` times a chunk's F + B + W."""
    limit = None if mem is None else mem * p
    copy_time = copy * 3.0 / v
    return Problem(
        num_stages=p,
        num_microbatches=m,
        num_chunks=v,
        placement="vshape",
        t_f=1.0 / v,
        t_b=1.0 / v,
        t_w=1.0 / v,
        m_f=1.0 / v,
        m_b=-0.5 / v,
        m_w=-0.5 / v,
        memory_limit=limit,
        offload=None
        if limit is None
        else {
            "bytes": 1.0 / v,
            "d2h_bandwidth": 1.0 / v / copy_time,
            "h2d_bandwidth": 1.0 / v / copy_time,
        },
    )
