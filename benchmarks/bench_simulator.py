"""Simulator throughput: ops per second on a 32-stage x 256-microbatch x 2-chunk schedule.

    python benchmarks/bench_simulator.py [--repeat 7]

Times ``simulate()`` end to end (validation, timing, memory curves, metrics) on two orders of the
same problem: a GPipe-like order (all F, then all B, then all W; no offload) and a 1F1B-like
interleaved order with every activation offloaded and reloaded (transfers on shared channels).
Prints the median over repeats.
"""

from __future__ import annotations

import argparse
import statistics
import time

from _shared import fbw_rows

from optpipe_lightning.schedule import Action, Problem, simulate


def offload_everything(p: int, m: int, v: int) -> list[list[Action]]:
    """All F with an offload after each, then per chunk (reversed) reload, B, W."""
    rows = []
    for s in range(p):
        row: list[Action] = []
        for c in range(v):
            for i in range(m):
                row.append(Action("F", i, c))
                last = s == p - 1 and c == v - 1
                if not last:
                    row.append(Action("OFFLOAD", i, c))
        for c in reversed(range(v)):
            for i in range(m):
                if not (s == p - 1 and c == v - 1):
                    row.append(Action("RELOAD", i, c))
                row.append(Action("B", i, c))
                row.append(Action("W", i, c))
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stages", type=int, default=32)
    ap.add_argument("--microbatches", type=int, default=256)
    ap.add_argument("--chunks", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    p, m, v = args.stages, args.microbatches, args.chunks
    base = Problem(
        num_stages=p,
        num_microbatches=m,
        num_chunks=v,
        t_f=1.0,
        t_b=1.0,
        t_w=0.5,
        t_comm=0.01,
        offload={
            "bytes": 1.0,
            "d2h_bandwidth": 2.0,
            "h2d_bandwidth": 2.0,
            "channel_groups": [[2 * k, 2 * k + 1] for k in range(p // 2)],
        },
    )
    print("| order | ops | median seconds | ops/s |\n|---|---|---|---|")
    for name, rows in (
        ("gpipe-like", fbw_rows(p, m, v)),
        ("offload-everything", offload_everything(p, m, v)),
    ):
        n = sum(len(r) for r in rows)
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            res = simulate(base, rows)
            times.append(time.perf_counter() - t0)
            assert res.evaluation.makespan is not None, res.evaluation.violations[:1]
        med = statistics.median(times)
        print(f"| {name} | {n} | {med:.4f} | {n / med:,.0f} |")


if __name__ == "__main__":
    main()
