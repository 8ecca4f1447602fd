"""Print the anchor table of the V-shape and offload generators (markdown).

    python tests/baselines_b/blb_anchor_table.py

Unit per-chunk costs (F = B = W = 1, no comm), one chunk unit of activation per F freed by its
W (m_f = 1, m_b = 0, m_w = -1), so peaks read in chunk units. Reference values from
/work/shared/notes/schedules.md (sail-sg generators; PipeOffload paper).
"""

from __future__ import annotations

import time

from optpipe_lightning.schedule import Problem
from optpipe_lightning.schedule.baselines import generate


def unit(p: int, m: int, v: int, placement: str, **kw: object) -> Problem:
    data: dict[str, object] = {
        "num_stages": p,
        "num_microbatches": m,
        "num_chunks": v,
        "placement": placement,
        "t_f": 1,
        "t_b": 1,
        "t_w": 1,
        "m_f": 1,
        "m_b": 0,
        "m_w": -1,
    }
    data.update(kw)
    return Problem.model_validate(data)


FAST = {"bytes": 1, "d2h_bandwidth": 2, "h2d_bandwidth": 2}  # 0.5 per copy, F takes 1
SLOW = {"bytes": 1, "d2h_bandwidth": 0.01, "h2d_bandwidth": 0.01}  # no copy can hide

ROWS: list[tuple[str, str, Problem, str]] = [
    ("zbv", "p=8 m=24 v=2", unit(8, 24, 2, "vshape"), "0.0003 / 16"),
    ("v-half", "p=8 m=24 v=2", unit(8, 24, 2, "vshape"), "0.106 / 10"),
    ("v-min", "p=8 m=24 v=2", unit(8, 24, 2, "vshape"), "0.159 / 8"),
    (
        "pipeoffload",
        "d=8 m=32 v=4, no limit",
        unit(8, 32, 4, "interleaved", offload=FAST),
        "GIS 0.0352 / 32",
    ),
    (
        "pipeoffload",
        "d=8 m=32 v=4, limit 20, slow copies",
        unit(8, 32, 4, "interleaved", offload=SLOW, memory_limit=20),
        "GIS-H 0.0634 / 20",
    ),
    (
        "pipeoffload",
        "d=8 m=32 v=4, limit 16, copy 0.5",
        unit(8, 32, 4, "interleaved", offload=FAST, memory_limit=16),
        "-",
    ),
    (
        "adaoffload",
        "d=8 m=32 v=4, limit 32, copy 0.5",
        unit(8, 32, 4, "interleaved", offload=FAST, memory_limit=32),
        "-",
    ),
    (
        "adaoffload",
        "d=8 m=32 v=4, limit 16, copy 0.5",
        unit(8, 32, 4, "interleaved", offload=FAST, memory_limit=16),
        "-",
    ),
    (
        "adaoffload",
        "p=8 m=24 v=1, limit 4, copy 0.5",
        unit(8, 24, 1, "interleaved", offload=FAST, memory_limit=4),
        "-",
    ),
    (
        "pipeoffload",
        "p=8 m=24 v=1, limit 4, copy 0.5",
        unit(8, 24, 1, "interleaved", offload=FAST, memory_limit=4),
        "-",
    ),
    (
        "adaoffload",
        "p=8 m=24 v=2 V, limit 8, copy 0.5",
        unit(8, 24, 2, "vshape", offload=FAST, memory_limit=8),
        "-",
    ),
]


def main() -> None:
    print(
        "| schedule | problem | bubble (global) | bubble (stage span) | peak (chunk units) "
        "| offloads | reference (span rate / peak) | params | seconds |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, label, pb, ref in ROWS:
        t = time.perf_counter()
        s = generate(name, pb)
        dt = time.perf_counter() - t
        ev = s.evaluation
        assert ev is not None and ev.feasible
        params = ", ".join(f"{k}={v}" for k, v in s.params.items() if k != "num_offloaded")
        print(
            f"| {name} | {label} | {ev.bubble_rate:.4f} | {ev.stage_span_bubble_rate:.4f} "
            f"| {max(ev.peak_memory):g} | {ev.num_offloaded} | {ref} | {params} | {dt:.2f} |"
        )


if __name__ == "__main__":
    main()
