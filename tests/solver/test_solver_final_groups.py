"""Issue 32: PipeOffload's grouped order with unequal group sizes (no short last group), each
fitted with the copy grid and judged by the one simulator (deterministic: a count of simulations
ends it, never the clock)."""

from __future__ import annotations

from pathlib import Path

import pytest
from search_problems import check_rows, deterministic_solve, gpt_problem

from optpipe_lightning.schedule import simulate
from optpipe_lightning.schedule.baselines import generate
from optpipe_lightning.schedule.baselines._gis_order import gis_order
from optpipe_lightning.solver import final_groups


def test_equal_groups_are_the_published_order(tmp_path: Path) -> None:
    pb = gpt_problem(tmp_path, 4, 8, memory_microbatches=3)
    for g in (2, 4):
        assert final_groups.mixed_order(pb, [g] * (8 // g)) == gis_order(pb, g)
    with pytest.raises(ValueError, match="do not sum to 8"):
        final_groups.mixed_order(pb, [4, 3])
    with pytest.raises(ValueError, match=r"outside 1\.\.4"):
        final_groups.mixed_order(pb, [5, 3])


def test_size_lists_balance_or_move_the_remainder() -> None:
    lists = final_groups.size_lists(32, 7)
    assert lists == [(7, 7, 6, 6, 6), (6, 6, 6, 7, 7), (7, 7, 7, 7, 4), (4, 7, 7, 7, 7)]
    assert all(sum(s) == 32 and max(s) <= 7 for s in lists)
    assert final_groups.size_lists(32, 8) == []  # g divides m: the published order
    assert final_groups.size_lists(10, 4) == [(4, 3, 3), (3, 3, 4), (4, 4, 2), (2, 4, 4)]


def test_unequal_groups_beat_pipeoffload_where_its_last_group_is_short(tmp_path: Path) -> None:
    # 4 stages, 10 microbatches, 75% memory: PipeOffload's best is g = 2 (1.8071 when written);
    # groups of 4, 4, 2 with one chunk offloaded (lazy grid) run 1.7471
    pb = gpt_problem(tmp_path, 4, 10, memory_microbatches=3)
    base = generate("pipeoffload", pb)
    assert base.evaluation is not None and base.evaluation.makespan is not None
    found = list(final_groups.members(pb, base.evaluation.makespan, max_tries=200))
    assert found, "no unequal group sizes beat PipeOffload"
    ms = [s.evaluation.makespan for s in found if s.evaluation is not None]
    assert ms == sorted(ms, reverse=True) and len(ms) == len(found)  # each beats the one before
    best = found[-1]
    assert ms[-1] is not None and ms[-1] < base.evaluation.makespan * (1 - 0.02)
    sizes = best.params["group_sizes"]
    assert isinstance(sizes, list) and sum(sizes) == 10 and len(set(sizes)) > 1
    again = simulate(pb, best.actions)  # the one simulator, within the limit
    assert again.feasible and again.makespan == pytest.approx(ms[-1])
    for peak, limit in zip(again.evaluation.peak_memory, pb.memory_limits(), strict=True):
        assert limit is not None and peak <= limit * (1 + 1e-9)
    rows = [list(r) for r in best.actions]
    check_rows(pb, rows)
    # deterministic: the same schedule each time; no tries find nothing
    repeat = list(final_groups.members(pb, base.evaluation.makespan, max_tries=200))
    assert [list(map(list, s.actions)) for s in repeat] == [
        list(map(list, s.actions)) for s in found
    ]
    assert list(final_groups.members(pb, base.evaluation.makespan, max_tries=0)) == []
    # nothing beats itself
    assert list(final_groups.members(pb, ms[-1], max_tries=200)) == []


def test_one_chunk_or_no_limit_is_left_alone(tmp_path: Path) -> None:
    pb = gpt_problem(tmp_path, 4, 10, memory_microbatches=3)
    assert list(final_groups.members(pb.with_changes(memory_limit=None), 1e9)) == []


def test_unequal_groups_run_inside_solve(tmp_path: Path) -> None:
    from optpipe_lightning.solver import Incumbent

    pb = gpt_problem(tmp_path, 4, 10, memory_microbatches=3)
    seen: list[Incumbent] = []
    res = deterministic_solve(pb, on_incumbent=seen.append)
    assert any(inc.source == "search:groups" for inc in seen), [i.source for i in seen]
    assert simulate(pb, res.schedule).makespan == pytest.approx(res.makespan)
    assert res.makespan < 1.7472  # the unequal groups (1.7471), or better
    # the action search's candidates, counted (a deterministic time: at most its 200 tries)
    counted = res.schedule.params["candidates"]["search: actions"]
    assert 0 < counted["candidates"] <= 200 and counted["per_second"] > 0


def test_the_order_knobs_leave_the_fill_and_final_groups_most_of_the_search() -> None:
    """compare --time-limit 60 on h4096-s8k-p8-m32-50% (issue 32): the order knobs took 7.7 s of
    the search's 11 s and the final groups got 0.66 s of the 3.4 s they need. Now the order knobs
    end by ORDER_SHARE of the window, and PipeOffload's family gets the larger share."""
    from optpipe_lightning.solver import phases

    orders, end = phases.search_deadlines(100.0, 30.0, family=True)
    assert end == pytest.approx(100.0 + phases.SEARCH_SHARE_FAMILY * 30.0)
    assert orders - 100.0 == pytest.approx(phases.ORDER_SHARE * (end - 100.0))
    assert end - orders >= 0.6 * (end - 100.0)  # the fill, final groups and actions' part
    _orders, other_end = phases.search_deadlines(100.0, 30.0, family=False)
    assert other_end == pytest.approx(100.0 + phases.SEARCH_SHARE * 30.0)
    assert other_end < end
    assert phases.search_deadlines(5.0, -2.0, family=True) == (5.0, 5.0)  # no time left


def test_the_rule_search_is_skipped_where_the_rules_are_far_behind(tmp_path: Path) -> None:
    """At 32 stages the rule search took 5.3 s of a 60 s compare while the best list rule was
    67% slower than pipeoffload (issue 32): tuning them cannot reach it."""
    from optpipe_lightning.solver import phases
    from optpipe_lightning.solver.list_rules import default_rules

    pb = gpt_problem(tmp_path, 4, 8)
    rule = default_rules(pb)[0]
    reach = phases.RULE_SEARCH_REACH
    assert phases.rules_far_behind([], 10.0) is None
    assert phases.rules_far_behind([(10.0 * (1 + reach) * 0.999, rule)], 10.0) is None
    why = phases.rules_far_behind([(17.0, rule), (10.0 * (1 + reach) * 1.01, rule)], 10.0)
    assert why is not None and why.startswith("rule search (")
    assert phases.rules_far_behind([(17.0, rule)], float("inf")) is None
