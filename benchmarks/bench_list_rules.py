"""The list-scheduling rules one by one: memory-fitted rules against the others (issue 3).

For each instance of the solver benchmark's kind (``bench_solver.make_problem``), every rule of
``default_rules`` runs once; the table shows the best makespan the simulator accepts among the
memory-fitted rules, among the rules that plan copies on the channel's timeline (``plan``, one
chunk per stage), among the rules that offload only where the copies fit in the round trip
(``trip_room``) and among the others (with the rule's name), and the first rule's name,
makespan and seconds (what ``solve`` reports first). "stuck" = no rule of that kind finished.
With ``--search``, the local search over the rules' parameters (``solver.rule_search``) then
runs from the portfolio's three best rules without a time limit: its best, the rules it ran, and
its seconds.

    python benchmarks/bench_list_rules.py                       # 4x8 to 16x64, seconds
    python benchmarks/bench_list_rules.py --sizes 32x256        # about a minute per instance
    python benchmarks/bench_list_rules.py --search              # and the rule search
    python benchmarks/bench_list_rules.py --chunks 1 --copies 0.5,1,2,4   # copy speeds
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_solver import make_problem

from optpipe_lightning.schedule import Problem
from optpipe_lightning.solver.heuristics import ListRule, default_rules, run_rule
from optpipe_lightning.solver.rule_search import search_rules


def _fmt(x: tuple[float, str] | None) -> str:
    return "stuck" if x is None else f"{x[0]:g} ({x[1]})"


def _search_cells(pb: Problem, starts: list[tuple[float, ListRule]]) -> str:
    runs = 0

    def count() -> bool:
        nonlocal runs
        runs += 1
        return True

    t = time.perf_counter()
    found = None
    for rule, sched in search_rules(pb, starts, count, tried=default_rules(pb)):
        assert sched.evaluation is not None and sched.evaluation.makespan is not None
        found = (sched.evaluation.makespan, rule.name.removeprefix("search:"))
    dt = time.perf_counter() - t
    cell = "no better" if found is None else _fmt(found)
    return f" {cell} | {runs} | {dt:.2f} |"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="4x8,8x32,16x64", help="comma-separated PxM")
    ap.add_argument("--chunks", default="1,2")
    ap.add_argument("--copies", default="0.5,2", help="copy time / compute, comma-separated")
    ap.add_argument("--search", action="store_true", help="also run the rule search")
    args = ap.parse_args(argv)
    flag = " --search" if args.search else ""
    print(
        f"Command: `python benchmarks/bench_list_rules.py --sizes {args.sizes} "
        f"--chunks {args.chunks} --copies {args.copies}{flag}`\n"
    )
    head = (
        "| instance | first rule | first (s) | fitted rules, best | planned copies, best "
        "| round-trip rules, best | other rules, best |"
    )
    line = "|---|---|---|---|---|---|---|"
    if args.search:
        head += " search, best | runs | search (s) |"
        line += "---|---|---|"
    print(head)
    print(line)
    for size in args.sizes.split(","):
        p, m = (int(x) for x in size.split("x"))
        for v in (int(x) for x in args.chunks.split(",")):
            for mem in (0.25, 0.5):
                for copy in (float(x) for x in args.copies.split(",")):
                    pb = make_problem(p, m, v, mem, copy)
                    best: dict[str, tuple[float, str] | None] = dict.fromkeys(
                        ("fit", "plan", "trip", "other")
                    )
                    first = ""
                    starts: list[tuple[float, ListRule]] = []
                    for i, rule in enumerate(default_rules(pb)):
                        t = time.perf_counter()
                        sched = run_rule(pb, rule)
                        dt = time.perf_counter() - t
                        ev = sched.evaluation if sched is not None else None
                        ms = ev.makespan if ev is not None and ev.feasible else None
                        if i == 0:
                            first = f"{rule.name}: {'stuck' if ms is None else f'{ms:g}'}"
                            first_s = dt
                        if ms is not None:
                            starts.append((ms, rule))
                        kind = (
                            "fit"
                            if rule.fit
                            else "plan"
                            if rule.offload == "plan"
                            else "trip"
                            if rule.trip_room > 0
                            else "other"
                        )
                        cur = best[kind]
                        if ms is not None and (cur is None or ms < cur[0]):
                            best[kind] = (ms, rule.name)
                    fitted = _fmt(best["fit"]) if v > 1 else "-"
                    planned = _fmt(best["plan"]) if v == 1 else "-"
                    row = (
                        f"| {p}x{m}x{v}, {mem:g}p, {copy:g}x | {first} | {first_s:.3f} | "
                        f"{fitted} | {planned} | {_fmt(best['trip'])} | {_fmt(best['other'])} |"
                    )
                    if args.search:
                        row += _search_cells(pb, starts)
                    print(row, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
