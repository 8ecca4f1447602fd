"""The search beyond the rules on bench_peer's problems, on its own (issue 32).

For each problem picked: the best of ``pipeoffload`` and ``adaoffload`` over every chunking (the
best baseline; the published PipeOffload family's best is ours, bench_peer checks), then
PipeOffload's unpublished group sizes (``solver.gis_search``) on every chunking, then its other
order knobs (``solver.order_search``: warm-up depth, W delay) on every chunking, then the warm-up
fill (``solver.warmup_fill``) of the best, then unequal group sizes (``solver.final_groups``: no
short last group) on every chunking, the fastest filled in turn, then the action search
(``solver.action_search``) from the best, each within ``--seconds``. Per problem: the best
baseline, what each step reached, the bound, and the idle time (p x makespan - work) over the best
baseline's; then how many problems with more than 2% room it improved and the median idle ratio.
Unlike ``bench_peer`` (the user's ``compare``) this gives the search all its seconds, so it shows
what the search finds, not what a time-limited ``compare`` on a loaded machine gets to.

    python benchmarks/bench_search.py --problems 1,4,6 --seconds 30
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from pathlib import Path

from bench_peer import FAMILY, build_problem, work

from optpipe_lightning.schedule.baselines import NotApplicable, best_schedule, generate_chunked
from optpipe_lightning.schedule.bounds import lower_bound
from optpipe_lightning.schedule.chunking import chunkings, rechunk
from optpipe_lightning.solver import (
    action_search,
    final_groups,
    gis_search,
    order_search,
    warmup_fill,
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--problems", default=None, help="1-based indices into bench_peer's FAMILY")
    ap.add_argument("--seconds", type=float, default=30.0, help="for each of the three searches")
    args = ap.parse_args()
    picked = (
        list(range(1, len(FAMILY) + 1))
        if args.problems is None
        else [int(i) for i in args.problems.split(",")]
    )
    print(
        "| problem | best baseline | group sizes | order knobs | warm-up fill | final groups (+ fill) | action search | bound | "
        "room | idle / best baseline's |\n|---|---|---|---|---|---|---|---|---|---|"
    )
    ratios: list[float] = []
    room_n = improved = 0
    with tempfile.TemporaryDirectory() as tmp:
        for i in picked:
            case = FAMILY[i - 1]
            pb, _ = build_problem(case, 4, Path(tmp))
            made = []
            for name in ("pipeoffload", "adaoffload"):
                with contextlib.suppress(NotApplicable):
                    made += generate_chunked(name, pb)
            fits = [s for s in made if s.evaluation is not None and s.evaluation.feasible]
            bound = min(lower_bound(rechunk(pb, v, pl)) for v, pl in chunkings(pb))
            if not fits:
                print(f"| {case.name} | none fits | - | - | - | - | - | {bound:.3f} | - | - |")
                continue
            base = best_schedule(fits)
            assert base.evaluation is not None and base.evaluation.makespan is not None
            m0 = base.evaluation.makespan
            best, best_s = m0, base
            until = time.perf_counter() + args.seconds
            for v, pl in chunkings(pb):
                for s in gis_search.extra_members(rechunk(pb, v, pl), best, until):
                    assert s.evaluation is not None and s.evaluation.makespan is not None
                    best, best_s = s.evaluation.makespan, s
            after_g = best
            until = time.perf_counter() + args.seconds
            for v, pl in chunkings(pb):
                for s in order_search.members(rechunk(pb, v, pl), best, until):
                    assert s.evaluation is not None and s.evaluation.makespan is not None
                    best, best_s = s.evaluation.makespan, s
            after_o = grouped_ms = best
            assert best_s.problem is not None
            start = [list(r) for r in best_s.actions]
            found = warmup_fill.best_fill(
                best_s.problem, start, deadline=time.perf_counter() + args.seconds
            )
            if found is not None and found[1].makespan is not None:
                start, best = found[0], found[1].makespan
            after_f = best
            # unequal group sizes beating the order knobs' best, the fastest filled in turn
            until = time.perf_counter() + args.seconds
            grouped = None
            for v, pl in chunkings(pb):
                for s in final_groups.members(rechunk(pb, v, pl), grouped_ms, until):
                    assert s.evaluation is not None and s.evaluation.makespan is not None
                    grouped, grouped_ms = s, s.evaluation.makespan
            if grouped is not None and grouped.problem is not None:
                rows = [list(r) for r in grouped.actions]
                found = warmup_fill.best_fill(
                    grouped.problem, rows, deadline=time.perf_counter() + args.seconds
                )
                if found is not None and found[1].makespan is not None:
                    rows, grouped_ms = found[0], found[1].makespan
                if grouped_ms < best:
                    start, best, best_s = rows, grouped_ms, grouped
            after_u = best
            _rows, res, _n = action_search.improve(
                best_s.problem, start, deadline=time.perf_counter() + args.seconds
            )
            if res.makespan is not None and res.makespan < best:
                best = res.makespan
            p, w = pb.num_stages, work(pb)
            ratio = (p * best - w) / (p * m0 - w)
            room = (m0 - bound) / m0
            ratios.append(ratio)
            if room > 0.02:
                room_n += 1
                improved += best < m0 * (1 - 1e-6)
            print(
                f"| {case.name} | {base.generator} {m0:.3f} | {after_g:.3f} | {after_o:.3f} | {after_f:.3f} | "
                f"{after_u:.3f} | {best:.3f} | "
                f"{bound:.3f} | {room:.1%} | {ratio:.3f} |",
                flush=True,
            )
    med = statistics.median(ratios) if ratios else float("nan")
    print(
        f"\nimproved on {improved} of {room_n} problems with more than 2% room; "
        f"median idle / best baseline's {med:.3f}"
    )


if __name__ == "__main__":
    main()
