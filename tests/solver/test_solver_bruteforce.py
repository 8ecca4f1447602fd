"""The solver's optimum equals exhaustive search over every action list on tiny problems.

The exhaustive search knows nothing of the solver: it enumerates, per stage, every order of the
stage's actions that keeps each microbatch's own chain (F, [OFFLOAD, RELOAD], B, W), every subset
of activations to offload, all their combinations over the stages, and lets the simulator time
each. No symmetry breaking, so it also checks that the solver's microbatch-order symmetry
breaking cuts off no optimum.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from bench_problems import brute_problem
from solver_budget import UNBOUNDED_SECONDS

from optpipe_lightning.schedule import Action, Problem, simulate
from optpipe_lightning.schedule.bounds import lower_bound
from optpipe_lightning.solver import solve

# what a solve reaches is asserted on CP-SAT's deterministic time, never the wall clock
pytestmark = pytest.mark.usefixtures("deterministic_cpsat")


def _merges(chains: list[list[Action]]) -> Iterator[list[Action]]:
    """Every interleaving of the chains (each chain's order kept)."""
    chains = [c for c in chains if c]
    if not chains:
        yield []
        return
    for i, ch in enumerate(chains):
        rest = [*chains[:i], ch[1:], *chains[i + 1 :]]
        for tail in _merges(rest):
            yield [ch[0], *tail]


def _subsets(m: int) -> list[set[int]]:
    return [set(x) for r in range(m + 1) for x in itertools.combinations(range(m), r)]


def _stage_rows(pb: Problem, fused: bool | str) -> list[list[Action]]:
    """``fused``: every backward a BW (True), B then W (False), or each either way ("mixed")."""
    m = pb.num_microbatches
    offloadable = pb.offload is not None and pb.memory_limit is not None
    out: list[list[Action]] = []
    subsets = _subsets(m) if offloadable else [set()]
    fusings = _subsets(m) if fused == "mixed" else [set(range(m)) if fused else set()]
    for sub in subsets:
        for fuse in fusings:
            chains = []
            for j in range(m):
                ch = [Action("F", j)]
                if j in sub:
                    ch += [Action("OFFLOAD", j), Action("RELOAD", j)]
                ch += [Action("BW", j)] if j in fuse else [Action("B", j), Action("W", j)]
                chains.append(ch)
            out.extend(_merges(chains))
    return out


_CACHE: dict[tuple[str, bool | str], float] = {}

# Exhaustive optima of the larger cases (over 2,000 row combinations: 1.5-20 s of CPU each),
# recorded by this module's own search (``OPTPIPE_RECORD_EXHAUSTIVE=1 pytest this_file`` rewrites
# the file). A problem not recorded (its hash changed) is searched again; smaller cases always
# are, and ``test_a_recorded_optimum_is_what_the_search_finds`` searches one recorded case again.
RECORDED = Path(__file__).with_name("exhaustive_optima.json")
CHEAP_COMBINATIONS = 2_000


def _recorded() -> dict[str, float]:
    return dict(json.loads(RECORDED.read_text())) if RECORDED.exists() else {}


def _key(pb: Problem, fused: bool | str) -> str:
    return f"{pb.hash}:{fused}"


def _combinations(pb: Problem, fused: bool | str) -> int:
    return len(_stage_rows(pb, fused)) ** pb.num_stages


def exhaustive_optimum(pb: Problem, fused: bool | str) -> float:
    if (pb.hash, fused) not in _CACHE:
        recorded = _recorded().get(_key(pb, fused))
        if recorded is None or _combinations(pb, fused) <= CHEAP_COMBINATIONS:
            _CACHE[(pb.hash, fused)] = _exhaustive(pb, fused)
        else:
            _CACHE[(pb.hash, fused)] = recorded
        if os.environ.get("OPTPIPE_RECORD_EXHAUSTIVE") == "1":
            value = _exhaustive(pb, fused)
            _CACHE[(pb.hash, fused)] = value
            if _combinations(pb, fused) > CHEAP_COMBINATIONS:
                RECORDED.write_text(
                    json.dumps({**_recorded(), _key(pb, fused): value}, indent=1, sort_keys=True)
                    + "\n"
                )
    return _CACHE[(pb.hash, fused)]


def _exhaustive(pb: Problem, fused: bool | str) -> float:
    per_stage = [_stage_rows(pb, fused) for _ in range(pb.num_stages)]
    best = float("inf")
    for rows in itertools.product(*per_stage):
        ev = simulate(pb, rows).evaluation
        if ev.feasible and ev.makespan is not None and ev.makespan < best:
            best = ev.makespan
    return best


def _assert_cpsat_proves(pb: Problem, brute: float) -> None:
    """CP-SAT alone proves the exhaustive search's optimum, and the simulator agrees."""
    res = solve(
        pb,
        backend="cpsat",
        time_limit=UNBOUNDED_SECONDS,
        deterministic_time=30.0,
        workers=1,
        seed=0,
        use_baselines=False,
    )
    assert res.status == "optimal"
    assert res.makespan == pytest.approx(brute, abs=1e-9)
    assert res.lower_bound == pytest.approx(brute, abs=1e-9)
    ev = simulate(pb, res.schedule).evaluation
    assert ev.feasible and ev.makespan == pytest.approx(res.makespan, abs=1e-12)


# (stages, microbatches, t_w, memory limit, offload, fused exhaustive search, copy bandwidth)
# fused search with t_w = 0 is exact: a zero-length W is best right after its B. Bandwidth 4
# makes a copy half an F; bandwidth 1 makes it two Fs, so the best schedules let an F wait for
# an offload to free memory (the simulator's memory wait). Copies on one lane for both
# directions (``duplex: false``); DUPLEX_CASES below have a lane each way.
CASES = [
    pytest.param(2, 2, 1.0, None, False, False, 4.0, id="2x2-unlimited"),
    pytest.param(2, 2, 1.0, 2.0, False, False, 4.0, id="2x2-mem1-no-offload"),
    pytest.param(3, 2, 1.0, 2.0, False, False, 4.0, id="3x2-mem1-no-offload"),
    # the drain argument alone proves this optimum (15; the other bounds reach 14)
    pytest.param(3, 2, 1.0, 4.0, False, False, 4.0, id="3x2-mem2-no-offload"),
    pytest.param(2, 3, 0.0, 3.0, False, True, 4.0, id="2x3-mem1.5-no-offload"),
    pytest.param(2, 2, 0.0, 2.0, False, True, 4.0, id="2x2-mem1-no-offload-fused"),
    pytest.param(2, 2, 0.0, 2.0, True, True, 4.0, id="2x2-mem1-offload"),
    pytest.param(2, 2, 0.0, 2.0, True, True, 1.0, id="2x2-mem1-slow-offload"),
    pytest.param(2, 2, 0.0, 3.0, True, True, 4.0, id="2x2-mem1.5-offload", marks=pytest.mark.slow),
    pytest.param(
        2, 2, 0.0, 3.0, True, True, 1.0, id="2x2-mem1.5-slow-offload", marks=pytest.mark.slow
    ),
]


@pytest.mark.parametrize("p,m,t_w,limit,offload,fused,bandwidth", CASES)
def test_optimum_equals_exhaustive_search(
    p: int, m: int, t_w: float, limit: float | None, offload: bool, fused: bool, bandwidth: float
) -> None:
    pb = brute_problem(
        p, m, t_w=t_w, limit=limit, offload=offload, bandwidth=bandwidth, duplex=False
    )
    brute = exhaustive_optimum(pb, fused)
    assert lower_bound(pb) <= brute + 1e-9  # the cheap bound is valid (fused search: t_w = 0)
    _assert_cpsat_proves(pb, brute)


# (memory limit, copy bandwidth, every stage on one channel): 2 stages, 2 microbatches, fused
# backward, W = 0, offloads and reloads on a lane each way (the default)
DUPLEX_CASES = [
    pytest.param(2.0, 4.0, False, id="2x2-mem1-offload-duplex"),
    pytest.param(2.0, 1.0, False, id="2x2-mem1-slow-offload-duplex"),
    pytest.param(2.0, 4.0, True, id="2x2-mem1-offload-shared-duplex", marks=pytest.mark.slow),
    pytest.param(3.0, 1.0, True, id="2x2-mem1.5-slow-shared-duplex", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("limit,bandwidth,shared", DUPLEX_CASES)
def test_optimum_equals_exhaustive_search_with_duplex_lanes(
    limit: float, bandwidth: float, shared: bool
) -> None:
    pb = brute_problem(2, 2, t_w=0.0, limit=limit, offload=True, bandwidth=bandwidth, shared=shared)
    assert pb.offload is not None and pb.offload.duplex
    brute = exhaustive_optimum(pb, True)
    assert lower_bound(pb) <= brute + 1e-9
    _assert_cpsat_proves(pb, brute)


def test_offload_beats_no_offload_on_the_tiny_case() -> None:
    """The offload case above is a real one: offload lowers the optimum (10 s against 14 s)."""
    with_off = exhaustive_optimum(
        brute_problem(2, 2, t_w=0.0, limit=2.0, offload=True, duplex=False), True
    )
    without = exhaustive_optimum(brute_problem(2, 2, t_w=0.0, limit=2.0, offload=False), True)
    assert with_off == pytest.approx(10.0)
    assert without == pytest.approx(14.0)


def test_a_reload_waits_for_the_offload_that_frees_its_room_with_duplex_lanes() -> None:
    """On one lane the 10 s optimum queues stage 0's first reload behind its second offload,
    which frees the room the reload needs. With a lane each way nothing queues it there: the
    reload waits for that offload by the memory wait (docs/formats.md) and the same list takes
    10 s; without that wait it would break the limit. F1 waits for offload 0's copy (its copy
    ends inside F1 otherwise: the bytes leave only at its settle point, F1's start)."""
    half = brute_problem(2, 2, t_w=0.0, limit=2.0, offload=True, duplex=False)
    duplex = brute_problem(2, 2, t_w=0.0, limit=2.0, offload=True)
    assert exhaustive_optimum(half, True) == pytest.approx(10.0)
    assert exhaustive_optimum(duplex, True) == pytest.approx(10.0)
    rows = [
        [Action(x, j) for x, j in (("F", 0), ("OFFLOAD", 0), ("F", 1), ("OFFLOAD", 1))]
        + [Action(x, j) for x, j in (("RELOAD", 0), ("BW", 0), ("RELOAD", 1), ("BW", 1))],
        [Action("F", 0), Action("BW", 0), Action("F", 1), Action("BW", 1)],
    ]
    for pb in (half, duplex):
        res = simulate(pb, rows)
        assert res.feasible and res.makespan == pytest.approx(10.0)
        assert res.timeline is not None
        i = rows[0].index(Action("RELOAD", 0))
        assert float(res.timeline.start[0][i]) == pytest.approx(3.0)  # offload 1's end
        assert res.timeline.memory_waits == [[(2, 1)], []]  # F1 starts when offload 0 ends
    # duplex: the reload's wait is named for the executor (reload 0 at 4 waits for offload 1 at 3)
    assert simulate(duplex, rows).timeline.reload_waits == [[(4, 3)], []]  # type: ignore[union-attr]


def test_slow_offload_no_longer_pays_once_bytes_leave_at_the_settle_point() -> None:
    """Copies twice as slow as an F: when an offload's bytes left at its copy's end, an F
    ending with that copy made 13 s; now they leave at the settle point (the F must start
    after the copy), and the best is 14 s, the same as without offload, on one lane or two."""
    for duplex in (False, True):
        pb = brute_problem(2, 2, t_w=0.0, limit=2.0, offload=True, bandwidth=1.0, duplex=duplex)
        assert exhaustive_optimum(pb, True) == pytest.approx(14.0)
        no_off = brute_problem(2, 2, t_w=0.0, limit=2.0, offload=False)
        assert exhaustive_optimum(no_off, True) == pytest.approx(14.0)


# (memory limit, fused backward seconds): B = 2, W = 1, so BW 2.5 saves half a second
MIXED_CASES = [
    pytest.param(None, 2.5, id="2x2-unlimited-bw2.5"),
    pytest.param(3.0, 2.5, id="2x2-mem1.5-bw2.5"),
    pytest.param(2.0, 2.5, id="2x2-mem1-bw2.5"),
    pytest.param(None, 2.0, id="2x2-unlimited-bw2"),
]


@pytest.mark.parametrize("limit,t_bw", MIXED_CASES)
def test_fused_or_split_per_backward_optimum_equals_exhaustive_search(
    limit: float | None, t_bw: float
) -> None:
    """Where a fused backward is cheaper, every backward may be fused or split: the search
    tries every combination, and CP-SAT, which chooses per backward, proves the same optimum."""
    pb = brute_problem(2, 2, t_w=1.0, limit=limit, t_bw=t_bw)
    brute = exhaustive_optimum(pb, "mixed")
    assert brute <= min(exhaustive_optimum(pb, True), exhaustive_optimum(pb, False)) + 1e-9
    assert lower_bound(pb) <= brute + 1e-9
    _assert_cpsat_proves(pb, brute)


def test_mixing_fused_and_split_beats_both_on_a_tiny_case() -> None:
    """The mixed search is a real one: some tiny case needs both kinds."""
    gains = []
    for limit in (None, 3.0, 2.0):
        pb = brute_problem(2, 2, t_w=1.0, limit=limit, t_bw=2.5)
        pure = min(exhaustive_optimum(pb, True), exhaustive_optimum(pb, False))
        gains.append(pure - exhaustive_optimum(pb, "mixed"))
    assert max(gains) > 0.25


def test_a_recorded_optimum_is_what_the_search_finds() -> None:
    """The record is the search's own answer: one recorded case (the cheapest of the larger
    ones: 2x2, every backward fused or split, 2,116 combinations) searched again."""
    pb = brute_problem(2, 2, t_w=1.0, limit=2.0, t_bw=2.5)
    assert _combinations(pb, "mixed") > CHEAP_COMBINATIONS
    assert _recorded()[_key(pb, "mixed")] == pytest.approx(_exhaustive(pb, "mixed"))
