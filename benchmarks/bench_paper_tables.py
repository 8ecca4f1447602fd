"""The Zero Bubble paper's comparison, reproduced by the one simulator (Markdown to stdout).

For the paper's 1.5B (p=8, m=24) and 14.6B (p=16, m=48) settings (examples/problems/), at memory
limits of p and 2p microbatch activations, every baseline's makespan, global bubble rate,
stage-span bubble rate (the paper's metric), peak memory and fit; plus interleaved 1F1B on the
same layers split into v=3 chunks of one layer (per-chunk costs and bytes / 3). The paper's published
stage-span rates (ZB-1p = zb-auto at limit p, ZB-2p = zb-auto at 2p) are printed beside them.

    python benchmarks/bench_paper_tables.py

Generators not written yet (ImportError/AttributeError) show "n/a"; a generator that does not
apply shows "n/a" with its one-line reason.
"""

from __future__ import annotations

import sys
from pathlib import Path

from optpipe_lightning.schedule import Problem
from optpipe_lightning.schedule.baselines import BASELINE_NAMES, NotApplicable, generate

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = [
    ("1.5B", "zb-1.5b-p8-m24.json"),
    ("14.6B", "zb-14.6b-p16-m48.json"),
]
# ZB paper (ICLR 2024) stage-span bubble rates: 1F1B, ZB-H1, ZB-H2, ZB-1p, ZB-2p
PAPER = {
    "1.5B": {"1f1b": 0.2431, "zb-h1": 0.1585, "zb-h2": 0.1083, "zb-1p": 0.1585, "zb-2p": 0.0433},
    "14.6B": {"1f1b": 0.2552, "zb-h1": 0.1397, "zb-h2": 0.0672, "zb-1p": 0.1397, "zb-2p": 0.0066},
}


def paper_value(model: str, name: str, units: int, p: int) -> str:
    key = name
    if name == "zb-auto":
        key = "zb-1p" if units == p else "zb-2p"
    value = PAPER[model].get(key)
    return f"{value:.4f}" if value is not None else ""


def table(model: str, problem: Problem, units: int) -> list[str]:
    p = problem.num_stages
    unit = problem.activation_unit()
    pb = problem.with_changes(memory_limit=units * unit)
    lines = [
        f"### {model}: p={p}, m={pb.num_microbatches}, memory limit {units} microbatches "
        f"({units * unit / 1e9:.2f} GB)",
        "",
        "| schedule | makespan (s) | bubble | stage-span | paper stage-span | peak (mb) | fits |",
        "|---|---:|---:|---:|---:|---:|:---:|",
    ]
    for name in BASELINE_NAMES:
        try:
            ev = generate(name, pb).evaluation
        except NotApplicable as e:
            lines.append(f"| {name} | n/a: {e} | | | | | |")
            continue
        except (ImportError, AttributeError):
            lines.append(f"| {name} | n/a (not written yet) | | | | | |")
            continue
        if ev is None or ev.makespan is None:
            lines.append(f"| {name} | invalid | | | | | no |")
            continue
        peak = max(ev.peak_memory) / unit
        lines.append(
            f"| {name} | {ev.makespan:.4f} | {ev.bubble_rate:.4f} | "
            f"{ev.stage_span_bubble_rate:.4f} | {paper_value(model, name, units, p)} | "
            f"{peak:.2f} | {'yes' if ev.feasible else 'no'} |"
        )
    # interleaved 1F1B on the same layers, one layer per chunk (v = 3), per-chunk costs / 3
    v = 3
    off = pb.offload
    split = pb.with_changes(
        num_chunks=v,
        **{k: float(pb.cost(k)[0, 0]) / v for k in ("t_f", "t_b", "t_w", "m_f", "m_b", "m_w")},
        offload=None
        if off is None
        else {**off.model_dump(), "bytes": float(pb.cost("offload_bytes")[0, 0]) / v},
    )
    try:
        ev = generate("interleaved-1f1b", split).evaluation
        assert ev is not None and ev.makespan is not None
        lines.append(
            f"| interleaved-1f1b (v=3, 1 layer/chunk) | {ev.makespan:.4f} | {ev.bubble_rate:.4f} | "
            f"{ev.stage_span_bubble_rate:.4f} | | {max(ev.peak_memory) / unit:.2f} | "
            f"{'yes' if ev.feasible else 'no'} |"
        )
    except (NotApplicable, ImportError, AttributeError) as e:
        lines.append(f"| interleaved-1f1b (v=3) | n/a: {e} | | | | | |")
    return [*lines, ""]


def main() -> int:
    out: list[str] = []
    for model, fn in SETTINGS:
        problem = Problem.model_validate_json((ROOT / "examples" / "problems" / fn).read_text())
        for units in (problem.num_stages, 2 * problem.num_stages):
            out += table(model, problem, units)
    sys.stdout.write("\n".join(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
