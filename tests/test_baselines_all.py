"""Every baseline on random problems: a schedule the simulator accepts, or a reason it does not
apply; and the lower bound never above the makespan of any feasible one."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from schedule_strategies import problems

from optpipe_lightning.schedule import Problem, simulate
from optpipe_lightning.schedule.baselines import BASELINE_NAMES, NotApplicable, generate
from optpipe_lightning.schedule.bounds import lower_bound

MEMORY_AWARE = {"zb-auto", "pipeoffload", "adaoffload"}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(max_stages=4, max_mb=5))
def test_every_baseline_is_valid_or_says_why(problem: Problem) -> None:
    bound = lower_bound(problem)
    for name in BASELINE_NAMES:
        try:
            sched = generate(name, problem)
        except NotApplicable as e:
            assert str(e) and "\n" not in str(e)
            continue
        ev = simulate(problem, sched).evaluation
        assert ev == sched.evaluation, name  # what the generator attached is the simulator's
        structural = [v for v in ev.violations if v.kind != "memory"]
        assert structural == [], (name, structural[:2])
        if name in MEMORY_AWARE:
            assert ev.feasible, (name, ev.violations[:2])
        if ev.feasible:
            assert bound <= ev.makespan * (1 + 1e-9) + 1e-12, (name, bound, ev.makespan)  # type: ignore[operator]
