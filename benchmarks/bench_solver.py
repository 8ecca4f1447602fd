"""Benchmark of the schedule optimiser against every baseline (issue 3).

Grid: stages x microbatches from 4x8 to 32x256, 1 and 2 chunks (V-shape), memory limits from a
quarter of 1F1B's activation memory (p activations on stage 0) to unlimited, and offload
bandwidths that make one activation copy take 0.5x to 4x the compute it must hide behind (one
microbatch's F+B+W on that chunk). Costs: F = B = W = 1 s per stage (split evenly over chunks),
activation 1 unit per stage, B frees half, W the rest; no p2p time.

For each instance: every baseline (makespan, or why it does not apply / does not fit), the best
offload-aware heuristic, the solved schedule, the proven bound and gap, the time to the first
and to the final solution, the wall time of the whole solve (against --time-limit: the solver's
guarantee is the limit plus about one simulation), and the idle time relative to PipeOffload at
the same limit, with the most any schedule can save there ("at most", from the proven bound).

    python benchmarks/bench_solver.py --quick                 # minutes, 10 s per instance
    python benchmarks/bench_solver.py --full --time-limit 60  # hours: the whole grid
    python benchmarks/bench_solver.py --sizes 8x32,16x64 --chunks 1 --time-limit 60
    python benchmarks/bench_solver.py --quick --lanes duplex,one   # both copy-lane models

Copies run on duplex lanes (``offload.duplex``, the default: a lane each way) or, with
``--lanes one``, on one lane for both directions; with both, each instance runs with each, side
by side.

Writes a Markdown table to stdout (and --out FILE) and one JSON object per line to --jsonl.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from optpipe_lightning.schedule import Problem
from optpipe_lightning.solver import InfeasibleMemoryLimit, heuristic_schedules, solve

QUICK_SIZES = [(4, 8), (8, 32)]
FULL_SIZES = [(4, 8), (8, 16), (8, 32), (16, 64), (32, 256)]
QUICK_MEM = [0.25, 0.5, None]
FULL_MEM = [0.25, 0.5, 1.0, None]
QUICK_RATIO = [0.5, 2.0]
FULL_RATIO = [0.5, 1.0, 2.0, 4.0]


def make_problem(
    p: int, m: int, v: int, mem_frac: float | None, ratio: float, duplex: bool = True
) -> Problem:
    act = 1.0  # one microbatch's activation per stage, over all its chunks
    limit = None if mem_frac is None else mem_frac * p * act
    chunk_compute = 3.0 / v  # F+B+W of one microbatch on one chunk
    copy_time = ratio * chunk_compute
    return Problem(
        name=f"{p}x{m}x{v} mem={mem_frac} copy={ratio}",
        num_stages=p,
        num_microbatches=m,
        num_chunks=v,
        placement="vshape",
        t_f=1.0 / v,
        t_b=1.0 / v,
        t_w=1.0 / v,
        m_f=act / v,
        m_b=-0.5 * act / v,
        m_w=-0.5 * act / v,
        memory_limit=limit,
        offload=None
        if limit is None
        else {
            "bytes": act / v,
            "d2h_bandwidth": (act / v) / copy_time,
            "h2d_bandwidth": (act / v) / copy_time,
            "duplex": duplex,
        },
    )


@dataclass
class Row:
    instance: str
    p: int
    m: int
    v: int
    mem: str
    copy: str
    baselines: dict[str, float | str] = field(default_factory=dict)
    best_baseline: float | None = None
    best_baseline_name: str = ""
    heuristic: float | None = None
    solved: float | None = None
    bound: float | None = None
    gap: float | None = None
    status: str = ""
    t_first: float | None = None
    t_final: float | None = None
    solve_seconds: float | None = None
    idle_vs_pipeoffload: float | None = None
    idle_vs_pipeoffload_at_most: float | None = None  # what the proven bound leaves possible
    beats_or_ties_all: bool | None = None
    error: str = ""
    phase_seconds: dict[str, float] = field(default_factory=dict)  # the solve's phases
    skipped: list[str] = field(default_factory=list)  # what the solve skipped for its limit


def parse_instance(text: str, prog: str) -> tuple[int, int, int, float | None, float]:
    """``PxMxV:mem:copy`` (mem a share of 1F1B's memory, or ``none``) as ``make_problem``'s
    arguments; a bad one ends ``prog`` with a one-line error."""
    try:
        shape, mem, copy = text.split(":")
        p, m, v = (int(x) for x in shape.lower().split("x"))
        return p, m, v, None if mem.lower() == "none" else float(mem), float(copy)
    except ValueError:
        raise SystemExit(
            f"{prog}: bad instance {text!r}; write PxMxV:mem:copy, e.g. 8x32x1:0.25:2 "
            "(mem: none for unlimited)"
        ) from None


def run_baselines(pb: Problem) -> dict[str, Any]:
    try:
        from optpipe_lightning.schedule.baselines import BASELINE_NAMES, NotApplicable, generate
    except ImportError:
        return {}
    out: dict[str, Any] = {}
    for name in BASELINE_NAMES:
        try:
            out[name] = generate(name, pb)
        except NotApplicable as e:
            out[name] = f"n/a ({str(e)[:40]})"
        except Exception as e:  # not written yet, or broken
            out[name] = f"error ({type(e).__name__})"
    return out


def bench_one(pb: Problem, time_limit: float, workers: int, seed: int) -> Row:
    p, m, v = pb.num_stages, pb.num_microbatches, pb.num_chunks
    name = pb.name or ""
    lim = pb.memory_limits()[0]
    copy = "-"
    if pb.offload is not None:
        copy = f"{pb.offload_time(0, 0) / (3.0 / v):g}x" + ("" if pb.offload.duplex else " 1-lane")
    row = Row(name, p, m, v, "unlimited" if lim is None else f"{lim / p:g}p", copy)
    base = run_baselines(pb)
    work = p * m * 3.0  # F+B+W = 3 s per microbatch per stage
    po_idle = None
    for bname, res in base.items():
        if isinstance(res, str):
            row.baselines[bname] = res
            continue
        ev = res.evaluation
        if ev is None or not ev.feasible or ev.makespan is None:
            kinds = sorted({x.kind for x in (ev.violations if ev else [])})
            row.baselines[bname] = "infeasible (" + ",".join(kinds) + ")"
            continue
        row.baselines[bname] = ev.makespan
        if row.best_baseline is None or ev.makespan < row.best_baseline:
            row.best_baseline, row.best_baseline_name = ev.makespan, bname
        if bname == "pipeoffload":
            po_idle = p * ev.makespan - work
    t = time.perf_counter()
    heur = heuristic_schedules(pb)
    row.heuristic = heur[0].evaluation.makespan if heur and heur[0].evaluation else None
    _ = time.perf_counter() - t
    try:
        res = solve(pb, time_limit=time_limit, workers=workers, seed=seed)
    except InfeasibleMemoryLimit as e:
        row.error = str(e)
        return row
    row.solved, row.bound, row.gap, row.status = res.makespan, res.lower_bound, res.gap, res.status
    row.t_first = res.first_solution_seconds
    row.t_final = res.incumbents[-1].wall_time if res.incumbents else None
    row.solve_seconds = res.solve_seconds
    row.phase_seconds = dict(res.schedule.params.get("phase_seconds") or {})
    row.skipped = list(res.schedule.params.get("skipped") or [])
    if po_idle is not None and po_idle > 0:
        row.idle_vs_pipeoffload = 1.0 - (p * res.makespan - work) / po_idle
        row.idle_vs_pipeoffload_at_most = 1.0 - (p * res.lower_bound - work) / po_idle
    feas = [x for x in row.baselines.values() if isinstance(x, float)]
    row.beats_or_ties_all = all(res.makespan <= x + 1e-9 for x in feas)
    return row


def fmt(x: float | None, nd: int = 2) -> str:
    if x is None:
        return "-"
    return f"{x:.{nd}f}".rstrip("0").rstrip(".") if isinstance(x, float) else str(x)


def _idle_cell(r: Row) -> str:
    """Idle time against PipeOffload's, and the most any schedule can save (from the bound)."""
    if r.idle_vs_pipeoffload is None:
        return "-"
    cell = f"{100 * r.idle_vs_pipeoffload:.0f}% less"
    most = r.idle_vs_pipeoffload_at_most
    if most is not None and most < 1.0 - 1e-9:
        cell += f" (at most {100 * most:.0f}%)"
    return cell


def markdown(rows: list[Row], baseline_names: list[str]) -> str:
    head = [
        "instance (p x m x v, mem, copy)",
        *baseline_names,
        "heuristic",
        "solved",
        "bound",
        "gap",
        "status",
        "t first (s)",
        "t final (s)",
        "wall (s)",
        "idle vs PipeOffload",
        "beats/ties all",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [f"{r.p}x{r.m}x{r.v}, {r.mem}, {r.copy}"]
        for b in baseline_names:
            val = r.baselines.get(b)
            if isinstance(val, float):
                cells.append(fmt(val))
            elif val is None:
                cells.append("-")
            elif val.startswith("n/a"):
                cells.append("n/a")
            elif val.startswith("infeasible"):
                cells.append("OOM" if "memory" in val else "inf.")
            else:
                cells.append("err")
        if r.error:
            cells += [fmt(r.heuristic), "infeasible limit", "-", "-", "-", "-", "-", "-", "-", "-"]
        else:
            cells += [
                fmt(r.heuristic),
                fmt(r.solved),
                fmt(r.bound),
                "-" if r.gap is None else f"{100 * r.gap:.1f}%",
                r.status,
                fmt(r.t_first, 3),
                fmt(r.t_final, 2),
                fmt(r.solve_seconds, 2),
                _idle_cell(r),
                "yes" if r.beats_or_ties_all else "NO",
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="small grid, 10 s per instance")
    mode.add_argument("--full", action="store_true", help="the whole grid of issue 3")
    ap.add_argument("--time-limit", type=float, default=None, help="seconds per instance")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sizes", default=None, help="e.g. 4x8,8x32 (overrides the mode's sizes)")
    ap.add_argument("--chunks", default="1,2")
    ap.add_argument(
        "--copies", default=None, help="e.g. 2 or 1,2 (copy time ratios; overrides the mode's)"
    )
    ap.add_argument(
        "--mems", default=None, help="e.g. 0.25,0.5,none (memory fractions; overrides the mode's)"
    )
    ap.add_argument(
        "--lanes",
        default="duplex",
        help="copy lanes: duplex (a lane each way), one (one lane for both), or duplex,one",
    )
    ap.add_argument("--out", default=None, help="also write the Markdown table here")
    ap.add_argument("--jsonl", default=None, help="one JSON object per instance")
    a = ap.parse_args(argv)
    full = a.full
    sizes = FULL_SIZES if full else QUICK_SIZES
    if a.sizes:
        sizes = [tuple(int(x) for x in s.split("x")) for s in a.sizes.split(",")]  # type: ignore[misc]
    mems = FULL_MEM if full else QUICK_MEM
    ratios = FULL_RATIO if full else QUICK_RATIO
    if a.copies:
        ratios = [float(x) for x in a.copies.split(",")]
    if a.mems:
        mems = [None if x.strip().lower() == "none" else float(x) for x in a.mems.split(",")]
    tl = a.time_limit if a.time_limit is not None else (60.0 if full else 10.0)
    chunks = [int(c) for c in a.chunks.split(",")]
    lanes = [x.strip() for x in a.lanes.split(",") if x.strip()]
    if not lanes or any(x not in ("duplex", "one") for x in lanes):
        ap.error(f"--lanes takes duplex, one or both (comma-separated), not {a.lanes!r}")
    rows: list[Row] = []
    jf = open(a.jsonl, "w") if a.jsonl else None  # noqa: SIM115 - closed below
    for p, m in sizes:
        for v in chunks:
            for mem in mems:
                for ratio in ratios if mem is not None else [0.0]:
                    for lane in lanes if mem is not None else lanes[:1]:
                        pb = make_problem(p, m, v, mem, ratio, duplex=lane == "duplex")
                        r = bench_one(pb, tl, a.workers, a.seed)
                        rows.append(r)
                        print(
                            f"{pb.name} {lane}: heuristic {fmt(r.heuristic)} solved "
                            f"{fmt(r.solved)} bound {fmt(r.bound)} best baseline "
                            f"{fmt(r.best_baseline)} ({r.best_baseline_name}) first "
                            f"{fmt(r.t_first, 3)}s wall {fmt(r.solve_seconds, 2)}s {r.error}",
                            file=sys.stderr,
                            flush=True,
                        )
                        if jf:
                            jf.write(json.dumps(asdict(r)) + "\n")
                            jf.flush()
    names: list[str] = []
    for r in rows:
        for b in r.baselines:
            if b not in names:
                names.append(b)
    table = markdown(rows, names)
    cmd = "python benchmarks/bench_solver.py " + " ".join(sys.argv[1:] if argv is None else argv)
    text = (
        f"Command: `{cmd}` (time limit {tl:g} s per instance, {a.workers} workers)\n\n"
        + table
        + "\n"
    )
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    if jf:
        jf.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
