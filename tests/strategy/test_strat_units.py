"""Single-process pieces: partition, contract, adapter mapping, planner (offload: test_strat_offload)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from optpipe_lightning.schedule import Action, Problem
from optpipe_lightning.schedule.baselines import generate, make_schedule
from optpipe_lightning.strategy.planning.partition import (
    PartitionError,
    balanced_partition,
    chunk_counts,
    chunked_partition,
    stage_layers,
    validate_partition,
)
from optpipe_lightning.strategy.planning.planner import (
    NoScheduleError,
    choose_schedule,
    profiling_schedule,
)
from optpipe_lightning.strategy.runtime.contract import (
    ContractError,
    LayerChain,
    PipelineSpec,
    get_spec,
)
from optpipe_lightning.strategy.runtime.engine import ScheduleRejectedError, validate_for_execution
from optpipe_lightning.strategy.runtime.torch_adapter import check_lowering, torch_order


def test_balanced_partition_minimises_the_largest_group() -> None:
    assert balanced_partition([1, 1, 1, 1, 4], 2) == [4, 1]
    assert balanced_partition([3, 1, 1, 1, 1, 1], 3) == [1, 2, 3]
    assert balanced_partition([1.0] * 8, 4) == [2, 2, 2, 2]
    # memory: group of layers 0-2 would hold 3 bytes over a limit of 2
    assert balanced_partition([1, 1, 1, 10], 2, memory=[1, 1, 1, 1], memory_limit=2) == [2, 2]
    with pytest.raises(PartitionError, match="only 3 layers"):
        balanced_partition([1, 1, 1], 4)
    with pytest.raises(PartitionError, match="fits the memory limit"):
        balanced_partition([1, 1], 2, memory=[5, 5], memory_limit=1)
    with pytest.raises(PartitionError, match="covers 5 layers"):
        validate_partition([2, 3], 6, 2)


def test_a_chunk_count_implies_the_partition_each_device_keeping_its_layers() -> None:
    # 2 stages of 4 and 2 layers: 2 chunks each, interleaved (chunk c of device d: group c*p+d)
    assert chunked_partition([4, 2], 2, "interleaved") == [2, 1, 2, 1]
    # V placement, 4 chunks of one layer: device 0 runs groups 0, 3, 4, 7
    assert chunked_partition([4, 4], 4, "vshape") == [1] * 8
    vshape = Problem(
        num_stages=2, num_microbatches=2, num_chunks=2, placement="vshape", t_f=1, t_b=1, t_w=1
    )
    assert stage_layers([3, 1, 1, 3], vshape) == [6, 2]  # device 0: groups 0 and 3
    assert chunk_counts([4, 6]) == [1, 2]
    with pytest.raises(
        PartitionError, match=r"layer count \[4, 6\] to divide by 4; these layers allow \[1, 2\]"
    ):
        chunked_partition([4, 6], 4)


def test_chunk_options_are_checked_when_given() -> None:
    from optpipe_lightning.strategy.planning.options import OptPipeConfigError, PipelineOptions

    assert PipelineOptions(schedule="gpipe", num_chunks=4, placement="vshape").chunks == (
        4,
        "vshape",
    )
    assert PipelineOptions(schedule="interleaved-1f1b", num_chunks=4).chunks == (4, "interleaved")
    assert PipelineOptions(schedule="zbv").chunks == (2, "vshape")
    with pytest.raises(OptPipeConfigError, match="zbv runs 2 chunks per device in V placement"):
        PipelineOptions(schedule="zbv", num_chunks=4)
    with pytest.raises(OptPipeConfigError, match="interleaved-1f1b runs 2 or more chunks"):
        PipelineOptions(schedule="interleaved-1f1b", placement="vshape")
    with pytest.raises(OptPipeConfigError, match="num_chunks must be an integer >= 1"):
        PipelineOptions(num_chunks=0)


def test_contract_errors_name_the_fix() -> None:
    class NoHook(nn.Module):
        pass

    with pytest.raises(ContractError, match="has no configure_pipeline"):
        get_spec(NoHook())

    class Stray(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(2, 2), nn.Linear(2, 2)

        def configure_pipeline(self) -> PipelineSpec:
            return PipelineSpec(layers=[self.a], loss_fn=nn.functional.mse_loss)

    with pytest.raises(ContractError, match=r"\['b.weight'"):
        get_spec(Stray())


def test_layer_chain_spreads_tuples() -> None:
    class Two(nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return x, 2 * x

    class Add(nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return a + b

    assert torch.equal(LayerChain([Two(), Add()])(torch.ones(2)), torch.full((2,), 3.0))


def _problem(p: int = 2, m: int = 4, v: int = 1, **kw: object) -> Problem:
    return Problem(
        num_stages=p,
        num_microbatches=m,
        num_chunks=v,
        placement="vshape" if v == 2 else "interleaved",
        t_f=1.0,
        t_b=1.0,
        t_w=1.0,
        **kw,
    )  # type: ignore[arg-type]


def test_torch_order_letters_and_vshape_groups() -> None:
    pb = _problem(v=2)
    sched = generate("zbv", pb)
    order = torch_order(pb, sched.actions)
    letters = {str(a)[len(str(a.stage_index))] for row in order.values() for a in row}
    assert letters == {"F", "I", "W"}  # B -> I (input grad), W -> W
    # V-shape: device 0 holds groups 0 and 3, device 1 groups 1 and 2
    assert {a.stage_index for a in order[0]} == {0, 3}
    assert {a.stage_index for a in order[1]} == {1, 2}
    fused = torch_order(_problem(), generate("1f1b", _problem()).actions)
    assert {str(a)[1] for a in fused[0]} == {"F", "B"}  # BW -> B (full backward)
    check_lowering(pb, sched.actions)


def test_rejects_infeasible_orders() -> None:
    pb = _problem()
    rows = [
        [Action("F", i) for i in range(4)] + [Action("BW", i) for i in range(4)] for _ in range(2)
    ]
    rows[0] = [Action("BW", 0), *rows[0][:4], *rows[0][5:]]  # backward before its forward
    bad = make_schedule(pb, "bad", rows)
    with pytest.raises(ScheduleRejectedError, match="not feasible"):
        validate_for_execution(pb, bad)
    tight = pb.with_changes(memory_limit=1.5)
    with pytest.raises(ScheduleRejectedError, match="over its limit"):
        validate_for_execution(tight, make_schedule(tight, "gpipe", generate("gpipe", pb).actions))


def test_choose_schedule_reports_memory_that_nothing_fits() -> None:
    pb = _problem(memory_limit=0.5)
    with pytest.raises(NoScheduleError, match=r"does not fit|no schedule fits"):
        choose_schedule("1f1b", pb)
    with pytest.raises(NoScheduleError):
        choose_schedule("optimal", pb, time_limit=1.0)
    with pytest.raises(NoScheduleError, match="unknown schedule"):
        choose_schedule("2f2b", _problem())


def test_profiling_schedule_is_feasible_and_measures_split_and_fused() -> None:
    pb = _problem(p=3, m=3, v=2)
    sched = profiling_schedule(pb)
    assert sched.evaluation is not None and sched.evaluation.feasible
    ops = [(a.op, a.mb) for row in sched.actions for a in row]
    assert {op for op, mb in ops if mb % 2 == 0} == {"F", "B", "W"}
    assert {op for op, mb in ops if mb % 2 == 1} == {"F", "BW"}


def test_every_baseline_passes_the_simulator_and_torch_lowering() -> None:
    from optpipe_lightning.schedule.baselines import BASELINE_NAMES, NotApplicable
    from optpipe_lightning.strategy.planning.planner import chunks_for, initial_problem

    checked = 0
    for p in (2, 4):
        for m in (p, p + 1, 2 * p):
            for name in BASELINE_NAMES:
                v, placement = chunks_for(name)
                pb = initial_problem(p, m, v, placement, [1.0] * (p * v))
                try:
                    sched = generate(name, pb)
                except NotApplicable:
                    continue
                validate_for_execution(pb, sched)
                checked += 1
    assert checked >= 40


def test_p2p_warm_up_skips_a_neighbour_stage_on_this_rank(tmp_path) -> None:
    """torch 2.9-2.12 warm up p2p with every neighbour stage at the first step, also one on the
    same rank: gloo cannot send to itself ("Pair is not connected", seen on torch 2.11 + CUDA)."""
    import torch.distributed as dist

    from optpipe_lightning.strategy.runtime.stage import OptPipeStage, RankCursor

    own = not dist.is_initialized()
    if own:
        dist.init_process_group(
            "gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1
        )
    try:
        cursor = RankCursor([], None, torch.device("cpu"))
        group = dist.group.WORLD
        stages = [
            OptPipeStage(nn.Linear(4, 4), i, 3, torch.device("cpu"), group, i, cursor)
            for i in range(3)
        ]
        for st in stages:
            ops = st._get_init_p2p_neighbors_ops()
            assert all(op.group_peer != st.group_rank for op in ops)
        # torch's own list does hold the sends to itself that gloo refuses
        middle = super(OptPipeStage, stages[1])._get_init_p2p_neighbors_ops()
        assert len(middle) == 4
    finally:
        if own:
            dist.destroy_process_group()
