"""Microbatches, the automatic count, joined logs and outputs, forward orders, run status."""

from __future__ import annotations

import contextlib
import logging
from collections import namedtuple
from typing import Any

import pytest
import torch

from optpipe_lightning.schedule import Problem
from optpipe_lightning.strategy.planning.planner import forward_order
from optpipe_lightning.strategy.runtime.microbatch import (
    MicrobatchError,
    choose_microbatches,
    combine_logged,
    eval_microbatches,
    leading_size,
    merge_outputs,
    split_batch,
)
from optpipe_lightning.strategy.runtime.torch_adapter import _sch, torch_order

Pair = namedtuple("Pair", "x y")


def test_split_batch_cuts_every_tensor_and_keeps_the_structure() -> None:
    batch = {
        "pair": Pair(torch.arange(8), torch.arange(16).view(8, 2)),
        "scale": torch.tensor(3.0),  # no batch dimension: every microbatch gets it
        "name": "abc",
    }
    parts = split_batch(batch, 4)
    assert len(parts) == 4 and leading_size(batch) == 8
    assert isinstance(parts[1]["pair"], Pair)
    assert parts[1]["pair"].x.tolist() == [2, 3]
    assert parts[3]["pair"].y.tolist() == [[12, 13], [14, 15]]
    assert all(p["scale"].item() == 3.0 and p["name"] == "abc" for p in parts)
    with pytest.raises(MicrobatchError, match=r"shape \(6,\) does not divide into 4 microbatches"):
        split_batch((torch.zeros(6),), 4)


@pytest.mark.parametrize(
    ("batch", "stages", "expected"),
    [(16, 3, 8), (12, 3, 6), (8, 2, 4), (6, 4, 6), (64, 4, 8), (7, 2, 7)],
)
def test_auto_microbatches_divide_the_batch_and_fill_the_pipeline(
    batch: int, stages: int, expected: int
) -> None:
    # the smallest divisor >= 2p, else the largest >= p
    assert choose_microbatches(batch, stages) == expected


def test_auto_microbatches_say_what_would_work() -> None:
    with pytest.raises(MicrobatchError, match=r"multiple of 6 or 3 \(e\.g\. 6\)"):
        choose_microbatches(2, 3)
    with pytest.raises(MicrobatchError, match="divides into 4, 8 microbatches but the schedule"):
        choose_microbatches(8, 4, runs_with=lambda m: False)


def test_forward_only_batches_take_any_count_that_divides() -> None:
    assert eval_microbatches(8, 2, 4) == 4  # training's count when it divides
    assert eval_microbatches(2, 2, 4) == 2  # a last, smaller batch
    assert eval_microbatches(3, 4, 8) == 3  # smaller than the pipeline
    assert eval_microbatches(1, 2, None) == 1


def test_logged_values_are_the_batch_mean_or_sum() -> None:
    vals = [torch.tensor(0.25), torch.tensor(0.75)]
    assert float(combine_logged(vals)) == 0.5
    assert float(combine_logged(vals, "max")) == 0.5  # max over steps: the batch is one step
    assert float(combine_logged(vals, "sum")) == 1.0
    assert float(combine_logged(vals, torch.sum)) == 1.0


def test_outputs_are_joined_along_the_batch() -> None:
    outs: list[Any] = [
        {"pred": torch.tensor([1, 2]), "loss": torch.tensor(1.0), "tag": "a"},
        {"pred": torch.tensor([3, 4]), "loss": torch.tensor(3.0), "tag": "b"},
    ]
    got = merge_outputs(outs)
    assert got["pred"].tolist() == [1, 2, 3, 4]
    assert float(got["loss"]) == 2.0
    assert got["tag"] == ["a", "b"]
    assert merge_outputs([None, None]) is None


@pytest.mark.parametrize(
    ("p", "v", "placement", "m"),
    [(2, 1, "interleaved", 3), (3, 4, "interleaved", 5), (3, 4, "vshape", 7), (4, 2, "vshape", 2)],
)
def test_forward_orders_lower_without_deadlock(p: int, v: int, placement: Any, m: int) -> None:
    problem = Problem(
        num_stages=p, num_microbatches=m, num_chunks=v, placement=placement, t_f=1, t_b=1, t_w=1
    )
    rows = forward_order(problem)
    assert sorted((a.mb, a.chunk) for row in rows for a in row) == sorted(
        (mb, c) for _ in range(p) for mb in range(m) for c in range(v)
    )
    stage_to_rank = {problem.group_of(s, c): s for s in range(p) for c in range(v)}
    _sch._add_send_recv(  # raises when the order cannot progress
        torch_order(problem, rows),
        stage_to_rank=lambda g: stage_to_rank[g],
        num_stages=problem.num_virtual_stages,
    )


class _FakeScheduler:
    def __init__(self) -> None:
        self.closed: list[str] = []

    def close(self, status: str) -> None:
        self.closed.append(status)


@pytest.mark.parametrize(
    ("exception", "status"),
    [(None, "finished"), (ValueError("x"), "failed"), (KeyboardInterrupt(), "interrupted")],
)
def test_run_status_is_how_the_call_ended(exception: BaseException | None, status: str) -> None:
    from optpipe_lightning.strategy.lightning.strategy import OptPipeStrategy

    strategy = OptPipeStrategy()
    fake = _FakeScheduler()
    strategy.scheduler = fake  # type: ignore[assignment]
    if exception is not None:
        strategy.on_exception(exception)
    with contextlib.suppress(AssertionError):  # Lightning's part needs a cluster environment
        strategy.teardown()
    assert fake.closed == [status]


def test_schedule_messages_go_through_lightnings_rank_zero_logging(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from optpipe_lightning.strategy.lightning.strategy import _notify

    with caplog.at_level(logging.INFO, logger="lightning.pytorch.utilities.rank_zero"):
        _notify("optpipe: step 3: schedule a -> b (profiled), predicted 1 ms per step", False)
        _notify("optpipe: calibrated quietly", True)
    assert [r.getMessage() for r in caplog.records] == [
        "optpipe: step 3: schedule a -> b (profiled), predicted 1 ms per step"
    ]


def test_the_first_stage_gets_the_batch_itself_when_the_inputs_are_its_pieces() -> None:
    """The default step's inputs are ``split_batch``'s views of the batch: the engine gives
    torch the batch back, not a copy joined from them (issue 34.3); anything else is joined."""
    from optpipe_lightning.strategy.runtime.engine import _joined

    cpu = torch.device("cpu")
    x, y = torch.randn(8, 3), torch.arange(8)
    mbs = split_batch((x, y), 4)
    joined = _joined([tuple(mb) for mb in mbs], cpu)
    assert joined[0] is x and joined[1] is y
    # not the batch's pieces in order: a copy with the same values
    for parts in (
        [mb[0] for mb in mbs][::-1],
        [mb[0] for mb in mbs][:3],
        list(x[:, :2].tensor_split(4)),
        list(torch.randn(3, 8).t().tensor_split(4)),
        [t.clone() for t in x.tensor_split(4)],
    ):
        (got,) = _joined([(p,) for p in parts], cpu)
        assert got is not x and torch.equal(got, torch.cat(parts))


def test_split_batch_cuts_each_tensor_once() -> None:
    """A batch tensor is cut once per step, not once per microbatch (issue 34.3: 8
    microbatches cut it 8 times, ~0.3 ms a step before the first stage can start)."""
    from unittest import mock

    x, y = torch.randn(16, 3), torch.randn(16)
    real = torch.Tensor.tensor_split
    calls: list[int] = []

    def cut(t: torch.Tensor, *a: Any, **kw: Any) -> Any:
        calls.append(1)
        return real(t, *a, **kw)

    with mock.patch.object(torch.Tensor, "tensor_split", cut):
        mbs = split_batch({"x": x, "y": [y, torch.tensor(2.0)]}, 8)
    assert len(calls) == 2
    for i, mb in enumerate(mbs):
        assert torch.equal(mb["x"], x[2 * i : 2 * i + 2]) and torch.equal(
            mb["y"][0], y[2 * i : 2 * i + 2]
        )
        assert mb["y"][1].item() == 2.0
