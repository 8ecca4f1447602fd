"""What each op leaves allocated (``strategy.op_memory``), from made-up allocator readings: the
cursor's windows, the profile's ``OpMemory``, the problem it gives and the reserve the strategy
keeps out of the solver's limit. CPU only: the allocator is a script, so every number is exact."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from pydantic import ValidationError

from optpipe_lightning.schedule import Action, Problem, simulate
from optpipe_lightning.schedule.profile import OpMemory, OpStats, Profile, StageProfile
from optpipe_lightning.strategy.runtime.op_memory import (
    OpMemoryWatch,
    limits_less_reserve,
    summarize,
)
from optpipe_lightning.strategy.runtime.stage import RankCursor
from optpipe_lightning.strategy.scheduling.profiler import (
    build_profile,
    hardware_fingerprint,
    local_measurements,
    model_fingerprint,
)

MB = 1 << 20


class FakeAllocator:
    """``memory_allocated`` and its peak as a test moves them."""

    def __init__(self, start: int = 100 * MB) -> None:
        self.now = self.high = start
        self.resets = 0

    def allocated(self) -> int:
        return self.now

    def peak(self) -> int:
        return self.high

    def reset_peak(self) -> None:
        self.high = self.now
        self.resets += 1

    def op(self, leaves: int, transient: int = 0) -> None:
        """An op that rises ``transient`` above its larger end and leaves ``leaves``."""
        self.high = max(self.high, max(self.now, self.now + leaves) + transient)
        self.now += leaves


def _cursor(actions: list[Action], alloc: FakeAllocator, measure: bool = True) -> RankCursor:
    return RankCursor(
        actions, None, torch.device("cpu"), measure=measure, memory=OpMemoryWatch(alloc)
    )


def _run(cursor: RankCursor, alloc: FakeAllocator, script: dict[tuple[str, int], Any]) -> None:
    """One step: every compute action of the list, each doing what ``script`` says (leaves,
    transient, and what the runtime does after it, before the next action)."""
    cursor.reset()
    for a in cursor.actions:
        cursor.begin(a.op, a.mb, a.chunk)
        leaves, transient, after = script[(a.op, a.chunk)]
        alloc.op(leaves, transient)
        cursor.end(a.op, a.mb, a.chunk)
        for step in after:  # e.g. the loss after the last stage's F: allocated, then part freed
            alloc.op(*step)
    cursor.step_done()


# torch's split backward on a stage: F leaves 10 MB (+1 MB loss graph after it), B keeps 7 MB of
# gradients for W, W frees the 18 MB; the fused BW frees F's 11 MB
SCRIPT = {
    ("F", 0): (10 * MB, 3 * MB, [(1 * MB, 2 * MB)]),
    ("B", 0): (7 * MB, 5 * MB, []),
    ("W", 0): (-18 * MB, 1 * MB, []),
    ("BW", 0): (-11 * MB, 4 * MB, []),
}
ROW = [
    Action("F", 0),
    Action("F", 1),
    Action("B", 0),
    Action("W", 0),
    Action("BW", 1),
]


def test_each_window_runs_from_an_action_to_the_next_and_charges_what_happens_between() -> None:
    alloc = FakeAllocator()
    cursor = _cursor(ROW, alloc)
    _run(cursor, alloc, SCRIPT)
    assert cursor.memory is not None
    s = cursor.memory.chunk_samples(0)
    # F: its 10 MB and the loss's 1 MB after it; transient: 2 MB above the loss's end
    assert s["F"] == [(11 * MB, 2 * MB), (11 * MB, 2 * MB)]
    assert s["B"] == [(7 * MB, 5 * MB)]
    assert s["W"] == [(-18 * MB, 1 * MB)]  # the rise above the larger end (its start)
    assert s["BW"] == [(-11 * MB, 4 * MB)]  # the last window ends with the step
    assert alloc.resets == len(ROW)
    assert cursor.memory.take_peak() == 100 * MB + 22 * MB + 12 * MB  # B's top, of the step
    assert cursor.memory.take_peak() == 0


def test_the_summary_is_the_median_per_op_and_the_largest_transient() -> None:
    alloc = FakeAllocator()
    cursor = _cursor(ROW, alloc)
    for _ in range(3):
        _run(cursor, alloc, SCRIPT)
    assert cursor.memory is not None
    cursor.memory.samples[("F", 0)].append((50 * MB, 30 * MB))  # one odd sample
    mem = summarize(cursor.memory.chunk_samples(0))
    assert mem == OpMemory(
        f=11 * MB, b=7 * MB, w=-18 * MB, bw=-11 * MB, transient=30 * MB, samples=3
    )
    assert mem.changes() == (11 * MB, 7 * MB, -18 * MB)
    assert summarize({"F": [(1, 0)], "BW": [(-1, 0)]}) is None  # no split backward measured


def test_only_profiling_watches_and_a_warm_up_or_unfinished_step_leaves_nothing() -> None:
    alloc = FakeAllocator()
    cursor = _cursor(ROW, alloc)
    assert cursor.memory is not None
    _run(cursor, alloc, SCRIPT)
    cursor.drop_times()  # the warm-up step: its samples go with its times
    assert cursor.memory.samples == {}
    cursor.reset()
    cursor.begin("F", 0, 0)  # a step that fails after its first action has started
    cursor.reset()
    assert cursor.memory.samples == {}
    resets = alloc.resets
    cursor.set_measure(False)  # the schedule adopted: no more watching
    cursor.measure = True  # calibration times ops; it does not watch the allocator
    _run(cursor, alloc, SCRIPT)
    assert cursor.memory.samples == {} and alloc.resets == resets
    # a cursor without a watch (CPU) never watches
    plain = RankCursor(ROW, None, torch.device("cpu"), measure=True)
    assert plain.memory is None and not plain.watch_memory


def _profile(memory: bool, stages: int = 2) -> Profile:
    alloc = FakeAllocator()
    gathered = []
    for s in range(stages):
        cursor = _cursor(ROW, alloc) if memory else RankCursor(ROW, None, torch.device("cpu"))
        cursor.set_measure(True)
        script = dict(SCRIPT)
        if s == 1:  # the second stage's B keeps more and its W has a larger workspace
            script[("B", 0)] = (9 * MB, 5 * MB, [])
            script[("W", 0)] = (-20 * MB, 6 * MB, [])
        _run(cursor, alloc, script)
        cursor.saved_bytes[0].append(8 * MB)  # what saved-tensor hooks counted
        gathered.append(local_measurements(cursor, s, 1))
    hw = hardware_fingerprint(torch.device("cpu"), stages, "gloo")
    model = model_fingerprint("m", [torch.nn.Linear(2, 2)] * stages, 1, stages, 1, [1] * stages)
    return build_profile(gathered, hw, model, 4, "interleaved", 1e-4, 1e9, 1e9)


def test_the_problem_follows_the_measured_memory_and_w_frees_what_f_and_b_left() -> None:
    prof = _profile(memory=True)
    assert [sp.memory is not None for sp in prof.stages] == [True, True]
    pb = prof.to_problem(memory_limit=1e9)
    assert pb.cost("m_f")[:, 0].tolist() == [11 * MB, 11 * MB]
    assert pb.cost("m_b")[:, 0].tolist() == [7 * MB, 9 * MB]  # B allocates: positive
    assert pb.cost("m_w")[:, 0].tolist() == [-18 * MB, -20 * MB]
    assert pb.cost("offload_bytes")[:, 0].tolist() == [8 * MB, 8 * MB]
    assert prof.memory_reserve() == [5 * MB, 6 * MB]  # the largest transient per stage
    # the profile's JSON carries it (a new optional field)
    again = Profile.model_validate_json(prof.model_dump_json())
    assert again == prof and again.to_problem() == prof.to_problem()


def test_without_an_allocator_the_rule_stands_and_old_profiles_still_load() -> None:
    prof = _profile(memory=False)
    assert all(sp.memory is None for sp in prof.stages)
    pb = prof.to_problem()
    assert pb.cost("m_f")[:, 0].tolist() == [8 * MB, 8 * MB]  # the saved bytes
    assert pb.cost("m_b")[:, 0].tolist() == [0.0, 0.0]  # B frees nothing (retain_graph)
    assert pb.cost("m_w")[:, 0].tolist() == [-8 * MB, -8 * MB]
    assert prof.memory_reserve() == [0.0, 0.0]
    old = prof.model_dump(mode="json")
    for sp in old["stages"]:
        del sp["memory"]  # a profile written before the field existed
    assert Profile.model_validate(old).to_problem() == pb


def test_measured_memory_must_be_finite_and_an_offload_moves_at_most_what_f_left() -> None:
    with pytest.raises(ValidationError):
        OpMemory(f=math.nan, b=0.0, w=0.0)
    with pytest.raises(ValidationError):
        OpMemory(f=1.0, b=math.inf, w=0.0)
    with pytest.raises(ValidationError):
        OpMemory(f=1.0, b=0.0, w=0.0, transient=-1.0)
    ops = OpStats(mean=1e-3)
    sp = StageProfile(
        stage=0,
        f=ops,
        b=ops,
        w=ops,
        activation_bytes=8 * MB,
        offloadable_bytes=8 * MB,
        memory=OpMemory(f=-1 * MB, b=2 * MB, w=-1 * MB),  # F freed more than it kept
    )
    assert sp.memory_changes() == (0.0, 2 * MB, -2 * MB)
    assert sp.offload_bytes() == 0.0


def test_auto_limits_keep_each_stages_reserve_out_of_the_solvers_limit() -> None:
    prof = _profile(memory=True)
    assert limits_less_reserve([100 * MB, 100 * MB], prof) == [95 * MB, 94 * MB]
    assert limits_less_reserve([4 * MB, 100 * MB], prof) == [1.0, 94 * MB]


def test_the_simulator_counts_what_b_keeps_until_w() -> None:
    """One stage, F F B W B W with B keeping 7 MB: the peak is 2 activations + 7 MB."""
    pb = Problem(
        num_stages=1,
        num_microbatches=2,
        t_f=1.0,
        t_b=1.0,
        t_w=1.0,
        m_f=11.0 * MB,
        m_b=7.0 * MB,
        m_w=-18.0 * MB,
    )
    row = [Action("F", 0), Action("F", 1), Action("B", 0), Action("W", 0)]
    row += [Action("B", 1), Action("W", 1)]
    ev = simulate(pb, [row]).evaluation
    assert ev.peak_memory == [29.0 * MB]
