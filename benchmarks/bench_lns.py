"""The large-neighbourhood search and the chunk search against the best baseline (issue 22).

For each problem: every baseline on every chunking its layers allow (the best row, as
``optpipe compare`` prints it), then the solver side by side at the same time limit, in one run,
given those baseline schedules as candidates (as ``compare`` does): without LNS
(``solve(lns=False)``), with it, and (``--own-chunking``, for problems with ``layers_per_stage``)
with LNS on the problem's own chunk count only. Problems: the solver benchmark's (``bench_solver.make_problem``: F = B = W,
copies 0.5x-2x a chunk's compute, limits a quarter or half of 1F1B's memory) and GPT layers with
FlashAttention (per layer F = sbh(24h+4s), B = sbh(24h+8s), W = 24sbh^2 FLOPs at 400 TFLOP/s;
activation 34sbh bytes, W-part 32sbh; PCIe 25 GB/s per direction, pairs of GPUs sharing a
channel; 4 layers per stage, so chunk counts 1, 2 and 4), limits a quarter and half of 1F1B's.

    python benchmarks/bench_lns.py --time-limit 20 --out lns.md
    python benchmarks/bench_lns.py --quick --time-limit 10

Writes a Markdown table to stdout (and --out FILE).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_solver import make_problem

from optpipe_lightning.schedule import Problem, Schedule
from optpipe_lightning.schedule.baselines import (
    BASELINE_NAMES,
    NotApplicable,
    generate_chunked,
)
from optpipe_lightning.schedule.chunking import own_chunking
from optpipe_lightning.solver import solve

FLOPS = 400e12
PCIE = 25e9


def gpt_problem(p: int, m: int, h: int, s: int, mem_frac: float, layers: int = 4) -> Problem:
    """GPT layers with FlashAttention, ``layers`` per stage, one chunk (module doc)."""
    f = s * h * (24 * h + 4 * s) / FLOPS
    b = s * h * (24 * h + 8 * s) / FLOPS
    w = 24 * s * h * h / FLOPS
    act, act_w = 34.0 * s * h, 32.0 * s * h
    return Problem(
        name=f"gpt h={h} s={s} {p}x{m} mem={mem_frac}",
        num_stages=p,
        num_microbatches=m,
        t_f=layers * f,
        t_b=layers * b,
        t_w=layers * w,
        t_comm=2 * s * h / 100e9,
        m_f=layers * act,
        m_b=-layers * (act - act_w),
        m_w=-layers * act_w,
        memory_limit=mem_frac * p * layers * act,
        offload={
            "bytes": layers * act,
            "d2h_bandwidth": PCIE,
            "h2d_bandwidth": PCIE,
            "channel_groups": [[i, i + 1] for i in range(0, p - 1, 2)],
        },
        layers_per_stage=layers,
    )


def problems(quick: bool) -> list[Problem]:
    out = [
        make_problem(8, 32, 2, 0.25, 2.0),
        make_problem(8, 32, 1, 0.5, 0.5),
        make_problem(16, 64, 1, 0.25, 0.5),
        make_problem(16, 64, 2, 0.5, 1.0),
        gpt_problem(8, 16, 4096, 8192, 0.5),
        gpt_problem(8, 16, 4096, 8192, 0.25),
    ]
    if not quick:
        out += [
            make_problem(32, 256, 1, 0.25, 0.5),
            gpt_problem(16, 32, 8192, 4096, 0.5),
            gpt_problem(16, 32, 4096, 16384, 0.25),
        ]
    return out


def baselines(pb: Problem) -> tuple[list[Schedule], tuple[str, float | None, str]]:
    """Every baseline schedule on every chunking, and (name, makespan, chunking) of the fastest
    that fits."""
    best: tuple[str, float | None, str] = ("-", None, "-")
    every: list[Schedule] = []
    for name in BASELINE_NAMES:
        try:
            made = generate_chunked(name, pb)
        except NotApplicable:
            continue
        every += made
        for sched in made:
            ev = sched.evaluation
            assert ev is not None
            if not ev.feasible or ev.makespan is None:
                continue
            if best[1] is None or ev.makespan < best[1]:
                v = sched.num_chunks or 1
                label = f"v={v}" + (f" {sched.placement}" if v > 1 else "")
                best = (name, ev.makespan, label)
    return every, best


def _solved(
    pb: Problem, time_limit: float, lns: bool, own: bool, candidates: list[Schedule]
) -> tuple[float, str, int]:
    res = solve(
        pb,
        time_limit=time_limit,
        workers=2,
        seed=0,
        lns=lns,
        chunkings=[own_chunking(pb)] if own else None,
        candidates=[c for c in candidates if not own or c.problem_hash == pb.hash],
        use_baselines=False,
    )
    v = res.schedule.num_chunks or 1
    label = f"v={v}" + (f" {res.schedule.placement}" if v > 1 else "")
    n_lns = sum(1 for i in res.incumbents if i.source.startswith("lns:"))
    return res.makespan, label, n_lns


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--time-limit", type=float, default=20.0)
    ap.add_argument("--quick", action="store_true", help="the first six problems only")
    ap.add_argument("--own-chunking", action="store_true", help="also solve on one chunking")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    head = (
        "| problem | best baseline (chunking) | solver, no LNS | solver + LNS | LNS steps kept"
        " | LNS vs no LNS | LNS vs best baseline |"
        + (" own chunking + LNS |" if args.own_chunking else "")
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    print(head, flush=True)
    for pb in problems(args.quick):
        every, (name, base, chunk) = baselines(pb)
        plain, plain_ch, _ = _solved(pb, args.time_limit, False, False, every)
        with_lns, lns_ch, n_lns = _solved(pb, args.time_limit, True, False, every)
        cells = [
            pb.name or pb.hash,
            f"{name} {base:.4g} ({chunk})" if base is not None else "none fits",
            f"{plain:.4g} ({plain_ch})",
            f"{with_lns:.4g} ({lns_ch})",
            str(n_lns),
            f"{with_lns / plain - 1:+.2%}",
            f"{with_lns / base - 1:+.2%}" if base else "-",
        ]
        if args.own_chunking:
            if pb.layers() is None:
                cells.append("-")
            else:
                own, _own_ch, _ = _solved(pb, args.time_limit, True, True, every)
                cells.append(f"{own:.4g}")
        line = "| " + " | ".join(cells) + " |"
        lines.append(line)
        print(line, flush=True)
    if args.out is not None:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
