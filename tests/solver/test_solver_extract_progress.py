"""From solver times to action lists; the Rich progress display."""

from __future__ import annotations

import io

from rich.console import Console

from optpipe_lightning.schedule import Action, Problem, simulate
from optpipe_lightning.solver import Incumbent, solve
from optpipe_lightning.solver.extract import actions_from_times
from optpipe_lightning.solver.progress import RichSolveProgress


def test_transfers_follow_the_last_compute_op_ending_by_their_start() -> None:
    pb = Problem(
        num_stages=1,
        num_microbatches=2,
        t_f=1,
        t_b=1,
        t_w=1,
        memory_limit=1.5,
        offload={"bytes": 1.0, "d2h_bandwidth": 2.0, "h2d_bandwidth": 2.0},
    )
    start = {
        ("F", 0, 0, 0): 0.0,
        ("OFFLOAD", 0, 0, 0): 1.0,
        ("F", 0, 0, 1): 1.0,
        ("B", 0, 0, 1): 2.0,
        ("RELOAD", 0, 0, 0): 3.0,
        ("W", 0, 0, 1): 3.0,
        ("B", 0, 0, 0): 4.0,
        ("W", 0, 0, 0): 5.0,
    }
    dur = {"F": 1.0, "B": 1.0, "W": 1.0, "OFFLOAD": 0.5, "RELOAD": 0.5}
    end = {k: v + dur[k[0]] for k, v in start.items()}
    rows = actions_from_times(pb, start, end)
    assert rows == [
        [
            Action("F", 0),
            Action("OFFLOAD", 0),
            Action("F", 1),
            Action("B", 1),
            Action("RELOAD", 0),
            Action("W", 1),
            Action("B", 0),
            Action("W", 0),
        ]
    ]
    ev = simulate(pb, rows).evaluation
    # F1 started before the offload's copy ended, so its bytes leave at B1's start (the settle
    # point), after F1's allocation at that instant: B1 waits for room, 0.5 later than the times
    # above (which freed at the copy's end)
    assert ev.feasible and ev.makespan == 6.5


def test_progress_display_shows_best_bound_gap_and_count() -> None:
    pb = Problem(num_stages=2, num_microbatches=4, t_f=1, t_b=1, t_w=1)
    buf = io.StringIO()
    console = Console(file=buf, width=120, force_terminal=False)
    prog = RichSolveProgress(pb, 10.0, console=console)
    prog(Incumbent(0.01, 20.0, 10.0, "heuristic:greedy"))
    prog(Incumbent(0.5, 16.0, 14.0, "cpsat"))
    console.print(prog.render())
    text = buf.getvalue()
    assert "16 s" in text and "14 s" in text and "12.50%" in text
    assert "cpsat" in text and " 2 " in text


def test_progress_works_as_the_solve_callback() -> None:
    pb = Problem(num_stages=2, num_microbatches=4, t_f=1, t_b=1, t_w=1)
    buf = io.StringIO()
    with RichSolveProgress(pb, 5.0, console=Console(file=buf, width=120)) as cb:
        res = solve(pb, time_limit=5, workers=1, on_incumbent=cb)
        cb.finish(res)
    assert cb.count == len(res.incumbents) >= 1
    assert cb.best is not None and cb.best.makespan == res.makespan
