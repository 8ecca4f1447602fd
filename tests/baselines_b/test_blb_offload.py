"""AdaOffload (memory-adaptive offload); PipeOffload is in test_blb_pipeoffload.py."""

from __future__ import annotations

import pytest

from optpipe_lightning.schedule import Action, Problem, simulate
from optpipe_lightning.schedule.baselines import NotApplicable, generate


def problem(p: int, m: int, v: int = 1, **kw: object) -> Problem:
    data: dict[str, object] = dict(
        num_stages=p,
        num_microbatches=m,
        num_chunks=v,
        t_f=1,
        t_b=1,
        t_w=1,
        m_f=1,
        m_b=0,
        m_w=-1,
        offload={"bytes": 1, "d2h_bandwidth": 2, "h2d_bandwidth": 2},
    )
    data.update(kw)
    return Problem.model_validate(data)


# ---- AdaOffload --------------------------------------------------------------------------------


def reloads_before_use(pb: Problem, actions: list[list[Action]]) -> None:
    res = simulate(pb, actions)
    assert res.timeline is not None
    for s in range(pb.num_stages):
        times = {a: (st, en) for a, st, en in res.timeline.transfer_rows(s)}
        comp = {a: (st, en) for a, st, en in res.timeline.compute_rows(s)}
        for a, (st, _en) in times.items():
            if a.op != "OFFLOAD":
                continue
            f_end = comp[Action("F", a.mb, a.chunk)][1]
            r_st, r_en = times[Action("RELOAD", a.mb, a.chunk)]
            b_st = comp[Action("B", a.mb, a.chunk)][0]
            assert f_end <= st and _en <= r_st and r_en <= b_st


def test_adaoffload_offloads_nothing_when_the_limit_is_loose() -> None:
    for v, pl in ((1, "interleaved"), (2, "interleaved"), (2, "vshape")):
        pb = problem(4, 8, v, placement=pl, memory_limit=100)
        s = generate("adaoffload", pb)
        assert s.evaluation.feasible and s.evaluation.num_offloaded == 0


@pytest.mark.parametrize(
    "v,placement,limit", [(1, "interleaved", 2), (1, "interleaved", 3), (2, "vshape", 4)]
)
def test_adaoffload_fits_tight_limits_with_needed_offloads_only(
    v: int, placement: str, limit: float
) -> None:
    pb = problem(4, 8, v, placement=placement, memory_limit=limit)
    s = generate("adaoffload", pb)
    ev = s.evaluation
    assert ev.feasible and max(ev.peak_memory) <= limit
    assert ev.num_offloaded > 0
    reloads_before_use(pb, [list(r) for r in s.actions])
    # minimal: dropping any one offload breaks the limit or slows the schedule
    assert ev.makespan is not None
    for st, row in enumerate(s.actions):
        for a in row:
            if a.op != "OFFLOAD":
                continue
            rows = [list(r) for r in s.actions]
            rows[st] = [
                x for x in rows[st] if not (x.op in ("OFFLOAD", "RELOAD") and x[1:] == a[1:])
            ]
            e = simulate(pb, rows).evaluation
            assert not e.feasible or (e.makespan or 0) > ev.makespan * (1 + 1e-9)


def test_adaoffload_beats_what_fits_without_offload() -> None:
    pb = problem(4, 12, 1, memory_limit=3)
    ada = generate("adaoffload", pb).evaluation
    no_copy = generate("adaoffload", pb.with_changes(offload=None)).evaluation
    assert ada.feasible and no_copy.feasible and no_copy.num_offloaded == 0
    assert ada.makespan is not None and no_copy.makespan is not None
    assert ada.makespan < no_copy.makespan


def test_adaoffload_not_applicable_names_the_reason() -> None:
    with pytest.raises(NotApplicable, match="below one activation"):
        generate("adaoffload", problem(4, 8, memory_limit=0.5))
    # two chunks: one microbatch holds 2 units on a device before its first B
    with pytest.raises(NotApplicable, match="offload is null"):
        generate("adaoffload", problem(4, 8, 2, offload=None, memory_limit=1.5))
    slow = {"bytes": 1, "d2h_bandwidth": 0.001, "h2d_bandwidth": 0.001}
    with pytest.raises(NotApplicable, match="even with offload"):
        generate("adaoffload", problem(4, 8, 2, offload=slow, memory_limit=1.5))
    # one microbatch at a time fits one unit without any copy
    ev = generate("adaoffload", problem(4, 8, offload=None, memory_limit=1)).evaluation
    assert ev.feasible and ev.num_offloaded == 0 and max(ev.peak_memory) == 1
