"""Each device's relaxation solved exactly on its state graph (issue 3, 2% goal).

Arguments 8 and 9 of the solver's bound (``optpipe_lightning/solver/steady_bound.py`` states and
proves them): per device, the least ticks per microbatch over the cycles of a state graph of that
device's relaxation (the steady state: ``makespan >= head + m * lambda``), and the least walk
with start and end (the walk). The solver runs them within a share of its time limit and a state
budget; this script runs them without the time limit, per device, and prints the graph's size,
the proven time per microbatch, the ratio of a cycle the relaxation achieves (how far from exact
the bisection stopped), both bounds, and the cheap bound (``schedule.bounds``) beside them.

    python benchmarks/bench_device_cycle.py --instances 8x32x1:0.25:2 --devices 0
    python benchmarks/bench_device_cycle.py --instances 4x8x1:0.25:2,5x12x1:0.4:1
    python benchmarks/bench_device_cycle.py --instances 4x8x2:0.25:2 --devices 3

The graph grows fast with the activations that fit, the round trip and the chunks: 8x32x1 and
4x8x2 at 0.25p have about 10^5 states; 16 stages, or 0.5p at 8 stages or with two chunks, run
past minutes (``--max-states``).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

from bench_solver import make_problem, parse_instance

from optpipe_lightning.schedule import Problem
from optpipe_lightning.schedule.bounds import lower_bound
from optpipe_lightning.solver.steady_bound import DeviceSteadyState, device_steady_state


@dataclass
class Row:
    instance: str
    device: int
    cheap: float
    seconds: float
    found: DeviceSteadyState | str


def measure(name: str, pb: Problem, s: int, cap: int | None, max_states: int) -> Row:
    t0 = time.perf_counter()
    cheap = lower_bound(pb)
    # a generous horizon: ticks stay exact for any makespan the bound could reach
    horizon = 4 * pb.num_microbatches * float(pb.cost("t_f").sum() + pb.cost("t_b").sum())
    found = device_steady_state(pb, s, horizon=horizon, max_states=max_states, cap=cap)
    return Row(name, s, cheap, time.perf_counter() - t0, found)


def table(rows: list[Row], cap: int | None) -> str:
    out = [
        "| instance | device | states | proven / mb | cycle / mb | steady bound | walk bound"
        " | cheap bound | seconds | note |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]

    def f(x: float | None, nd: int = 3) -> str:
        return "-" if x is None else f"{round(x, nd):g}"

    for r in rows:
        if isinstance(r.found, str):
            cells = f"- | - | - | - | - | {f(r.cheap, 2)} | {r.seconds:.1f} | {r.found}"
        else:
            d = r.found
            note = "cap below m: not a bound" if cap is not None else ""
            cells = (
                f"{d.states} | {f(d.per_microbatch)} | {f(d.cycle)} | {f(d.steady, 2)} | "
                f"{f(d.walk, 2)} | "
                f"{f(r.cheap, 2)} | {r.seconds:.1f} | {note}"
            )
        out.append(f"| {r.instance} | {r.device} | {cells} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--instances", default="8x32x1:0.25:2", help="PxMxV:mem:copy, comma-separated")
    ap.add_argument("--devices", default=None, help="e.g. 0,1 (default: every device)")
    ap.add_argument("--cap", type=int, default=None, help="pending microbatches (default m)")
    ap.add_argument("--max-states", type=int, default=400_000)
    ap.add_argument("--out", default=None, help="also write the Markdown table here")
    args = ap.parse_args(argv)
    rows = []
    for spec in args.instances.split(","):
        p, m, v, mem, copy = parse_instance(spec, "bench_device_cycle.py")
        pb = make_problem(p, m, v, mem, copy)
        devices = range(p) if args.devices is None else [int(d) for d in args.devices.split(",")]
        for s in devices:
            rows.append(measure(spec, pb, s, args.cap, args.max_states))
            print(table(rows[-1:], args.cap).splitlines()[-1], flush=True)
    text = table(rows, args.cap)
    print()
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
