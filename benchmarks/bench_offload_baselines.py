"""CPU time of the offload baselines over every chunking, this tree beside another (issue 22).

For each of ``bench_peer.py``'s problems (``--problems``, 1-based), ``generate_chunked(name, pb)``
of each generator (``--generators``) runs in a child process and its process CPU time is taken
(not wall: the development machine is shared). With ``--against PATH`` (the root of another
checkout, e.g. ``git worktree add /tmp/main main``) the same runs in a second child at the same
time with that code, and every schedule (actions, params, makespan) or ``NotApplicable`` message
is compared: the ratio and "identical" are what to read, side by side in one run.

    python benchmarks/bench_offload_baselines.py --problems 4,6 --against /tmp/main
"""

from __future__ import annotations

import argparse
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def child(problem_paths: list[Path], names: list[str], out: Path) -> None:
    from optpipe_lightning.schedule import Problem
    from optpipe_lightning.schedule.baselines import NotApplicable, generate_chunked

    res: dict[tuple[str, str], tuple[Any, float]] = {}
    for path in problem_paths:
        pb = Problem.model_validate_json(path.read_text())
        for name in names:
            t = time.process_time()
            try:
                made = generate_chunked(name, pb)
                val: Any = [
                    ([list(map(tuple, r)) for r in s.actions], s.params, s.evaluation.makespan)
                    for s in made
                    if s.evaluation is not None
                ]
            except NotApplicable as e:
                val = f"not applicable: {e}"
            res[(path.stem, name)] = (val, time.process_time() - t)
    out.write_bytes(pickle.dumps(res))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--problems", default="1,2,3,4,5,6,7,8,9,10")
    ap.add_argument("--generators", default="pipeoffload,adaoffload")
    ap.add_argument("--against", type=Path, default=None, help="another checkout's root")
    ap.add_argument("--child", nargs=2, metavar=("OUT", "PROBLEM_DIR"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    names = args.generators.split(",")
    picked = [int(i) for i in args.problems.split(",")]
    if args.child:
        out, where = Path(args.child[0]), Path(args.child[1])
        child([where / f"p{i}.json" for i in picked], names, out)
        return
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_peer import FAMILY, build_problem

    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        for i in picked:
            _pb, path = build_problem(FAMILY[i - 1], 4, where)
            path.rename(where / f"p{i}.json")
        trees = {"this": ROOT} | ({"against": args.against.resolve()} if args.against else {})
        procs = {}
        for label, tree in trees.items():
            env = dict(os.environ, PYTHONPATH=str(tree))
            cmd = [sys.executable, __file__, "--problems", args.problems]
            cmd += ["--generators", args.generators, "--child", str(where / label), str(where)]
            procs[label] = subprocess.Popen(cmd, env=env, cwd=tree)
        for label, proc in procs.items():
            if proc.wait() != 0:
                raise SystemExit(f"the {label} run failed")
        got = {k: pickle.loads((where / k).read_bytes()) for k in trees}
    load = os.getloadavg()[0]
    print(f"CPU seconds of generate_chunked (load average {load:.1f})\n")
    head = "| problem | generator | this |" + (
        " against | ratio | identical |" if args.against else ""
    )
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    sums = {k: {n: 0.0 for n in names} for k in trees}
    for i in picked:
        for n in names:
            key = (f"p{i}", n)
            val, t = got["this"][key]
            sums["this"][n] += t
            row = f"| {FAMILY[i - 1].name} | {n} | {t:.2f} |"
            if "against" in got:
                val_a, t_a = got["against"][key]
                sums["against"][n] += t_a
                row += (
                    f" {t_a:.2f} | {t_a / max(t, 1e-9):.2f} | {'yes' if val == val_a else 'NO'} |"
                )
            print(row)
    for n in names:
        row = f"| sum | {n} | {sums['this'][n]:.2f} |"
        if "against" in got:
            t_a = sums["against"][n]
            row += f" {t_a:.2f} | {t_a / max(sums['this'][n], 1e-9):.2f} | |"
        print(row)


if __name__ == "__main__":
    main()
