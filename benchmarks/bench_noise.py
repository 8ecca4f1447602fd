"""How the solver's schedule holds up under noise against the best baseline (issue 32.4).

For each ``bench_peer`` problem picked: the best of the ``pipeoffload`` and ``adaoffload``
baselines over every chunking (as ``compare`` makes them), then ``solve`` with those as
candidates (as ``compare`` runs it) at ``--time-limit``; both schedules are timed on ``--draws``
noisy copies of their problem (``schedule.noise``: ±``--spread`` op and copy times, seed
``--seed``; the same draws for both where they share a chunking). Per problem: the nominal
makespans, the mean and worst loss of optpipe against the baseline over the draws (positive:
optpipe slower), and the limit breaks of each. Markdown on stdout.

    python benchmarks/bench_noise.py --problems 1,2,6 --time-limit 20
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from pathlib import Path

from bench_peer import FAMILY, build_problem

from optpipe_lightning.schedule.baselines import NotApplicable, best_schedule, generate_chunked
from optpipe_lightning.schedule.noise import noise_draws, noise_evaluation
from optpipe_lightning.solver import solve


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--problems", default="1,2,6", help="1-based indices into bench_peer's FAMILY")
    ap.add_argument("--time-limit", type=float, default=20.0)
    ap.add_argument("--draws", type=int, default=20)
    ap.add_argument("--spread", type=float, default=0.2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(
        "| problem | best baseline | optpipe | mean loss | worst loss | breaks baseline | "
        "breaks optpipe | same draws |\n|---|---|---|---|---|---|---|---|"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for i in args.problems.split(","):
            case = FAMILY[int(i) - 1]
            pb, _ = build_problem(case, 4, Path(tmp))
            made = []
            for name in ("pipeoffload", "adaoffload"):
                with contextlib.suppress(NotApplicable):
                    made += generate_chunked(name, pb)
            fits = [s for s in made if s.evaluation is not None and s.evaluation.feasible]
            if not fits:
                print(f"| {case.name} | none fits | - | - | - | - | - | - |")
                continue
            base = best_schedule(fits)
            res = solve(pb, time_limit=args.time_limit, candidates=made, use_baselines=False)
            ours = res.schedule
            assert base.problem is not None and ours.problem is not None
            same = base.problem.hash == ours.problem.hash
            reps = []
            for s in (base, ours):
                assert s.problem is not None
                draws = noise_draws(s.problem, args.draws, args.spread, args.seed)
                reps.append(noise_evaluation(s.problem, s, problems=draws))
            losses = [
                (o - b) / b
                for b, o in zip(reps[0].makespans, reps[1].makespans, strict=True)
                if b is not None and o is not None
            ]
            mean = sum(losses) / len(losses) if losses else float("nan")
            worst = max(losses) if losses else float("nan")
            assert base.evaluation is not None
            print(
                f"| {case.name} | {base.generator} {base.evaluation.makespan:.3f} | "
                f"{res.makespan:.3f} | {mean:+.2%} | {worst:+.2%} | {reps[0].breaks} | "
                f"{reps[1].breaks} | {'yes' if same else 'no'} |",
                flush=True,
            )
    print(f"\n{args.draws} draws, spread ±{args.spread:.0%}, seed {args.seed}", file=sys.stderr)


if __name__ == "__main__":
    main()
