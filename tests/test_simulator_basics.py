"""Simulator basics on hand-built schedules (closed forms for the baselines live elsewhere)."""

from __future__ import annotations

import pytest

from optpipe_lightning.schedule import Action, Problem, Schedule, simulate
from optpipe_lightning.schedule.simulator import ScheduleMismatchError


def one_f_one_b_rows(p: int, m: int, fused: bool = True) -> list[list[Action]]:
    rows = []
    for s in range(p):
        warm = min(p - s - 1, m)
        row = [Action("F", i) for i in range(warm)]
        f = warm
        for b in range(m):
            if f < m:
                row.append(Action("F", f))
                f += 1
            if fused:
                row.append(Action("BW", b))
            else:
                row += [Action("B", b), Action("W", b)]
        rows.append(row)
    return rows


@pytest.mark.parametrize("p,m", [(2, 2), (4, 8), (3, 7)])
def test_1f1b_makespan_and_peak(p: int, m: int) -> None:
    pb = Problem(num_stages=p, num_microbatches=m, t_f=1, t_b=1.5, t_w=0.5)
    ev = simulate(pb, one_f_one_b_rows(p, m)).evaluation
    assert ev.feasible
    assert ev.makespan == pytest.approx(m * 3.0 + (p - 1) * 3.0)
    assert ev.peak_memory == pytest.approx([min(p - s, m) for s in range(p)])
    assert ev.bubble_rate == pytest.approx(1 - m * 3.0 / (ev.makespan))


def test_comm_delays_every_cross_stage_hop() -> None:
    pb = Problem(num_stages=3, num_microbatches=1, t_f=1, t_b=1, t_w=1, t_comm=0.25)
    ev = simulate(pb, one_f_one_b_rows(3, 1)).evaluation
    # one microbatch: the F chain and the BW chain, 2 hops each way
    assert ev.makespan == pytest.approx(3 * 1 + 3 * 2 + 4 * 0.25)


def test_missing_and_duplicate_ops_are_named() -> None:
    pb = Problem(num_stages=2, num_microbatches=2, t_f=1, t_b=1, t_w=1)
    rows = one_f_one_b_rows(2, 2)
    rows[1] = [a for a in rows[1] if a != Action("BW", 1)] + [Action("F", 0)]
    ev = simulate(pb, rows).evaluation
    kinds = {v.kind for v in ev.violations}
    assert kinds == {"missing-op", "duplicate-op"}
    assert not ev.feasible and ev.makespan is None


def test_deadlock_names_the_waiting_ops() -> None:
    pb = Problem(num_stages=2, num_microbatches=2, t_f=1, t_b=1, t_w=1)
    rows = one_f_one_b_rows(2, 2)
    rows[0] = [Action("F", 0), Action("BW", 0), Action("BW", 1), Action("F", 1)]
    ev = simulate(pb, rows).evaluation
    (v,) = ev.violations
    assert v.kind == "deadlock"
    assert "stage 0 BW1" in v.message


def test_memory_over_limit_is_reported_with_time() -> None:
    pb = Problem(num_stages=2, num_microbatches=4, t_f=1, t_b=1, t_w=1, memory_limit=1.5)
    ev = simulate(pb, one_f_one_b_rows(2, 4)).evaluation
    assert not ev.feasible
    (v,) = ev.violations
    assert v.kind == "memory" and v.stage == 0 and v.time is not None


def test_offload_frees_and_reload_allocates() -> None:
    pb = Problem(
        num_stages=1,
        num_microbatches=2,
        t_f=1,
        t_b=1,
        t_w=1,
        memory_limit=1.0,
        offload={"bytes": 1.0, "d2h_bandwidth": 2.0, "h2d_bandwidth": 2.0},
    )
    # F0 F1 would hold 2; offload mb 0 first: its copy ends at t=1.5, inside F1 (1..2) if F1 ran
    # at once: its bytes leave only at its settle point, so F1 waits and starts at 1.5 (2.5 end).
    rows = [
        [
            Action("F", 0),
            Action("OFFLOAD", 0),
            Action("F", 1),
            Action("BW", 1),
            Action("RELOAD", 0),
            Action("BW", 0),
        ]
    ]
    r = simulate(pb, rows)
    assert r.evaluation.feasible, r.evaluation.violations
    assert r.evaluation.num_offloaded == 1
    assert r.evaluation.peak_memory == [1.0]
    assert r.timeline is not None and r.timeline.memory_waits == [[(2, 1)]]
    # reload issued when BW1 ends (t=4.5), takes 0.5 s; BW0 waits for it
    assert r.evaluation.makespan == pytest.approx(7.0)


def test_reload_after_its_backward_is_caught() -> None:
    pb = Problem(
        num_stages=1,
        num_microbatches=1,
        t_f=1,
        t_b=1,
        t_w=1,
        offload={"bytes": 1.0, "d2h_bandwidth": 1.0, "h2d_bandwidth": 1.0},
    )
    rows = [[Action("F", 0), Action("OFFLOAD", 0), Action("BW", 0), Action("RELOAD", 0)]]
    kinds = {v.kind for v in simulate(pb, rows).evaluation.violations}
    assert "reload-after-use" in kinds


def test_schedule_for_another_problem_is_refused() -> None:
    a = Problem(num_stages=2, num_microbatches=2, t_f=1, t_b=1, t_w=1)
    b = a.with_changes(t_f=2)
    sched = Schedule(problem_hash=a.hash, generator="hand", actions=one_f_one_b_rows(2, 2))
    with pytest.raises(ScheduleMismatchError):
        simulate(b, sched)


def test_problem_hash_ignores_spelling() -> None:
    a = Problem(num_stages=2, num_microbatches=2, t_f=1, t_b=1, t_w=1)
    b = Problem(num_stages=2, num_microbatches=2, t_f=[1.0, 1.0], t_b=[[1.0], [1.0]], t_w=1)
    assert a.hash == b.hash
    assert a.hash != a.with_changes(num_microbatches=3).hash


def test_fused_backward_cost_is_used_for_bw_only() -> None:
    pb = Problem(num_stages=2, num_microbatches=4, t_f=1, t_b=1.5, t_w=0.5, t_bw=1.6)
    fused = simulate(pb, one_f_one_b_rows(2, 4)).evaluation
    split = simulate(pb, one_f_one_b_rows(2, 4, fused=False)).evaluation
    assert fused.makespan == pytest.approx(4 * 2.6 + 2.6)
    assert split.makespan == pytest.approx(4 * 3.0 + 2.5)  # the gradient leaves after B
    # without t_bw the hash is what it was; with it, it differs
    plain = Problem(num_stages=2, num_microbatches=4, t_f=1, t_b=1.5, t_w=0.5)
    assert plain.with_changes(t_bw=None).hash == plain.hash != pb.hash
    assert (plain.cost("t_bw") == 2.0).all()
