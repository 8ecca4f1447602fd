"""Chunks as a decision (``layers_per_stage``): validation, re-chunking, and the problem a
schedule built for a re-chunking is checked against."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from optpipe_lightning.schedule import Problem, ScheduleMismatchError
from optpipe_lightning.schedule.baselines import best_schedule, generate, generate_chunked
from optpipe_lightning.schedule.chunking import (
    chunk_counts,
    chunkings,
    is_rechunking_of,
    problem_for,
    rechunk,
    stamped,
)


def layered(p: int = 4, m: int = 8, layers: int | list[int] = 4, **kw: object) -> Problem:
    args: dict[str, object] = dict(
        num_stages=p,
        num_microbatches=m,
        t_f=1.0,
        t_b=1.5,
        t_w=0.5,
        t_comm=0.0,
        m_f=4.0,
        m_b=-3.0,
        m_w=-1.0,
        layers_per_stage=layers,
    )
    args.update(kw)
    return Problem.model_validate(args)


@pytest.mark.parametrize("v", [2, 4])
@pytest.mark.parametrize("p,m", [(4, 8), (4, 12), (2, 6)])
def test_rechunked_interleaved_1f1b_meets_its_closed_form(p: int, m: int, v: int) -> None:
    """notes/schedules.md: interleaved 1F1B with per-chunk costs has bubble (p-1)(F+B+W), 1/v of
    1F1B's on the same layers, and a peak of p*v + p - 1 chunk units."""
    base = layered(p, m, layers=4)
    pb = rechunk(base, v, "interleaved")
    assert (pb.num_chunks, pb.placement) == (v, "interleaved")
    f, b, w = 1.0 / v, 1.5 / v, 0.5 / v
    assert pb.cost("t_f").tolist() == [[f] * v] * p
    assert pb.cost("m_f").tolist() == [[4.0 / v] * v] * p
    ev = generate("interleaved-1f1b", pb).evaluation
    assert ev is not None and ev.feasible and ev.makespan is not None
    work = m * v * (f + b + w)
    assert ev.makespan - work == pytest.approx((p - 1) * (f + b + w))
    one = generate("1f1b", base).evaluation
    assert one is not None and one.makespan is not None
    assert one.makespan - work == pytest.approx(v * (ev.makespan - work))
    assert ev.peak_memory[0] == pytest.approx(min(p * v + p - 1, m * v) * 4.0 / v)


def test_rechunk_keeps_totals_comm_limit_and_channels() -> None:
    base = layered(
        t_comm=[0.1, 0.2, 0.3, 0.4],
        t_bw=1.8,
        memory_limit=[10.0, 11.0, 12.0, 13.0],
        offload={
            "bytes": [4.0, 3.0, 2.0, 1.0],
            "d2h_bandwidth": 8.0,
            "h2d_bandwidth": 4.0,
            "channel_groups": [[0, 1]],
        },
    )
    pb = rechunk(base, 4, "vshape")
    for name in ("t_f", "t_b", "t_w", "t_bw", "m_f", "m_b", "m_w", "offload_bytes"):
        assert pb.cost(name).sum(axis=1) == pytest.approx(base.cost(name).sum(axis=1)), name
    assert pb.cost("t_comm")[:, 0] == pytest.approx([0.1, 0.2, 0.3, 0.4])  # per hop unchanged
    assert pb.memory_limits() == base.memory_limits()
    assert pb.offload is not None and base.offload is not None
    assert pb.offload.channel_groups == [[0, 1]]
    assert pb.offload_time(0, 0) == pytest.approx(base.offload_time(0, 0) / 4)
    assert pb.layers() == base.layers()
    assert is_rechunking_of(pb, base)
    assert not is_rechunking_of(pb, base.with_changes(t_f=1.1))


def test_chunkings_are_the_divisors_in_both_placements() -> None:
    pb = layered(layers=[4, 8, 4, 12])
    assert chunk_counts(pb) == [1, 2, 4]
    assert chunkings(pb) == [
        (1, "interleaved"),
        (2, "interleaved"),
        (2, "vshape"),
        (4, "interleaved"),
        (4, "vshape"),
    ]
    own = layered(layers=6, num_chunks=2, placement="vshape")
    assert chunkings(own)[0] == (2, "vshape")  # its own first
    assert set(chunkings(own)) == {
        (1, "interleaved"),
        (2, "interleaved"),
        (2, "vshape"),
        (3, "interleaved"),
        (3, "vshape"),
        (6, "interleaved"),
        (6, "vshape"),
    }
    assert rechunk(own, 2, "vshape") is own
    # without layers_per_stage the chunk count is fixed
    fixed = Problem(num_stages=2, num_microbatches=4, num_chunks=2, t_f=1, t_b=1, t_w=1)
    assert chunkings(fixed) == [(2, "interleaved")]
    with pytest.raises(ValueError, match="add layers_per_stage"):
        rechunk(fixed, 1)


def test_hash_has_layers_only_when_given() -> None:
    a = Problem(num_stages=2, num_microbatches=4, t_f=1, t_b=1, t_w=1)
    b = a.with_changes(layers_per_stage=2)
    assert a.hash != b.hash
    assert b.hash == a.with_changes(layers_per_stage=[2, 2]).hash
    # re-chunking from a re-chunked problem gives the same problem as from the original
    base = layered(layers=4)
    assert rechunk(rechunk(base, 2, "vshape"), 4, "interleaved").hash == rechunk(base, 4).hash
    assert rechunk(rechunk(base, 4), 1).hash == base.hash


@pytest.mark.parametrize(
    "layers,chunks,match",
    [
        ([4, 4, 4], 1, "layers_per_stage has 3 entries, expected num_stages=4"),
        (0, 1, "layers_per_stage must be whole numbers >= 1"),
        ([4, -2, 4, 4], 1, "layers_per_stage must be whole numbers >= 1"),
        (6, 4, "layers_per_stage: num_chunks=4 does not divide the 6 layers of stage 0"),
    ],
)
def test_bad_layers_name_the_field(layers: object, chunks: int, match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        layered(layers=layers, num_chunks=chunks)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="allowed chunk counts: 1, 2, 4"):
        rechunk(layered(layers=4), 3)


def test_a_schedule_for_a_rechunking_is_checked_against_it() -> None:
    base = layered(layers=4)
    pb = rechunk(base, 2, "interleaved")
    sched = stamped(generate("interleaved-1f1b", pb), pb)
    assert (sched.num_chunks, sched.placement) == (2, "interleaved")
    assert problem_for(base, sched) is sched.problem
    # without the embedded problem, the recorded chunking rebuilds it
    bare = sched.model_copy(update={"problem": None})
    assert problem_for(base, bare).hash == pb.hash
    with pytest.raises(ScheduleMismatchError, match="nor a re-chunking"):
        problem_for(base.with_changes(t_b=2.0), bare)
    with pytest.raises(ScheduleMismatchError):
        problem_for(base.with_changes(t_b=2.0), sched)


def test_each_baseline_gets_its_best_chunking() -> None:
    base = layered(p=4, m=8, layers=4)
    made = generate_chunked("interleaved-1f1b", base)
    assert sorted(s.num_chunks or 0 for s in made) == [2, 4]  # v=1 and the V do not apply
    best = best_schedule(made)
    assert best.num_chunks == 4 and best.evaluation is not None
    assert best.evaluation.makespan == pytest.approx(8 * 3 + 3 * 3 / 4)
