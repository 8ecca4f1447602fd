"""The order-only memory check the offload sweeps skip simulations with, and the chunking order
of the offload generators (schedule/baselines/_memory_bound.py, baselines.generate_chunked)."""

from __future__ import annotations

from typing import Any

import pytest

from optpipe_lightning.schedule import Action, Problem, simulate
from optpipe_lightning.schedule.baselines import NotApplicable, generate
from optpipe_lightning.schedule.baselines._listsched import with_transfers
from optpipe_lightning.schedule.baselines._memory_bound import surely_over_limit
from optpipe_lightning.schedule.baselines.pipeoffload import Member, member_orders

Rows = list[list[Action]]


def problem(p: int, m: int, v: int, limit: float, **kw: object) -> Problem:
    data: dict[str, object] = dict(
        num_stages=p,
        num_microbatches=m,
        num_chunks=v,
        t_f=1.0,
        t_b=1.5,
        t_w=0.5,
        m_f=2.0,
        m_b=-1.5,
        m_w=-0.5,
        memory_limit=limit,
        offload={
            "bytes": 2.0,
            "d2h_bandwidth": 1.0,
            "h2d_bandwidth": 1.0,
            "channel_groups": [[0, 1], [2, 3]],
            "duplex": True,
        },
    )
    data.update(kw)
    return Problem.model_validate(data)


def orders(pb: Problem) -> list[Rows]:
    """Orders with and without offload: the plain baselines, each offloading every activation
    and every other one of its F's, and PipeOffload's members."""
    out: list[Rows] = []
    for name in ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "adaoffload"):
        try:
            rows = [list(r) for r in generate(name, pb).actions]
        except NotApplicable:
            continue
        out.append(rows)
        res = simulate(pb, [[a for a in r if a.is_compute] for r in rows])
        if res.timeline is None:
            continue
        comp = [[a for a in r if a.is_compute] for r in rows]
        fs = [(s, a.mb, a.chunk) for s, r in enumerate(comp) for a in r if a.op == "F"]
        out.append(with_transfers(pb, comp, fs, res))
        out.append(with_transfers(pb, comp, fs[::2], res))
    for g in range(1, pb.num_stages + 1):
        for k in range(pb.num_chunks + 1):
            for rule in ("lazy", "fit"):
                try:
                    out.append(member_orders(pb, Member(g, k, rule)))
                except ValueError:
                    continue
    return out


@pytest.mark.parametrize("v", [1, 2])
def test_an_order_the_check_rejects_never_fits(v: int) -> None:
    """Sound: every order it calls over the limit simulates over it; and it does reject some
    (with and without offload) and never one that fits."""
    rejected = fitting = 0
    moved_rejected = 0
    for limit in (2.5, 4.0, 6.0, 9.0):
        pb = problem(4, 8, v, limit)
        for rows in orders(pb):
            over = surely_over_limit(pb, rows)
            res = simulate(pb, rows)
            assert not (over and res.feasible), rows
            rejected += over
            fitting += res.feasible
            moved_rejected += over and any(a.op == "OFFLOAD" for r in rows for a in r)
    assert rejected > 0 and fitting > 0 and moved_rejected > 0


def test_an_explicit_offload_set_matches_the_offload_actions() -> None:
    pb = problem(4, 8, 1, 3.0)
    rows = [list(r) for r in generate("gpipe", pb).actions]
    res = simulate(pb, rows)
    fs = [(s, a.mb, a.chunk) for s, r in enumerate(rows) for a in r if a.op == "F"]
    for chosen in (fs, fs[::2], fs[::3], []):
        moved: list[set[tuple[int, int]]] = [set() for _ in range(4)]
        for s, mb, c in chosen:
            moved[s].add((mb, c))
        placed = with_transfers(pb, rows, chosen, res)
        assert surely_over_limit(pb, rows, moved) == surely_over_limit(pb, placed)
    assert surely_over_limit(pb, rows, [set() for _ in range(4)])  # gpipe holds 8 > 3


def test_the_check_is_off_where_op_ends_could_merge() -> None:
    """A W of no time ends with the op before it (the simulator merges the two events), so the
    prefix sum between them is no bound: the check says nothing."""
    pb = problem(4, 8, 1, 3.0, t_w=0.0)
    rows = [list(r) for r in generate("gpipe", pb).actions]
    assert not simulate(pb, rows).feasible
    assert not surely_over_limit(pb, rows)
    assert surely_over_limit(problem(4, 8, 1, 3.0), rows)


def test_the_offload_generators_try_the_most_chunks_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """The chunkings are listed as ``chunkings`` gives them, own first, whatever order they ran
    in; stopped at a deadline, pipeoffload keeps its most-chunks member."""
    import optpipe_lightning.schedule.baselines as pkg
    from optpipe_lightning.schedule.baselines import generate_chunked
    from optpipe_lightning.schedule.baselines._deadline import DeadlineExceeded
    from optpipe_lightning.schedule.chunking import chunkings

    base = problem(4, 8, 2, 20.0, placement="interleaved", layers_per_stage=4)
    real = pkg.generate
    ran: list[tuple[str, int, str]] = []

    def recording(name: str, pb: Problem) -> Any:
        ran.append((name, pb.num_chunks, pb.placement))
        return real(name, pb)

    monkeypatch.setattr(pkg, "generate", recording)
    expected = [(v, pl) for v, pl in chunkings(base) if pl == "interleaved"]
    made = generate_chunked("pipeoffload", base)
    assert [(s.num_chunks, s.placement) for s in made] == expected  # own (2) first, then 1, 4
    assert [v for _n, v, _pl in ran] == [4, 4, 2, 2, 1]  # most chunks first
    ran.clear()
    generate_chunked("gpipe", base)
    assert [(v, pl) for _n, v, pl in ran] == chunkings(base)  # the others: the listed order

    def first_only(name: str, pb: Problem) -> Any:
        if ran:
            raise DeadlineExceeded("stopped")
        return recording(name, pb)

    ran.clear()
    monkeypatch.setattr(pkg, "generate", first_only)
    made = generate_chunked("pipeoffload", base)
    assert [(s.num_chunks, s.placement) for s in made] == [(4, "interleaved")]
